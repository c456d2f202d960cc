"""A worktree's life after allocation: status (including whether its work landed),
cleanup with retention, and prune.

Work is never lost here: a dirty or unlanded worktree is retained with a lock
file saying why, ``--force`` first saves its full state on a backup ref, and a
worktree a running process uses is never removed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import atomic_write
from dagrunner.git.command import git
from dagrunner.git.integrated import integrated, state_integrated, unheld
from dagrunner.git.link import pin_gitfile
from dagrunner.git.statetree import backup_commit, state_tree
from dagrunner.records.worktree import WorktreeStatus
from dagrunner.worktrees.allocate import (
    Context,
    default_target,
    open_context,
    recorded_state,
    split_id,
    undo_unfinished,
)
from dagrunner.worktrees.gone import drop_gone, half_removed, in_use, remove_worktree
from dagrunner.worktrees.ledger import WorktreeRecord, now
from dagrunner.worktrees.pool import pool_room, to_pool


def status(wt_id: str, *, repo: Path | None = None, target: str | None = None) -> dict[str, Any]:
    """Everything about one worktree; a vanished directory is reconciled in the ledger."""
    ctx = open_context(repo)
    split_id(wt_id)
    return _status(ctx, wt_id, recorded_state(ctx, wt_id), target or default_target(ctx)).to_json()


def _status(ctx: Context, wt_id: str, state: WorktreeRecord, target: str) -> WorktreeStatus:
    path = Path(state.path)
    recorded = WorktreeStatus(
        id=wt_id,
        path=str(path),
        branch=state.branch,
        base=state.base,
        session=state.session,
        created=state.created,
        last_activity=state.last_activity,
        target=target,
        retained=state.retained,
        missing=True,
        ports=state.ports,
    )
    if not path.is_dir():
        if not state.missing:
            ctx.ledger.append("missing", wt_id)
        return recorded
    if half_removed(path):  # no git runs there: said, never fatal to a listing
        return dataclasses.replace(recorded, half_removed=True)
    # The worker could have pointed its .git at another repository (the user's): every
    # later git command here -- a cleanup's reset and checkout -- would act on that one.
    pin_gitfile(ctx.info.common_dir, path)
    porcelain = git(["status", "--porcelain=v2", "-z", "--untracked-files=all"], cwd=path).stdout
    staged = unstaged = untracked = unmerged = 0
    for entry in porcelain.split(b"\0"):
        if entry[:2] in (b"1 ", b"2 "):
            xy = entry[2:4]
            staged += xy[0:1] != b"."
            unstaged += xy[1:2] != b"."
        elif entry[:2] == b"u ":
            unmerged += 1
        elif entry[:2] == b"? ":
            untracked += 1
    # a rename entry ("2 ") is followed by its original path as a separate field
    head = git(["rev-parse", "HEAD"], cwd=path).text
    git_dir = Path(git(["rev-parse", "--absolute-git-dir"], cwd=path).text)
    rebase = (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists()
    merge = (git_dir / "MERGE_HEAD").exists()
    counts = git(["rev-list", "--left-right", "--count", f"{target}...HEAD"], cwd=path, check=False)
    behind, ahead = (
        (int(n) for n in counts.text.split()) if counts.returncode == 0 else (None, None)
    )
    landed, why = integrated(path, head, state.base, target)
    clean = staged == unstaged == untracked == unmerged == 0 and not rebase and not merge
    return dataclasses.replace(
        recorded,
        missing=False,
        head=head,
        clean=clean,
        staged=staged,
        unstaged=unstaged,
        untracked=untracked,
        unmerged=unmerged,
        ahead=ahead,
        behind=behind,
        diffstat=git(["diff", "--shortstat", "--no-ext-diff", state.base], cwd=path).text,
        rebase_in_progress=rebase,
        merge_in_progress=merge,
        integrated=landed,
        integrated_reason=why,
        ports=state.ports,
    )


def list_statuses(*, repo: Path | None = None, target: str | None = None) -> list[WorktreeStatus]:
    """Every recorded worktree's status, in id order."""
    ctx = open_context(repo)
    goal = target or default_target(ctx)
    return [_status(ctx, wt_id, state, goal) for wt_id, state in sorted(ctx.ledger.state().items())]


def kept_refs(repo: Path | None = None) -> list[dict[str, str]]:
    """The work kept on refs of dagrunner's own when its worktree went: ``retained/``
    (commits no other ref held when a landed branch was deleted) and ``backup/`` (a forced
    cleanup's or a sync's full state); each with the command that restores it as a branch."""
    ctx = open_context(repo)
    spaces = ["refs/dagrunner/retained/", "refs/dagrunner/backup/"]
    listed = git(
        ["for-each-ref", "--format=%(refname) %(objectname)", *spaces], cwd=ctx.info.root
    ).text.splitlines()
    kept = []
    for line in listed:
        ref, _, commit = line.partition(" ")
        name = "restored/" + ref.removeprefix("refs/dagrunner/").replace("/", "-")
        kept.append({"ref": ref, "commit": commit, "restore": f"git branch {name} {ref}"})
    return kept


