"""Work is never judged landed by a lookalike, and never deleted without a ref (issue 36):
``git cherry`` and ``patch-id --stable`` ignore whitespace, so a re-indented copy of a
worker's commit -- other Python behaviour -- made the worker's work read landed, and prune
deleted it with its branch."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git, run_json

from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import lifecycle

VICTIM = "def f(x):\n    if x:\n        return 1\n    return 2\n"
# the same lines re-indented: `return 2` now belongs to the if, and f(False) returns None
LOOKALIKE = "def f(x):\n    if x:\n        return 1\n        return 2\n"


@pytest.fixture
def code(repo: Path) -> Path:
    (repo / "f.py").write_text("def f(x):\n    return 0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "f")
    return repo


def commit_in(path: Path, text: str, message: str) -> str:
    (path / "f.py").write_text(text)
    git(path, "commit", "-q", "-am", message)
    return git(path, "rev-parse", "HEAD").strip()


def test_a_whitespace_lookalike_on_the_target_does_not_make_the_victims_work_landed(
    code: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = Path(wt.allocate(mission="m", worker="victim", repo=code, session="s1")["path"])
    kept = commit_in(victim, VICTIM, "victim's work")
    commit_in(code, LOOKALIKE, "a lookalike lands")  # on main, as the queue would land it
    said = lifecycle.status("m/victim", repo=code)
    assert said["integrated"] is False, said
    _, pruned = run_json(capsys, "worktree", "prune", "--repo", str(code))
    assert [r["id"] for r in pruned["retained"]] == ["m/victim"], pruned
    assert (
        victim.is_dir() and git(code, "rev-parse", "refs/heads/" + said["branch"]).strip() == kept
    )
    # released, unclaimed and idle for ever: still not landed, so its branch stays
    _, pruned = run_json(capsys, "worktree", "prune", "--idle", "0", "--repo", str(code))
    assert git(code, "cat-file", "-t", kept).strip() == "commit"
    assert git(code, "for-each-ref", "--contains", kept).strip(), "no ref holds the work"


def test_a_claimed_worktree_whose_work_landed_is_kept_by_prune(
    code: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Path(wt.allocate(mission="m", worker="w", repo=code, session="s1")["path"])
    commit_in(path, VICTIM, "work")
    git(code, "merge", "-q", "--ff-only", git(path, "rev-parse", "HEAD").strip())
    assert lifecycle.status("m/w", repo=code)["integrated"] is True
    _, pruned = run_json(capsys, "worktree", "prune", "--repo", str(code))
    assert pruned["removed"] == [] and path.is_dir(), pruned


def test_a_branch_whose_commits_no_other_ref_holds_is_kept_on_a_ref_before_it_goes(
    code: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Path(wt.allocate(mission="m", worker="w", repo=code)["path"])
    mine = commit_in(path, VICTIM, "work")
    (code / "other.txt").write_text("the target moved on\n")
    git(code, "add", "other.txt")
    git(code, "commit", "-q", "-m", "elsewhere")
    git(code, "cherry-pick", mine)  # the very same bytes, as another commit
    assert lifecycle.status("m/w", repo=code)["integrated"] is True
    _, cleaned = run_json(capsys, "worktree", "cleanup", "m/w", "--repo", str(code))
    ref = cleaned["retained_ref"]
    assert cleaned["branch_deleted"] is True and ref.startswith("refs/dagrunner/retained/m/w/")
    assert git(code, "rev-parse", ref).strip() == mine
    _, listing = run_json(capsys, "worktree", "list", "--repo", str(code))
    (kept,) = listing["kept"]
    assert kept["ref"] == ref and kept["commit"] == mine
    git(code, *kept["restore"].split()[1:])
    assert git(code, "rev-parse", kept["restore"].split()[2]).strip() == mine
