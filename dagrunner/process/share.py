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

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import folder_beneath, open_regular

HOW = ("reflink", "overlay", "copy")
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
MOUNT_TIMEOUT = 30.0
MNT_DETACH = 2  # the descriptor that names the mount holds it: detach, gone when closed


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
        if how == "overlay":
            lower, merged = probe / "lower", probe / "merged"
            lower.mkdir()
            (lower / "f").write_bytes(b"probe")
            merged.mkdir()
            with beneath(probe, "merged") as point:
                if not _mount(lower, probe / "up", point):
                    return False
            seen = (merged / "f").read_bytes() == b"probe"
            _unmount(merged)
            return seen
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _clone(source: Path, dest: Path) -> bool:
    """Whether ``dest`` was made as a reflink of ``source`` (False: the filesystem cannot)."""
    with open_regular(source) as (src, _info), dest.open("wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src)
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


def _copy_file(source: str, dest: str, *, reflink: bool) -> None:
    """``source``, a file of a stored seed, copied to ``dest`` (new) -- read as untrusted
    code's file (``open_regular``): what is not a regular file (a FIFO, a socket, a device a
    seed stored before they were dropped) is skipped, never opened."""
    if not stat.S_ISREG(os.lstat(source).st_mode):
        return
    if reflink and _clone(Path(source), Path(dest)):
        shutil.copystat(source, dest, follow_symlinks=False)
        return
    with open_regular(source) as (src, _info):
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while os.sendfile(out, src, None, 1 << 24):
                pass
        finally:
            os.close(out)
    shutil.copystat(source, dest, follow_symlinks=False)


def clone_or_copy(source: str, dest: str) -> None:
    """A reflink of ``source`` where the filesystem can make one, else a copy (regular files
    only: ``_copy_file``)."""
    _copy_file(source, dest, reflink=True)


def place(
    tree: Path, worktree: Path, rel: str, how: str, layer: Path, ready: Callable[[Path], None]
) -> None:
    """Make ``worktree/rel`` (missing, every folder above it real) this worktree's own copy
    of ``tree``, finished by ``ready(copy)``: made beside the store, readied, and renamed
    in, or mounted and readied, through descriptors opened without following a link
    (``beneath``), never by name."""
    parent_rel, _, leaf = rel.rpartition("/")
    with beneath(worktree, parent_rel) as parent:
        if how == "overlay":
            if layer.exists():
                shutil.rmtree(layer)
            os.mkdir(leaf, dir_fd=parent)
            with beneath(worktree, rel) as point:
                mounted = _mount(tree, layer, point)
            if mounted:  # opened again: the descriptor from before the mount is beneath it
                with beneath(worktree, rel) as merged:
                    ready(Path(f"/proc/self/fd/{merged}"))
                return
            os.rmdir(leaf, dir_fd=parent)
            raise DagrunnerError(
                "seed-share-unavailable",
                f"could not mount the seed's overlay on {worktree / rel}",
                where=str(worktree / rel),
                exit_code=ExitCode.ENVIRONMENT,
                hint="set DAGRUNNER_SEED_SHARE=copy",
            )
        staged = layer.parent / f".{layer.name}.{uuid.uuid4().hex[:8]}"  # same filesystem
        staged.parent.mkdir(parents=True, exist_ok=True)
        copy = functools.partial(_copy_file, reflink=how == "reflink")
        try:
            shutil.copytree(tree, staged, symlinks=True, copy_function=copy)
            ready(staged)
            try:
                os.rename(staged, leaf, dst_dir_fd=parent)  # fails if anything is there now
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # another filesystem
                shutil.copytree(staged, worktree / rel, symlinks=True, copy_function=copy)
        finally:
            shutil.rmtree(staged, ignore_errors=True)


def remount(tree: Path, worktree: Path, rel: str, layer: Path) -> bool:
    """An overlay seed whose mount is gone (the machine restarted) mounted again on its own
    upper layer: what the worker wrote there is back.  Whether it had to.  The folder is
    opened component by component without following a link (a worker's link there is
    ``path-occupied``), and mounted through that descriptor."""
    if not layer.is_dir():
        return False
    with beneath(worktree, rel) as point:
        parent = os.open("..", os.O_PATH | os.O_DIRECTORY, dir_fd=point)
        try:
            if os.fstat(point).st_dev != os.fstat(parent).st_dev:
                return False  # mounted already
        finally:
            os.close(parent)
        listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=point)
        try:
            if os.listdir(listing):
                return False
        finally:
            os.close(listing)
        return _mount(tree, layer, point)


