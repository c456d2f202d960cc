"""Files written in the second a gate reads them: what tools that trust a file's time miss.

Many tools keep what they learnt of a file under its size and its mtime *in whole seconds*
and trust it while both match: CPython's bytecode and pytest's rewritten test modules
(``__pycache__``), mypy's incremental cache, make on a coarse file system.  A same-size
edit within the second a tool read the file in (``assert 1`` to ``assert 0`` right after
a check: agents do this) is then invisible to it: the gate judges the old code, passes a
tree that fails, and that pass is stored under the new content's key, for any tree that
holds it.  Git has the same race with its index ("racy git").

So, before the gates of a tree that is not freshly checked out (a checkout, a worker's
worktree; integration trees are checked out afresh, and their tool caches start from
entries that name the main checkout's paths, which mypy checks by content):

- each file the last run's gates may have read in the second it was written in, and that
  was written again since, is touched (``settle``: its content untouched, its time now, as
  ``touch`` does, or the next second's start when it was rewritten in this very second: a
  check right after an edit never waits), so every tool sees a change.  Those are the files written while that run
  went on (from the second it began to the second its gates ended, ``ended``) other than as
  it listed them at its start, and files dated ahead of the clock.  Each run records its
  start (the files written in its first second, with their times) and its end for the
  next, in a folder of the cache store that no gate can write; a run killed before its end
  leaves the window open (every later write counts);
- bytecode that Python would load for its source as it is now, written in the second of
  the source's last write (or before it), is removed: Python reads the source before it
  writes the bytecode, so a rewrite in that second may be newer than what the bytecode
  holds.  It may come from a run outside dagrunner's (the user's own pytest); it is
  Python's cache, written again at the next import.

Paths are reached through folders opened without following links.  Left out: a file
system that keeps whole seconds only (a rewrite in the same second leaves no trace);
ignored files (a generated module a gate writes; they are not listed); bytecode whose
compile straddled a second's end (read in one second, written in the next); two runs in
one tree that began in the same second, the first ending while the second still reads; a
worker that sets a rewritten file's time back (``touch -d``): its own tool caches are then
wrong, and nothing of them is read by another tree (docs/cache.md, "Tools' own caches").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import stat
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.files import atomic_write, folder_beneath
from dagrunner.git.command import git, split_z

RECORDED = 10_000  # files of a run's first second recorded at most: the record stays small
HEADER = 16  # magic, flags, source mtime (seconds), source size: little-endian 32-bit words
HASH_BASED = 0b01
CHECKED = 0b10


def _files(root: Path) -> list[str] | None:
    """The tree's tracked and untracked files (not ignored), or None outside a git tree."""
    listed = git(
        ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, check=False
    )
    return split_z(listed.stdout) if listed.returncode == 0 else None


def _record_path(state: Path, root: Path) -> Path:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:32]
    return state / f"{digest}.json"


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    """The records' folder, held: a run's start and another's end in one tree read and
    rewrite the same record."""
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(record: Path) -> dict[str, Any]:
    try:
        found = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return {}
    valid = isinstance(found, dict) and isinstance(found.get("since"), int)
    return found if valid and isinstance(found.get("files"), dict) else {}


def _write(record: Path, data: dict[str, Any]) -> None:
    # json, not orjson: a name that is not UTF-8 (surrogate escapes) round-trips as \udcXX
    atomic_write(record, json.dumps(data, ensure_ascii=True).encode(), durable=False)


def _mtimes(root: Path, files: list[str]) -> dict[str, int]:
    """Each listed file's mtime (ns), links left out; a string join, not a Path, per file:
    trees of many thousands of files."""
    top, found = f"{root}/", {}
    for rel in files:
        with contextlib.suppress(OSError):
            now = os.lstat(top + rel)
            if not stat.S_ISLNK(now.st_mode):
                found[rel] = now.st_mtime_ns
    return found


def _racy(last: dict[str, Any], rel: str, mtime: int, now: int) -> bool:
    """Whether the last run's gates may have read ``rel`` in the second of its time, and it
    was written after the last run listed it: written while that run went on (its first
    second included), or dated ahead of the clock (a time no tool's order can be read from)."""
    until = last.get("until")
    if mtime < last["since"] or last["files"].get(rel) == mtime:
        return False  # written before the last run began, or unchanged since it listed it
    after = isinstance(until, int) and mtime // 10**9 > until // 10**9 and mtime <= now
    return not after  # a later second than the run's last: after every read of its gates


