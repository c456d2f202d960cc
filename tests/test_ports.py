"""Ports leased to worktrees (``[worktrees] ports``), on real processes: concurrent
allocations never share one, a port something listens on is skipped, the worktree and its
setup see them, and they are free again once it is cleaned."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import CLI, commit_release_manifest

from dagrunner.errors import DagrunnerError
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import lifecycle

GATES = '[gates.ok]\nrun = "true"\n'


def with_ports(project: Path, ports: int, span: str) -> None:
    commit_release_manifest(
        project, f'[worktrees]\nports = {ports}\nport_range = "{span}"\n{GATES}'
    )


def test_twenty_concurrent_allocations_lease_disjoint_ports(project: Path) -> None:
    with_ports(project, 2, "41000-41999")
    procs = [
        subprocess.Popen(
            [*CLI, "worktree", "allocate", "--mission", "m", "--worker", f"w{i:02d}", "--json"],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(20)
    ]
    leased: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        body = orjson.loads(out)
        assert len(body["ports"]) == 2
        leased += body["ports"]
        env = (Path(body["path"]) / ".dagrunner" / "env").read_text()
        assert f"DAGRUNNER_PORT={body['ports'][0]}\n" in env
    assert len(set(leased)) == 40 and all(41000 <= p <= 41999 for p in leased)
    status = lifecycle.status("m/w03", repo=project)
    assert len(status["ports"]) == 2 and set(status["ports"]) <= set(leased)


def test_a_busy_port_is_skipped_setup_sees_the_ports_and_cleanup_frees_them(
    project: Path,
) -> None:
    with_ports(project, 1, "42100-42102")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 42100))
    busy.listen()
    try:
        probe = f"{sys.executable} -c \"import os; open('seen', 'w').write(os.environ['DAGRUNNER_PORTS'])\""
        first = wt.allocate(mission="m", worker="a", repo=project, setup=[probe])
        assert first["ports"] == [42101]  # 42100 is listened on
        assert (Path(first["path"]) / "seen").read_text() == "42101"
        # .dagrunner/ stays out of git: the worktree has only the setup's file untracked
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=first["path"], capture_output=True, text=True
        ).stdout
        assert status == "?? seen\n"
        second = wt.allocate(mission="m", worker="b", repo=project)
        assert second["ports"] == [42102]
        with pytest.raises(DagrunnerError) as raised:
            wt.allocate(mission="m", worker="c", repo=project)
        assert raised.value.code == "ports-exhausted"
        assert not (Path(second["root"]) / "m" / "c").exists()  # nothing was made
        (Path(first["path"]) / "seen").unlink()
        lifecycle.cleanup("m/a", force=True, repo=project)
        assert wt.allocate(mission="m", worker="c", repo=project)["ports"] == [42101]
    finally:
        busy.close()


def test_a_bad_port_range_is_a_manifest_error_and_allocates_nothing(project: Path) -> None:
    commit_release_manifest(project, f'[worktrees]\nports = 1\nport_range = "90-80"\n{GATES}')
    with pytest.raises(DagrunnerError) as raised:
        wt.allocate(mission="m", worker="x", repo=project)
    assert raised.value.code == "manifest-value" and "worktrees.port_range" in str(raised.value.key)
