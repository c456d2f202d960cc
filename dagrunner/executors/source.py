"""The run's source, shipped to machines that share nothing with the submitter.

Submitter side: ``source_commit`` makes the checkout's full state (HEAD plus
staged, unstaged and untracked files; gitignored ones excepted --
``statetree``) one parentless commit; ``bundle`` packs it as a ``git bundle``,
leaving out what the workers already hold (``exclude``: commits of earlier
runs), so a one-file change ships one blob and its trees.  The bundle is made
from a throwaway repository that borrows the checkout's objects
(``alternates``): no ref of the user's repository is written.

Worker side: checkouts live in *slots* under the worker's remote root
(``slots/<n>``, each a worktree of one object store, ``store.git``), each
marked with the commit it holds once complete (``slots/<n>.commit``).  A gate
holds its slot's lock shared while it runs (``using``); ``materialise`` moves
a slot nobody uses to the new commit with an incremental ``git checkout`` and
``git clean`` (only changed files are written), or makes a new slot when all
are busy.  All of it under one lock per machine, and marked complete only
when whole: a worker that died half-way leaves a slot that is redone, never
half-used.  A gate never runs anywhere else: when the checkout cannot be made
the caller fails the attempt (``ShipError``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagrunner.files import atomic_write, locked
from dagrunner.git.command import IDENTITY, git
from dagrunner.git.statetree import state_tree

REF = "refs/dagrunner/ship"


class ShipError(Exception):
    """The source could not be packed or checked out (the message says where and why)."""


@dataclass(frozen=True)
class Shipment:
    commit: str  # a parentless commit of the checkout's full state
    bundle: bytes  # a git bundle holding it under ``REF`` (maybe less what workers hold)


# A fixed date: one state is one commit, whenever it is packed, so that a worker that
# holds it from an earlier run is sent nothing (with the clock's date, only runs within
# the same second would find it).
FIXED_DATE = {"GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000"}


def source_commit(checkout: Path) -> str:
    """The full state of ``checkout`` as a parentless commit, the same for the same state."""
    tree = state_tree(checkout)
    return git(
        ["commit-tree", "--no-gpg-sign", tree, "-m", "dagrunner: the run's source"],
        cwd=checkout,
        env={**IDENTITY, **FIXED_DATE},
    ).text


def bundle(checkout: Path, commit: str, exclude: Sequence[str] = ()) -> bytes:
    """A bundle of ``commit`` without the objects of ``exclude`` (which must exist here)."""
    objects = git(["rev-parse", "--path-format=absolute", "--git-path", "objects"], cwd=checkout)
    with tempfile.TemporaryDirectory(prefix="dagrunner-ship-") as tmp:
        side = Path(tmp) / "side.git"
        git(["init", "-q", "--bare", str(side)], cwd=Path(tmp))
        (side / "objects" / "info" / "alternates").write_text(objects.text + "\n")
        git(["update-ref", REF, commit], cwd=side)
        out = Path(tmp) / "source.bundle"
        git(["bundle", "create", "-q", str(out), REF, *(f"^{c}" for c in exclude)], cwd=side)
        return out.read_bytes()


def known_here(checkout: Path, commits: Sequence[str]) -> list[str]:
    """Those of ``commits`` that this repository has (an earlier run made them here): one
    ``cat-file --batch-check`` for all of them."""
    if not commits:
        return []
    asked = "".join(f"{c}^{{commit}}\n" for c in commits).encode()
    answers = git(["cat-file", "--batch-check"], cwd=checkout, input=asked).text.splitlines()
    return [
        c for c, answer in zip(commits, answers, strict=True) if not answer.endswith(" missing")
    ]


# -- worker side ---------------------------------------------------------------------------


def _slots(root: Path) -> list[Path]:
    folder = root / "slots"
    if not folder.is_dir():
        return []
    return sorted(
        (p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )


def _marker(slot: Path) -> Path:
    return slot.with_name(f"{slot.name}.commit")


def _holds(slot: Path) -> str:
    try:
        return _marker(slot).read_text().strip()
    except OSError:
        return ""


def held(root: Path) -> list[str]:
    """The commits this machine has complete checkouts of."""
    return [c for c in (_holds(s) for s in _slots(root)) if c]


def store_of(slot: Path) -> Path:
    """The object store that the checkout in ``slot`` is a worktree of."""
    return slot.parent.parent / "store.git"


def ready(commit: str, root: Path) -> Path | None:
    """A complete checkout of ``commit`` under ``root``, if this machine has one."""
    return next((s for s in _slots(root) if _holds(s) == commit), None)


@contextlib.contextmanager
def using(slot: Path, commit: str) -> Iterator[bool]:
    """Hold ``slot`` for a gate (shared): True when it still holds ``commit``.  The lock
    file's time is the slot's last use (``prune`` drops the least recently used)."""
    lock = slot.with_name(f"{slot.name}.lock")
    with lock.open("a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            os.utime(lock)
        yield _holds(slot) == commit


def materialise(commit: str, bundle_bytes: bytes, root: Path) -> Path:
    """A checkout of ``commit`` under ``root`` (made from ``bundle_bytes`` when not there)."""
    found = ready(commit, root)
    if found is not None:
        return found
    store = root / "store.git"
    with locked(root / "ship.lock"):
        found = ready(commit, root)
        if found is not None:
            return found
        try:
            if not (store / "HEAD").exists():
                store.mkdir(parents=True, exist_ok=True)
                git(["init", "-q", "--bare", str(store)], cwd=root)
            with tempfile.NamedTemporaryFile(dir=root, suffix=".bundle") as file:
                file.write(bundle_bytes)
                file.flush()
                git(
                    ["fetch", "-q", "--no-tags", file.name, f"{REF}:refs/trees/{commit}"], cwd=store
                )
            return _into_slot(store, root, commit)
        except Exception as exc:  # git's own message says what; the caller names the worker
            raise ShipError(f"cannot check out the run's source {commit[:12]}: {exc}") from exc


def _into_slot(store: Path, root: Path, commit: str) -> Path:
    """Move a slot nobody uses to ``commit`` (only changed files are written), else make one."""
    for slot in _slots(root):
        with slot.with_name(f"{slot.name}.lock").open("a+b") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a gate runs in it
            _marker(slot).unlink(missing_ok=True)
            moved = git(["checkout", "-q", "-f", "--detach", commit], cwd=slot, check=False)
            if moved.returncode != 0:
                continue  # a damaged slot: leave it unmarked, try the next
            git(["clean", "-q", "-ffdx"], cwd=slot)
            atomic_write(_marker(slot), commit.encode())
            return slot
    slot = root / "slots" / str(max((int(s.name) for s in _slots(root)), default=0) + 1)
    slot.parent.mkdir(parents=True, exist_ok=True)
    git(["worktree", "add", "-q", "--detach", str(slot), commit], cwd=store)
    atomic_write(_marker(slot), commit.encode())
    return slot


# -- pruning (worker side) -----------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    """What ``prune`` did to one machine's store (bytes on disk, as ``du`` counts them)."""

    removed: tuple[str, ...]  # the commits whose checkouts went
    dropped_refs: int  # sources no checkout holds, dropped from the object store
    busy: int  # checkouts kept because a gate runs in them
    size_before: int
    size_after: int


