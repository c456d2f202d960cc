"""``integrate serve`` runs each drain in a child process (issue 48: serve's memory).  Serve's
own process never imports the engine -- networkx, trio, the report's templates -- while its
drains land what arrives and its waiters over ``/mcp`` are answered (the wait's estimate
included); a serve killed alone leaves its drain to queue its items again and end, never to
gate on unowned; a drain killed alone ends serve with ``drain-crashed`` and the next
integrator lands its item."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
from conftest import commit_release_manifest, envelope, git
from mcp.client.session import ClientSession
from test_agents import SLOW, call, free_port, http_session, states_of, until, until_final

from dagrunner.git.repo import repo_info
from dagrunner.integration.submit import submit

ENGINE = {"networkx", "trio", "jinja2"}  # what a drain imports and serve itself must not


def test_serve_itself_never_imports_the_engine_and_its_drains_land(
    project: Path, tmp_path: Path
) -> None:
    commit_release_manifest(project, '[gates.ok]\nrun = "sleep 2"\n')
    token = tmp_path / "token"
    token.write_text("tok-for-the-child-test\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    errors = tmp_path / "stderr"  # a file, not a pipe: a thousand lines would fill a pipe
    with errors.open("w") as sink:
        server = subprocess.Popen(  # -X importtime: serve's own imports, one line each, on stderr
            [sys.executable, "-X", "importtime", "-m", "dagrunner", "integrate", "serve",
             "--repo", str(project), "--http", f"127.0.0.1:{port}", "--token-file", str(token)],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )  # fmt: skip
    said: dict[str, Any] = {}
    try:
        assert server.stdout is not None and server.stdout.readline() == "serving main\n"
        inline = envelope(project, "remote").read_text()

        async def main() -> None:
            async with http_session(f"{base}/mcp", "tok-for-the-child-test") as session:
                queued = await call(session, "dagrunner_submit", envelope=inline)
                # a wait that ends before the item does: its answer carries an estimate
                said["early"] = await call(
                    session, "dagrunner_wait", id=queued["id"], timeout_seconds=1
                )
                said.update(await until_final(session, queued["id"]))

        anyio.run(main)
        submit(repo_info(project), [envelope(project, "cli")])  # and one by the command line
        assert until(lambda: states_of(project).get("cli") == "landed", 60), states_of(project)
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=20)
    err = errors.read_text()
    assert server.returncode == 130, (out, err[-2000:])
    assert said["state"] == "landed" and not said["early"]["final"], said
    assert "eta_seconds" in said["early"], said
    assert git(project, "cat-file", "-e", "main:remote.txt") == ""
    assert git(project, "cat-file", "-e", "main:cli.txt") == ""
    imported = {
        line.split("|")[2].strip() for line in err.splitlines() if line.startswith("import time:")
    }
    assert "dagrunner.agents.server" in imported  # the capture works: the MCP face is there
    assert "dagrunner.agents.follow" in imported
    assert not {name.split(".")[0] for name in imported} & ENGINE, sorted(imported)
    assert "dagrunner.integration.steps" not in imported


def serve(project: Path) -> subprocess.Popen[str]:
    """``integrate serve`` on ``project``, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "dagrunner", "integrate", "serve", "--repo", str(project)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def gating_drain(project: Path, server: subprocess.Popen[str], name: str) -> psutil.Process:
    """Once ``server`` serves: worker ``name``'s envelope submitted and being gated, and the
    one drain child gating it."""
    assert server.stdout is not None and server.stdout.readline() == "serving main\n"
    submit(repo_info(project), [envelope(project, name)])
    assert until(lambda: states_of(project).get(name) == "gating", 60), states_of(project)
    children = psutil.Process(server.pid).children()
    drains = [p for p in children if "drain" in " ".join(p.cmdline())]
    assert len(drains) == 1, children
    return drains[0]


