"""What the worktrees under the cache root hold on disk, and the budget an allocation keeps.

Sizes are allocated blocks (``st_blocks``), each inode counted once, on the walked
folder's own filesystem (an overlay seed's files are its store's and its layer's).  A worktree's
``unique_bytes`` are those of the files no other place holds: a file hard-linked from
elsewhere (another worktree, the pool, a store) is in its ``bytes`` but not its
``unique_bytes``.  (Reflinked extents look unique: the filesystem does not say they are
shared without a per-file query.)  The root's total counts every inode under it once.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.command import git
from dagrunner.worktrees.ledger import WorktreeRecord


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
    """Every entry under ``top`` on its filesystem: a mount inside (an overlay seed) is not
    walked, its files being another place's (the seed's store, the worktree's layer)."""
    found: list[os.stat_result] = []
    try:
        device = os.lstat(top).st_dev
    except OSError:
        return found
    for folder, dirs, names in os.walk(top):
        kept = []
        for name in (*names, *dirs):
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue  # gone while we looked
            if st.st_dev != device:
                continue
            found.append(st)
            if name in dirs:
                kept.append(name)
        dirs[:] = [d for d in dirs if d in kept]
    return found


def size_of(top: Path) -> int:
    """The bytes allocated under ``top`` (each entry once, on its own filesystem)."""
    return sum(st.st_blocks * 512 for st in _files(top))


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
    listing = git(["ls-tree", "-r", "-l", "-z", commit], cwd=repo).stdout
    total = 0
    for entry in listing.split(b"\0"):
        fields = entry.split(maxsplit=4)
        if len(fields) >= 4 and fields[3].isdigit():
            total += int(fields[3])
    return total


IDLE_DAYS = 7.0


def spare(repo: Path, records: Mapping[str, WorktreeRecord], target: str) -> dict[str, str]:
    """The worktrees whose cleanup loses nothing, and why: clean with their commits on the
    target (landed), or clean, unclaimed and idle for a week."""
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=IDLE_DAYS)
    found: dict[str, str] = {}
    for wt_id, record in sorted(records.items()):
        path = Path(record.path)
        if not path.is_dir():
            continue
        status = git(["status", "--porcelain", "--untracked-files=all"], cwd=path, check=False)
        if status.returncode != 0 or status.stdout:
            continue  # work in it, or not readable: never offered
        head = git(["rev-parse", "HEAD"], cwd=path, check=False).text
        on = git(
            ["merge-base", "--is-ancestor", head, f"refs/heads/{target}"], cwd=repo, check=False
        )
        if head and on.returncode == 0:
            found[wt_id] = "landed"
        elif not record.session and dt.datetime.fromisoformat(record.last_activity) < cutoff:
            found[wt_id] = f"idle since {record.last_activity[:10]}"
    return found


def check_budget(
    root: Path,
    repo: Path,
    records: Mapping[str, WorktreeRecord],
    *,
    budget: int,
    base: str,
    target: str,
) -> None:
    """``disk-budget`` when a new worktree of ``base`` would take ``root`` past ``budget``."""
    live = {i: Path(r.path) for i, r in records.items() if Path(r.path).is_dir()}
    report = measure(root, live)
    needed = checkout_size(repo, base)
    if report.total + needed <= budget:
        return
    offered = spare(repo, records, target)
    room = sorted(offered, key=lambda i: -report.worktrees[i].unique_bytes)
    named = ", ".join(
        f"{i} ({offered[i]}, {report.worktrees[i].unique_bytes >> 20} MiB)" for i in room[:10]
    )
    raise DagrunnerError(
        "disk-budget",
        f"the worktrees hold {report.total >> 20} MiB and a new one needs about "
        f"{needed >> 20} MiB, past max_disk ({budget >> 20} MiB)"
        + (f"; cleaning {named} would make room" if named else "; nothing landed or idle to clean"),
        key="worktrees.max_disk",
        exit_code=ExitCode.REFUSED,
        hint="clean those up (worktree cleanup ID, or worktree prune), or raise max_disk",
    )
