"""Observed reads: what a gate opened in its tree, seen by the kernel (``records.Observation``).

A gate with a view runs under bubblewrap, which binds the tree at its own path in the
gate's mount namespace: that bind is a mount of the gate's alone.  A fanotify mark on it
(``FAN_MARK_MOUNT``) sees every open through it -- by any process of the gate, whatever
its language -- and nothing of another gate's, even in the same tree.  The mark goes on
before the gate's command runs: bubblewrap tells its child's pid (``--info-fd``), and the
child waits on a pipe (``--block-fd``) once the view is up, before it runs anything; when
the kernel shows it waiting there, the observer opens ``/proc/<pid>/root/<tree>`` (the
gate's own mount, and every mount below it), marks it, holds the namespace open (so every
event's path is read in it), and lets the gate go.
A thread reads the events: each carries an open file, whose path ``/proc/self/fd`` names.
A git database bound into the view on its own (a worktree's common git dir) is marked too:
an open there is git's, reading the tree's content unseen (``GIT``).

A mount namespace a gate process makes copies the marked mount without its mark: the gate
starts under a seccomp filter that tells of it (``nested``), and the observation is then
incomplete.  Whatever goes wrong here makes the observation incomplete, never the gate's
result: the keys then fall back to the whole tree.  What is not seen: a ``stat`` without
an open, an ``O_PATH`` open; docs/cache.md, "Observed reads".
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import json
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from dagrunner.process import made, nested
from dagrunner.process.share import mount_points
from dagrunner.records.run import Observation

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_NOTIF = 0x1, 0x2, 0x0
FAN_MARK_ADD, FAN_MARK_MOUNT = 0x1, 0x10
FAN_OPEN, FAN_OPEN_EXEC, FAN_Q_OVERFLOW, FAN_ONDIR = 0x20, 0x1000, 0x4000, 0x40000000
FAN_CLOSE_WRITE = 0x8  # what the gate wrote: only that of a need is excused for its gates
MASK = FAN_OPEN | FAN_OPEN_EXEC | FAN_CLOSE_WRITE | FAN_ONDIR
_CLOSER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dagrunner-observe")
EVENT = struct.Struct("IBBHQii")  # fanotify_event_metadata: len, vers, _, len, mask, fd, pid
FANOTIFY_VERSION = 3
READY_TIMEOUT = 30.0  # for the view to come up (bubblewrap dies with its own error before)
NOT_BWRAPPED = "the gate does not run under bubblewrap (none here, or a command keeping its HOME)"
NOT_TREE = "the folder to observe is not in the gate's tree (no mount of the gate's own holds it)"
GIT = "the gate read git's database; what it read through git is not seen"
# read(2)'s number, to see bubblewrap's child waiting on its block pipe (/proc/<pid>/syscall)
READ = {"x86_64": 0, "aarch64": 63, "riscv64": 63, "ppc64le": 3, "s390x": 3, "i686": 3}


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [
        ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p,
    ]  # fmt: skip
    return libc


CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # Linux's; Python 3.13 names it


def _fanotify() -> int:
    """A new fanotify group (``OSError`` where the kernel or our privilege refuses).  Each
    event's file is opened non-blocking: a FIFO's would otherwise wait for a writer (this
    kernel reports no FIFO's open; others may)."""
    try:
        fd = int(_libc().fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK,
                                       os.O_RDONLY | os.O_NONBLOCK | os.O_LARGEFILE | os.O_CLOEXEC))  # fmt: skip
    except AttributeError as exc:  # a libc without fanotify
        raise OSError(0, "this C library has no fanotify") from exc
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _mark(fan: int, folder: int) -> None:
    """Mark the mount that holds the open folder ``folder``."""
    if _libc().fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_MOUNT, MASK, folder, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@functools.cache