def test_serve_killed_alone_leaves_its_drain_to_queue_its_items_again(project: Path) -> None:
    commit_release_manifest(project, SLOW)  # a gate that waits: the drain is mid-gate
    server = serve(project)
    drains: list[psutil.Process] = []
    try:
        drains = [gating_drain(project, server, "waits")]
        server.kill()  # serve alone, not its group: the drain is told by the kernel
        server.wait()
        _, alive = psutil.wait_procs(drains, timeout=20)
        assert not alive, "the drain outlived serve by 20 s"
        assert until(lambda: states_of(project)["waits"] == "queued", 5), states_of(project)
    finally:
        for process in drains:
            if process.is_running():
                process.kill()
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=10)


def test_a_drain_killed_alone_ends_serve_with_a_code_and_the_next_run_lands_it(
    project: Path,
) -> None:
    commit_release_manifest(project, '[gates.slow]\nrun = "sleep 3"\n')
    server = serve(project)
    try:
        gating_drain(
            project, server, "orphan"
        ).kill()  # the OOM killer's choice, say: the drain alone
        out, err = server.communicate(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate(timeout=10)
    assert server.returncode == 3 and "drain-crashed" in out + err, (out, err)
    ran = subprocess.run(
        [sys.executable, "-m", "dagrunner", "integrate", "run", "--repo", str(project)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran
    assert states_of(project)["orphan"] == "landed"
    assert git(project, "cat-file", "-e", "main:orphan.txt") == ""


def test_an_mcp_submit_killed_with_serve_lands_once_as_its_workers_item(
    project: Path, tmp_path: Path
) -> None:
    """Issue 48's lost item, as the soak met it: serve killed while it answered an inline
    ``dagrunner_submit``, after the envelope was stored and before its journal line.  The
    client reconnects to a new serve and submits again; the item must land once and
    ``status`` must name its mission and worker (it named neither: the soak counted it lost,
    and a worker-bound server would not show the worker its own item)."""
    commit_release_manifest(project, '[gates.ok]\nrun = "true"\n')
    token = tmp_path / "token"
    token.write_text("tok-for-the-kill-test\n")
    port = free_port()
    inline = envelope(project, "killed").read_text()

    def start(env: dict[str, str]) -> subprocess.Popen[str]:
        server = subprocess.Popen(
            [sys.executable, "-m", "dagrunner", "integrate", "serve", "--repo", str(project),
             "--http", f"127.0.0.1:{port}", "--token-file", str(token)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,  # a group of its own, killed whole as the soak kills it
        )  # fmt: skip
        assert server.stdout is not None
        said = server.stdout.readline()
        assert said == "serving main\n", (said, server.communicate(timeout=20))
        return server

    async def session_of(work: Any) -> Any:
        async with http_session(f"http://127.0.0.1:{port}/mcp", "tok-for-the-kill-test") as session:
            return await work(session)

    async def submit_and_wait(session: ClientSession) -> Any:
        queued = await call(session, "dagrunner_submit", envelope=inline)
        final = await until_final(session, queued["id"])
        return queued, final, await call(session, "dagrunner_status")

    server = start({**os.environ, "DAGRUNNER_CRASH_AT": "submitting"})
    try:
        with contextlib.suppress(Exception):  # serve dies under the call: no answer
            anyio.run(session_of, lambda s: call(s, "dagrunner_submit", envelope=inline))
        assert server.wait(timeout=20) == -signal.SIGKILL
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # its drain, if one had started
        server.communicate(timeout=10)
        server = start(dict(os.environ))
        queued, final, status = anyio.run(session_of, submit_and_wait)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        server.communicate(timeout=20)
    assert final["state"] == "landed", final
    (entry,) = [e for e in status["envelopes"] if e["id"] == queued["id"]]
    assert (entry.get("mission"), entry.get("worker"), entry["state"]) == ("m", "killed", "landed")
    assert len(status["envelopes"]) == 1, status["envelopes"]
    log = git(project, "log", "--format=%(trailers:key=Dagrunner-Envelope,valueonly)", "main")
    assert [line for line in log.splitlines() if line.strip()] == [queued["id"]]
