"""``integrate prune`` beyond the journal (issue 48): the worktree ledger compacted to what
live worktrees (and an allocation a kill left unfinished) need, while other processes
append to it; the landed proofs of the items it drops removed, the one on the target's tip
kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import commit_release_manifest, envelope, git
from test_crash_cleanup import cli

from dagrunner.engine.landed import NOTES_REF
from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees.ledger import Ledger


def ids(ledger: Ledger) -> set[str]:
    return {str(event.get("id")) for event in ledger.events()}


@pytest.fixture
def history(repo: Path) -> Path:
    """Three workers' items landed one run each (a landed proof on each commit; their
    worktrees cleaned by the integrator), one worker exported and queued, one worker
    allocated, and an allocation a kill cut short."""
    commit_release_manifest(repo, '[gates.ok]\nrun = "true"\n')
    for i in range(3):
        submit(repo_info(repo), [envelope(repo, f"old{i}")])
        assert [o.state for o in integrate(repo=repo).envelopes] == ["landed"]
    submit(repo_info(repo), [envelope(repo, "live")])
    from dagrunner.worktrees import allocate as wt

    wt.allocate(mission="m", worker="idle", repo=repo)
    # what a SIGKILL between the two ledger lines of an allocation leaves
    Ledger(repo_info(repo).state_dir).append("allocating", "m/ghost", path="/nowhere")
    return repo


def test_prune_compacts_the_ledger_to_what_live_worktrees_need(history: Path) -> None:
    ledger = Ledger(repo_info(history).state_dir)
    state, unfinished = ledger.state(), ledger.unfinished()
    assert sorted(state) == ["m/idle", "m/live"] and list(unfinished) == ["m/ghost"]
    before = ledger.path.stat().st_size
    assert {f"m/old{i}" for i in range(3)} <= ids(ledger)
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0, pruned
    assert ids(ledger) == {"m/idle", "m/live", "m/ghost"}  # the cleaned ones' lines gone
    assert pruned["ledger_bytes"] == {"before": before, "after": ledger.path.stat().st_size}
    assert ledger.path.stat().st_size < before / 2
    assert ledger.state() == state and ledger.unfinished() == unfinished  # reads the same
    # and works on: the live worker's envelope still proves where it came from, it lands
    # and its worktree is cleaned; the idle one is listed and cleaned by hand
    result = integrate(repo=history)
    assert [o.state for o in result.envelopes] == ["landed"]
    assert sorted(ledger.state()) == ["m/idle"]
    code, listed = cli(history, "worktree", "list")
    assert code == 0 and [w["id"] for w in listed["worktrees"]] == ["m/idle"], listed
    code, said = cli(history, "worktree", "cleanup", "m/idle")
    assert code == 0, said
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0 and ids(ledger) == {"m/ghost"}, (pruned, ledger.events())


def test_a_dry_run_leaves_the_ledger_as_it_is(history: Path) -> None:
    ledger = Ledger(repo_info(history).state_dir)
    before = ledger.path.read_bytes()
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s", "--dry-run")
    assert code == 0 and pruned["ledger_bytes"]["after"] < len(before), pruned
    assert ledger.path.read_bytes() == before


APPENDER = """
import sys
from pathlib import Path
from dagrunner.worktrees.ledger import Ledger
ledger, stop, n = Ledger(Path(sys.argv[1])), Path(sys.argv[2]), 0
while not stop.exists():
    ledger.append("claimed", "m/live", session=f"{sys.argv[3]}-{n}")
    n += 1
print(n)
"""


def test_ledger_lines_appended_while_it_compacts_are_never_lost(
    history: Path, tmp_path: Path
) -> None:
    ledger = Ledger(repo_info(history).state_dir)
    stop = tmp_path / "stop"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(ledger.dir), str(stop), f"w{i}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        for _ in range(4):  # each has lines to drop, so each rewrites the ledger
            ledger.append("allocated", "m/again", path="/x", branch="b", base="c")
            ledger.append("cleaned", "m/again")
            code, _ = cli(history, "integrate", "prune", "--keep", "0s")
            assert code == 0
    finally:
        stop.touch()
    written = [int(w.communicate(timeout=30)[0]) for w in writers]
    claims = [str(e.get("session")) for e in ledger.events() if e.get("event") == "claimed"]
    for i, count in enumerate(written):
        assert sum(1 for c in claims if c.startswith(f"w{i}-")) == count, (i, count)
    assert "m/again" not in ids(ledger)


def test_a_kill_while_it_compacts_the_ledger_leaves_it_whole(history: Path) -> None:
    ledger = Ledger(repo_info(history).state_dir)
    before = ledger.path.read_bytes()
    code, _ = cli(history, "integrate", "prune", "--keep", "0s",
                  env={"DAGRUNNER_CRASH_AT": "compacting-ledger"})  # fmt: skip
    assert code == -9
    assert ledger.path.read_bytes() == before
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0 and ids(ledger) == {"m/idle", "m/live", "m/ghost"}, pruned


def test_prune_removes_the_landed_proofs_of_the_items_it_drops(history: Path) -> None:
    def noted() -> set[str]:
        listed = git(history, "notes", f"--ref={NOTES_REF}", "list")
        return {line.split()[1] for line in listed.splitlines()}

    landed = git(history, "log", "--format=%H", "-3", "main").split()
    assert noted() == set(landed)
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0, pruned
    # old0 and old1 dropped; old2 kept (the newest landing's item), and its commit is the tip
    assert pruned["notes_removed"] == 2 and noted() == {landed[0]}, pruned
    code, again = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0 and again["notes_removed"] == 0
