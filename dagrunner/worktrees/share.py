"""How a stored seed reaches a worktree, each worktree's copy its own (``seeds`` builds them).

- ``reflink``: every file cloned (``FICLONE``): shared extents, copied on write by the
  filesystem (btrfs, XFS, bcachefs...).
- ``overlay``: a kernel overlay mounted on the worktree's folder, the stored seed its read-only
  lower layer and a layer of the worktree's own (``<root>/.seeds/layers/<mission>+<worker>``)
  the upper: a worker's writes land in its upper layer, never in the seed.  Where this
  process may mount (root, or CAP_SYS_ADMIN).  The mount lives in this mount namespace and
  until the machine restarts: ``allocate`` of the same worktree mounts it again.
- ``copy``: a plain copy, the last resort.

``DAGRUNNER_SEED_SHARE`` picks one (``seed-share-unavailable`` when this machine cannot);
otherwise the first this machine can do, probed once under the seeds' folder.  Hard links are
never used: an in-place write through a link (root ignores a read-only mode) would reach the
seed and every other worktree.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode

HOW = ("reflink", "overlay", "copy")
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
MOUNT_TIMEOUT = 30.0


def choose(seeds_dir: Path, env: Mapping[str, str]) -> str:
    """The mechanism seeds reach worktrees by on this machine."""
    forced = env.get("DAGRUNNER_SEED_SHARE", "")
    if forced:
        if forced not in HOW:
            raise DagrunnerError(
                "seed-share-unavailable",
                f"DAGRUNNER_SEED_SHARE={forced!r} is not one of {', '.join(HOW)}",
                key="DAGRUNNER_SEED_SHARE",
                exit_code=ExitCode.ENVIRONMENT,
                hint="set it to reflink, overlay or copy, or unset it to let dagrunner choose",
            )
        if forced != "copy" and not can(forced, seeds_dir):
            raise DagrunnerError(
                "seed-share-unavailable",
                f"this machine cannot share seeds by {forced} under {seeds_dir}",
                key="DAGRUNNER_SEED_SHARE",
                exit_code=ExitCode.ENVIRONMENT,
                hint="`dagrunner doctor` says what it can; unset DAGRUNNER_SEED_SHARE",
            )
        return forced
    return next(how for how in HOW if how == "copy" or can(how, seeds_dir))


def can(how: str, seeds_dir: Path) -> bool:
    seeds_dir.mkdir(parents=True, exist_ok=True)
    return _probe(how, str(seeds_dir.resolve()))


@functools.cache
def _probe(how: str, folder: str) -> bool:
    probe = Path(folder) / f".probe-{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    try:
        if how == "reflink":
            (probe / "a").write_bytes(b"dagrunner reflink probe")
            return _clone(probe / "a", probe / "b")
        if how == "overlay" and not any(c in folder for c in ",:\\"):
            lower, merged = probe / "lower", probe / "merged"
            lower.mkdir()
            (lower / "f").write_bytes(b"probe")
            merged.mkdir()
            if not _mount(lower, probe / "up", merged):
                return False
            seen = (merged / "f").read_bytes() == b"probe"
            _unmount(merged)
            return seen
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _clone(source: Path, dest: Path) -> bool:
    """Whether ``dest`` was made as a reflink of ``source`` (False: the filesystem cannot)."""
    with source.open("rb") as src, dest.open("wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError as exc:
            if exc.errno in (
                errno.EOPNOTSUPP,
                errno.EXDEV,
                errno.EINVAL,
                errno.ENOTTY,
                errno.EPERM,
            ):
                dest.unlink()
                return False
            raise
    return True


def _reflink_copy(source: str, dest: str) -> None:
    if not _clone(Path(source), Path(dest)):
        shutil.copyfile(source, dest)
    shutil.copystat(source, dest)


def place(tree: Path, dest: Path, how: str, layer: Path) -> None:
    """Make ``dest`` (missing, its parent a real folder) this worktree's own copy of ``tree``."""
    if how == "overlay":
        if layer.exists():
            shutil.rmtree(layer)
        dest.mkdir()
        if not _mount(tree, layer, dest):
            dest.rmdir()
            raise DagrunnerError(
                "seed-share-unavailable",
                f"could not mount the seed's overlay on {dest}",
                where=str(dest),
                exit_code=ExitCode.ENVIRONMENT,
                hint="set DAGRUNNER_SEED_SHARE=copy",
            )
        return
    copy = _reflink_copy if how == "reflink" else shutil.copy2
    shutil.copytree(tree, dest, symlinks=True, copy_function=copy)


def remount(tree: Path, dest: Path, layer: Path) -> bool:
    """An overlay seed whose mount is gone (the machine restarted) mounted again on its own
    upper layer: what the worker wrote there is back.  Whether it had to."""
    if os.path.ismount(dest) or not layer.is_dir() or not dest.is_dir() or any(dest.iterdir()):
        return False
    return _mount(tree, layer, dest)


def _mount(lower: Path, layer: Path, merged: Path) -> bool:
    upper, work = layer / "upper", layer / "work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    try:
        done = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
            capture_output=True,
            timeout=MOUNT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _unmount(point: Path) -> None:
    done = subprocess.run(
        ["umount", str(point)], capture_output=True, timeout=MOUNT_TIMEOUT, check=False
    )
    if done.returncode != 0:  # busy (a process still in it): detached now, gone when it leaves
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def _mountinfo() -> str:
    """The kernel's table of the mounts this process sees ('' where it cannot be read)."""
    try:
        with open("/proc/self/mountinfo", "rb") as info:
            return info.read().decode("utf-8", "surrogateescape")
    except OSError:
        return ""


def _overlays() -> Iterator[tuple[Path, str]]:
    """(mount point, upperdir) of every overlay mount this process sees."""
    for line in _mountinfo().splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] != "overlay":
            continue
        options = dict(o.partition("=")[::2] for o in tail[2].split(","))
        yield Path(_unescape(fields[4])), options.get("upperdir", "")


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    return (
        text.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")
    )


def lower_in_use(trees: set[Path]) -> set[Path]:
    """Which of ``trees`` (stored seeds) a live overlay mount has as its lower layer."""
    found: set[Path] = set()
    text = _mountinfo()
    for tree in trees:
        if f"lowerdir={tree}," in text or f"lowerdir={tree}:" in text:
            found.add(tree)
    return found


def release(path: Path, layers: Path) -> list[str]:
    """Unmount every overlay under ``path`` (a worktree about to be removed or pooled) and
    delete its upper layer when it is one of ``layers``; the mount points released."""
    released = []
    top = path.resolve() if path.exists() else path
    for point, upper in sorted(_overlays(), key=lambda m: -len(str(m[0]))):
        if point != top and top not in point.parents:
            continue
        _unmount(point)
        released.append(str(point))
        layer = Path(upper).parent if upper else None
        if layer is not None and layers.resolve() in layer.parents:
            shutil.rmtree(layer, ignore_errors=True)
    return released
