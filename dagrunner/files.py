"""Crash-safe files: write to a temporary file, fsync, rename; exclusive locks."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import os
import signal
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never a part.

    ``durable`` also fsyncs, so the data survives a crash of the machine; reports,
    which a rerun can rewrite, skip that cost.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def append_line(path: Path, line: bytes) -> None:
    """Append one line under an exclusive lock, then fsync.  A line a writer could not finish
    (a kill between a write's pages, a full disk) is ended first: this line is never glued to
    it, so a reader skips that fragment, not this line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = line if line.endswith(b"\n") else line + b"\n"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _replaced(fd, path):
                continue  # compacted (written whole and renamed) while we waited: append there
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            view = memoryview(b"\n" + data if torn else data)
            while view:  # a short write (a full disk, a signal) leaves a fragment: go on
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            return
        finally:
            os.close(fd)


def _replaced(fd: int, path: Path) -> bool:
    """Whether ``path`` names another file than the open ``fd`` now (a rename replaced it)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return True
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino)


def text_of(value: Any) -> str | None:
    """A string read back from a JSON line, or None when the line holds something else."""
    return value if isinstance(value, str) else None


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a line a crash cut short is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    found = []
    for line in data.split(b"\n"):
        if line.strip():
            with contextlib.suppress(orjson.JSONDecodeError):
                found.append(orjson.loads(line))
    return found


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def locked(
    path: Path,
    *,
    wait: bool = True,
    busy: Callable[[str], Exception] | None = None,
    waiting: str = "",
) -> Iterator[int]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) for the block; its
    file descriptor is the block's value (a child it is passed to holds the lock as well).

    With ``busy``, the holder writes who it is beside the lock (``.holder``);
    when the lock is taken, ``wait=False`` raises ``busy(who)``, and waiting
    first prints ``waiting`` (formatted with who) to stderr.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = path.with_suffix(".holder")
    with path.open("a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = holder.read_text() if busy is not None and holder.exists() else "unknown"
            if not wait and busy is not None:
                raise busy(who) from None
            if waiting:
                print(waiting.format(who), file=sys.stderr)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        if busy is not None:
            stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
            holder.write_text(f"pid {os.getpid()} since {stamp}")
        try:
            yield handle.fileno()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def is_inside(child: Path, parent: Path) -> bool:
    """Whether ``child`` is ``parent`` or below it, symlinks resolved."""
    try:
        child.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


CACHEDIR_TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This file is a cache directory tag created by dagrunner.\n"
    b"# For information about cache directory tags see https://bford.info/cachedir/\n"
)


def mark_own_output(folder: Path) -> None:
    """Mark a folder dagrunner writes for itself (reports, the cache): a ``.gitignore`` of
    ``*`` so it never shows in ``git status``, and a ``CACHEDIR.TAG`` so backups skip it --
    as pytest, ruff and mypy do.  Files already there are left alone."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (
        (".gitignore", b"# created by dagrunner\n*\n"),
        ("CACHEDIR.TAG", CACHEDIR_TAG),
    ):
        path = folder / name
        if not path.exists():
            with contextlib.suppress(OSError):
                path.write_bytes(data)


def crash_point(name: str) -> None:
    """Fault injection for the durability tests: SIGKILL ourselves at a named point
    (``DAGRUNNER_CRASH_AT``: applying, gating, landing, landed-ref, allocating, pruning,
    compacting-ledger, ...); or block there in ``open(2)`` of a FIFO nobody writes
    (``DAGRUNNER_HANG_AT=point:fifo``), the wedge no signal interrupts, for the tests of a
    bounded exit."""
    if os.environ.get("DAGRUNNER_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    point, _, fifo = os.environ.get("DAGRUNNER_HANG_AT", "").partition(":")
    if point == name and fifo:
        os.close(os.open(fifo, os.O_RDONLY))


@contextlib.contextmanager
def open_regular(
    path: Path | str, *, dir_fd: int | None = None, follow: bool = False
) -> Iterator[tuple[int, os.stat_result]]:
    """A descriptor of ``path`` and its ``fstat``, read as a file of a tree that untrusted
    code built: ``lstat`` first (``stat`` with ``follow``), so a FIFO, socket or device is
    never opened; then ``O_NONBLOCK`` (a FIFO swapped in meanwhile never blocks the open)
    and ``O_NOFOLLOW`` unless ``follow``; the opened file must be that regular file.
    ``OSError`` for anything else."""
    info = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
            info.st_dev,
            info.st_ino,
        ):
            raise OSError(errno.EINVAL, "not the regular file seen a moment ago", str(path))
        yield fd, opened
    finally:
        os.close(fd)


def read_regular(
    path: Path | str, *, limit: int, dir_fd: int | None = None, follow: bool = False
) -> bytes:
    """The bytes of the regular file ``path`` (``open_regular``), at most ``limit``:
    ``OSError`` (``EFBIG``) for a larger one, which is never read in full."""
    with open_regular(path, dir_fd=dir_fd, follow=follow) as (fd, info):
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    if len(data) > limit:  # it grew after the fstat
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def folder_beneath(root: Path, folders: list[str], mode: int = os.O_RDONLY) -> int:
    """A descriptor of ``root/folders...`` (the caller closes it), every folder below
    ``root`` (trusted) opened ``O_NOFOLLOW``: a link on the way -- one a worker or a gate
    planted, or swaps in meanwhile -- is an ``OSError``, never followed.  ``mode``:
    ``O_RDONLY``, or ``O_PATH``."""
    fd = os.open(root, mode | os.O_DIRECTORY)
    try:
        for part in folders:
            step = os.open(part, mode | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd
