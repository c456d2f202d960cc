"""What of a gate's tree the gate made itself, told once it has ended (``observe``).

Other gates run beside it in the same tree, and its mount's events show only its own
opens: a file is its own when it closed that inode after a write (a rename keeps the
inode); a folder is no file, so one is its own only when it holds such a file.  What is
not its own, it may have learnt from another gate that read what it never did: its
observation is then incomplete (``engine.inputs.stands_for``, docs/cache.md)."""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import functools
import os
import re
import stat
import struct
from collections.abc import Callable, Mapping, Set

# A file: (device, inode, birth time, generation), -1 for what is not known.  The inode
# number alone is handed out again once the file is removed; its birth time is the file
# system's coarse clock (a few ms); its generation (ext4, XFS) is drawn anew for each.
Node = tuple[int, int, int, int]
AT_EMPTY_PATH, STATX_BTIME, STATX_BTIME_AT = 0x1000, 0x800, 80  # struct statx: stx_btime at 80
FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long)
# a bytecode file's name in its folder (as ``engine.inputs.PYCACHE``), or its temporary one
BYTECODE = re.compile(r"[^./]+\.[^/]*\.pyc(\.\d+)?")
WALK = 20000  # entries of the new folders a gate listed, checked for its own (``_all_made``)


@functools.cache
def _statx() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        call = libc.statx
    except AttributeError:  # a C library without statx: no birth times
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]
    found: Callable[..., int] = call
    return found


def born(fd: int) -> int | None:
    """When the open file ``fd``'s inode was made (ns since the epoch), None if unknown."""
    call, out = _statx(), ctypes.create_string_buffer(256)
    if call is None or call(fd, b"", AT_EMPTY_PATH, STATX_BTIME, out) != 0:
        return None
    (mask,) = struct.unpack_from("I", out.raw, 0)
    if not mask & STATX_BTIME:
        return None
    sec, nsec = struct.unpack_from("qI", out.raw, STATX_BTIME_AT)
    return int(sec) * 1_000_000_000 + int(nsec)


def born_at(path: str | os.PathLike[str]) -> int | None:
    """When ``path`` (a link not followed, never opened for its content) was made, as
    ``born``; None: not there, or not known."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return born(fd)
    finally:
        os.close(fd)


def identity(fd: int, found: os.stat_result, birth: int | None) -> Node:
    """The open file ``fd`` (``found`` its ``fstat``, ``birth`` its ``born``) as a ``Node``."""
    generation = array.array("l", [-1])
    try:
        fcntl.ioctl(fd, FS_IOC_GETVERSION, generation)
    except OSError:  # a file system without generations (tmpfs): the rest must do
        generation[0] = -1
    return found.st_dev, found.st_ino, -1 if birth is None else birth, generation[0]


def foreign(
    tree: str,
    fresh: Mapping[str, Set[Node]],
    made: Set[Node],
    listed: Set[str],
    new: Set[str],
) -> frozenset[str]:
    """Of the new files the gate opened (``fresh``, each with the inodes it opened under
    the name), those it never wrote (``made``); of the new folders it listed, those holding
    an entry other than a file it wrote or a folder holding one (``_all_made``); and the
    bytecode folders it listed holding a file no bytecode: another gate's, made beside it
    from what this one never read."""
    found = {rel for rel, nodes in fresh.items() if not nodes <= made}
    made_now = listed & new
    found |= {rel for rel in made_now if not _all_made(f"{tree}/{rel}" if rel else tree, made)}
    # a bytecode folder counts for nothing (``stands_for``): only while it holds nothing
    # but bytecode, whose names are its sources' (another gate may name any file there)
    pycache = {rel for rel in listed if rel.rsplit("/", 1)[-1] == "__pycache__"}
    return frozenset(found | {rel for rel in pycache - made_now if not _bytecode(tree, rel)})


def _all_made(top: str, made: Set[Node]) -> bool:
    """Whether each entry under the folder ``top`` now is a file the gate wrote (``made``),
    and each folder in it one holding such a file (a bytecode folder aside; a walk past
    ``WALK`` entries says no).  A folder is no file: who made it is known only by what the
    gate put in it (an empty one, or one of empty folders, may be another gate's, named
    after what it read).  A folder gone by now leaves nothing: its names were the gate's
    own to make and remove."""
    folders: set[str] = set()  # the folders under ``top``, at any depth
    holding: set[str] = set()  # those holding a file the gate wrote, at any depth
    stack, count = [top], 0
    while stack:
        with contextlib.suppress(FileNotFoundError):  # gone by now (an entry, or all)
            for entry in list(os.scandir(stack.pop())):
                count += 1
                if (found := _node(entry)) is None:
                    continue  # removed since it was listed: nothing
                mode, node = found
                rel = entry.path[len(top) + 1 :]
                if count > WALK or not (stat.S_ISDIR(mode) or node in made):
                    return False
                if stat.S_ISDIR(mode) and entry.name != "__pycache__":
                    stack.append(entry.path)
                    folders.add(rel)
                elif node in made:  # each folder above it holds it
                    holding.update(rel[:at] for at, c in enumerate(rel) if c == "/")
    return folders <= holding


def _bytecode(tree: str, rel: str) -> bool:
    """Whether the folder ``rel`` holds only bytecode files now (or is gone)."""
    try:
        with os.scandir(f"{tree}/{rel}" if rel else tree) as entries:
            return all(
                entry.is_file(follow_symlinks=False) and BYTECODE.fullmatch(entry.name)
                for entry in entries
            )
    except FileNotFoundError:
        return True


def _node(entry: os.DirEntry[str]) -> tuple[int, Node] | None:
    """(mode, ``Node``) of ``entry``: a regular file's, (0, 0, 0, 0) for any other; None
    when it is gone."""
    try:
        found = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return found.st_mode, (0, 0, 0, 0)
    # a regular file when it was listed, maybe not now (another gate runs on): held by a
    # path that opens nothing, and read only once it is known to be a regular file still
    try:
        held = os.open(entry.path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(held).st_mode):
            return stat.S_IFLNK, (0, 0, 0, 0)  # not a file the gate wrote: "not its own"
        fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(held)
    try:
        now = os.fstat(fd)
        return now.st_mode, identity(fd, now, born(fd))
    finally:
        os.close(fd)
