"""What the worktrees under the cache root hold on disk, and the budget an allocation keeps.

Sizes are allocated blocks (``st_blocks``), each inode counted once.  A worktree's
``unique_bytes`` are those of the files no other place holds: a file hard-linked from
elsewhere (another worktree, the pool, a store) is in its ``bytes`` but not its
``unique_bytes``.  (Reflinked extents look unique: the filesystem does not say they are
shared without a per-file query.)  The root's total counts every inode under it once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dagrunner.errors import DagrunnerError, ExitCode

if TYPE_CHECKING:
    from dagrunner.worktrees.allocate import Context


@dataclass(frozen=True)
class Usage:
    bytes: int
    unique_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"bytes": self.bytes, "unique_bytes": self.unique_bytes}


@dataclass(frozen=True)
class DiskReport:
    worktrees: Mapping[str, Usage]
    total: int  # everything under the root, each inode once (pool and integration included)

    def to_json(self) -> dict[str, object]:
        return {"total_bytes": self.total}


def _files(top: Path) -> list[os.stat_result]:
    found: list[os.stat_result] = []
    for folder, dirs, names in os.walk(top):
        for name in (*names, *dirs):
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue  # gone while we looked
            found.append(st)
    return found


def measure(root: Path, worktrees: Mapping[str, Path]) -> DiskReport:
    """The usage of each worktree (id -> folder) and the root's total."""
    owners: dict[tuple[int, int], set[str]] = {}
    seen_links: dict[tuple[int, int], int] = {}
    sizes: dict[tuple[int, int], int] = {}
    nlink: dict[tuple[int, int], int] = {}
    inside: dict[str, set[tuple[int, int]]] = {}
    for wt_id, path in worktrees.items():
        mine = inside.setdefault(wt_id, set())
        for st in _files(path):
            key = (st.st_dev, st.st_ino)
            owners.setdefault(key, set()).add(wt_id)
            seen_links[key] = seen_links.get(key, 0) + 1
            sizes[key], nlink[key] = st.st_blocks * 512, st.st_nlink
            mine.add(key)
    total = 0
    counted: set[tuple[int, int]] = set()
    for st in _files(root) if root.is_dir() else []:
        key = (st.st_dev, st.st_ino)
        if key not in counted:
            counted.add(key)
            total += st.st_blocks * 512
    usages = {}
    for wt_id, keys in inside.items():
        unique = sum(sizes[k] for k in keys if owners[k] == {wt_id} and nlink[k] <= seen_links[k])
        usages[wt_id] = Usage(bytes=sum(sizes[k] for k in keys), unique_bytes=unique)
    return DiskReport(worktrees=usages, total=total)


def checkout_size(repo: Path, commit: str) -> int:
    """The bytes a checkout of ``commit`` holds (its blobs' sizes): a new worktree's share."""
    from dagrunner.git.command import git

    listing = git(["ls-tree", "-r", "-l", "-z", commit], cwd=repo).stdout
    total = 0
    for entry in listing.split(b"\0"):
        fields = entry.split(maxsplit=4)
        if len(fields) >= 4 and fields[3].isdigit():
            total += int(fields[3])
    return total


def over_budget(
    root: Path,
    worktrees: Mapping[str, Path],
    *,
    budget: int,
    needed: int,
    spare: Mapping[str, str],
) -> str | None:
    """A sentence when ``needed`` more bytes would take the root past ``budget``: how far,
    and which of ``spare`` (id -> why it could go: landed, idle) would make room; else None."""
    report = measure(root, worktrees)
    if report.total + needed <= budget:
        return None
    room = sorted(spare, key=lambda i: -report.worktrees.get(i, Usage(0, 0)).unique_bytes)
    named = ", ".join(
        f"{i} ({spare[i]}, {report.worktrees[i].unique_bytes >> 20} MiB)" for i in room[:10]
    )
    return (
        f"the worktrees hold {report.total >> 20} MiB and a new one needs about {needed >> 20} "
        f"MiB, past max_disk ({budget >> 20} MiB)"
        + (f"; cleaning {named} would make room" if named else "; nothing landed or idle to clean")
    )


def check_budget(ctx: Context, budget: int, base: str) -> None:
    """``disk-budget`` when a new worktree of ``base`` would take the root past ``budget``."""
    from dagrunner.worktrees.lifecycle import spare_worktrees  # it imports allocate

    live = {i: Path(r.path) for i, r in ctx.ledger.state().items() if Path(r.path).is_dir()}
    needed = checkout_size(ctx.info.root, base)
    said = over_budget(ctx.root, live, budget=budget, needed=needed, spare=spare_worktrees(ctx))
    if said:
        raise DagrunnerError(
            "disk-budget",
            said,
            key="worktrees.max_disk",
            exit_code=ExitCode.REFUSED,
            hint="clean those up (worktree cleanup ID, or worktree prune), or raise max_disk",
        )