def prune(root: Path, *, max_age: float, max_size: int, full: bool = False) -> Pruned:
    """Bound the store under ``root``: checkouts not used for ``max_age`` seconds go, then
    the least recently used until the whole is at most ``max_size`` bytes; sources no
    checkout holds leave the object store.  Checkouts in use are never touched.  ``full``
    (an explicit ``cache prune``) also repacks the store now, dropping unreachable objects;
    otherwise git's own ``gc --auto`` does that in time."""
    store = root / "store.git"
    if not (store / "HEAD").exists():
        return Pruned((), 0, 0, _du(root), _du(root))
    with locked(root / "ship.lock"):
        before = _du(root)
        now = time.time()
        idle: list[tuple[float, int, Path]] = []
        busy = 0
        with contextlib.ExitStack() as locks:
            for slot in _slots(root):
                handle = locks.enter_context(slot.with_name(f"{slot.name}.lock").open("a+b"))
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    busy += 1
                    continue
                idle.append((os.fstat(handle.fileno()).st_mtime, _du(slot), slot))
            total, removed = before, []
            for used, size, slot in sorted(idle, key=lambda entry: entry[0]):
                if now - used <= max_age and total <= max_size:
                    break
                removed.append(_holds(slot) or slot.name)
                _marker(slot).unlink(missing_ok=True)
                git(["worktree", "remove", "--force", "--force", str(slot)], cwd=store, check=False)
                slot.with_name(f"{slot.name}.lock").unlink(missing_ok=True)
                total -= size
        dropped = _drop_unheld(store, set(held(root)))
        if dropped or removed:
            git(["worktree", "prune"], cwd=store, check=False)
            if full or total > max_size:
                git(["gc", "-q", "--prune=now"], cwd=store, check=False)
            else:
                git(["gc", "-q", "--auto"], cwd=store, check=False)
        return Pruned(tuple(removed), dropped, busy, before, _du(root))


def _drop_unheld(store: Path, kept: set[str]) -> int:
    """Delete the source refs (``refs/trees/<commit>``) that no checkout holds."""
    refs = git(["for-each-ref", "--format=%(refname)", "refs/trees/"], cwd=store).text.split()
    gone = [ref for ref in refs if ref.rsplit("/", 1)[-1] not in kept]
    if gone:
        lines = "".join(f"delete {ref}\n" for ref in gone)
        git(["update-ref", "--stdin"], cwd=store, input=lines.encode())
    return len(gone)


def _du(path: Path) -> int:
    """Bytes ``path`` takes on disk (each inode once; symlinks not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
    return total
