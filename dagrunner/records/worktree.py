"""Records of a worktree's life that cross module boundaries: its status and its export.

Typed here, JSON only at the edges: ``to_json()`` gives exactly the shapes the
CLI's ``--json`` and the Python API have always returned (docs/worktrees.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar


class Jsonable(Protocol):
    def to_json(self) -> dict[str, Any]: ...


P = ParamSpec("P")
R = TypeVar("R", bound=Jsonable)


def as_json(typed: Callable[P, R]) -> Callable[P, dict[str, Any]]:
    """The JSON twin of a function that returns a record: the public API and ``--json``."""

    @functools.wraps(typed)
    def twin(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        return typed(*args, **kwargs).to_json()

    return twin


@dataclass(frozen=True, kw_only=True)
class SeedUse:
    """A seed in a worktree: its folder, its key in the store, and how it got there."""

    path: str
    key: str
    how: str  # reflink, overlay or copy (process/share.py)
    built: bool = False  # this allocation built it (the store had no seed of that key)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "key": self.key, "how": self.how, "built": self.built}


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """A worker's worktree, as ``allocate`` made, restored or found it."""

    id: str
    path: str
    branch: str
    base: str
    root: str
    session: str | None
    created: str | None
    reused: bool  # it existed already (same mission/worker): allocation is idempotent
    pooled: bool = False  # made new from the pool rather than ``git worktree add``
    copied: tuple[str, ...] = ()  # files .worktreeinclude copied in (new ones only)
    restored: bool = False  # its folder had vanished; it was made again from its branch
    main_checkout_dirty: bool | None = None  # None: a bare repository
    ports: tuple[int, ...] = ()  # leased to it ([worktrees] ports)
    seeds: tuple[SeedUse, ...] = ()  # its dependency seeds ([[worktrees.seed]])

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "path": self.path,
            "branch": self.branch,
            "base": self.base,
            "root": self.root,
            "session": self.session,
            "created": self.created,
            "reused": self.reused,
        }
        if not self.reused:
            body.update(pooled=self.pooled, copied=list(self.copied))
        if self.restored:
            body["restored"] = True
        body["main_checkout_dirty"] = self.main_checkout_dirty
        if self.main_checkout_dirty:
            body["note"] = (
                "the main checkout has uncommitted work; it is not in this worktree's base"
            )
        body["ports"] = list(self.ports)
        body["seeds"] = [seed.to_json() for seed in self.seeds]
        return body


@dataclass(frozen=True, kw_only=True)
class WorktreeStatus:
    """One recorded worktree now: its place, its claim, what it holds, whether it landed."""

    id: str
    path: str
    branch: str
    base: str
    session: str | None
    created: str | None
    last_activity: str | None
    target: str
    retained: str | None
    missing: bool
    # None when the directory is missing:
    head: str | None = None
    clean: bool | None = None
    staged: int = 0
    unstaged: int = 0
    untracked: int = 0
    unmerged: int = 0
    ahead: int | None = None
    behind: int | None = None
    diffstat: str = ""
    rebase_in_progress: bool = False
    merge_in_progress: bool = False
    integrated: bool | None = None
    integrated_reason: str = ""
    ports: tuple[int, ...] = ()  # leased to it ([worktrees] ports)
    half_removed: bool = False  # its folder is there without its .git (a removal cut short)

    @property
    def operation_in_progress(self) -> bool:
        return self.rebase_in_progress or self.merge_in_progress

    @property
    def landing(self) -> str:
        """What of its work is on the target, in a word: ``landed`` only when all of it is
        (``nothing-committed``: its head is still its base, so nothing of it is anywhere)."""
        if self.missing:
            return "missing"
        if self.retained and "conflict" in self.retained:
            return "conflict"
        if not self.integrated:
            return "committed-not-landed"
        if not self.clean:
            return "uncommitted"
        if self.head is not None and self.head == self.base:
            return "nothing-committed"
        return "landed"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "path": self.path,
            "branch": self.branch,
            "base": self.base,
            "session": self.session,
            "created": self.created,
            "last_activity": self.last_activity,
            "target": self.target,
            "retained": self.retained,
        }
        if self.missing:
            gone: dict[str, Any] = {"missing": True, "clean": None, "integrated": None, "ports": []}
            return {**body, **gone, **({"half_removed": True} if self.half_removed else {})}
        return {
            **body,
            "missing": False,
            "head": self.head,
            "clean": self.clean,
            "staged": self.staged,
            "unstaged": self.unstaged,
            "untracked": self.untracked,
            "unmerged": self.unmerged,
            "ahead": self.ahead,
            "behind": self.behind,
            "diffstat": self.diffstat,
            "rebase_in_progress": self.rebase_in_progress,
            "merge_in_progress": self.merge_in_progress,
            "integrated": self.integrated,
            "integrated_reason": self.integrated_reason,
            "ports": list(self.ports),
        }


@dataclass(frozen=True, kw_only=True)
class ExportSummary:
    """What ``worktree export`` wrote: the envelope's file and its identity."""

    id: str
    file: str
    worktree: str
    empty: bool
    base: str
    head: str
    tree: str
    changed_files: int
    diff_bytes: int
    diff_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "file": self.file,
            "worktree": self.worktree,
            "empty": self.empty,
            "base": self.base,
            "head": self.head,
            "tree": self.tree,
            "changed_files": self.changed_files,
            "diff_bytes": self.diff_bytes,
            "diff_sha256": self.diff_sha256,
        }
