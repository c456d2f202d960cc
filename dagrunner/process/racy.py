"""Files written in the second a gate reads them: what tools that trust a file's time miss.

Many tools keep what they learnt of a file under its size and its mtime *in whole seconds*
and trust it while both match: CPython's bytecode and pytest's rewritten test modules
(``__pycache__``), mypy's incremental cache, make on a coarse file system.  A same-size
edit within the second a tool read the file in (``assert 1`` to ``assert 0`` right after
a check: agents do this) is then invisible to it: the gate judges the old code, passes a
tree that fails, and that pass is stored under the new content's key, for any tree that
holds it.  Git has the same race with its index ("racy git").

So, before the gates of a tree that is not freshly checked out (a checkout, a worker's
worktree; integration trees are cleaned first, their tool caches fresh):

- a file the last run found written in the second it began (its gates may have read it in
  that second) and that was rewritten since within that very second is touched (``settle``:
  its content untouched, its time now, as ``touch`` does), so every tool sees a change;
  the files written in this run's first second are recorded for the next run, in a folder
  of the cache store that no gate can write;
- bytecode that Python would load for a source written at or after it, in the second it
  names, is removed (it may come from a run outside dagrunner's: the user's own pytest);
  it is Python's cache, written again at the next import.

Paths are reached through folders opened without following links.  Left out: a file
system that keeps whole seconds only (a rewrite in the same second leaves no trace), and
ignored files a need rewrites (two runs within one second).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
from pathlib import Path

import orjson

from dagrunner.files import atomic_write, folder_beneath
from dagrunner.git.command import git, split_z

HEADER = 16  # magic, flags, source mtime (seconds), source size: little-endian 32-bit words
HASH_BASED = 0b01
CHECKED = 0b10


def _files(root: Path, *pathspec: str) -> list[str] | None:
    """The tree's tracked and untracked files (not ignored), or None outside a git tree."""
    listed = git(
        ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *pathspec],
        cwd=root,
        check=False,
    )
    return split_z(listed.stdout) if listed.returncode == 0 else None


def _record_path(state: Path, root: Path) -> Path:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:32]
    return state / f"{digest}.json"


def settle(state: Path, root: Path) -> list[str]:
    """Before a run's gates in ``root``: touch each file the last run recorded as written in
    the second it began (its gates may have read it in that second) that was rewritten since
    within that same second -- a tool trusting its time would not see the rewrite; then
    record the files written in this second for the next run.  ``state``: a folder no gate
    can write (under the cache store).  The files touched, tree-relative."""
    files = _files(root)
    if files is None:
        return []
    record = _record_path(state, root)
    try:
        before: dict[str, int] = orjson.loads(record.read_bytes())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        before = {}
    touched: list[str] = []
    for rel, was in sorted(before.items()) if isinstance(before, dict) else ():
        try:
            now = os.lstat(root / rel)
        except OSError:
            continue
        if not isinstance(was, int) or now.st_mtime_ns == was or stat.S_ISLNK(now.st_mode):
            continue
        if now.st_mtime_ns // 10**9 == was // 10**9:  # rewritten in the very second
            while time.time_ns() // 10**9 == was // 10**9:  # now: a time of another second
                time.sleep(0.05)
            if _touch(root, rel):
                touched.append(rel)
    second = time.time_ns() // 10**9 * 10**9
    recent: dict[str, int] = {}
    for rel in files:
        with contextlib.suppress(OSError):
            if (mtime := os.lstat(root / rel).st_mtime_ns) >= second:
                recent[rel] = mtime
    if recent:
        state.mkdir(parents=True, exist_ok=True)
        atomic_write(
            record,
            orjson.dumps({"tree": str(root), "second": second // 10**9, "files": recent}),
            durable=False,
        )
    else:
        record.unlink(missing_ok=True)
    return touched


def _recorded_second(state: Path, root: Path) -> int | None:
    """The second the last run in ``root`` began, as its record says; None without one."""
    try:
        second = orjson.loads(_record_path(state, root).read_bytes())["second"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return second if isinstance(second, int) and 0 < second < 2**33 else None


def _touch(root: Path, rel: str) -> bool:
    """Set ``rel``'s times to now, through folders opened without following links."""
    *folders, name = rel.split("/")
    if {"", ".", ".."} & {*folders, name}:
        return False
    try:
        fd = folder_beneath(root, folders)
    except OSError:
        return False
    try:
        os.utime(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def remove_stale_bytecode(root: Path) -> list[str]:
    """Remove the bytecode of ``root``'s Python sources (a git work tree) that Python would
    load though its source was rewritten after it was compiled; the paths removed."""
    folders: dict[str, set[str]] = {}
    for rel in _files(root, "*.py") or []:
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


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def prepare(state: Path, root: Path) -> list[str]:
    """``settle`` and ``remove_stale_bytecode`` for ``root``; the run's warnings saying what
    they did (docs/cache.md, "Files rewritten in the second they were read")."""
    warnings = []
    began = _recorded_second(state, root)  # read before settle records this run
    if touched := settle(state, root):
        when = time.strftime("%H:%M:%S UTC", time.gmtime(began)) if began else "unknown"
        warnings.append(
            f"touched {len(touched)} file(s) (their time set to now, contents unchanged) "
            f"rewritten within the second the last run in this tree began ({when}), when its "
            f"gates may have read them: tools that trust file times (mypy's cache, Python's "
            f"bytecode) would not have seen the change: {_shown(touched)}"
        )
    if removed := sorted(remove_stale_bytecode(root)):
        warnings.append(
            f"removed {len(removed)} stale bytecode file(s) Python would have loaded for a "
            f"source rewritten in the second it was compiled in: {_shown(removed)}"
        )
    return warnings
