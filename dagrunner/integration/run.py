"""Drain the integration queue: the public entry points (``integrate``, ``queue_status``).

The integrator's steps live in ``steps.py``, crash recovery and the preflight in
``recovery.py``, the commit trailers in ``trailers.py`` and the result record in
``records/integration.py``; the names users and tests import are re-exported here.
``overlaps`` is the queue's foresight: which live work would collide
(``worktrees/overlaps.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagrunner.engine.landed import drop_notes
from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.executors.factory import check_integration_executor
from dagrunner.git.command import git
from dagrunner.git.repo import check_branch
from dagrunner.integration.admission import trusted_manifest
from dagrunner.integration.baseline import red_now
from dagrunner.integration.events import median_gate_run
from dagrunner.integration.landing import SHA_TRAILER, TRAILER
from dagrunner.integration.needs import Batch
from dagrunner.integration.queue import (
    Pruned,
    Queue,
    integrator_lock,
    prune_queue,
    stuck_on_error,
)
from dagrunner.manifest.load import load_manifest
from dagrunner.records.integration import FINAL, IntegrationResult
from dagrunner.worktrees.allocate import default_target, open_context
from dagrunner.worktrees.gone import half_removed
from dagrunner.worktrees.overlaps import Overlaps, find_overlaps

DEFAULT_KEEP = 7 * 86400.0  # seconds (prune): a week of final items, for stats and `why`

__all__ = [
    "DEFAULT_KEEP",
    "SHA_TRAILER",
    "TRAILER",
    "IntegrationResult",
    "check_integration_executor",
    "integrate",
    "integrator_lock",
    "overlaps",
    "prune",
    "queue_status",
    "window_of",
]


def integrate(
    *,
    repo: Path | None = None,
    target: str | None = None,
    manifest: Path | None = None,
    batch: Batch = None,
    wait: bool = True,
    env: Mapping[str, str] | None = None,
    trust_envelope_manifest: bool = False,
    executor: str = "local",
    window: int | None = None,
    confirm_failures: int | None = None,
) -> IntegrationResult:
    """Drain the queue of ``repo`` onto ``target`` (default: the main checkout's branch);
    ``executor`` runs the gates (``local``, or ``dask://HOST:PORT``).  ``window``: queue items
    gated at once (default: the manifest's ``[integrate] window``, else adaptive);
    ``confirm_failures``: re-runs of failed gates before blame (default: the manifest's, 1)."""
    # the run's machinery (the engine, trio, networkx, the report's templates) here, not at
    # the module's import: status, prune and the tools `integrate serve` answers need none
    from dagrunner.engine.steps import new_run_id
    from dagrunner.integration.steps import Integrator

    check_integration_executor(executor)  # before anything is read or applied
    env = os.environ if env is None else env
    ctx = open_context(repo, env)
    goal = target or default_target(ctx)
    lock = ctx.info.state_dir / f"integrate-{goal.replace('/', '--')}.lock"
    with integrator_lock(lock, wait=wait), stuck_on_error(Queue.of(ctx.info, target=goal)):
        return Integrator(
            ctx,
            target=goal,
            manifest=manifest,
            batch=batch,
            env=env,
            run_id=new_run_id(),
            trust_envelope_manifest=trust_envelope_manifest,
            executor=executor,
            window=window,
            confirm_failures=confirm_failures,
        ).run()


def prune(
    *,
    repo: Path | None = None,
    keep: float = DEFAULT_KEEP,
    dry_run: bool = False,
    held: Path | None = None,
) -> Pruned:
    """``integrate prune``: the journal compacted to what live items (and final ones younger
    than ``keep`` seconds) need, and what only the others needed removed (``queue.prune_queue``),
    the worktree ledger compacted (``Ledger.compact``) and their landed proofs removed.
    Every integrator lock of the repository is taken first, never waited for (``held``: the
    one the caller holds, ``serve --prune-every``): ``integrator-busy`` while one runs."""
    ctx = open_context(repo)
    with contextlib.ExitStack() as stack:
        for lock in sorted(ctx.info.state_dir.glob("integrate-*.lock")):
            if held is not None and lock == held:
                continue
            try:
                stack.enter_context(integrator_lock(lock, wait=False))
            except DagrunnerError as exc:
                raise DagrunnerError(
                    exc.code,
                    exc.message,
                    exit_code=exc.exit_code,
                    hint="prune when no integrator runs, or let `integrate serve "
                    "--prune-every DUR` prune as it goes",
                ) from None
        reports = ctx.root / ".integration" / ".reports"
        pruned = prune_queue(Queue.of(ctx.info), reports, keep, dry_run=dry_run)
        # after the queue lock is let go: a cleanup takes the worktrees lock, then the queue's
        before, after = ctx.ledger.compact(dry_run=dry_run)
        notes = drop_notes(ctx.info.root, pruned.landed, dry_run=dry_run)
        return dataclasses.replace(
            pruned, ledger_bytes_before=before, ledger_bytes_after=after, notes_removed=notes
        )


def queue_status(*, repo: Path | None = None) -> dict[str, Any]:
    """``integrate status``: every envelope's entry; each one not yet final with its
    ``position`` among its target's pending items and an ``eta_seconds`` (``eta``)."""
    ctx = open_context(repo)
    entries = list(Queue.of(ctx.info).entries().values())
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.state] = counts.get(entry.state, 0) + 1
    body = [e.to_json() for e in entries]
    run_seconds = median_gate_run(repo=repo)
    default = default_target(ctx)
    by_target: dict[str, list[int]] = {}
    for index, entry in enumerate(entries):
        if entry.state not in FINAL:
            by_target.setdefault(entry.target or default, []).append(index)
    for goal, indexes in by_target.items():
        window = window_of(ctx.info.root, goal)
        ordered = sorted(indexes, key=lambda i: -entries[i].priority)  # as the queue takes them
        for position, index in enumerate(ordered, 1):
            body[index]["position"] = position
            body[index]["eta_seconds"] = (
                None
                if run_seconds is None
                else round(math.ceil(position / window) * run_seconds, 1)
            )
    return {
        "envelopes": body,
        "counts": counts,
        "eta": {"gate_run_seconds": run_seconds},
        "target_red": red_now(Queue.of(ctx.info), ctx.info.root),
    }


_WINDOWS: dict[tuple[str, str], int] = {}  # (repository, target head) -> its window


def window_of(root: Path, target: str) -> int:
    """The target's ``[integrate] window`` (1 when it is adaptive or cannot be read: the
    estimate is then an upper bound); read once per head of the target."""
    with contextlib.suppress(DagrunnerError), tempfile.TemporaryDirectory() as folder:
        head = git(["rev-parse", "--verify", f"refs/heads/{target}^{{commit}}"], cwd=root).text
        if (str(root), head) in _WINDOWS:
            return _WINDOWS[str(root), head]
        path = trusted_manifest(
            repo=root,
            head=head,
            target=target,
            given=None,
            tree_under_test=None,
            folder=Path(folder),
        )
        window = _WINDOWS[str(root), head] = load_manifest(path).integrate.window or 1
        return window
    return 1


def overlaps(
    *,
    repo: Path | None = None,
    target: str | None = None,
    only: str | None = None,
    prefilter: bool = True,
) -> Overlaps:
    """``worktree overlaps``: the pairs among the live worktrees, the envelopes queued for
    ``target`` (default: the main checkout's branch) and its tip that touch a common path,
    and whether each merges cleanly (``only``: the pairs of that worktree or envelope)."""
    ctx = open_context(repo)
    goal = target or default_target(ctx)
    check_branch(ctx.info, goal)
    records = ctx.ledger.state()
    live = [
        (wt_id, Path(record.path), record.base)
        for wt_id, record in sorted(records.items())
        if not record.missing and Path(record.path).is_dir() and not half_removed(Path(record.path))
    ]
    queue = Queue.of(ctx.info)
    envelopes: list[Envelope] = []
    for item, entry in queue.entries().items():
        if entry.state in FINAL or entry.target not in (None, goal):
            continue
        with contextlib.suppress(DagrunnerError):  # a damaged file: integrate rejects it
            envelopes.append(queue.load(item))
    exported = [
        (wt_id, e.envelope) for wt_id, r in records.items() for e in r.exports if e.envelope
    ]
    return find_overlaps(
        ctx.info.root,
        ctx.info.common_dir,
        target=goal,
        worktrees=live,
        envelopes=envelopes,
        related=[(w, e) for w, e in exported],
        only=only,
        prefilter=prefilter,
    )
