"""The agents' interface (issue 37): ``dagrunner mcp`` driven by the MCP SDK's own client over
stdio, on a real repository -- the whole loop (allocate, edit, submit, wait until final)
lands a good change; a bad one ends ``gates-failed`` and ``dagrunner_why`` names its gate and
failed test; a wait returns within its bound with progress notifications; a worker-bound
server refuses another worker's worktree."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import CLI, commit_release_manifest, git
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from dagrunner.git.repo import repo_info
from dagrunner.integration.submit import submit

MANIFEST = """
[env]
pass = ["PATH"]

[gates.unit]
run = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=build/unit.xml", "checks"]
junit = "build/unit.xml"
"""


@pytest.fixture
def project(repo: Path) -> Path:
    (repo / ".gitignore").write_text("reports/\nbuild/\n__pycache__/\n")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "checks").mkdir()
    (repo / "checks" / "test_calc.py").write_text(
        "import sys, os\nsys.path.insert(0, os.getcwd())\nimport calc\n\n\n"
        "def test_add():\n    assert calc.add(2, 3) == 5\n"
    )
    commit_release_manifest(repo, MANIFEST)
    return repo


Session = Callable[[ClientSession], Awaitable[None]]


def with_server(repo: Path, body: Session, *args: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "dagrunner", "mcp", "--repo", str(repo), *args],
        env=dict(os.environ),
        cwd=str(repo),
    )

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await body(session)

    anyio.run(main)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An MCP session over streamable HTTP at ``url``, with ``token`` as its bearer."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(name, arguments)
    assert not result.is_error, result.content
    content = result.structured_content
    assert isinstance(content, dict)
    return content


async def until_final(session: ClientSession, item: str) -> dict[str, Any]:
    cursor = 0
    for _ in range(40):
        said = await call(session, "dagrunner_wait", id=item, timeout_seconds=10, cursor=cursor)
        if said["final"]:
            return said
        cursor = said["cursor"]
    raise AssertionError(f"{item} never ended")


def test_the_whole_loop_lands_a_good_change_and_explains_a_bad_one(project: Path) -> None:
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        tools = (await session.list_tools()).tools
        names = {t.name for t in tools}
        assert {
            "dagrunner_allocate",
            "dagrunner_submit",
            "dagrunner_wait",
            "dagrunner_why",
        } <= names
        assert all(re.fullmatch(r"dagrunner_[a-z0-9_]+", n) for n in names)
        assert all(t.annotations is not None for t in tools)
        good = await call(session, "dagrunner_allocate", mission="m", worker="good")
        (Path(good["path"]) / "calc.py").write_text("def add(a, b):\n    return b + a\n")
        queued = await call(session, "dagrunner_submit", worktree="m/good")
        seen["good"] = await until_final(session, queued["id"])
        bad = await call(session, "dagrunner_allocate", mission="m", worker="bad")
        (Path(bad["path"]) / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        queued = await call(session, "dagrunner_submit", worktree="m/bad")
        seen["bad"] = await until_final(session, queued["id"])
        seen["why"] = await call(session, "dagrunner_why", id=queued["id"])

    with_server(project, body)
    assert seen["good"]["state"] == "landed", seen["good"]
    assert "b + a" in git(project, "show", "main:calc.py")
    assert seen["bad"]["state"] == "gates-failed", seen["bad"]
    (failed,) = seen["why"]["failed_gates"]
    assert failed["gate"] == "unit" and "test_add" in json.dumps(failed["failed_tests"])
    assert "submit again" in seen["why"]["next"]


def test_a_wait_returns_within_its_bound_with_progress(project: Path) -> None:
    """The gate takes 6 s; a wait of 3 s answers in time, not final, having sent progress."""
    commit_release_manifest(
        project, MANIFEST.replace('run = ["python"', 'run = ["sh", "-c", "sleep 6"]\n# ["python"')
    )
    notes: list[float] = []
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        slow = await call(session, "dagrunner_allocate", mission="m", worker="slow")
        (Path(slow["path"]) / "NOTES").write_text("a note\n")
        queued = await call(session, "dagrunner_submit", worktree="m/slow")

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append(progress)

        begun = anyio.current_time()
        result = await session.call_tool(
            "dagrunner_wait", {"id": queued["id"], "timeout_seconds": 3}, progress_callback=progress
        )
        said.update(result.structured_content or {})
        said["took"] = anyio.current_time() - begun
        said["end"] = (await until_final(session, queued["id"]))["state"]  # nothing left running

    with_server(project, body)
    assert said["final"] is False and said["took"] < 6, said
    assert said["end"] == "landed"
    assert notes, "no progress notification came while it waited"


def test_a_worker_bound_server_refuses_another_workers_worktree(project: Path) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        result = await session.call_tool("dagrunner_allocate", {"mission": "m", "worker": "other"})
        said["error"] = result.is_error
        (content,) = result.content
        assert isinstance(content, TextContent)
        said["text"] = content.text

    with_server(project, body, "--worker", "m/mine")
    assert said["error"] is True
    text = said["text"]  # the SDK says which tool failed, then the coded error object
    assert json.loads(text[text.index("{") :])["error"]["code"] == "worker-bound"


def error_code(result: Any) -> str:
    """The coded error of a tool call that failed (the SDK names the tool, then the object)."""
    assert result.is_error is True, result.content
    (content,) = result.content
    assert isinstance(content, TextContent)
    text = content.text
    return str(json.loads(text[text.index("{") :])["error"]["code"])


URGENT = 1 << 30  # the queue's internal "urgent" (integration/queue.URGENT)


def priorities_of(repo: Path) -> dict[str, int]:
    from dagrunner.integration.queue import Queue

    return {e.id.split(".")[1]: e.priority for e in Queue.of(repo_info(repo)).entries().values()}


def test_a_worker_bound_server_never_submits_as_urgent_nor_above_the_public_maximum(
    project: Path,
) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="mine")
        (Path(mine["path"]) / "mine.txt").write_text("mine\n")
        for priority in ("urgent", URGENT, 1001, -1001):
            result = await session.call_tool(
                "dagrunner_submit", {"worktree": "m/mine", "priority": priority}
            )
            said[str(priority)] = error_code(result)
        said["public"] = await call(session, "dagrunner_submit", worktree="m/mine", priority=1000)

    with_server(project, body, "--worker", "m/mine", "--no-drive")
    assert said["urgent"] == "urgent-refused", said
    assert said[str(URGENT)] == said["1001"] == said["-1001"] == "bad-priority", said
    assert said["public"]["state"] == "queued", said["public"]
    assert priorities_of(project) == {"mine": 1000}


def test_an_unbound_server_submits_urgent_only_when_its_caller_allows_it(project: Path) -> None:
    said: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        mine = await call(session, "dagrunner_allocate", mission="m", worker="mine")
        (Path(mine["path"]) / "mine.txt").write_text("mine\n")
        said["urgent"] = await call(
            session, "dagrunner_submit", worktree="m/mine", priority="urgent"
        )

    def refused(session: ClientSession) -> Awaitable[None]:
        async def body() -> None:
            mine = await call(session, "dagrunner_allocate", mission="m", worker="mine")
            (Path(mine["path"]) / "mine.txt").write_text("mine\n")
            result = await session.call_tool(
                "dagrunner_submit", {"worktree": "m/mine", "priority": "urgent"}
            )
            said["refused"] = error_code(result)

        return body()

    with_server(project, refused, "--no-drive")
    assert said["refused"] == "urgent-refused"
    with_server(project, body, "--no-drive", "--allow-urgent")
    assert said["urgent"]["state"] == "queued", said["urgent"]
    assert priorities_of(project) == {"mine": URGENT}
    bound = subprocess.run(
        [*CLI, "mcp", "--repo", str(project), "--worker", "m/w", "--allow-urgent", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bound.returncode == 2 and '"bad-usage"' in bound.stdout, bound


# -- integrate serve ---------------------------------------------------------------------


def envelope_of(repo: Path, worker: str, name: str) -> Path:
    from dagrunner.worktrees import allocate as wt
    from dagrunner.worktrees import export as exporting

    path = Path(wt.allocate(mission="m", worker=worker, repo=repo)["path"])
    (path / name).write_text(f"{worker}\n")
    out = path.parent / f"{worker}.json"
    exporting.export(f"m/{worker}", output=out, repo=repo)
    return out


def states_of(repo: Path) -> dict[str, str]:
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.queue import Queue

    return {e.id.split(".")[1]: str(e.state) for e in Queue.of(repo_info(repo)).entries().values()}


def until(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def serving(project: Path, *args: str) -> subprocess.Popen[str]:
    """``integrate serve`` started, once it holds the target's lock ("serving main")."""
    server = subprocess.Popen(
        [*CLI, "integrate", "serve", "--repo", str(project), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline() == "serving main\n"
    return server


SLOW = """
[gates.slow]
run = "while [ ! -e go.txt ] && [ ! -e stay.txt ]; do sleep 0.1; done; test -e go.txt"
timeout = "60s"
"""


def test_serve_lands_what_arrives_while_it_runs_and_stops_on_sigterm(project: Path) -> None:
    commit_release_manifest(project, '[gates.ok]\nrun = "true"\n')
    server = serving(project)
    try:
        # a second integrator for the same target is refused while it serves
        busy = subprocess.run(
            [*CLI, "integrate", "serve", "--repo", str(project), "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert busy.returncode == 4 and "integrator-busy" in busy.stdout, busy
        for worker in ("first", "second"):  # one after the other, no restart between
            submit(repo_info(project), [envelope_of(project, worker, f"{worker}.txt")])

            def landed(name: str = worker) -> bool:
                return states_of(project).get(name) == "landed"

            assert until(landed, 60), states_of(project)
        assert git(project, "cat-file", "-e", "main:second.txt") == ""
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=15)
        assert server.returncode == 130, err
        assert "stopped (SIGTERM) after 2 run(s)" in out, out
    finally:
        server.kill()


def test_sigterm_during_a_gate_ends_serve_and_the_item_stays_queued(project: Path) -> None:
    commit_release_manifest(project, SLOW)
    server = serving(project)
    try:
        submit(repo_info(project), [envelope_of(project, "waits", "waits.txt")])
        assert until(lambda: states_of(project).get("waits") == "gating", 60), states_of(project)
        begun = time.monotonic()
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=15)
        assert time.monotonic() - begun < 15 and server.returncode == 130, (out, err)
        assert states_of(project)["waits"] == "queued"
    finally:
        server.kill()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


PROMETHEUS_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? -?[0-9.eE+-]+|NaN")


def test_serve_over_http_metrics_health_and_the_tools_behind_a_token(
    project: Path, tmp_path: Path
) -> None:
    commit_release_manifest(project, '[gates.ok]\nrun = "true"\n')
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-tests\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = serving(project, "--http", f"127.0.0.1:{port}", "--token-file", str(token))
    said: dict[str, Any] = {}
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
                    return bool(answer.read() == b"ok\n")
            except OSError:
                return False

        assert until(healthy, 30), server.stderr
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        samples = [line for line in metrics.splitlines() if line and not line.startswith("#")]
        assert samples and all(PROMETHEUS_LINE.fullmatch(s) for s in samples), metrics
        assert "dagrunner_serve_runs_total" in metrics and "dagrunner_queue_pending" in metrics
        refused = urllib.request.Request(f"{base}/mcp", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(refused, timeout=5)
        assert caught.value.code == 401
        caught.value.close()  # its response holds the socket: unclosed, a later test fails
        inline = envelope_of(project, "remote", "remote.txt").read_text()

        async def main() -> None:
            async with http_session(f"{base}/mcp", "s3cret-token-for-tests") as session:
                # an agent over HTTP is not the operator: urgent is refused there too
                urgent = {"envelope": inline, "priority": "urgent"}
                said["urgent"] = error_code(await session.call_tool("dagrunner_submit", urgent))
                queued = await call(session, "dagrunner_submit", envelope=inline)
                said.update(await until_final(session, queued["id"]))

        anyio.run(main)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=15)
    assert said["state"] == "landed" and said["urgent"] == "urgent-refused", said
    assert git(project, "cat-file", "-e", "main:remote.txt") == ""


def test_the_published_tool_schemas_are_what_the_server_lists() -> None:
    from dagrunner.agents.server import rendered

    published = Path(__file__).resolve().parents[1] / "docs" / "agents.tools.json"
    assert published.read_text() == rendered(), "run python -m dagrunner.agents.server"
