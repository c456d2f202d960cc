"""The run's source, shipped to machines that share nothing with the submitter.

Submitter side, ``pack``: the checkout's full state (HEAD plus staged,
unstaged and untracked files; gitignored ones excepted -- ``statetree``) as
one parentless commit, and a ``git bundle`` of it.  The bundle is made from a
throwaway repository that borrows the checkout's objects (``alternates``), so
no ref of the user's repository is written.

Worker side, ``materialise``: exactly that commit, checked out once per
machine and commit under the worker's cache root (``remote/trees/<commit>``),
reused by every later gate and run that ships the same state.  Made under a
lock (threads and worker processes of one machine share it) and marked
complete only when whole, so a worker that died half-way is redone, never
half-used.  A gate never runs anywhere else: when the checkout cannot be made
the caller fails the attempt (``ShipError``).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dagrunner.fsutil import atomic_write, locked
from dagrunner.git import IDENTITY, git
from dagrunner.statetree import state_tree

REF = "refs/dagrunner/ship"


class ShipError(Exception):
    """The source could not be packed or checked out (the message says where and why)."""


@dataclass(frozen=True)
class Shipment:
    commit: str  # a parentless commit of the checkout's full state
    bundle: bytes  # a git bundle holding it, under ``REF``


def pack(checkout: Path) -> Shipment:
    """The full state of ``checkout`` as a commit and a bundle of it."""
    tree = state_tree(checkout)
    commit = git(
        ["commit-tree", "--no-gpg-sign", tree, "-m", "dagrunner: the run's source"],
        cwd=checkout,
        env=IDENTITY,
    ).text
    objects = git(["rev-parse", "--path-format=absolute", "--git-path", "objects"], cwd=checkout)
    with tempfile.TemporaryDirectory(prefix="dagrunner-ship-") as tmp:
        side = Path(tmp) / "side.git"
        git(["init", "-q", "--bare", str(side)], cwd=Path(tmp))
        (side / "objects" / "info" / "alternates").write_text(objects.text + "\n")
        git(["update-ref", REF, commit], cwd=side)
        bundle = Path(tmp) / "source.bundle"
        git(["bundle", "create", "-q", str(bundle), REF], cwd=side)
        return Shipment(commit, bundle.read_bytes())


def ready(commit: str, root: Path) -> Path | None:
    """The complete checkout of ``commit`` under ``root``, if this machine has it."""
    checkout = root / "trees" / commit
    return checkout if (root / "trees" / f"{commit}.complete").exists() else None


def materialise(commit: str, bundle: bytes, root: Path) -> Path:
    """A checkout of ``commit`` under ``root`` (made from ``bundle`` when not there yet)."""
    trees = root / "trees"
    done = trees / f"{commit}.complete"
    checkout = trees / commit
    if done.exists():
        return checkout
    store = root / "store.git"
    with locked(root / "ship.lock"):
        if done.exists():
            return checkout
        try:
            if not (store / "HEAD").exists():
                store.mkdir(parents=True, exist_ok=True)
                git(["init", "-q", "--bare", str(store)], cwd=root)
            if checkout.exists():  # left by a worker that died half-way
                git(["worktree", "remove", "--force", str(checkout)], cwd=store, check=False)
                shutil.rmtree(checkout, ignore_errors=True)
                git(["worktree", "prune"], cwd=store, check=False)
            with tempfile.NamedTemporaryFile(dir=root, suffix=".bundle") as file:
                file.write(bundle)
                file.flush()
                git(
                    ["fetch", "-q", "--no-tags", file.name, f"{REF}:refs/trees/{commit}"], cwd=store
                )
            git(["worktree", "add", "-q", "--detach", str(checkout), commit], cwd=store)
        except Exception as exc:  # git's own message says what; the caller names the worker
            raise ShipError(f"cannot check out the run's source {commit[:12]}: {exc}") from exc
        atomic_write(done, commit.encode())
    return checkout
