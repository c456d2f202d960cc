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

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dagrunner.files import folder_beneath
from dagrunner.git.command import git

KEPT_LIMIT = 64 * 1024 * 1024  # a dirty file larger than this is compared by size and time


@dataclass(frozen=True)
class FileState:
    """A tracked path's state in the worktree: a file's bytes and mode, a link's target,
    or missing; a large file by its size and modification time only (``data`` empty)."""

    kind: str  # "file", "link", "missing", "large", "other" (a folder, a device...)
    data: bytes = b""
    mode: int = 0
    stamp: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class TreeSnapshot:
    """The tracked files of ``tree`` that differed from its index when the run began, and the
    git dir it had then: every later look goes there, never where the tree's ``.git`` file
    points after a gate (a gate may rewrite it to a repository of its own making)."""

    tree: Path
    git_dir: str
    dirty: dict[str, FileState]


def _dirty(tree: Path, git_dir: str) -> set[str]:
    """Tracked paths whose worktree content differs from the index (or that are unmerged)."""
    out = git(
        [
            f"--git-dir={git_dir}",
            f"--work-tree={tree}",
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
    probe = git(["rev-parse", "--is-inside-work-tree", "--absolute-git-dir"], cwd=tree, check=False)
    lines = probe.text.splitlines()
    if probe.returncode != 0 or lines[:1] != ["true"] or len(lines) < 2:
        return None
    git_dir = lines[1]
    return TreeSnapshot(tree, git_dir, {p: _state(tree, p) for p in _dirty(tree, git_dir)})


def changes(shot: TreeSnapshot) -> list[str]:
    """The tracked paths whose content is no longer what the snapshot saw, sorted."""
    now = _dirty(shot.tree, shot.git_dir)
    changed = {p for p in now if p not in shot.dirty}
    changed |= {p for p, was in shot.dirty.items() if _state(shot.tree, p) != was}
    return sorted(changed)


def put_back(shot: TreeSnapshot, paths: list[str], keep: Path) -> list[str]:
    """Each of ``paths`` as the snapshot saw it, the gate's version kept under ``keep`` first
    (nothing a gate -- or a person editing meanwhile -- wrote is lost).  Every file is read
    and written through its folder's descriptor, each folder opened without following a
    link: a gate running meanwhile that swaps a folder for a link sends nothing outside the
    tree.  The paths that could not be put back (a link on the way, a large file, a folder
    where the file was): they stay as the gate left them, and are named."""
    left: list[str] = []
    clean = []
    for rel in paths:
        try:
            with _parent(shot.tree, rel) as (folder, leaf):
                _keep(folder, leaf, keep / rel)
                was = shot.dirty.get(rel)
                if was is None:
                    clean.append(rel)
                elif not _restore(folder, leaf, was):
                    left.append(rel)
        except OSError:
            left.append(rel)
    if clean:  # as the index holds them (git writes no file beyond a symbolic link)
        git(
            [f"--git-dir={shot.git_dir}", f"--work-tree={shot.tree}", "checkout-index",
             "--force", "--", *clean],
            cwd=shot.tree,
            check=False,  # a folder where a file was stays: a failed gate says so already
        )  # fmt: skip
    return left


def _state(tree: Path, rel: str) -> FileState:
    """``rel``'s state, read through its folder's descriptor (a link on the way: missing)."""
    try:
        with _parent(tree, rel) as (folder, leaf):
            try:
                info = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                return FileState("missing")
            if stat.S_ISLNK(info.st_mode):
                return FileState("link", os.fsencode(os.readlink(leaf, dir_fd=folder)))
            if not stat.S_ISREG(info.st_mode):
                return FileState("other")
            if info.st_size > KEPT_LIMIT:
                return FileState("large", stamp=(info.st_size, info.st_mtime_ns))
            return FileState("file", _read(folder, leaf), stat.S_IMODE(info.st_mode))
    except OSError:
        return FileState("missing")


@contextlib.contextmanager
def _parent(tree: Path, rel: str) -> Iterator[tuple[int, str]]:
    """The descriptor of ``rel``'s folder, every folder from ``tree`` opened ``O_NOFOLLOW``
    (``OSError`` on a link or anything but a folder), and ``rel``'s last name."""
    *folders, leaf = rel.split("/")
    fd = folder_beneath(tree, folders)
    try:
        yield fd, leaf
    finally:
        os.close(fd)


def _read(folder: int, leaf: str) -> bytes:
    # lstat said a regular file; O_NONBLOCK: a FIFO swapped in since never blocks the open
    fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _keep(folder: int, leaf: str, saved: Path) -> None:
    """The gate's version of ``leaf`` (a file's bytes, a link's target) under ``saved``."""
    try:
        info = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    saved.parent.mkdir(parents=True, exist_ok=True)
    if stat.S_ISLNK(info.st_mode):
        saved.with_name(saved.name + ".link").write_bytes(
            os.fsencode(os.readlink(leaf, dir_fd=folder))
        )
    elif stat.S_ISREG(info.st_mode) and info.st_size <= KEPT_LIMIT:
        saved.write_bytes(_read(folder, leaf))


def _restore(folder: int, leaf: str, was: FileState) -> bool:
    """``leaf`` made ``was`` again; False when that cannot be (a large file, a folder)."""
    if was.kind in ("large", "other"):
        return False
    try:
        info = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            return False
        os.unlink(leaf, dir_fd=folder)
    except FileNotFoundError:
        pass
    if was.kind == "link":
        os.symlink(os.fsdecode(was.data), leaf, dir_fd=folder)
    elif was.kind == "file":
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(leaf, flags, 0o600, dir_fd=folder)
        with os.fdopen(fd, "wb") as handle:
            handle.write(was.data)
            os.fchmod(handle.fileno(), was.mode)
    return True
