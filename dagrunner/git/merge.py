"""Commits made and merged as objects only: ``commit-tree`` and ``merge-tree --write-tree``,
no index, no work tree, no ref.  ``worktree overlaps``, ``submit``'s foresight and
``worktree sync`` merge untrusted work with it, in an empty work tree of its own (no
``.gitattributes`` of any worktree is read; drivers are off: ``drivers.py``)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dagrunner.git.command import IDENTITY, git, split_z


def commit_tree(
    repo: Path, tree: str, parent: str, message: bytes, env: Mapping[str, str] = IDENTITY
) -> str:
    """A commit of ``tree`` on ``parent`` (author and committer from ``env``)."""
    cmd = ["commit-tree", "--no-gpg-sign", tree, "-p", parent]
    return git(cmd, cwd=repo, input=message, env=env).text


@dataclass(frozen=True)
class Merged:
    tree: str | None  # the merged tree; None when it conflicts or git failed
    conflicts: tuple[str, ...]  # the conflicting paths
    failed: str = ""  # git's message when merge-tree itself failed
    marked: str | None = None  # when it conflicts: the tree with conflict markers in them


def merge_commits(common: Path, ours: str, theirs: str) -> Merged:
    """``ours`` and ``theirs`` merged on their content (their merge base from history)."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-merge-") as empty:
        where = ["--git-dir", str(common), "--work-tree", empty]
        how = ["--write-tree", "-z", "--name-only", "--no-messages"]
        done = git([*where, "merge-tree", *how, ours, theirs], cwd=Path(empty), check=False)
    fields = split_z(done.stdout)
    if done.returncode == 1:
        return Merged(None, tuple(sorted(set(fields[1:]))), marked=fields[0] if fields else None)
    if done.returncode != 0 or not fields:
        return Merged(None, (), failed=done.message)
    return Merged(fields[0], ())
