"""``worktree sync``: a worker onto the target's tip with everything it did carried --
commits replayed, staged, unstaged and untracked work -- and a refusal that changes nothing."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import orjson
import pytest
from conftest import CLI, git

from dagrunner.errors import DagrunnerError
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees.export import export
from dagrunner.worktrees.sync import sync


def snapshot(path: Path) -> tuple[str, str, str, dict[str, str]]:
    """HEAD, the index (modes and blobs), the status, and every file's bytes (.git aside)."""
    files = {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(path).parts
    }
    return (
        git(path, "rev-parse", "HEAD"),
        git(path, "ls-files", "-s"),
        git(path, "status", "--porcelain", "--untracked-files=all"),
        files,
    )


def busy_worker(project: Path) -> Path:
    """A commit, a staged change, an unstaged change and an untracked file."""
    path = Path(wt.allocate(mission="m", worker="w", repo=project)["path"])
    (path / "feature.txt").write_text("committed\n")
    git(path, "add", "feature.txt")
    git(path, "commit", "-qm", "the worker's commit")
    (path / "shared.txt").write_text("one\ntwo\nthree, staged\n")
    git(path, "add", "shared.txt")
    (path / "run.sh").write_text("#!/bin/sh\necho unstaged\n")
    (path / "notes.txt").write_text("untracked\n")
    return path


def test_sync_carries_commits_staged_unstaged_and_untracked_work_onto_the_tip(
    project: Path,
) -> None:
    path = busy_worker(project)
    (project / "shared.txt").write_text("ONE from main\ntwo\nthree\n")
    git(project, "commit", "-qam", "main moves on")
    tip = git(project, "rev-parse", "main").strip()
    done = subprocess.run(
        [*CLI, "worktree", "sync", "m/w", "--json"], cwd=project, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    body = orjson.loads(done.stdout)
    assert body["new_base"] == tip and body["replayed"] == 1
    assert body["carried"] == {"staged": 1, "unstaged": 1, "untracked": 1}
    # the commit is on top of the tip, with its message and author
    assert git(path, "rev-parse", "HEAD~1").strip() == tip
    assert git(path, "log", "-1", "--format=%s|%an", "HEAD") == "the worker's commit|t\n"
    # staged stays staged (merged with main's line one), unstaged unstaged, untracked untracked
    assert git(path, "show", ":shared.txt") == "ONE from main\ntwo\nthree, staged\n"
    assert sorted(git(path, "status", "--porcelain", "--untracked-files=all").splitlines()) == [
        " M run.sh",
        "?? notes.txt",
        "M  shared.txt",
    ]
    assert (path / "run.sh").read_text() == "#!/bin/sh\necho unstaged\n"
    # the backup holds the full state from before; the envelope is now against the tip
    assert git(project, "show", f"{body['backup']}:notes.txt") == "untracked\n"
    exported = orjson.loads(Path(export("m/w", repo=project)["file"]).read_bytes())
    assert exported["base"] == tip


def test_a_conflict_refuses_and_leaves_the_worktree_byte_identical(project: Path) -> None:
    path = busy_worker(project)
    (project / "feature.txt").write_text("main's own feature\n")  # add/add with the commit
    git(project, "add", "feature.txt")
    git(project, "commit", "-qm", "main adds feature.txt")
    before = snapshot(path)
    refs = git(project, "for-each-ref")
    with pytest.raises(DagrunnerError) as raised:
        sync("m/w", repo=project)
    assert raised.value.code == "sync-conflict"
    assert raised.value.details["paths"] == ["feature.txt"]
    assert snapshot(path) == before
    assert git(project, "for-each-ref") == refs  # not even a backup ref
    (project / "feature.txt").unlink()
    git(project, "commit", "-qam", "main drops it again")
    (project / "shared.txt").write_text("one\ntwo\nTHREE from main\n")  # the staged line
    git(project, "commit", "-qam", "main edits the staged line")
    with pytest.raises(DagrunnerError) as again:
        sync("m/w", repo=project)
    assert again.value.details["paths"] == ["shared.txt"] and snapshot(path) == before


def test_sync_runs_no_filter_or_merge_driver_a_worker_planted(
    project: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    path = busy_worker(project)
    (path / ".gitattributes").write_text("* filter=evil merge=evil\n")
    git(path, "add", ".gitattributes")
    git(path, "commit", "-qm", "attributes")
    for key in ("filter.evil.smudge", "filter.evil.clean", "merge.evil.driver"):
        git(path, "config", key, f"touch '{marker}'; cat")
    marker.unlink(missing_ok=True)  # the worker's own git ran them (it planted them)
    (project / "other.txt").write_text("main moves\n")
    git(project, "add", "other.txt")
    git(project, "commit", "-qm", "main moves")
    sync("m/w", repo=project)
    assert not marker.exists()
    assert (path / "other.txt").read_text() == "main moves\n"


def test_a_worktree_whose_head_points_at_the_target_is_refused_and_main_never_moves(
    project: Path,
) -> None:
    """The hostile view: the worker points its HEAD at refs/heads/main; a sync that moved
    "its branch" would move main onto unreviewed commits."""
    path = busy_worker(project)
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    main = git(project, "rev-parse", "main")
    with pytest.raises(DagrunnerError) as raised:
        sync("m/w", repo=project)
    assert raised.value.code == "sync-off-branch"
    assert git(project, "rev-parse", "main") == main
