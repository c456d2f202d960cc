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
from dagrunner.worktrees.disk import checkout_size, measure

GATES = '[gates.ok]\nrun = "true"\n'


def free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
    low = next(p for p in range(42000, 43000, 3) if all(free(p + i) for i in range(3)))
    with_ports(project, 1, f"{low}-{low + 2}")
    busy = socket.socket()
    busy.bind(("127.0.0.1", low))
    busy.listen()
    try:
        probe = f"{sys.executable} -c \"import os; open('seen', 'w').write(os.environ['DAGRUNNER_PORTS'])\""
        first = wt.allocate(mission="m", worker="a", repo=project, setup=[probe])
        assert first["ports"] == [low + 1]  # low is listened on
        assert (Path(first["path"]) / "seen").read_text() == str(low + 1)
        # .dagrunner/ stays out of git: the worktree has only the setup's file untracked
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=first["path"], capture_output=True, text=True
        ).stdout
        assert status == "?? seen\n"
        second = wt.allocate(mission="m", worker="b", repo=project)
        assert second["ports"] == [low + 2]
        with pytest.raises(DagrunnerError) as raised:
            wt.allocate(mission="m", worker="c", repo=project)
        assert raised.value.code == "ports-exhausted"
        assert not (Path(second["root"]) / "m" / "c").exists()  # nothing was made
        (Path(first["path"]) / "seen").unlink()
        lifecycle.cleanup("m/a", force=True, repo=project)
        assert wt.allocate(mission="m", worker="c", repo=project)["ports"] == [low + 1]
    finally:
        busy.close()


def test_a_bad_port_range_is_a_manifest_error_and_allocates_nothing(project: Path) -> None:
    commit_release_manifest(project, f'[worktrees]\nports = 1\nport_range = "90-80"\n{GATES}')
    with pytest.raises(DagrunnerError) as raised:
        wt.allocate(mission="m", worker="x", repo=project)
    assert raised.value.code == "manifest-value" and "worktrees.port_range" in str(raised.value.key)


def test_list_gives_each_worktrees_disk_and_a_budget_refuses_writing_nothing(
    project: Path,
) -> None:
    """A worktree with a 3 MiB file of its own and a hard link to another's: the link is in
    its bytes, not its unique bytes.  With max_disk just above what the root holds, the next
    allocation refuses (disk-budget, naming the landed worktree to clean) and makes nothing."""
    import os

    commit_release_manifest(project, GATES)
    a = Path(wt.allocate(mission="m", worker="a", repo=project)["path"])
    b = Path(wt.allocate(mission="m", worker="b", repo=project)["path"])
    (a / "big.bin").write_bytes(os.urandom(3 << 20))
    os.link(a / "big.bin", b / "linked.bin")
    (b / "own.bin").write_bytes(os.urandom(1 << 20))
    listing = orjson.loads(
        subprocess.run(
            [*CLI, "worktree", "list", "--json"], cwd=project, capture_output=True, check=True
        ).stdout
    )
    disk = {w["id"]: w["disk"] for w in listing["worktrees"]}
    assert disk["m/b"]["bytes"] - disk["m/b"]["unique_bytes"] >= 3 << 20  # the link is shared
    assert disk["m/b"]["unique_bytes"] >= 1 << 20
    assert disk["m/a"]["unique_bytes"] < 3 << 20 <= disk["m/a"]["bytes"]
    total = listing["disk"]["total_bytes"]
    assert total >= (4 << 20) and total < disk["m/a"]["bytes"] + disk["m/b"]["bytes"]
    (a / "big.bin").unlink()  # m/a: clean again, and its work (none) is on main: landed
    for name in ("linked.bin", "own.bin"):
        (b / name).unlink()
    b_state = subprocess.run(["git", "status", "--porcelain"], cwd=b, capture_output=True)
    assert b_state.stdout == b""
    git_in(b, "commit", "--allow-empty", "-qm", "m/b's own unlanded commit")
    commit_release_manifest(project, f'[worktrees]\nmax_disk = "1G"\n{GATES}')
    root = Path(listing["worktrees"][0]["path"]).parents[1]
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True)
    needed = checkout_size(project, base.stdout.strip())
    total = measure(root, {"m/a": a, "m/b": b}).total
    tight = total + needed - 8192  # a new checkout would pass it, by a margin
    commit_release_manifest(project, f'[worktrees]\nmax_disk = "{tight}"\n{GATES}')
    with pytest.raises(DagrunnerError) as raised:
        wt.allocate(mission="m", worker="c", repo=project)
    assert raised.value.code == "disk-budget", raised.value.message
    assert "cleaning m/a (landed" in raised.value.message and "m/b" not in raised.value.message
    assert not (root / "m" / "c").exists()
    assert "m/c" not in lifecycle.list_worktrees(repo=project).__repr__()
    commit_release_manifest(project, f'[worktrees]\nmax_disk = "{tight + (1 << 20)}"\n{GATES}')
    assert wt.allocate(mission="m", worker="c", repo=project)["id"] == "m/c"


def git_in(path: Path, *args: str) -> None:
    from conftest import git

    git(path, *args)


def test_a_dagrunner_symlink_in_the_base_is_never_written_through(
    project: Path, tmp_path: Path
) -> None:
    from conftest import git

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / ".dagrunner").symlink_to(elsewhere)
    git(project, "add", ".dagrunner")
    with_ports(project, 1, "43100-43199")
    with pytest.raises(DagrunnerError) as raised:
        wt.allocate(mission="m", worker="s", repo=project)
    assert raised.value.code == "path-occupied"
    assert list(elsewhere.iterdir()) == []


def test_prune_to_budget_cleans_idle_clean_worktrees_oldest_first_and_never_work(
    project: Path,
) -> None:
    for worker in ("old", "dirty", "recent"):
        path = Path(wt.allocate(mission="m", worker=worker, repo=project)["path"])
        (path / f"{worker}.txt").write_text("work\n")
        subprocess.run(["git", "add", "-A"], cwd=path, check=True)
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", worker],
            cwd=path,
            check=True,
        )
    dirty = wt.open_context(project).root / "m" / "dirty"
    (dirty / "unsaved.txt").write_text("not committed\n")
    ledger = wt.open_context(project).ledger.path
    lines = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
    for line in lines:  # m/old and m/dirty were last touched ten days ago
        if line["id"] in ("m/old", "m/dirty"):
            line["at"] = "2026-01-01T00:00:00.000+00:00"
    ledger.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    # the budget the target's manifest sets now: far below what the three hold
    commit_release_manifest(project, f'[worktrees]\nmax_disk = "1"\n{GATES}')
    plain = lifecycle.prune(repo=project)
    assert plain["removed"] == []  # nothing landed, and no --idle
    body = lifecycle.prune(repo=project, to_budget=True)
    assert [(r["id"], r["reason"]) for r in body["removed"]] == [
        ("m/old", "to budget: idle since 2026-01-01")
    ]
    assert sorted(wt.open_context(project).ledger.state()) == ["m/dirty", "m/recent"]
    assert (dirty / "unsaved.txt").exists()
    # its commit is kept on its branch: cleaning it to make room lost nothing
    branch = subprocess.run(
        ["git", "log", "-1", "--format=%s", "dagrunner/m/old"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    assert branch.stdout.strip() == "old"


def test_prune_to_budget_without_a_budget_is_a_coded_error(project: Path) -> None:
    commit_release_manifest(project, GATES)
    with pytest.raises(DagrunnerError) as caught:
        lifecycle.prune(repo=project, to_budget=True)
    assert caught.value.code == "no-disk-budget"
