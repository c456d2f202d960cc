"""Worker worktrees under the cache root: allocate, claim, release, export, and the pool.

Every worktree is ``<root>/<mission>/<worker>`` on branch
``dagrunner/<mission>/<worker>``, locked in git (so ``git worktree prune``
never drops it) and recorded in the ledger (``ledger.py``).
Allocation and cleanup of one repository are serialised by a lock in its
common git dir.  Status, cleanup and prune -- the rest of a worktree's life --
are in ``lifecycle.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import crash_point
from dagrunner.git.command import git, is_dirty
from dagrunner.git.repo import RepoInfo, cache_root, checkout_branch, repo_info, worktree_root
from dagrunner.manifest.settings import WorktreesSpec
from dagrunner.names import RULE, is_safe_name
from dagrunner.process import share
from dagrunner.records.worktree import Allocation, SeedUse, as_json
from dagrunner.worktrees import seeds
from dagrunner.worktrees.disk import check_budget
from dagrunner.worktrees.gone import remove_worktree
from dagrunner.worktrees.ledger import Ledger, WorktreeRecord
from dagrunner.worktrees.pool import take_from_pool
from dagrunner.worktrees.ports import held_ports, lease, port_env, write_env
from dagrunner.worktrees.prepare import (
    base_manifest,
    copy_included,
    provision_seeds,
    release_seeds,
    remount_seeds,
    run_setup,
)

POOL_DIR = ".pool"


@dataclass(frozen=True)
class Context:
    info: RepoInfo
    root: Path
    ledger: Ledger

    @property
    def pool(self) -> Path:
        return self.root / POOL_DIR


def open_context(repo: Path | None, env: Mapping[str, str] | None = None) -> Context:
    """The repository, its checked worktree root (exit 3 if unsafe) and its ledger."""
    info = repo_info(repo)
    root = worktree_root(info, env)
    return Context(info=info, root=root, ledger=Ledger(info.state_dir))


def check_slug(kind: str, value: str) -> str:
    if not is_safe_name(value):
        raise DagrunnerError(
            "bad-name",
            f"{kind} {value!r} is not a safe name",
            key=f"--{kind}",
            hint=f"use {RULE}",
        )
    return value


def split_id(wt_id: str) -> tuple[str, str]:
    mission, sep, worker = wt_id.partition("/")
    if not sep:
        raise DagrunnerError(
            "bad-name", f"{wt_id!r} is not a worktree id", hint="ids look like MISSION/WORKER"
        )
    return check_slug("mission", mission), check_slug("worker", worker)


# -- allocate ---------------------------------------------------------------------------


def allocate_worktree(
    *,
    mission: str,
    worker: str,
    base: str = "HEAD",
    session: str | None = None,
    repo: Path | None = None,
    setup: Sequence[str] = (),
    setup_timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> Allocation:
    """A worktree for MISSION/WORKER at BASE, claimed for SESSION; the same one when called again.

    Raises DagrunnerError: bad-name / bad-base (2), unsafe-root (3), claimed /
    path-occupied / branch-exists (4), setup-failed (1).
    """
    env = os.environ if env is None else env
    check_slug("mission", mission)
    check_slug("worker", worker)
    if session is not None:
        check_slug("session", session)
    ctx = open_context(repo, env)
    wt_id = f"{mission}/{worker}"
    probe = git(
        ["rev-parse", "--verify", "-q", f"{base}^{{commit}}"], cwd=ctx.info.root, check=False
    )
    if probe.returncode != 0:
        raise DagrunnerError(
            "bad-base",
            f"{base!r} is not a commit in this repository",
            key="--base",
            hint="pass a branch, tag or commit id",
        )
    base_commit = probe.text
    manifest = base_manifest(ctx.info.root, base_commit)
    # Seeds are built (once per key, each under its own lock) before the ledger is locked.
    built = []
    if manifest is not None:  # a base the target does not hold gets seeds of its own (trust)
        trusted = _on_target(ctx, base_commit)
        hide = None if trusted else cache_root()
        built = seeds.ensure(
            ctx.root, ctx.info.root, base_commit, manifest, env, trusted=trusted, hide=hide
        )
    wants = Wants(manifest.worktrees if manifest else WorktreesSpec(), built, env)
    # Reading the main checkout's status walks it; do that while the worktree is made.
    with ThreadPoolExecutor(max_workers=1) as pool:
        dirty = pool.submit(_main_dirty, ctx)
        result = _allocate_locked(
            ctx, wt_id, mission, worker, base_commit, session, setup, setup_timeout, wants
        )
        return replace(result, main_checkout_dirty=dirty.result())


@dataclass(frozen=True)
class Wants:
    """What the base's manifest asks of a new worktree, its seeds built."""

    spec: WorktreesSpec
    built: list[tuple[seeds.Seed, bool]]
    env: Mapping[str, str]


allocate = as_json(allocate_worktree)  # the JSON shape (docs/worktrees.md)


