"""Faults leave the truth: a full disk while landing, and stale git locks (issue #9, 11-12)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import can_mount, git, run_json

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting

root_only = pytest.mark.skipif(not can_mount(), reason="mounting a small tmpfs needs root")


def make_project(root: Path) -> Path:
    repo = root / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text('[gates.ok]\nrun = ["true"]\n')
    (repo / "README").write_text("hi\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    return repo


def envelope(repo: Path, name: str, size: int = 0) -> Path:
    path = Path(wt.allocate(mission="m", worker=name, repo=repo)["path"])
    (path / f"{name}.bin").write_bytes(os.urandom(size) if size else b"small\n")
    out = path.parent / f"{name}.json"
    exporting.export(f"m/{name}", output=out, repo=repo)
    return out


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12M", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> Path:
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    filler = disk / "filler"
    subprocess.run(["fallocate", "-l", str(max(free - leave, 0)), str(filler)], check=True)
    return filler


@root_only
def test_full_disk_while_landing_tells_the_truth_and_repairs_later(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_project(small_disk)
    submit(repo_info(repo), [envelope(repo, "big", size=3_000_000)])
    filler = fill(small_disk, 200 * 1024)
    code, body = run_json(capsys, "integrate", "run", "--repo", str(repo))
    head = git(repo, "rev-parse", "main").strip()
    if "error" in body:  # the disk filled while applying (the blobs are written there)
        assert code == 3 and body["error"]["code"] == "disk-full", body
        judged = {e.state for e in Queue.of(repo_info(repo)).entries().values()}
        assert judged <= {"queued", "applying"}, judged  # not judged: the disk is ours
    elif body["end"] != body["start"]:  # the target moved and could not be moved back
        assert body["envelopes"][0]["state"] == "landed"
        assert head == body["end"]
        assert code == 1 and body["checkout_stale"]["command"].startswith("git -C ")
    else:  # or it moved back: then nothing landed
        assert head == body["start"] and body["envelopes"][0]["state"] == "queued"
        assert code == 1 and body["land_blocked"]["code"] in (
            "target-checkout-blocked",
            "disk-full",
        )
    # A rerun on the still-full disk spends no gate run and names the state.
    code, again = run_json(capsys, "integrate", "run", "--repo", str(repo))
    assert code in (1, 3) and "error" in again, again
    filler.unlink()
    code, last = run_json(capsys, "integrate", "run", "--repo", str(repo))
    assert code == 0, last
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "big.bin").stat().st_size == 3_000_000
    assert {e.state for e in Queue.of(repo_info(repo)).entries().values()} == {"landed"}


@root_only
def test_submit_on_a_full_disk_is_a_coded_error_and_queues_nothing(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_project(small_disk)
    env = envelope(repo, "big", size=3_000_000)
    fill(small_disk, 64 * 1024)
    code, body = run_json(capsys, "integrate", "submit", str(env), "--repo", str(repo))
    assert code == 3 and body["error"]["code"] in ("queue-write-failed", "disk-full"), body
    assert Queue.of(repo_info(repo)).entries() == {}


def test_stale_target_ref_lock_no_process_holds_is_cleared_and_the_item_lands(
    tmp_path: Path,
) -> None:
    """A service killed in the middle of a landing leaves its git's ref lock: no process has
    it open (a git writing one holds it open until it renames it), so it is removed and the
    next run lands -- no human needed (issue 48)."""
    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, "w1")])
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("left by a killed git\n")
    assert integrate(repo=repo).envelopes[0].state == "landed"
    assert not lock.exists()


def test_a_ref_lock_a_process_holds_open_stops_before_any_gate_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, "w1")])
    lock = repo / ".git" / "packed-refs.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1], 'w'); print(flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline()  # it holds the file
        code, body = run_json(capsys, "integrate", "run", "--repo", str(repo))
        assert code == 3 and body["error"]["code"] == "stale-git-lock", body
        assert str(lock) in body["error"]["message"] and "rm " in body["error"]["hint"]
        assert lock.exists() and Queue.of(repo_info(repo)).pending()
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert integrate(repo=repo).envelopes[0].state == "landed"  # gone with its holder


def test_stale_index_lock_of_the_target_checkout_is_named(tmp_path: Path) -> None:
    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, "w1")])
    (repo / ".git" / "index.lock").write_text("")
    with pytest.raises(Exception) as info:
        integrate(repo=repo)
    assert getattr(info.value, "code", "") == "stale-git-lock"


def test_stale_lock_in_the_integrators_own_worktree_is_cleared(tmp_path: Path) -> None:
    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, "w1")])
    assert integrate(repo=repo).envelopes[0].state == "landed"  # makes the worktree
    own = next((repo / ".git" / "worktrees").iterdir())
    (own / "index.lock").write_text("")
    submit(repo_info(repo), [envelope(repo, "w2")])
    result = integrate(repo=repo)
    assert result.envelopes[0].state == "landed" and result.gate_runs == 1
    assert not (own / "index.lock").exists()


def test_stale_locks_in_every_speculative_slot_are_cleared(tmp_path: Path) -> None:
    """The pipeline's slots are the integrator's own too: a killed git's index.lock or
    HEAD.lock under any of them is removed, where it once failed every rerun."""
    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, f"w{i}") for i in range(3)])
    assert integrate(repo=repo, window=3, batch=1).ok  # makes the speculative slots
    admins = sorted((repo / ".git" / "worktrees").iterdir())
    assert len(admins) >= 2
    for admin in admins:
        (admin / "index.lock").write_text("")
        (admin / "HEAD.lock").write_text("")
    submit(repo_info(repo), [envelope(repo, f"v{i}") for i in range(3)])
    result = integrate(repo=repo, window=3, batch=1)
    assert result.ok and {str(e.state) for e in result.envelopes} == {"landed"}
    assert not [a for a in admins if (a / "index.lock").exists() or (a / "HEAD.lock").exists()]


def test_stale_head_lock_is_cleared_before_any_gate_run(tmp_path: Path) -> None:
    """Moving a branch that HEAD names writes HEAD's reflog under HEAD.lock: a stale one
    once cost a whole gate run, then target-ref-unwritable; one no process holds goes."""
    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, "w1")])
    lock = repo / ".git" / "HEAD.lock"
    lock.write_text("")
    result = integrate(repo=repo)
    assert result.ok and result.gate_runs == 1 and not lock.exists()


def test_ref_that_cannot_be_written_is_not_mistaken_for_a_moving_target(tmp_path: Path) -> None:
    repo = make_project(tmp_path)
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    # While the gate runs, something else (the test: a gate may not write .git) locks the
    # ref and leaves the lock behind, after the preflight that clears stale locks.
    sync = tmp_path / "sync"  # where the gate and the test meet (the gate may write it)
    sync.mkdir()
    wait = f"touch '{sync}/please'; while [ ! -e '{sync}/locked' ]; do sleep 0.05; done"
    (repo / "manifests" / "release.toml").write_text(
        f'[sandbox]\nwritable = ["{sync}"]\n[gates.ok]\nrun = "{wait}"\n'
    )
    git(repo, "commit", "-qam", "a gate during which the ref gets locked")
    submit(repo_info(repo), [envelope(repo, "w1")])

    def lock_when_asked() -> None:
        while not (sync / "please").exists():
            time.sleep(0.02)
        lock.write_text("")
        (sync / "locked").touch()

    locker = threading.Thread(target=lock_when_asked, daemon=True)
    locker.start()
    result = integrate(repo=repo)
    locker.join(timeout=10)
    assert result.gate_runs == 1, "a ref that cannot move must not burn rebuilds"
    assert result.land_blocked is not None
    assert result.land_blocked.code == "target-ref-unwritable"
    assert not result.target_moving


def test_a_shared_lock_another_targets_git_holds_a_moment_is_not_stale(tmp_path: Path) -> None:
    """Two integrators of two targets share ``packed-refs.lock`` and ``HEAD.lock``: the other
    one's git, working in its own worktree, holds one for milliseconds.  Seen then, it once
    stopped this integrator with ``stale-git-lock`` (exit 3) under load."""
    import threading

    repo = make_project(tmp_path)
    submit(repo_info(repo), [envelope(repo, "w1")])
    lock = repo / ".git" / "packed-refs.lock"
    lock.write_text("")
    threading.Timer(0.3, lock.unlink).start()  # its holder finishes
    result = integrate(repo=repo)
    assert result.ok and result.envelopes[0].state == "landed"