@contextlib.contextmanager
def beneath(root: Path, rel: str) -> Iterator[int]:
    """An ``O_PATH`` descriptor of ``root/rel`` (``root`` trusted: a worktree dagrunner made),
    each component opened ``O_NOFOLLOW``: a link anywhere on the way is ``path-occupied``."""
    try:
        fd = folder_beneath(root, [p for p in rel.split("/") if p], os.O_PATH)
    except OSError as exc:
        raise DagrunnerError(
            "path-occupied",
            f"{root / rel} is not a folder of the worktree's own ({exc.strerror}: "
            "a link, a file, or missing)",
            where=str(root / rel),
            exit_code=ExitCode.REFUSED,
            hint="remove what is there (a seed's folder is dagrunner's to make)",
        ) from None
    try:
        yield fd
    finally:
        os.close(fd)


def _mount(lower: Path, layer: Path, point: int) -> bool:
    return overlay([lower], layer, point) == 0


def overlay(lowers: Sequence[Path], layer: Path, point: int, extra: str = "") -> int:
    """An overlay mounted on the folder ``point`` (an ``O_PATH`` descriptor), by mount(2) on
    its ``/proc/self/fd`` name (the kernel resolves that to the very folder): ``lowers``
    read-only, the first on top, ``layer``'s ``upper`` (and ``work``) the writable layer;
    ``extra`` more options.  0, or mount(2)'s error number."""
    upper, work = layer / "upper", layer / "work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    below = ":".join(map(_option, lowers))
    options = f"lowerdir={below},upperdir={_option(upper)},workdir={_option(work)}{extra}"
    libc = ctypes.CDLL(None, use_errno=True)
    target = f"/proc/self/fd/{point}".encode()
    return (
        0
        if libc.mount(b"overlay", target, b"overlay", 0, options.encode()) == 0
        else ctypes.get_errno()
    )


def _option(path: Path) -> str:
    """A folder as an overlay's mount options name it: ``,`` separates options and ``:``
    the lower folders, so both (and the escape, ``\\``) are escaped as the kernel reads them."""
    return str(path).replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


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


def _overlays() -> Iterator[tuple[Path, str, tuple[str, ...]]]:
    """(mount point, upperdir, lowerdirs) of every overlay mount this process sees: the
    table shows the options as mounted (``_option``), a ``,`` in them escaped octal."""
    for line in _mountinfo().splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] != "overlay":
            continue
        options = {k: _unescape(v) for k, _, v in (o.partition("=") for o in tail[2].split(","))}
        upper = _folders(options.get("upperdir", ""))
        yield (
            Path(_unescape(fields[4])),
            upper[0] if upper else "",
            _folders(options.get("lowerdir", "")),
        )


def _folders(option: str) -> tuple[str, ...]:
    """The folders an overlay's option names (``_option`` undone): ``:`` between them."""
    found, part, escaped = [], "", False
    for char in option:
        if escaped:
            part, escaped = part + char, False
        elif char == "\\":
            escaped = True
        elif char == ":":
            found.append(part)
            part = ""
        else:
            part += char
    return (*found, part) if option else ()


def mount_points(mountinfo: Path) -> list[str]:
    """The mount points in a namespace's ``mountinfo`` (a ``/proc/PID/mountinfo``), each once."""
    text = mountinfo.read_bytes().decode("utf-8", "surrogateescape")
    return list(dict.fromkeys(_unescape(line.split(" ")[4]) for line in text.splitlines()))


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    return (
        text.encode("utf-8", "surrogateescape")
        .decode("unicode_escape")
        .encode("latin-1")
        .decode("utf-8", "surrogateescape")
    )


def lower_in_use(trees: set[Path]) -> set[Path]:
    """Which of ``trees`` (stored seeds) a live overlay mount has as its lower layer."""
    lowers = {lower for _, _, below in _overlays() for lower in below}
    return {tree for tree in trees if str(tree) in lowers}


def release(path: Path, layers: Path) -> list[str]:
    """Unmount every overlay under ``path`` (a worktree about to be removed or pooled) and
    delete its upper layer when it is one of ``layers``; the mount points released."""
    released = []
    top = path.resolve() if path.exists() else path
    for point, upper, _ in sorted(_overlays(), key=lambda m: -len(str(m[0]))):
        if point != top and top not in point.parents:
            continue
        try:  # through the folder opened beneath the worktree, never by a name it controls
            with beneath(top, point.relative_to(top).as_posix()) as held:
                gone = ctypes.CDLL(None, use_errno=True).umount2(
                    f"/proc/self/fd/{held}".encode(), MNT_DETACH
                )
        except DagrunnerError:
            continue  # not where the table says: a link on the way; left mounted, retained
        if gone != 0:
            continue
        released.append(str(point))
        layer = Path(upper).parent if upper else None
        if layer is not None and layers.resolve() in layer.parents:
            shutil.rmtree(layer, ignore_errors=True)
    return released
