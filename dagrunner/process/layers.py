"""A gate's own layer over an envelope's tree: what it writes, only the gates that need it see.

Gates share the tree they judge.  Before layers, what one gate wrote that git does not
track (a build's generated ``_version.py``, a ``mypy.ini``, a ``.pth`` in the tree's venv
seed) stayed there for every gate that ran after it, so a verdict could hang on which gate
ran first, and a gate that runs an envelope's code could write what makes a later check
pass.  So in an envelope's tree (the integration queue: ``RunOptions.layered``) each gate
runs on an overlay of the tree: the tree, and each mount inside it (an overlay seed), is a
read-only lower layer, and a folder of the gate's own is the upper one.  Whatever the gate
writes lands there, never in the tree.  A gate that ``needs`` others sees their layers
beneath its own (the nearest need on top); any other sees the tree as it was checked out.
When the tree's run ends, its layers go.

The runner mounts the overlays in its own mount namespace (root, or ``CAP_SYS_ADMIN``:
``available``) in the run's sandbox folder, which no gate sees (the private ``/tmp``
covers it), and the gate's view binds the merged folder at the tree's path
(``process.view.View.sources``): the gate's paths, its observed reads (a mount of its own)
and its JUnit file are the tree's as before.  Where this process may not mount, gates
share the tree's scratch as before; ``doctor`` says which, and docs/security.md.

A run holds a lock on its layers' folder while it lives.  A run killed outright (SIGKILL, the
OOM killer) drops nothing: its overlays stayed mounted over the slot, and its upper folders
in the temporary folder, for as long as the machine ran.  The next layered run unmounts and
removes the layers whose lock no live run holds (``sweep``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagrunner.errors import DagrunnerError
from dagrunner.process import share
from dagrunner.process.contain import detect

MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8
# what an overlay's options cannot carry in a folder's name (``,``, ``:`` and ``\\`` are
# escaped: ``share.overlay``)
UNSAFE = ("\n",)
LOCK = ".lock"  # in a run's layers' folder: held while the run lives


class LayerError(OSError):
    """An overlay could not be mounted for a gate: the gate cannot run on its own layer."""


@dataclass(frozen=True)
class Layer:
    """One gate's layer over ``tree``: the merged view at ``merged`` (mounted while the gate
    runs), and an upper folder for the tree and for each mount inside it (``parts``: ""
    for the tree, else the mount's path relative to it)."""

    tree: Path
    folder: Path
    parts: tuple[str, ...]

    @property
    def merged(self) -> Path:
        return self.folder / "merged"

    def upper(self, part: str) -> Path:
        return self.folder / str(self.parts.index(part)) / "upper"


@functools.cache
def available() -> bool:
    """Whether this process can mount a gate's overlay in the temporary folder, probed once."""
    if os.geteuid() != 0:
        return False  # an ordinary user's overlay needs a user namespace of its own
    with tempfile.TemporaryDirectory(prefix="dagrunner-layer-probe-") as tmp:
        return share.can("overlay", Path(tmp))


def in_force(asked: bool = True, *, local: bool = True) -> bool:
    """Whether a run that asks for layers (``RunOptions.layered``) gets them: its gates run
    here (``local``: a cluster's run on its workers' copies), with views, and this process
    can mount an overlay.  The one test: the gates' layers, and the cache's mark on passes."""
    return asked and local and detect().views and available()


def mount(tree: Path, folder: Path, below: Sequence[Layer] = ()) -> Layer:
    """A new layer for one gate over ``tree`` at ``folder`` (made now), its overlays mounted:
    ``below`` are the layers of the gate's needs, the nearest first.  ``LayerError`` when
    the kernel refuses; nothing is left mounted then."""
    tree = Path(os.path.realpath(tree))
    inside = sorted(
        {p for p in share.mount_points(Path("/proc/self/mountinfo")) if p.startswith(f"{tree}/")},
        key=lambda p: p.count("/"),
    )
    parts = ("", *(os.path.relpath(p, tree) for p in inside))
    layer = Layer(tree=tree, folder=folder, parts=parts)
    if any(c in str(folder) + str(tree) + "".join(parts) for c in UNSAFE):
        raise LayerError(0, f"{tree} or a mount in it has a name an overlay cannot take")
    folder.mkdir(parents=True)
    layer.merged.mkdir()
    try:
        for part in parts:
            lowers = [b.upper(part) for b in below if part in b.parts]
            lowers.append(tree / part if part else tree)
            # a mount inside the tree goes on its folder in the merged view, opened without
            # following a link (a need's layer may hold a link there, to anywhere); no inode
            # index: a need's overlay not yet released (its namespace goes a moment after
            # the gate) holds its upper, which a dependent takes as a lower layer, and a
            # kernel indexing by default refused that mount as busy
            with share.beneath(layer.merged, part) as point:
                error = share.overlay(lowers, layer.upper(part).parent, point, ",index=off")
                if error:
                    raise LayerError(error, f"overlay on {tree / part}: {os.strerror(error)}")
    except DagrunnerError as exc:  # a link where a mount of the tree is
        discard(layer)
        raise LayerError(0, exc.message) from None
    except BaseException:
        discard(layer)
        raise
    return layer


def unmount(layer: Layer) -> None:
    """The layer's overlays unmounted, each inside the merged one with it (a lazy unmount
    takes the whole tree of mounts: no path a gate could have turned into a link is
    followed); its upper folders stay."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(layer.merged).encode(), MNT_DETACH | UMOUNT_NOFOLLOW)


def discard(layer: Layer) -> None:
    """The layer unmounted and removed."""
    unmount(layer)
    with contextlib.suppress(OSError):
        shutil.rmtree(layer.folder)


class Layers:
    """The layers of one run's gates, under ``folder``: each gate's mounted while it runs,
    those of the gates that passed kept for the gates that need them, all gone at ``drop``."""

    def __init__(self, folder: Path, runs: Iterable[Path] = ()) -> None:
        """``runs``: the folders of other runs whose layers a killed run left (``sweep``)."""
        sweep(runs, folder.name)
        self.folder = folder
        self.passed: dict[tuple[Path, str], Layer] = {}
        self.mounted: set[Layer] = set()
        self.made = itertools.count()
        staged = folder.with_name(f".{folder.name}-new")  # locked before a sweep can see it
        staged.mkdir(parents=True)
        self.lock: int | None = os.open(staged / LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        staged.rename(folder)

    def open(self, tree: Path, node: str, needs: Sequence[str]) -> Layer:
        """``node``'s layer over ``tree``, over the kept layers of ``needs`` (nearest first)."""
        below = [self.passed[(tree, n)] for n in needs if (tree, n) in self.passed]
        layer = mount(tree, self.folder / str(next(self.made)), below)
        self.mounted.add(layer)
        return layer

    def close(self, tree: Path, node: str, layer: Layer, passed: bool) -> None:
        """The gate has ended: its layer unmounted, kept for its dependents when it passed."""
        self.mounted.discard(layer)
        if passed:
            unmount(layer)
            self.passed[(tree, node)] = layer
        else:
            discard(layer)

    def drop(self) -> None:
        for layer in [*self.mounted, *self.passed.values()]:
            discard(layer)
        self.mounted.clear()
        self.passed.clear()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


def sweep(runs: Iterable[Path], name: str) -> None:
    """Each of ``runs`` whose layers' folder (``name`` in it) is locked by no live run (it
    was killed): its overlays unmounted, then the run's folder removed -- not while any mount
    is left under it (nothing is removed through one)."""
    for run in runs:
        try:
            info = os.lstat(run)  # a folder of this user's (/tmp is anyone's): never a link
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            held = os.open(run / name / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # no layers, or being made, or gone
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(held)
            continue  # its run lives
        try:
            inside = f"{os.path.realpath(run / name)}/"
            libc = ctypes.CDLL(None, use_errno=True)
            for point in _points(inside):  # the shallowest first: a lazy unmount takes all
                libc.umount2(point.encode(), MNT_DETACH | UMOUNT_NOFOLLOW)
            if not _points(inside):
                shutil.rmtree(run, ignore_errors=True)
        finally:
            os.close(held)


def _points(inside: str) -> list[str]:
    """The mount points of this namespace under the folder ``inside`` (ending in a slash)."""
    found = share.mount_points(Path("/proc/self/mountinfo"))
    return sorted((p for p in found if p.startswith(inside)), key=lambda p: p.count("/"))
