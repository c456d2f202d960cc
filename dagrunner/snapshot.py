"""The full state of a worktree as a git tree, without touching its index or files.

``git add -A`` runs against a temporary copy of the worktree's index
(``GIT_INDEX_FILE``), so staged, unstaged and untracked work (gitignored files
excepted), deletions, modes and symlinks all land in one tree, and every blob
is written to the shared object database -- which is what a later
``git apply --3way`` needs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from dagrunner.git import IDENTITY, git


def state_tree(worktree: Path) -> str:
    """The tree id of everything in ``worktree`` that git would track."""
    index = Path(git(["rev-parse", "--git-path", "index"], cwd=worktree).text)
    if not index.is_absolute():
        index = worktree / index
    with tempfile.TemporaryDirectory(prefix="dagrunner-index-") as tmp:
        temp_index = Path(tmp) / "index"
        if index.exists():
            shutil.copyfile(
                index, temp_index
            )  # keeps git's stat cache: only changed files are read
        env = {"GIT_INDEX_FILE": str(temp_index)}
        git(["add", "-A", "--", "."], cwd=worktree, env=env)
        return git(["write-tree"], cwd=worktree, env=env).text


def backup_commit(worktree: Path, ref: str, message: str) -> str:
    """Record the worktree's full state as a commit on ``ref`` (on top of HEAD); its id."""
    tree = state_tree(worktree)
    head = git(["rev-parse", "--verify", "-q", "HEAD"], cwd=worktree, check=False).text
    parents = ["-p", head] if head else []
    commit = git(
        ["commit-tree", "--no-gpg-sign", tree, *parents, "-m", message], cwd=worktree, env=IDENTITY
    ).text
    git(["update-ref", ref, commit], cwd=worktree)
    return commit