def _allocate_locked(
    ctx: Context,
    wt_id: str,
    mission: str,
    worker: str,
    base_commit: str,
    session: str | None,
    setup: Sequence[str],
    setup_timeout: float,
    wants: Wants,
) -> Allocation:
    branch = f"dagrunner/{mission}/{worker}"
    path = ctx.root / mission / worker
    with ctx.ledger.exclusive():
        existing = ctx.ledger.state().get(wt_id)
        if existing is not None and not existing.missing and Path(existing.path).is_dir():
            owner = existing.session
            if owner and session and owner != session:
                raise DagrunnerError(
                    "claimed",
                    f"{wt_id} is claimed by session {owner!r}",
                    exit_code=ExitCode.REFUSED,
                    details={"owner": owner},
                    hint="use another worker name, or release it from that session",
                )
            if session and not owner:
                ctx.ledger.append("claimed", wt_id, session=session)
            remount_seeds(ctx.root, wt_id, Path(existing.path), existing.seeds)
            return _describe(
                ctx, existing, session=owner or session, created=existing.created, reused=True
            )
        begun = ctx.ledger.unfinished().get(wt_id)
        if begun is not None:
            undo_unfinished(ctx, path, branch, str(begun.get("base")))
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise DagrunnerError(
                "path-occupied",
                f"{path} exists and is not a worktree dagrunner allocated",
                exit_code=ExitCode.REFUSED,
                where=str(path),
                hint="move it away; dagrunner never reuses or overwrites a stray directory",
            )
        branch_exists = (
            git(
                ["rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
                cwd=ctx.info.root,
                check=False,
            ).returncode
            == 0
        )
        if branch_exists and existing is not None:
            # Ours, but its folder vanished: bring it back from its branch (its commits are there).
            return _restore(ctx, wt_id, existing, path, branch, session)
        if branch_exists:
            raise DagrunnerError(
                "branch-exists",
                f"branch {branch} already exists and is not a recorded worktree",
                exit_code=ExitCode.REFUSED,
                hint=f"rename or delete that branch (git branch -m {branch} ...), or pick another worker",
            )
        # checked and leased under the ledger's lock, before anything is made: a refusal
        # writes nothing
        spec, records = wants.spec, ctx.ledger.state()
        if spec.max_disk is not None:
            goal, info = default_target(ctx), ctx.info
            check_budget(
                ctx.root, info.root, records, budget=spec.max_disk, base=base_commit, target=goal
            )
        ports = lease(spec, held_ports(records))
        path.parent.mkdir(parents=True, exist_ok=True)
        ctx.ledger.append("allocating", wt_id, path=str(path), branch=branch, base=base_commit)
        pooled = take_from_pool(ctx.info.root, ctx.pool, path, branch, base_commit, wt_id)
        if not pooled:
            git(
                [
                    "worktree",
                    "add",
                    "--lock",
                    "--reason",
                    f"dagrunner: {wt_id}",
                    "-b",
                    branch,
                    str(path),
                    base_commit,
                ],
                cwd=ctx.info.root,
            )
        crash_point("allocating")  # the durability tests kill us here
        planted = _plant(ctx, wt_id, path, branch, wants)
        copied = copy_included(ctx.info.root, path, [seed.path for seed in planted])
        write_env(path, ports)
        at = ctx.ledger.append(
            "allocated",
            wt_id,
            path=str(path),
            branch=branch,
            base=base_commit,
            session=session,
            pooled=pooled,
            copied=copied,
            ports=list(ports),
            seeds=[seed.to_json() for seed in planted],
        )
    if setup:

        def undo(command: str) -> None:
            with ctx.ledger.exclusive():
                remove_worktree(ctx, path, branch, delete_branch=True)
                ctx.ledger.append("cleaned", wt_id, reason=f"setup failed: {command}")

        run_setup(path, setup, setup_timeout, {**wants.env, **port_env(ports)}, undo)
    made = WorktreeRecord(wt_id, str(path), branch, base_commit, created=at, last_activity=at)
    made = replace(made, ports=ports, seeds=planted)
    return _describe(
        ctx, made, session=session, created=at, reused=False, pooled=pooled, copied=tuple(copied)
    )


def _plant(ctx: Context, wt_id: str, path: Path, branch: str, wants: Wants) -> tuple[SeedUse, ...]:
    """The seeds in the new worktree; when one cannot be, the worktree goes (nothing kept)."""
    if not wants.built:
        return ()
    try:
        how = share.choose(seeds.seeds_dir(ctx.root), wants.env)
        return provision_seeds(ctx.root, wt_id, path, wants.built, how)
    except (DagrunnerError, OSError):
        remove_worktree(ctx, path, branch, delete_branch=True)
        ctx.ledger.append("pruned", wt_id, reason="its seeds could not be provisioned")
        raise


def undo_unfinished(ctx: Context, path: Path, branch: str, base: str) -> bool:
    """What a killed allocation left (a moved pool entry or a half-added worktree, never
    handed to anyone) is removed -- unless it holds changes, which stay (path-occupied).
    Whether nothing of it is left."""
    listed = git(["worktree", "list", "--porcelain", "-z"], cwd=ctx.info.root).stdout
    if path.is_dir() and f"worktree {path}".encode() in listed.split(b"\0"):
        if is_dirty(path, untracked=True):
            return False
        release_seeds(ctx.root, path)
        git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
        git(["worktree", "remove", "--force", "--force", str(path)], cwd=ctx.info.root)
    tip = git(
        ["rev-parse", "-q", "--verify", f"refs/heads/{branch}"], cwd=ctx.info.root, check=False
    )
    if tip.returncode == 0 and tip.text == base:  # made by that allocation: nothing on it
        git(["branch", "-D", branch], cwd=ctx.info.root, check=False)
    return not path.exists()


def _restore(
    ctx: Context, wt_id: str, existing: WorktreeRecord, path: Path, branch: str, session: str | None
) -> Allocation:
    git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
    git(["worktree", "prune"], cwd=ctx.info.root, check=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    git(
        ["worktree", "add", "--lock", "--reason", f"dagrunner: {wt_id}", str(path), branch],
        cwd=ctx.info.root,
    )
    copied = copy_included(ctx.info.root, path)
    owner = existing.session or session
    at = ctx.ledger.append(
        "allocated",
        wt_id,
        path=str(path),
        branch=branch,
        base=existing.base,
        session=owner,
        pooled=False,
        copied=copied,
        restored=True,
    )
    made = WorktreeRecord(wt_id, str(path), branch, existing.base, created=at, last_activity=at)
    return _describe(ctx, made, session=owner, created=at, reused=True, restored=True)


def _main_dirty(ctx: Context) -> bool | None:
    """Whether the main checkout has uncommitted work (None for a bare repository)."""
    if ctx.info.bare:
        return None
    return is_dirty(ctx.info.root, untracked=True)


def _describe(
    ctx: Context,
    state: WorktreeRecord,
    *,
    session: str | None,
    created: str,
    reused: bool,
    pooled: bool = False,
    copied: tuple[str, ...] = (),
    restored: bool = False,
) -> Allocation:
    return Allocation(
        id=state.id,
        path=state.path,
        branch=state.branch,
        base=state.base,
        root=str(ctx.root),
        session=session,
        created=created,
        reused=reused,
        pooled=pooled,
        copied=copied,
        restored=restored,
        ports=state.ports,
        seeds=state.seeds,
    )


# -- state ------------------------------------------------------------------------------


def default_target(ctx: Context) -> str:
    return checkout_branch(ctx.info)


def _on_target(ctx: Context, commit: str) -> bool:
    """Whether ``commit`` is the target's own (on the main checkout's branch): what a seed
    built from it may serve every allocation of that key."""
    try:
        target = f"refs/heads/{default_target(ctx)}"
    except DagrunnerError:
        return False
    probe = git(["merge-base", "--is-ancestor", commit, target], cwd=ctx.info.root, check=False)
    return probe.returncode == 0


def recorded_state(ctx: Context, wt_id: str) -> WorktreeRecord:
    state = ctx.ledger.state().get(wt_id)
    if state is None:
        raise DagrunnerError(
            "unknown-worktree",
            f"no worktree {wt_id!r} is recorded for this repository",
            hint="see `dagrunner worktree list`",
        )
    return state


# -- claim / release ---------------------------------------------------------------------


def _check_owner(wt_id: str, owner: str | None, session: str, force: bool, code: str) -> None:
    """Refuse (exit 4, naming the owner) when another session holds the claim, unless ``force``."""
    if owner and owner != session and not force:
        raise DagrunnerError(
            code,
            f"{wt_id} is claimed by session {owner!r}, not {session!r}",
            exit_code=ExitCode.REFUSED,
            details={"owner": owner},
            hint="ask the owning session to release it, or pass --force",
        )


def claim(
    wt_id: str, *, session: str, force: bool = False, repo: Path | None = None
) -> dict[str, Any]:
    """Claim for ``session``; another session's claim is refused (exit 4) unless ``force``."""
    check_slug("session", session)
    ctx = open_context(repo)
    with ctx.ledger.exclusive():
        owner = recorded_state(ctx, wt_id).session
        _check_owner(wt_id, owner, session, force, "claimed")
        if owner != session:
            ctx.ledger.append(
                "claimed", wt_id, session=session, previous=owner, forced=bool(owner and force)
            )
    return {"id": wt_id, "session": session, "previous": owner}


def release(
    wt_id: str, *, session: str, force: bool = False, repo: Path | None = None
) -> dict[str, Any]:
    """Release ``session``'s claim; a non-owner is refused (exit 4) unless ``force``."""
    check_slug("session", session)
    ctx = open_context(repo)
    with ctx.ledger.exclusive():
        owner = recorded_state(ctx, wt_id).session
        _check_owner(wt_id, owner, session, force, "not-owner")
        if owner:
            ctx.ledger.append("released", wt_id, session=session, owner=owner)
    return {"id": wt_id, "session": None, "previous": owner}
