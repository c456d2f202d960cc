"""The full state of a worktree as a git tree, without touching its index or files.

Everything happens in a temporary copy of the worktree's index
(``GIT_INDEX_FILE``), so staged, unstaged and untracked work (gitignored files
excepted), deletions, modes and symlinks all land in one tree.  ``state_tree``
runs ``git add -A`` there, which writes every blob to the shared object
database (a backup, a shipped source and a cleanup proof need them).
``indexed_state`` only hashes the changed files into the index (``update-index
--info-only``) and writes the tree with ``--missing-ok``: export reads its diff
from the worktree through that index, and ``git apply --3way`` later needs only
the base's blobs, which are there.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.command import IDENTITY, git


def _copy_index(worktree: Path, copy: Path) -> None:
    """Make ``copy`` a copy of ``worktree``'s index (absent when it has none)."""
    index = Path(git(["rev-parse", "--git-path", "index"], cwd=worktree).text)
    if not index.is_absolute():
        index = worktree / index
    if index.exists():
        # Keeps git's stat cache, so only changed files are read.  copy2 keeps the
        # index's mtime too: git's racy-entry check compares file times against it,
        # and a copy stamped "now" would make a same-size edit made within the same
        # second as the checkout look unchanged.
        shutil.copy2(index, copy)
    else:
        copy.unlink(missing_ok=True)


@contextlib.contextmanager
def temp_index(worktree: Path) -> Iterator[dict[str, str]]:
    """The environment of a temporary copy of ``worktree``'s index (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-index-") as tmp:
        copy = Path(tmp) / "index"
        _copy_index(worktree, copy)
        yield {"GIT_INDEX_FILE": str(copy)}


def state_tree(worktree: Path) -> str:
    """The tree id of everything in ``worktree`` that git would track (blobs written)."""
    with temp_index(worktree) as env:
        return _add_all(worktree, env)


def _add_all(worktree: Path, env: dict[str, str]) -> str:
    """``git add -A`` into the index of ``env``; the tree it then holds (blobs written)."""
    git(["add", "-A", "--", "."], cwd=worktree, env=env)
    return git(["write-tree"], cwd=worktree, env=env).text


@dataclass(frozen=True)
class IndexedState:
    tree: str  # what state_tree would say
    env: dict[str, str]  # a temporary index holding that state: diff the worktree with it
    worktree: Path

    def write_objects(self) -> None:
        """Write the blobs too: ``git diff`` reads a symlink, and a file git converts on its
        way in (line endings, a clean filter), from the object database, not the worktree,
        once its index entry is stat-clean.  The hashed entries are stat-clean, so ``git
        add`` would skip them: it runs on a fresh copy of the worktree's index, where every
        change is new, and must give the same tree."""
        _copy_index(self.worktree, Path(self.env["GIT_INDEX_FILE"]))
        tree = _add_all(self.worktree, self.env)
        if tree != self.tree:
            raise DagrunnerError(
                "export-unstable",
                f"the worktree changed while it was exported (tree {self.tree[:12]}, "
                f"then {tree[:12]})",
                where=str(self.worktree),
                hint="let the worker finish writing, then export again",
                exit_code=ExitCode.REFUSED,
            )


def _changes(status: list[str]) -> list[str] | None:
    """The paths whose worktree differs from the index, from ``status --porcelain=v2 -z``
    entries; None for what only ``git add`` handles (a submodule, a nested repository)."""
    paths: list[str] = []
    i = 0
    while i < len(status):
        entry = status[i]
        i += 1
        kind = entry[:1]
        if kind in ("1", "2"):
            fields = entry.split(" ", 8 if kind == "1" else 9)
            if fields[2] != "N...":
                return None  # a submodule
            if kind == "2":
                i += 1  # its original path follows
            if fields[1][1] != ".":
                paths.append(fields[-1])
        elif kind == "?":
            if entry.endswith("/"):
                return None  # a nested repository
            paths.append(entry[2:])
        elif kind == "u":
            return None
    return paths


@contextlib.contextmanager
def indexed_state(worktree: Path, status: list[str]) -> Iterator[IndexedState]:
    """The worktree's state in a temporary index, its changed files hashed but not written
    (``state_tree``'s way when the status holds what only ``git add`` handles)."""
    with temp_index(worktree) as env:
        paths = _changes(status)
        if paths is None:
            tree = _add_all(worktree, env)
        else:
            if paths:
                git(
                    [
                        "update-index",
                        "-z",
                        "--add",
                        "--remove",
                        "--replace",
                        "--info-only",
                        "--stdin",
                    ],
                    cwd=worktree,
                    env=env,
                    input=b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths),
                )
            tree = git(["write-tree", "--missing-ok"], cwd=worktree, env=env).text
        yield IndexedState(tree=tree, env=env, worktree=worktree)


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
