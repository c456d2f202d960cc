"""A gate's own network (``network = "isolated"``): its own namespace with only loopback up,
on real processes -- two gates bind one port at once, and none reaches the host's loopback."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import orjson
import pytest
from conftest import check, gate_results

from dagrunner.process.contain import network_isolation
from dagrunner.report.rundir import default_runs

needs_netns = pytest.mark.skipif(
    not network_isolation(), reason="this machine gives gates no network namespace"
)

BIND = (
    "import socket, time; s = socket.socket(); "
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0); "
    "s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(1.5); print('bound')"
)
REACH = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
    "except OSError as exc:\n"
    "    print('unreachable:', exc); sys.exit(0)\n"
    "print('reached the host'); sys.exit(1)\n"
)


@needs_netns
def test_two_isolated_gates_bind_one_port_and_reach_no_host_loopback_server(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen()
    port = host.getsockname()[1]
    py = sys.executable
    code, _, run_dir = check(
        capsys,
        repo,
        f"""
        [defaults]
        network = "isolated"
        [gates.one]
        run = [{py!r}, "-c", "{BIND.format(port=8000)}"]
        [gates.two]
        run = [{py!r}, "-c", "{BIND.format(port=8000)}"]
        [gates.reach]
        run = [{py!r}, "-c", {REACH.format(port=port)!r}]
        """,
    )
    results = gate_results(run_dir)
    assert code == 0, results
    one, two = (results[g] for g in ("one", "two"))
    assert one["started"] < two["finished"] and two["started"] < one["finished"]  # at once
    assert "unreachable" in (run_dir / "logs" / "reach.log").read_text()
    machine = orjson.loads((run_dir / "run.json").read_bytes())["machine"]
    assert machine["containment"]["network_isolation"] is True
    host.setblocking(False)
    with pytest.raises(BlockingIOError):  # no connection ever came in
        host.accept()
    host.close()


def test_a_host_gate_still_reaches_the_host(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen()
    py = sys.executable
    code, _, run_dir = check(
        capsys,
        repo,
        f"""
        [gates.reach]
        network = "host"
        run = [{py!r}, "-c", {REACH.format(port=host.getsockname()[1])!r}]
        """,
    )
    assert code == 1 and "reached the host" in (run_dir / "logs" / "reach.log").read_text()
    host.close()
    # no gate asked for a network of its own: not probed (its processes cost every run 40 ms)
    machine = orjson.loads((run_dir / "run.json").read_bytes())["machine"]
    assert machine["containment"]["network_isolation"] is None


def test_a_bad_network_value_is_a_manifest_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = check(capsys, repo, '[gates.g]\nrun = "true"\nnetwork = "none"\n')
    assert code == 2 and out["error"]["key"] == "gates.g.network"
    assert "host or isolated" in out["error"]["message"]


def test_where_gates_get_no_namespace_an_isolated_gate_is_a_coded_error_never_host(
    repo: Path,
) -> None:
    """DAGRUNNER_CONTAINMENT=session is the mode of a machine without namespaces."""
    import os
    import subprocess

    from conftest import CLI, write_manifest

    path = write_manifest(repo, '[gates.g]\nrun = "true"\nnetwork = "isolated"\n')
    done = subprocess.run(
        [*CLI, "release-check", str(path), "--json"],
        cwd=repo,
        env={**os.environ, "DAGRUNNER_CONTAINMENT": "session"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout
    assert '"network-isolation-unavailable"' in done.stdout
    assert not (default_runs(repo) / "latest").exists()  # nothing ran
