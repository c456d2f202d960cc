"""Worktrees that are gone, or going: who still uses a folder, and the end of a worktree
whose folder vanished or was half removed (files without a ``.git``: a removal a kill cut
short, by an older dagrunner or by hand).  A half-removed folder is never fatal to a
listing (``lifecycle``); only ``cleanup --force`` (or an integrator that landed its work)
removes it."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import crash_point
from dagrunner.git.command import git
from dagrunner.git.integrated import integrated
from dagrunner.git.repo import RepoInfo
from dagrunner.worktrees.ledger import Ledger, WorktreeRecord
from dagrunner.worktrees.prepare import release_seeds


class Context(Protocol):
    """What of ``allocate.Context`` removal needs (that module imports this one)."""

    @property
    def info(self) -> RepoInfo: ...

    @property
    def root(self) -> Path: ...

    @property
    def ledger(self) -> Ledger: ...


def remove_worktree(ctx: Context, path: Path, branch: str, *, delete_branch: bool) -> None:
    """Remove a worktree so that a kill at any moment leaves it whole or wholly gone from
    its place: it is first renamed to its trash name (``trash_of``, one rename), then
    unregistered and deleted; a trash folder a kill left is swept by the next cleanup or
    prune of that worktree (``sweep``)."""
    release_seeds(ctx.root, path)
    git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
    trash = trash_of(path)
    if path.exists():
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(path, trash)
    crash_point("removing")
    git(["worktree", "prune"], cwd=ctx.info.root, check=False)
    sweep(path)
    if delete_branch:
        git(["branch", "-D", branch], cwd=ctx.info.root, check=False)


def trash_of(path: Path) -> Path:
    """Where a worktree at ``path`` is while it is being removed (a name no worktree has:
    mission and worker names never start with a dot)."""
    return path.parent / f".{path.name}.removing"


def half_removed(path: Path) -> bool:
    """Whether the worktree folder ``path`` is there without its ``.git`` (a removal by an
    older dagrunner, or by hand, cut short): no git command can run in it."""
    return path.is_dir() and not os.path.lexists(path / ".git")


def sweep(path: Path) -> None:
    """The trash a removal of the worktree at ``path`` left, deleted."""
    trash = trash_of(path)
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash)


def processes_using(path: Path) -> list[int]:
    """Pids of processes whose cwd or an open file is under ``path``."""
    import psutil  # only cleanup needs it: the swarm's other calls start without it

    prefix = str(path.resolve())
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cwd"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            cwd = proc.info.get("cwd") or ""
            if cwd == prefix or cwd.startswith(prefix + os.sep):
                found.append(proc.pid)
                continue
            for handle in proc.open_files():
                if handle.path.startswith(prefix + os.sep):
                    found.append(proc.pid)
                    break
    return found


def in_use(wt_id: str, path: Path) -> None:
    """Refuse (``in-use``, exit 4) a worktree a running process uses."""
    users = processes_using(path)
    if users:
        raise DagrunnerError(
            "in-use",
            f"{wt_id} is in use by process(es) {users}",
            exit_code=ExitCode.REFUSED,
            details={"pids": users},
            hint="stop those processes (or leave their directory) first",
        )


def drop_gone(
    ctx: Context, wt_id: str, state: WorktreeRecord, *, force: bool, target: str
) -> dict[str, Any]:
    """A worktree whose folder is gone (or half removed: no ``.git``, ``--force`` only): its
    registration, trash and record go, and its branch too when the target holds all of it
    (a removal a kill cut short), else the branch is kept."""
    path, branch = Path(state.path), state.branch
    broken = path.is_dir()
    if broken and not force:
        raise DagrunnerError(
            "worktree-half-removed",
            f"{wt_id} was half removed: its folder is there without its .git, so nothing "
            "in it can be read as git work",
            where=str(path),
            exit_code=ExitCode.REFUSED,
            hint=f"`dagrunner worktree cleanup {wt_id} --force` removes what is left (its "
            "branch is kept unless the target holds it)",
        )
    if broken:
        in_use(wt_id, path)
        os.replace(path, trash_of(path))
    git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
    git(["worktree", "prune"], cwd=ctx.info.root, check=False)
    sweep(path)
    head = git(["rev-parse", "--verify", "-q", f"refs/heads/{branch}"], cwd=ctx.info.root,
               check=False).text  # fmt: skip
    landed = bool(head) and integrated(ctx.info.root, head, state.base, target)[0]
    if landed:
        git(["branch", "-D", branch], cwd=ctx.info.root, check=False)
    why = "half removed" if broken else "directory gone"
    ctx.ledger.append("pruned", wt_id, reason=f"{why}; branch {'deleted' if landed else 'kept'}")
    return {
        "id": wt_id,
        "action": "removed" if broken else "dropped-record",
        "reason": why,
        "branch_kept": None if landed or not head else branch,
        "branch_deleted": landed,
    }
