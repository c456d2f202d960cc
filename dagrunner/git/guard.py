"""What a gate did to the tracked files of the tree it checks, and putting them back.

A release gate judges a tree; it must never pass by changing it (``ruff check .`` of a
project whose ruff config says ``fix = true`` fixes a planted error and exits 0).  Before
the first gate of a run starts in a tree, ``snapshot`` notes the tracked files that differ
from the index (the user's own edits: their bytes are kept); after each gate ``changes``
says which tracked files now differ from that snapshot, and ``put_back`` keeps the gate's
version of each under a folder of the run and writes the snapshot's bytes back, so the
user's file ends byte-identical.  Ignored and untracked files are the gates' scratch
(``__pycache__``, ``.pytest_cache``, coverage data) and are not looked at.

git runs with ``--no-optional-locks``: reading the user's checkout never writes its index.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from dagrunner.git.command import git

KEPT_LIMIT = 64 * 1024 * 1024  # a dirty file larger than this is compared by size and time


@dataclass(frozen=True)
class FileState:
    """A tracked path's state in the worktree: a file's bytes and mode, a link's target,
    or missing; a large file by its size and modification time only (``data`` empty)."""

    kind: str  # "file", "link", "missing", "large"
    data: bytes = b""
    mode: int = 0
    stamp: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, path: Path) -> FileState:
        try:
            info = path.lstat()
        except FileNotFoundError:
            return cls("missing")
        if stat.S_ISLNK(info.st_mode):
            return cls("link", os.fsencode(os.readlink(path)))
        if info.st_size > KEPT_LIMIT:
            return cls("large", stamp=(info.st_size, info.st_mtime_ns))
        return cls("file", path.read_bytes(), stat.S_IMODE(info.st_mode))


@dataclass(frozen=True)
class TreeSnapshot:
    """The tracked files of ``tree`` that differed from its index when the run began."""

    tree: Path
    dirty: dict[str, FileState]


def _dirty(tree: Path) -> set[str]:
    """Tracked paths whose worktree content differs from the index (or that are unmerged)."""
    out = git(
        [
            "--no-optional-locks",
            "status",
            "--porcelain=v2",
            "-z",
            "--untracked-files=no",
            "--ignore-submodules=all",
            "--no-renames",
        ],
        cwd=tree,
    ).stdout
    found = set()
    for entry in out.split(b"\0"):
        if entry[:2] in (b"1 ", b"u "):
            fields = entry.split(b" ", 8 if entry[:1] == b"1" else 10)
            found.add(os.fsdecode(fields[-1]))
    return found


def snapshot(tree: Path) -> TreeSnapshot | None:
    """The tree's tracked state before any gate runs in it (None: not a git work tree)."""
    probe = git(["rev-parse", "--is-inside-work-tree"], cwd=tree, check=False)
    if probe.returncode != 0 or probe.text != "true":
        return None
    return TreeSnapshot(tree, {p: FileState.of(tree / p) for p in _dirty(tree)})


def changes(shot: TreeSnapshot) -> list[str]:
    """The tracked paths whose content is no longer what the snapshot saw, sorted."""
    now = _dirty(shot.tree)
    changed = {p for p in now if p not in shot.dirty}
    changed |= {p for p, was in shot.dirty.items() if FileState.of(shot.tree / p) != was}
    return sorted(changed)


def put_back(shot: TreeSnapshot, paths: list[str], keep: Path) -> list[str]:
    """Each of ``paths`` as the snapshot saw it, the gate's version kept under ``keep`` first
    (nothing a gate -- or a person editing meanwhile -- wrote is lost).  The paths that could
    not be put back (a large file): they stay as the gate left them."""
    # A folder on the way that a gate turned into a link is never followed: git puts those
    # back itself (it refuses to write beyond a symbolic link), the rest stay as they are.
    left = [p for p in paths if not _real_parents(shot.tree, p)]
    paths = [p for p in paths if p not in left]
    for rel in paths:
        here = shot.tree / rel
        if here.is_symlink() or here.exists():
            saved = keep / rel
            saved.parent.mkdir(parents=True, exist_ok=True)
            if here.is_dir() and not here.is_symlink():
                shutil.copytree(here, saved, symlinks=True, dirs_exist_ok=True)
                shutil.rmtree(here)
            else:
                shutil.copy2(here, saved, follow_symlinks=False)
    clean = [p for p in paths if p not in shot.dirty]
    if clean:  # as the index holds them
        git(["checkout-index", "--force", "--", *clean], cwd=shot.tree)
    for rel in paths:
        was = shot.dirty.get(rel)
        if was is None:
            continue
        here = shot.tree / rel
        if was.kind == "large":
            left.append(rel)
            continue
        if here.is_symlink() or here.exists():
            here.unlink()
        if was.kind == "link":
            here.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.fsdecode(was.data), here)
        elif was.kind == "file":
            here.parent.mkdir(parents=True, exist_ok=True)
            here.write_bytes(was.data)
            os.chmod(here, was.mode)
    return left


def _real_parents(tree: Path, rel: str) -> bool:
    """Whether every folder between ``tree`` and ``rel`` is a real folder (or missing)."""
    here = tree
    for part in rel.split("/")[:-1]:
        here = here / part
        if here.is_symlink():
            return False
    return True