def settle(state: Path, root: Path, files: list[str] | None = None) -> tuple[list[str], int | None]:
    """Before a run's gates in ``root``: touch each file the last run's gates may have read
    in the second it was written in, and that was written again since (a tool trusting its
    whole-second time would not see that); then record this run's start for the next run
    (``ended`` records its end).  ``state``: a folder no gate can write (under the cache
    store).  ``files``: the tree's listing, if taken.  The files touched, tree-relative, and
    the second the record begins at."""
    files = _files(root) if files is None else files
    if files is None:
        return [], None
    record = _record_path(state, root)
    # this run's window begins before its listing: a file written while it is taken is in it
    second = time.time_ns() // 10**9 * 10**9
    with _locked(state):  # held for the record only: a huge tree's listing holds up no other
        last = _read(record)
    mtimes = _mtimes(root, files)
    touched: list[str] = []
    now = time.time_ns()
    for rel, mtime in sorted(mtimes.items()) if last else ():
        if not _racy(last, rel, mtime, now):
            continue
        # a time of another second than the rewrite's: now, or (a rewrite of this very
        # second) the next second's start, a moment ahead -- never waited for; this run's
        # window then reaches that second (``ended``)
        at = time.time_ns()
        if at // 10**9 == mtime // 10**9:
            at = (mtime // 10**9 + 1) * 10**9
        if _touch(root, rel, at):
            touched.append(rel)
    mtimes.update(_mtimes(root, touched))
    # A file left out of the record (written after its listing here, or past RECORDED: a
    # tree dated ahead of the clock) is taken by the next run as written while this run
    # went on: touched if written again, never missed.
    recent = dict(itertools.islice(((r, m) for r, m in mtimes.items() if m >= second), RECORDED))
    with _locked(state):
        _write(record, {"tree": str(root), "since": second, "files": recent})
    return touched, second


def ended(state: Path, root: Path, since: int) -> None:
    """After the gates of the run that began in second ``since`` in ``root`` (passed, failed
    or interrupted): record the second they ended in, so that the next run leaves alone what
    was written in a later second.  A run that never gets here (killed) leaves its record
    open: the next run treats every file written since it began as possibly read in the
    second it was written in.  Another run that began later in the tree owns the record: its
    end is kept open while that run goes on, else pushed to this one's."""
    record = _record_path(state, root)
    with _locked(state):
        last = _read(record)
        until = last.get("until")
        if not last or last["since"] < since or (last["since"] > since and until is None):
            return
        # a file dated ahead by a touch (``settle``) is in the window up to its second
        # (a second at most: a file a worker dated in 2100 does not keep the window open)
        now = time.time_ns()
        ahead = [m for m in last["files"].values() if isinstance(m, int) and m <= now + 10**9]
        last["until"] = max(now, until if isinstance(until, int) else 0, *ahead)
        _write(record, last)


def prune(state: Path, *, dry_run: bool = False) -> list[str]:
    """The records of trees that are gone (a removed worktree, one moved to the pool): the
    trees they named, removed (``dry_run``: only named).  A tree's record is all that is
    kept of it: one small file, written again by its next run."""
    gone = []
    with _locked(state):
        for record in sorted(state.glob("*.json")):
            if not record.is_file() or record.is_symlink():
                continue  # not a record of ours (made by hand): left as it is
            tree = _read(record).get("tree")
            if isinstance(tree, str) and os.path.isdir(tree):
                continue
            gone.append(tree if isinstance(tree, str) else record.name)
            if not dry_run:
                record.unlink(missing_ok=True)
    return gone


@dataclass(frozen=True)
class Settled:
    """What ``prepare`` did in a tree: its warnings, and the run's window to close."""

    state: Path
    root: Path
    since: int | None  # the second this run's record begins at (None: not a git tree)
    warnings: list[str]

    def end(self) -> None:
        """``ended``: the run's gates are over (it may raise nothing: a run's last step)."""
        if self.since is not None:
            with contextlib.suppress(OSError):
                ended(self.state, self.root, self.since)


def _touch(root: Path, rel: str, at: int) -> bool:
    """Set ``rel``'s times to ``at`` (ns), through folders opened without following links."""
    *folders, name = rel.split("/")
    if {"", ".", ".."} & {*folders, name}:
        return False
    try:
        fd = folder_beneath(root, folders)
    except OSError:
        return False
    try:
        os.utime(name, ns=(at, at), dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def remove_stale_bytecode(root: Path, files: list[str] | None = None) -> list[str]:
    """Remove the bytecode of ``root``'s Python sources (a git work tree; ``files`` its
    listing, if taken) that Python would load though its source may have been rewritten
    after it was read; the paths removed."""
    folders: dict[str, set[str]] = {}
    for rel in (_files(root) or []) if files is None else files:
        if not rel.endswith(".py"):
            continue
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
    bytecode was written in the second of the source's last write (or before it): Python
    stats and reads the source, compiles, then writes the bytecode, so a rewrite after the
    read in that same second may be newer than the source the bytecode holds, or older."""
    source = root / folder / f"{entry.name.split('.', 1)[0]}.py"
    try:
        compiled = entry.stat(follow_symlinks=False)
        now = source.stat()
        if not stat.S_ISREG(compiled.st_mode) or (
            compiled.st_mtime_ns // 10**9 > now.st_mtime_ns // 10**9
        ):
            return False  # written in a later second: a later rewrite has a later second
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


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def prepare(state: Path, root: Path, outputs: Collection[str] = ()) -> Settled:
    """``settle`` and ``remove_stale_bytecode`` for ``root``, on one listing of the tree; the
    run's warnings say what they did (docs/cache.md, "Files rewritten in the second they were
    read").  ``outputs``: the files the gates declare they write (their JUnit files), left
    out: every run writes them again, and no gate's key holds them.  Call ``end`` on what it
    returns when the run's gates are over."""
    warnings = []
    files = _files(root)
    if files is None:
        return Settled(state=state, root=root, since=None, warnings=[])
    files = [path for path in files if path not in outputs]
    began = _read(_record_path(state, root)).get("since")  # before settle records this run
    touched, since = settle(state, root, files)
    if touched:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(began // 10**9)) if began else "?"
        warnings.append(
            f"touched {len(touched)} file(s) (their time set to now, contents unchanged) "
            f"written again since the last run in this tree (begun {when}) may have read "
            f"them, in a second it went on in: tools that trust whole-second file times "
            f"(mypy's cache, Python's bytecode) would not have seen it: {_shown(touched)}"
        )
    if removed := sorted(remove_stale_bytecode(root, files)):
        warnings.append(
            f"removed {len(removed)} stale bytecode file(s) Python would have loaded for a "
            f"source written in the second it was compiled in: {_shown(removed)}"
        )
    return Settled(state=state, root=root, since=since, warnings=warnings)
