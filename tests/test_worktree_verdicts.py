"""A verdict a worker's own ``release-check`` computed in its worktree answers no other tree.

A worker's worktree is not trusted (docs/security.md): what is in it beside the gate's
declared inputs (an undeclared helper it edited for a while, a package it installed into
its venv) can make a gate pass there.  Stored under the input key, that pass answered the
integration tree of the worker's envelope, whose own run would fail: it landed red."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
from conftest import CLI, SIDE_BY_SIDE, commit_release_manifest, git

from dagrunner.integration.run import integrate
from dagrunner.process import toolcaches
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import lifecycle

MANIFEST = (
    SIDE_BY_SIDE
    + """
    [gates.check]
    run = "sh check.sh"
    inputs = ["src/**"]
"""
)


def commit_project(repo: Path) -> None:
    """``src/a.txt``, which the gate fails on the word BROKEN, through ``check.sh`` (which
    its inputs leave out)."""
    (repo / "src").mkdir()
    (repo / "src" / "a.txt").write_text("fine\n")
    (repo / "check.sh").write_text("! grep -q BROKEN src/a.txt\n")
    commit_release_manifest(repo, MANIFEST)


def test_a_pass_a_worker_computed_with_an_undeclared_helper_it_edited_never_lands(
    repo: Path,
) -> None:
    commit_project(repo)
    path = Path(wt.allocate(mission="m", worker="w", repo=repo, session="w")["path"])
    (path / "src" / "a.txt").write_text("BROKEN\n")
    (path / "check.sh").write_text("exit 0\n")  # lenient for its own check, for a while
    checked = subprocess.run(
        [*CLI, "release-check", "--quiet"], cwd=path, capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
    git(path, "checkout", "--", "check.sh")  # put back: the envelope holds src/a.txt alone
    out = path.parent / "w.envelope.json"
    exporting.export("m/w", output=out, repo=repo)
    subprocess.run([*CLI, "integrate", "submit", str(out)], cwd=repo, check=True)
    result = integrate(repo=repo, window=1)
    assert [o.state for o in result.envelopes] == ["gates-failed"]
    assert git(repo, "show", "main:src/a.txt") == "fine\n"


def statuses(tree: Path) -> list[str]:
    done = subprocess.run(
        [*CLI, "release-check", "--json"], cwd=tree, capture_output=True, check=False
    )
    return [g["status"] for g in orjson.loads(done.stdout)["gates"]]


def test_a_workers_pass_answers_its_own_later_runs_and_the_main_checkouts_answer_it(
    repo: Path,
) -> None:
    commit_project(repo)
    assert statuses(repo) == ["passed"]  # the main checkout's run: trusted, by input key
    one = Path(wt.allocate(mission="m", worker="w1", repo=repo, session="w1")["path"])
    two = Path(wt.allocate(mission="m", worker="w2", repo=repo, session="w2")["path"])
    assert statuses(one) == ["cached"]  # answered by the main checkout's pass
    for tree in (one, two):
        (tree / "src" / "a.txt").write_text("still fine\n")
    assert statuses(one) == ["passed"]
    assert statuses(one) == ["cached"]  # its own pass, for its own later run
    assert statuses(two) == ["passed"]  # another worktree's pass answers nothing here


def test_a_worktree_taken_again_from_the_pool_starts_with_none_of_its_last_workers_passes(
    repo: Path,
) -> None:
    """The pool gives a cleaned worktree to the next allocation, at that one's path: for the
    same mission and worker again, the very path of the last one.  What the last worker's
    own checks stored (its own passes, its tool cache layer) is that worker's: the new
    worker's check of the same content runs (a worktree made again starts from nothing)."""
    commit_project(repo)
    one = Path(wt.allocate(mission="m", worker="w", repo=repo, session="s1")["path"])
    (one / "check.sh").write_text("exit 0\n")  # lenient, for its own check
    (one / "src" / "a.txt").write_text("BROKEN\n")
    assert statuses(one) == ["passed"]
    git(one, "checkout", "--", ".")  # back to its base: clean, nothing to retain
    lifecycle.cleanup("m/w", force=True, repo=repo)
    again = Path(wt.allocate(mission="m", worker="w", repo=repo, session="s2")["path"])
    assert again == one and (again / "check.sh").read_text() != "exit 0\n"
    (again / "src" / "a.txt").write_text("BROKEN\n")
    assert statuses(again) == ["failed"]  # judged, not answered by the last worker's pass


def test_a_worktree_pooled_again_and_again_is_a_new_tree_each_time(repo: Path) -> None:
    """The same path given out again and again (the same mission and worker, pooled
    between): a file system hands a freed inode number out again (ext4 does), so one
    worker's ``.git`` may get the number of a worker's before it -- and it must not be that
    worker's tree (its passes, its tool cache layer)."""
    commit_project(repo)
    seen: dict[str, int] = {}
    for turn in range(40):
        path = Path(wt.allocate(mission="m", worker="w", repo=repo, session=f"s{turn}")["path"])
        made = toolcaches.tree_id(path)
        assert made not in seen, f"turn {turn} is turn {seen[made]}'s tree"
        seen[made] = turn
        lifecycle.cleanup("m/w", force=True, repo=repo)