def refused() -> str:
    """Why this machine cannot mark a mount with fanotify ('' when it can): probed once."""
    try:
        fan = _fanotify()
    except OSError as exc:
        return f"fanotify is refused here ({exc.strerror or exc}; it needs root)"
    try:
        folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _mark(fan, folder)
        finally:
            os.close(folder)
    except OSError as exc:
        return f"a fanotify mount mark is refused here ({exc.strerror or exc})"
    finally:
        os.close(fan)
    return ""


class Observer:
    """One gate attempt's observer: the pipes its bubblewrap gets (``fds``, ``options``),
    then ``attach`` (the gate waits for it) and ``finish`` (the observation)."""

    def __init__(self, tree: str, why: str = "", seen: str = "") -> None:
        self.tree = os.path.realpath(tree) if tree else ""
        # where the tree as the gate saw it is once it has ended: the tree, or the merged
        # folder of the gate's own layer over it (``process.layers``)
        self.seen = os.path.realpath(seen) if seen else self.tree
        self.why = why  # set: no observation is made, and this says why (``finish``)
        self.fds: tuple[int, ...] = ()  # the child's ends (info's write, block's read)
        self._ours: tuple[int, ...] = ()  # info's read end, block's write end
        self._fan = self._ns = -1
        self._read: set[str] = set()
        self._listed: set[str] = set()
        self._wrote: set[str] = set()  # files closed after being opened to write
        # files whose inode was made while the gate ran (a name the tree did not hold, of
        # an older inode, is a link or a rename of a file of the tree: ``stands_for``)
        self._new: set[str] = set()
        self._made: set[made.Node] = set()  # the files it wrote, by inode (renames keep it)
        self._fresh: dict[str, set[made.Node]] = {}  # its opens of new files, by inode
        self._inodes: dict[str, set[tuple[int, int]]] = {}  # the older ones, by the name read
        self._start = 0  # the file system's clock (coarse) when the gate was let go
        self._git: list[str] = []  # git databases bound outside the tree, marked too
        self._thread: threading.Thread | None = None
        self._stop: tuple[int, ...] = ()  # a pipe: written when the gate has ended
        self._listener = -1  # the gate's seccomp filter's (``nested``)
        if not self.tree or why:
            return
        try:
            self._fan = _fanotify()
            info, block = os.pipe(), os.pipe()
            sock = tuple(end.detach() for end in socket.socketpair())
        except OSError as exc:
            self.why = f"fanotify is refused here ({exc.strerror or exc})"
            self.close()
            return
        self._ours, self.fds = (info[0], block[1], sock[0]), (info[1], block[0], sock[1])
        self._waits_on = block[0]  # the number bubblewrap's child reads its block pipe at

    def options(self) -> list[str]:
        """bubblewrap's options: its child's pid to ``fds[0]``, and wait on ``fds[1]``."""
        if not self.fds:
            return []
        return ["--info-fd", str(self.fds[0]), "--block-fd", str(self.fds[1])]

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as the gate starts it: under the filter that tells of its own mount
        namespaces (``nested``), when observed."""
        return nested.watched(list(argv), self.fds[2]) if self.fds else list(argv)

    def started(self) -> None:
        """The child holds its ends: close ours of them (else the info pipe never ends)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = ()

    async def attach(self) -> None:
        """Mark the gate's mounts of the tree, then let the gate run (always, marked or not)."""
        if not self._ours:
            return
        try:
            with trio.fail_after(READY_TIMEOUT):
                await self._attach()
        except Exception as exc:  # a bug here must not fail the gate: it is unobserved
            self.why = self.why or f"the observer could not attach ({exc})"
        # started even so: the calls the gate's filter tells of wait for an answer
        # the clock inodes are stamped with: a file the gate makes is born at or after it
        self._start = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
        self._stop = os.pipe()
        self._thread = threading.Thread(target=self._drain, name="dagrunner-observe", daemon=True)
        self._thread.start()
        with contextlib.suppress(OSError):
            os.write(self._ours[1], b"x")  # the gate goes

    async def _attach(self) -> None:
        body = b""
        async with trio.lowlevel.FdStream(os.dup(self._ours[0])) as info:
            while chunk := await info.receive_some(4096):
                body += chunk
        pid = int(json.loads(body)["child-pid"])
        read = READ.get(os.uname().machine)
        if read is None:
            raise OSError(0, f"no read(2) number known for {os.uname().machine}")
        # waiting on its block pipe: the view is up and nothing of the gate has run
        waiting = f"{read} {hex(self._waits_on)}"
        delay = 0.0005
        while not Path(f"/proc/{pid}/syscall").read_text().startswith(waiting + " "):
            await trio.sleep(delay)
            delay = min(delay * 2, 0.002)
        root = f"/proc/{pid}/root"
        self._ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        folders = []
        try:
            points = mount_points(Path(f"/proc/{pid}/mountinfo"))
            # the tree's mounts; and a git database bound on its own (a worktree's common
            # git dir): an open there is git's, read for the tree unseen
            self._git = [p for p in points if _git_database(root + p, p, self.tree)]
            under = [p for p in points if p.startswith(self.tree + "/")]
            for point in dict.fromkeys([self.tree, *under, *self._git]):
                folders.append(os.open(root + point, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for folder in folders:
                _mark(self._fan, folder)
        finally:
            for folder in folders:
                os.close(folder)

    def _drain(self) -> None:
        try:
            wake = select.poll()  # not select(): a busy runner's descriptors pass 1024
            for fd in (self._fan, self._stop[0], self._ours[2]):
                wake.register(fd, select.POLLIN)
            while True:
                ready = dict(wake.poll())
                if self._ours[2] in ready:  # the filter's listener, once
                    wake.unregister(self._ours[2])
                    self._listener = nested.receive(self._ours[2])
                    if self._listener < 0:
                        self.why = self.why or "the gate's own mount namespaces are not watched"
                    else:
                        wake.register(self._listener, select.POLLIN)
                if self._listener in ready:
                    if ready[self._listener] & select.POLLIN and nested.answer(self._listener):
                        self.why = self.why or nested.MADE
                    elif not ready[self._listener] & select.POLLIN:  # no process left
                        wake.unregister(self._listener)
                self._events()
                if self._stop[0] in ready:
                    break
            self._events()  # the gate has ended: every event it made is queued
        except Exception as exc:  # the observation is lost, the gate is not
            self.why = self.why or f"the observer failed ({exc})"

    def _events(self) -> None:
        while True:
            try:
                data = os.read(self._fan, 256 * EVENT.size)
            except BlockingIOError:
                return
            offset = 0
            while offset + EVENT.size <= len(data):
                size, version, _, _, mask, fd, _pid = EVENT.unpack_from(data, offset)
                offset += max(size, EVENT.size)
                if version != FANOTIFY_VERSION:  # another layout: not even its fd is known
                    raise OSError(0, f"fanotify events of version {version}, not 3")
                if fd < 0:
                    if mask & FAN_Q_OVERFLOW:
                        self.why = self.why or "events were lost (the kernel's queue overflowed)"
                    continue
                try:
                    if not self.why:  # incomplete already: the rest is only closed
                        self._place(fd, mask)
                except OSError as exc:
                    self.why = f"an open the observer could not name ({exc})"
                finally:
                    os.close(fd)

    def _place(self, fd: int, mask: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        found = os.fstat(fd)  # FAN_ONDIR is in the event's mask only for FID groups
        folder = stat.S_ISDIR(found.st_mode)
        if path.endswith(" (deleted)") and found.st_nlink == 0:
            path = path[: -len(" (deleted)")]  # opened, then removed (or replaced)
        rel = _relative(path, self.tree)
        if rel is None and any(path == g or path.startswith(g + "/") for g in self._git):
            self.why = self.why or GIT
        elif rel is None:
            self.why = self.why or f"an open the observer could not place ({path!r})"
        elif ".git" in rel.split("/"):
            self.why = self.why or GIT
        else:
            # a change time before the gate's start proves the birth before it too (birth
            # never follows it): the birth time is asked only of what may be new
            older = found.st_ctime_ns < self._start
            born, node = None if older else made.born(fd), (found.st_dev, found.st_ino)
            # a new file by more than its inode number, which the file system hands out
            # again once freed (another gate's new file may get one the gate made, removed)
            if born is not None and born >= self._start:
                self._new.add(rel)
                if not folder:
                    self._fresh.setdefault(rel, set()).add(made.identity(fd, found, born))
            else:  # its name is read now, not when it was opened: checked once the gate ends
                self._inodes.setdefault(rel, set()).add(node)
            if folder:
                self._listed.add(rel)
            elif mask & (FAN_OPEN | FAN_OPEN_EXEC):
                self._read.add(rel)
            if not folder and mask & FAN_CLOSE_WRITE:
                self._wrote.add(rel)
                self._made.add(made.identity(fd, found, born))

    def _renamed(self) -> str:
        """A name of an older file or folder the gate opened that holds another now (or
        none): it was renamed or swapped while its event waited, so the name may be wrong
        ('' when each still holds what was opened)."""
        for rel, inodes in sorted(self._inodes.items()):
            try:
                now = os.lstat(os.path.join(self.seen, rel) if rel else self.seen)
            except OSError:
                return rel
            if {(now.st_dev, now.st_ino)} == inodes:
                continue
            # bytecode is rewritten by replacing it: a new file under the name is the gate's
            if not (rel.endswith(".pyc") and _replaced(now.st_ino, rel, self)):
                return rel
        return ""

    def finish(self) -> Observation | None:
        """The observation (None when none was asked for); closes everything."""
        if not self.tree:
            return None
        if self._thread is not None:
            os.write(self._stop[1], b"x")
            self._thread.join()
        elif not self.why:
            self.why = "the gate was not observed (it did not start, or was stopped first)"
        self.close()
        if not self.why and (moved := self._renamed()):
            self.why = f"{moved} was renamed, replaced or removed while the gate ran"
        if self.why:
            return Observation(complete=False, why=self.why)
        return Observation(complete=True, read=frozenset(self._read),
                           listed=frozenset(self._listed), wrote=frozenset(self._wrote),
                           new=frozenset(self._new),
                           foreign=made.foreign(self.seen, self._fresh, self._made,
                                                self._listed, self._new))  # fmt: skip

    def close(self) -> None:
        self.started()
        fds = [*self._ours, *self._stop, self._fan, self._ns, self._listener]
        self._ours, self._stop, self._fan, self._ns, self._listener = (), (), -1, -1, -1
        fds = [fd for fd in fds if fd >= 0]
        # A fanotify group with marks, and a mount namespace, each wait for the kernel's
        # grace period when closed (15 ms a gate): apart, the gate's result does not wait.
        _CLOSER.submit(_close, fds)


def _replaced(inode: int, rel: str, observer: Observer) -> bool:
    """Whether ``rel`` now holds a file the gate made (``inode``'s, born in the run)."""
    path = os.path.join(observer.seen, rel)
    birth = made.born_at(path)  # in the run: since the gate was let go
    return birth is not None and birth >= observer._start and os.lstat(path).st_ino == inode


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _relative(path: str, tree: str) -> str | None:
    """``path`` relative to ``tree`` ('' for the tree itself); None if it is not in it or
    is no clean posix path (not UTF-8: it could not be stored)."""
    if path == tree:
        return ""
    if not path.startswith(tree + "/"):
        return None
    rel = path[len(tree) + 1 :]
    parts = rel.split("/")
    if "" in parts or "." in parts or ".." in parts:
        return None
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return rel


def _git_database(where: str, point: str, tree: str) -> bool:
    """Whether the mount at ``point`` (reached at ``where``), outside ``tree``, is a git
    database: a ``.git`` folder, or a bare repository's (HEAD, objects and refs)."""
    if point == tree or point.startswith(tree + "/"):
        return False
    if ".git" in point.split("/"):
        return True
    return all(os.path.exists(f"{where}/{name}") for name in ("HEAD", "objects", "refs"))
