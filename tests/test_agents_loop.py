"""The agents' loop closes inside MCP (issue 45): every test drives the real ``dagrunner mcp``
with the SDK's own client, on a real repository.  An agent never waits forever (a queue that
cannot move says why, in the first or second wait), never needs git or the CLI to recover
(conflict, withdraw, requeue, cleanup), and always gets a coded answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import CLI, commit_release_manifest, git
from mcp.client.session import ClientSession
from mcp_types import CallToolResult
from test_agents import MANIFEST, call, project, until_final, with_server

from dagrunner.version import VERSION

__all__ = ["project"]  # the fixture, shared with test_agents


def coded(result: CallToolResult) -> dict[str, Any]:
    """The coded error of a failed call: structured, and the same object as its text."""
    assert result.is_error is True, result.content
    body = result.structured_content
    assert isinstance(body, dict) and set(body) == {"error"}, body
    (content,) = result.content
    assert json.loads(getattr(content, "text", "")) == body
    error = body["error"]
    assert isinstance(error, dict)
    return error


def test_a_queue_with_no_manifest_says_so_in_the_first_or_second_wait(repo: Path) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
        (Path(mine["path"]) / "new.txt").write_text("new\n")
        queued = await call(session, "dagrunner_submit", worktree="m/w")
        cursor, answers = 0, []
        for _ in range(2):
            answer = await call(
                session, "dagrunner_wait", id=queued["id"], timeout_seconds=10, cursor=cursor
            )
            answers.append(answer)
            cursor = answer["cursor"]
            if "stuck" in answer:
                break
        said["waits"] = answers
        said["why"] = await call(session, "dagrunner_why", id=queued["id"])
        said["status"] = await call(session, "dagrunner_status")

    with_server(repo, body)
    last = said["waits"][-1]
    assert last["final"] is False and last["stuck"]["code"] == "manifest-not-found", last
    assert "dagrunner.toml" in last["stuck"]["message"] + last["stuck"]["hint"]
    assert "manifest-not-found" in last["next"]
    assert said["why"]["stuck"]["code"] == "manifest-not-found", said["why"]
    health = said["status"]["integrator"]
    assert health["healthy"] is False and health["stuck"][0]["code"] == "manifest-not-found"


def test_every_tool_answers_a_coded_error_as_structured_content(project: Path) -> None:
    errors: dict[str, dict[str, Any]] = {}

    async def body(session: ClientSession) -> None:
        tries: dict[str, tuple[str, dict[str, Any]]] = {
            "unknown": ("dagrunner_wait", {"id": "m.w.0123456789ab"}),
            "climbing": ("dagrunner_wait", {"id": "../../x"}),
            "huge": ("dagrunner_wait", {"id": "x" * 1_000_000}),
            "cursor": ("dagrunner_wait", {"id": "m.w.0123456789ab", "cursor": -1}),
            "timeout": ("dagrunner_wait", {"id": "m.w.0123456789ab", "timeout_seconds": 51}),
            "extra": ("dagrunner_submit", {"worktree": "m/w", "requeu": True}),
            "form": ("dagrunner_sync", {"worktree": "no-slash"}),
            "mission": ("dagrunner_allocate", {"mission": "m" * 100_000, "worker": "w"}),
            "why": ("dagrunner_why", {"id": "m.w.0123456789ab"}),
        }
        for name, (tool, arguments) in tries.items():
            result = await session.call_tool(tool, arguments)
            errors[name] = coded(result)
            errors[name]["size"] = len(getattr(result.content[0], "text", ""))

    with_server(project, body)
    assert errors["unknown"]["code"] == errors["why"]["code"] == "envelope-unknown", errors
    for name in ("climbing", "huge", "cursor", "timeout", "extra", "form", "mission"):
        assert errors[name]["code"] == "bad-argument", (name, errors[name])
    assert (
        "requeu" in errors["extra"]["message"] and "not an argument" in errors["extra"]["message"]
    )
    assert all(e["size"] < 2000 for e in errors.values()), {k: e["size"] for k, e in errors.items()}


def test_the_tools_publish_titles_bounds_output_schemas_and_the_version(project: Path) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        said["tools"] = (await session.list_tools()).tools
        said["server"] = session.initialize_result

    with_server(project, body)
    for tool in said["tools"]:
        assert tool.title and tool.annotations and tool.annotations.open_world_hint is False
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        assert tool.output_schema and tool.output_schema.get("required"), tool.name
    wait = next(t for t in said["tools"] if t.name == "dagrunner_wait").input_schema
    assert wait["properties"]["timeout_seconds"]["maximum"] == 50
    assert wait["properties"]["cursor"]["minimum"] == 0
    names = {t.name for t in said["tools"]}
    assert {"dagrunner_withdraw", "dagrunner_sync", "dagrunner_cleanup"} <= names
    info = said["server"]
    assert info is not None and info.server_info.version == VERSION


def test_cancelled_waits_free_their_slots_at_once(project: Path) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
        (Path(mine["path"]) / "new.txt").write_text("new\n")
        queued = await call(session, "dagrunner_submit", worktree="m/w")

        async def cancelled() -> None:
            with anyio.move_on_after(1):
                await session.call_tool(
                    "dagrunner_wait", {"id": queued["id"], "timeout_seconds": 40}
                )

        async with anyio.create_task_group() as group:
            for _ in range(20):
                group.start_soon(cancelled)
        begun = time.monotonic()
        answer = await call(session, "dagrunner_wait", id=queued["id"], timeout_seconds=2)
        said["took"] = time.monotonic() - begun
        said["answer"] = answer

    with_server(project, body, "--no-drive")  # it stays queued: every wait takes its bound
    assert said["answer"]["state"] == "queued" and said["took"] < 5, said


def test_a_wait_answers_within_its_bound_all_included(project: Path) -> None:
    said: dict[str, float] = {}

    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
        (Path(mine["path"]) / "new.txt").write_text("new\n")
        queued = await call(session, "dagrunner_submit", worktree="m/w")
        begun = time.monotonic()
        await call(session, "dagrunner_wait", id=queued["id"], timeout_seconds=4)
        said["took"] = time.monotonic() - begun

    with_server(project, body, "--no-drive")
    assert 2 < said["took"] <= 4.0, said


def test_a_conflict_is_recovered_with_mcp_alone(project: Path) -> None:
    """Two agents change the same line; the second gets conflict, reads the hunks (landed /
    yours), syncs (markers left, its state backed up), fixes the file and lands."""
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        first = await call(session, "dagrunner_allocate", mission="m", worker="first")
        second = await call(session, "dagrunner_allocate", mission="m", worker="second")
        (Path(first["path"]) / "calc.py").write_text("def add(a, b):\n    return b + a\n")
        (Path(second["path"]) / "calc.py").write_text("def add(a, b):\n    return (a + b)\n")
        one = await call(session, "dagrunner_submit", worktree="m/first")
        said["first"] = await until_final(session, one["id"])
        two = await call(session, "dagrunner_submit", worktree="m/second")
        said["second"] = await until_final(session, two["id"])
        said["why"] = await call(session, "dagrunner_why", id=two["id"])
        said["sync"] = await call(session, "dagrunner_sync", worktree="m/second")
        file = Path(second["path"]) / "calc.py"
        said["marked"] = file.read_text()
        said["unresolved"] = coded(
            await session.call_tool("dagrunner_submit", {"worktree": "m/second"})
        )["code"]
        file.write_text("def add(a, b):\n    return (b + a)\n")
        again = await call(session, "dagrunner_submit", worktree="m/second")
        said["again"] = await until_final(session, again["id"])
        said["cleanup"] = await call(session, "dagrunner_cleanup", worktree="m/second")

    with_server(project, body)
    assert said["first"]["state"] == "landed" and said["first"]["commit"], said["first"]
    assert said["second"]["state"] == "conflict", said["second"]
    hunks = said["why"]["hunks"]
    assert "<<<<<<< landed" in hunks and ">>>>>>> yours" in hunks, hunks
    assert said["sync"]["conflicts"] == ["calc.py"] and said["sync"]["backup"], said["sync"]
    assert "<<<<<<< landed" in said["marked"] and ">>>>>>> yours" in said["marked"]
    assert said["unresolved"] == "export-unresolved"
    assert said["again"]["state"] == "landed", said["again"]
    assert any(e["event"] == "landed" for e in said["again"]["events"]), said["again"]
    assert "(b + a)" in git(project, "show", "main:calc.py")
    assert said["cleanup"]["action"] in ("already-removed", "removed", "pooled"), said["cleanup"]


SLOW = """
[gates.slow]
run = "sleep 4"
"""


def test_withdraw_while_gating_never_lands_and_requeue_queues_it_again(project: Path) -> None:
    commit_release_manifest(project, SLOW)
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
        (Path(mine["path"]) / "slow.txt").write_text("slow\n")  # its gate passes, in 4 s
        queued = await call(session, "dagrunner_submit", worktree="m/w")
        # a wait of 3 s answers after 1.5 s (it keeps a margin; 1 s answered at once, and 60
        # of those passed before a loaded machine's queue began gating): about every 1.5 s,
        # for up to 2 minutes, inside the gate's 4 s
        for _ in range(80):
            answer = await call(session, "dagrunner_wait", id=queued["id"], timeout_seconds=3)
            if answer["state"] == "gating":
                break
        said["withdrawn"] = await call(session, "dagrunner_withdraw", id=queued["id"])
        said["final"] = await until_final(session, queued["id"])
        said["again"] = await call(session, "dagrunner_submit", worktree="m/w", requeue=True)
        said["landed"] = await until_final(session, said["again"]["id"])

    begun = git(project, "rev-parse", "main").strip()
    with_server(project, body)
    assert said["withdrawn"]["state"] == "withdrawn" and said["withdrawn"]["was"] == "gating"
    assert said["final"]["state"] == "withdrawn" and said["final"]["final"] is True
    assert said["again"]["again_of"] and said["again"]["id"] != said["withdrawn"]["id"]
    assert said["landed"]["state"] == "landed", said["landed"]
    log = git(project, "log", "--format=%H", f"{begun}..main").split()
    assert len(log) == 1, log  # the withdrawn one never landed: only the requeued one


def test_an_empty_submit_is_refused_and_withdraw_of_a_queued_item(project: Path) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        await call(session, "dagrunner_allocate", mission="m", worker="w")
        said["empty"] = coded(await session.call_tool("dagrunner_submit", {"worktree": "m/w"}))
        mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
        (Path(mine["path"]) / "x.txt").write_text("x\n")
        queued = await call(session, "dagrunner_submit", worktree="m/w")
        said["withdrawn"] = await call(session, "dagrunner_withdraw", id=queued["id"])
        said["again"] = await call(session, "dagrunner_withdraw", id=queued["id"])

    with_server(project, body, "--no-drive")
    assert said["empty"]["code"] == "envelope-empty", said
    assert said["withdrawn"]["was"] == "queued" and said["again"]["already"] is True
    status = subprocess.run(
        [*CLI, "integrate", "status", "--repo", str(project)], capture_output=True, text=True
    )
    assert "withdrawn" in status.stdout, status


def test_serve_backs_off_a_refused_landing_until_the_checkout_changes(project: Path) -> None:
    commit_release_manifest(project, '[gates.ok]\nrun = "true"\n')
    (project / "README").write_text("dirty\n")  # the target's checkout: landing is refused
    server = subprocess.Popen(
        [*CLI, "integrate", "serve", "--repo", str(project)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: dict[str, Any] = {}
    try:
        assert server.stdout is not None and server.stdout.readline() == "serving main\n"

        async def body(session: ClientSession) -> None:
            mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
            (Path(mine["path"]) / "w.txt").write_text("w\n")
            queued = await call(session, "dagrunner_submit", worktree="m/w")
            cursor, events = 0, list[dict[str, Any]]()
            for _ in range(20):
                answer = await call(
                    session, "dagrunner_wait", id=queued["id"], timeout_seconds=5, cursor=cursor
                )
                cursor, events = answer["cursor"], events + answer["events"]
                if "stuck" in answer:
                    break
            said["stuck"] = answer
            answer = await call(
                session, "dagrunner_wait", id=queued["id"], timeout_seconds=6, cursor=cursor
            )
            said["gated"] = [e for e in events + answer["events"] if e["event"] == "gating"]
            git(project, "checkout", "--", "README")  # the operator cleans it
            said["end"] = await until_final(session, queued["id"])

        with_server(project, body, "--no-drive")
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=15)
    assert said["stuck"]["stuck"]["code"] == "target-checkout-dirty", said["stuck"]
    assert len(said["gated"]) == 1, said["gated"]  # not gated again while it stayed dirty
    assert said["end"]["state"] == "landed", said["end"]
    assert server.returncode == 130


def test_a_stdio_server_ends_when_its_client_goes(project: Path) -> None:
    env = dict(os.environ)
    command = [sys.executable, "-m", "dagrunner", "mcp", "--repo", str(project)]
    closed = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    assert closed.stdin is not None
    closed.stdin.close()  # stdin's end
    assert closed.wait(timeout=10) == 0
    # the parent killed while stdin stays open (the test holds it): the kernel ends it
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen({command!r}, stdin=sys.stdin)\nprint(p.pid, flush=True)\n"
         "time.sleep(120)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(1.5)  # it is serving
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as stat:
            if stat.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the server outlived its client by 10 s")
    assert parent.stdin is not None
    parent.stdin.close()
    parent.stdout.close()


def test_withdraw_from_the_cli(project: Path) -> None:
    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="w")
        (Path(mine["path"]) / "x.txt").write_text("x\n")
        said["id"] = (await call(session, "dagrunner_submit", worktree="m/w"))["id"]

    said: dict[str, Any] = {}
    with_server(project, body, "--no-drive")
    done = subprocess.run(
        [*CLI, "integrate", "withdraw", said["id"], "--repo", str(project), "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["state"] == "withdrawn", done
    run = subprocess.run(
        [*CLI, "integrate", "run", "--repo", str(project), "--json"], capture_output=True, text=True
    )
    assert json.loads(run.stdout)["envelopes"] == [], run.stdout
    assert MANIFEST  # the project's gates: never run for a withdrawn item
