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
            # Keeps git's stat cache, so only changed files are read.  copy2 keeps the
            # index's mtime too: git's racy-entry check compares file times against it,
            # and a copy stamped "now" would make a same-size edit made within the same
            # second as the checkout look unchanged.
            shutil.copy2(index, temp_index)
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
