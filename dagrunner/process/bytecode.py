"""Python bytecode that would be loaded for a source it was not compiled from.

A timestamp ``.pyc`` -- CPython's, and pytest's rewritten test modules beside it -- holds its
source's size and mtime in whole seconds, and is loaded whenever both still match.  A
same-size rewrite within the second the source was compiled in (``assert 1`` to
``assert 0`` right after a check) therefore leaves bytecode that runs the old code for the
new source: a gate would pass a tree that fails, and its verdict be stored under the new
content's key.  Git has the same race with its index ("racy git") and settles it the same
way: a source written at or after its bytecode's own write, in the second the bytecode
names, is not trusted.

Before the gates of a tree that may hold such files (a checkout, a worker's worktree:
integration trees are cleaned first) they are removed -- they are Python's cache, written
again at the next import -- through folders opened without following links.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from dagrunner.files import folder_beneath
from dagrunner.git.command import git, split_z

HEADER = 16  # magic, flags, source mtime (seconds), source size: little-endian 32-bit words
HASH_BASED = 0b01
CHECKED = 0b10


def remove_stale_bytecode(root: Path) -> list[str]:
    """Remove the bytecode of ``root``'s Python sources (a git work tree) that Python would
    load though its source was rewritten after it was compiled; the paths removed."""
    listed = git(
        ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.py"],
        cwd=root,
        check=False,
    )
    if listed.returncode != 0:
        return []
    folders: dict[str, set[str]] = {}
    for rel in split_z(listed.stdout):
        folder, _, name = rel.rpartition("/")
        folders.setdefault(folder, set()).add(name[: -len(".py")])
    removed: list[str] = []
    for folder, stems in sorted(folders.items()):
        removed += _in_folder(root, folder, stems)
    return removed


def _in_folder(root: Path, folder: str, stems: set[str]) -> list[str]:
    try:
        fd = folder_beneath(root, [*(folder.split("/") if folder else []), "__pycache__"])
    except OSError:
        return []  # no bytecode folder, or one behind a link: never followed
    removed: list[str] = []
    try:
        for entry in os.scandir(fd):
            stem = entry.name.split(".", 1)[0]
            if stem in stems and entry.name.endswith(".pyc") and _stale(root, folder, entry, fd):
                os.unlink(entry.name, dir_fd=fd)
                removed.append(f"{folder}/__pycache__/{entry.name}".lstrip("/"))
    except OSError:
        pass  # a folder that changed under the scan: what was found stays removed
    finally:
        os.close(fd)
    return removed


def _stale(root: Path, folder: str, entry: os.DirEntry[str], fd: int) -> bool:
    """Whether Python would load ``entry`` for its source as the source is now, though the
    source was written at or after the bytecode was."""
    source = root / folder / f"{entry.name.split('.', 1)[0]}.py"
    try:
        compiled = entry.stat(follow_symlinks=False)
        now = source.stat()
        if not stat.S_ISREG(compiled.st_mode) or now.st_mtime_ns < compiled.st_mtime_ns:
            return False  # compiled after the source's last write: it is that source's
        handle = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        with os.fdopen(handle, "rb") as file:
            header = file.read(HEADER)
    except OSError:
        return False
    if len(header) < HEADER:
        return False
    flags, mtime, size = (int.from_bytes(header[i : i + 4], "little") for i in (4, 8, 12))
    if flags & HASH_BASED:
        return not flags & CHECKED  # an unchecked hash is loaded whatever the source holds
    return (mtime, size) == (int(now.st_mtime) & 0xFFFFFFFF, now.st_size & 0xFFFFFFFF)


def note(removed: Iterable[str]) -> list[str]:
    """The run's warning for what :func:`remove_stale_bytecode` removed (none: no warning)."""
    paths = sorted(removed)
    if not paths:
        return []
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return [
        f"removed {len(paths)} stale bytecode file(s) Python would have loaded for a source "
        f"rewritten in the second it was compiled in (docs/cache.md): {shown}"
    ]