def list_worktrees(*, repo: Path | None = None, target: str | None = None) -> list[dict[str, Any]]:
    """``list_statuses`` as JSON (the CLI's ``--json`` shape)."""
    return [status.to_json() for status in list_statuses(repo=repo, target=target)]


# -- cleanup / prune ---------------------------------------------------------------------


def retention_file(path: Path) -> Path:
    return path.parent / f"{path.name}.retained.json"


def cleanup(
    wt_id: str,
    *,
    force: bool = False,
    repo: Path | None = None,
    target: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Remove a clean, landed worktree and its branch (or return it to the pool).

    A dirty or unlanded one is retained (exit 4, with a retention file) unless
    ``force``, which first saves its full state on ``refs/dagrunner/backup/...``.
    A worktree a running process uses is refused (exit 4) even with ``force``.
    """
    env = os.environ if env is None else env
    split_id(wt_id)
    ctx = open_context(repo, env)
    with ctx.ledger.exclusive():
        state = recorded_state(ctx, wt_id)
        return cleanup_recorded(
            ctx, wt_id, state, force=force, target=target or default_target(ctx), env=env
        )


def cleanup_recorded(
    ctx: Context,
    wt_id: str,
    state: WorktreeRecord,
    *,
    force: bool,
    target: str,
    env: Mapping[str, str],
    keep_unlanded_branch: bool = False,
    assume_landed: bool = False,
) -> dict[str, Any]:
    """``assume_landed``: the caller checked that everything the worktree holds has landed."""
    path, branch = Path(state.path), state.branch
    if not path.is_dir() or half_removed(path):
        return drop_gone(ctx, wt_id, state, force=force, target=target)
    in_use(wt_id, path)
    info = _status(ctx, wt_id, state, target)
    if not info.clean and not assume_landed and not info.operation_in_progress:
        # a worker's uncommitted work the integrator landed (its state tree, as one commit)
        on, why = state_integrated(path, state.base, state_tree(path), target)
        if on and not info.unmerged:
            assume_landed, info = True, dataclasses.replace(info, integrated_reason=why)
    landed = bool(info.integrated) or assume_landed
    problems = []
    if not info.clean and not assume_landed:
        problems.append(
            f"uncommitted work ({info.staged} staged, {info.unstaged} unstaged, "
            f"{info.untracked} untracked"
            f"{', rebase or merge in progress' if info.operation_in_progress else ''})"
        )
    if not landed and not keep_unlanded_branch:
        problems.append(f"not landed on {target}: {info.integrated_reason}")
    backup = None
    if problems and not force:
        why = "; ".join(problems)
        atomic_write(
            retention_file(path),
            orjson.dumps(
                {
                    "id": wt_id,
                    "retained_at": now(),
                    "why": why,
                    "branch": branch,
                    "head": info.head,
                    "base": state.base,
                    "status": {
                        "staged": info.staged,
                        "unstaged": info.unstaged,
                        "untracked": info.untracked,
                        "ahead": info.ahead,
                        "diffstat": info.diffstat,
                    },
                },
                option=orjson.OPT_INDENT_2,
            ),
        )
        ctx.ledger.append("retained", wt_id, reason=why)
        raise DagrunnerError(
            "retained",
            f"{wt_id} holds work and was kept: {why}",
            exit_code=ExitCode.REFUSED,
            where=str(retention_file(path)),
            details={"why": why},
            hint="land or export its work first; --force saves its state on a backup ref, then removes it",
        )
    if problems:
        ref = f"refs/dagrunner/backup/{wt_id}/{_stamp()}"
        backup = {
            "ref": ref,
            "commit": backup_commit(
                path, ref, f"dagrunner backup of {wt_id} before forced cleanup"
            ),
        }
    delete_branch = landed or backup is not None
    retained_ref = None
    if delete_branch and backup is None and info.head and unheld(ctx.info.root, info.head, branch):
        # "landed" by a patch of the same bytes, yet no other ref holds these commits: keep
        # them on a ref of their own, listed by `worktree list`, before the branch goes
        retained_ref = f"refs/dagrunner/retained/{wt_id}/{_stamp()}"
        git(["update-ref", retained_ref, info.head], cwd=ctx.info.root)
    action = "removed"
    if info.clean and pool_room(ctx.pool, env):
        to_pool(ctx.info.root, ctx.pool, path, branch, delete_branch=delete_branch)
        action = "pooled"
    else:
        remove_worktree(ctx, path, branch, delete_branch=delete_branch)
    retention_file(path).unlink(missing_ok=True)
    ctx.ledger.append(
        "cleaned",
        wt_id,
        action=action,
        backup=backup,
        branch_deleted=delete_branch,
        retained_ref=retained_ref,
    )
    return {
        "id": wt_id,
        "action": action,
        "backup": backup,
        "branch_deleted": delete_branch,
        "integrated_reason": info.integrated_reason,
        "retained_ref": retained_ref,
    }


def prune(
    *,
    idle_days: float | None = None,
    dry_run: bool = False,
    repo: Path | None = None,
    target: str | None = None,
    env: Mapping[str, str] | None = None,
    to_budget: bool = False,
) -> dict[str, Any]:
    """Drop records of vanished worktrees; remove integrated ones and clean unclaimed idle ones.

    Everything else is listed as retained, with the reason.  An idle worktree
    that is clean but unlanded loses its directory, never its branch.  ``to_budget``: then
    clean unclaimed, clean ones (landed, or idle a week) oldest first while the root holds
    more than the target's ``[worktrees] max_disk``.
    """
    env = os.environ if env is None else env
    ctx = open_context(repo, env)
    goal = target or default_target(ctx)
    removed: list[dict[str, Any]] = []
    retained: list[dict[str, Any]] = []
    cutoff = None
    if idle_days is not None:
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=idle_days)
    with ctx.ledger.exclusive():
        for wt_id, state in sorted(ctx.ledger.state().items()):
            path = Path(state.path)
            if not path.is_dir():
                removed.append(
                    {"id": wt_id, "action": "dropped-record", "reason": "directory gone"}
                )
                if not dry_run:
                    cleanup_recorded(ctx, wt_id, state, force=False, target=goal, env=env)
                continue
            info = _status(ctx, wt_id, state, goal)
            if info.half_removed:
                retained.append(
                    {
                        "id": wt_id,
                        "reason": "half removed (its folder has no .git): "
                        f"`dagrunner worktree cleanup {wt_id} --force` removes it",
                    }
                )
                continue
            idle = cutoff is not None and dt.datetime.fromisoformat(state.last_activity) < cutoff
            reason = None
            if state.session:  # its worker may still be at it, landed or not
                reason = f"claimed by session {state.session!r}"
            elif not info.clean:
                reason = "uncommitted work"
            elif not info.integrated and not idle:
                reason = f"not landed ({info.integrated_reason}) and not idle"
            if reason:
                retained.append({"id": wt_id, "reason": reason})
                continue
            why = info.integrated_reason if info.integrated else f"idle since {state.last_activity}"
            removed.append(
                {
                    "id": wt_id,
                    "action": "remove",
                    "reason": why,
                    "branch_kept": None if info.integrated else state.branch,
                }
            )
            if not dry_run:
                cleanup_recorded(
                    ctx,
                    wt_id,
                    state,
                    force=False,
                    target=goal,
                    env=env,
                    keep_unlanded_branch=not info.integrated,
                )
        for wt_id, begun in sorted(ctx.ledger.unfinished().items()):  # a killed allocate's
            place = (Path(str(begun.get("path"))), str(begun.get("branch")), str(begun.get("base")))
            if wt_id in ctx.ledger.state():
                continue
            if dry_run or undo_unfinished(ctx, *place):
                removed.append({"id": wt_id, "action": "remove", "reason": "allocation killed"})
                if not dry_run:
                    ctx.ledger.append("pruned", wt_id)
            else:
                retained.append({"id": wt_id, "reason": "a killed allocation's folder has changes"})
        if to_budget:
            removed += _to_budget(ctx, goal, env, dry_run=dry_run)
    return {"dry_run": dry_run, "removed": removed, "retained": retained}


def _to_budget(
    ctx: Context, goal: str, env: Mapping[str, str], *, dry_run: bool
) -> list[dict[str, Any]]:
    from dagrunner.worktrees.disk import measure, spare
    from dagrunner.worktrees.prepare import base_manifest

    manifest = base_manifest(ctx.info.root, f"refs/heads/{goal}")
    budget = manifest.worktrees.max_disk if manifest else None
    if budget is None:
        raise DagrunnerError(
            "no-disk-budget",
            f"the manifest on {goal} sets no [worktrees] max_disk to prune to",
            key="worktrees.max_disk",
            hint='set max_disk = "50G" in [worktrees], or prune without --to-budget',
        )
    records = ctx.ledger.state()
    live = {i: Path(r.path) for i, r in records.items() if Path(r.path).is_dir()}
    report = measure(ctx.root, live)
    total, removed = report.total, []
    offered = spare(ctx.info.root, records, goal)
    for wt_id in sorted(offered, key=lambda i: records[i].last_activity):
        if total <= budget:
            break
        if records[wt_id].session:
            continue
        total -= report.worktrees[wt_id].unique_bytes
        removed.append({"id": wt_id, "action": "remove", "reason": f"to budget: {offered[wt_id]}"})
        if not dry_run:
            cleanup_recorded(
                ctx,
                wt_id,
                records[wt_id],
                force=False,
                target=goal,
                env=env,
                keep_unlanded_branch=offered[wt_id] != "landed",
            )
    return removed


def _stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
