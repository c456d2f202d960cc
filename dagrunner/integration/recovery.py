"""Before an integrator does any work: what a crash or a fault left behind is settled.

``recover`` turns envelopes whose commit is already on the target (by the
integrator's own trailers) into ``landed`` and queues the rest again;
``preflight`` repairs a target checkout a landing left half-updated (or names
it) and clears or names stale git locks -- so no gate run is spent on a ref
that cannot move.

``Deadline`` bounds an interrupted run: a thread blocked in a system call (an ``open`` of a
FIFO, a hung filesystem) cannot be interrupted, and the run would wait for it forever
holding the integrator lock; past the grace the queue is journaled as a crash would leave
it (``recover``) and the process exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.command import git
from dagrunner.git.locks import check_locks
from dagrunner.integration import landing as checkouts
from dagrunner.integration.landing import landed_on_target
from dagrunner.integration.queue import QueueEntry
from dagrunner.records.integration import (
    FINAL,
    Details,
    EnvelopeOutcome,
    EnvelopeState,
    StaleCheckout,
)
from dagrunner.worktrees.allocate import default_target
from dagrunner.worktrees.gone import drop_gone, half_removed
from dagrunner.worktrees.landed import clean_after_landing

if TYPE_CHECKING:
    from dagrunner.integration.needs import IntegratorLike as Integrator


def recover(it: Integrator) -> None:
    """After a crash: envelopes whose commit is already on the target are landed; the rest requeue."""
    pending = {  # this target's (another integrator may be working on another's right now)
        i: e
        for i, e in it.queue.entries().items()
        if e.state not in FINAL and e.target in (None, it.target)
    }
    if not pending:
        return
    landed = landed_on_target(it.repo, it.ref)
    for envelope_id, entry in pending.items():
        commit = landed_commit(it, envelope_id, landed)
        if commit is not None:
            it.queue.record(
                envelope_id, EnvelopeState.LANDED, Details(commit=commit, recovered=True)
            )
            old, new = entry.details.old, entry.details.new
            if entry.state is EnvelopeState.LANDING and old and new:
                finish_checkout_sync(it, old, new)
        elif entry.state is not EnvelopeState.QUEUED:
            it.queue.record(
                envelope_id, EnvelopeState.QUEUED, Details(recovered_from=str(entry.state))
            )


def finish_checkout_sync(it: Integrator, old: str, new: str) -> None:
    """A crash between moving the ref and updating its checkout: finish the update."""
    checkout = it.target_checkout()
    if checkout is None or it.head() != new:
        return
    index_at_old = git(["diff-index", "--cached", "--quiet", old, "--"], cwd=checkout, check=False)
    worktree_at_index = git(["diff-files", "--quiet"], cwd=checkout, check=False)
    if index_at_old.returncode == 0 and worktree_at_index.returncode == 0:
        git(["read-tree", "-m", "-u", old, new], cwd=checkout, check=False)


def landed_commit(
    it: Integrator, envelope_id: str, landed: dict[str, tuple[str, str]]
) -> str | None:
    """The target commit that landed exactly this envelope (same id and diff hash), if any."""
    if envelope_id not in landed:
        return None
    commit, sha = landed[envelope_id]
    try:
        envelope = it.queue.load(envelope_id)
    except DagrunnerError:
        return None
    return commit if envelope.diff_sha256 == sha else None


def preflight(it: Integrator) -> None:
    """Before any gate run: a checkout left half-updated is repaired (or named), and stale
    git locks are cleared where ours (or named): no gate run is spent on a ref that cannot
    move."""
    stale = checkouts.recall(it.ctx.info.state_dir, it.target) or last_landing(it)
    if stale is not None:
        where = Path(stale.checkout)
        if not where.is_dir() or not checkouts.at_tree_of(where, stale.old):
            checkouts.forget(it.ctx.info.state_dir, it.target)  # synced, or moved on
        elif it.head() == stale.to and checkouts.repair(where, stale.old, stale.new, stale.to):
            checkouts.forget(it.ctx.info.state_dir, it.target)
        else:
            raise DagrunnerError(
                "target-checkout-stale",
                f"the checkout {stale.checkout} was left between two trees ({stale.reason})",
                where=stale.checkout,
                exit_code=ExitCode.FAILED,
                details=stale.to_json(),
                hint="it was clean before landing: free what blocked it (disk space) and run "
                f"again, and dagrunner repairs it; or restore it yourself: {stale.command}",
            )
    finish_cleanups(it)
    for path in check_locks(
        common_dir=it.ctx.info.common_dir,
        ref=it.ref,
        checkout=it.target_checkout(),
        own_worktrees=it.slots(),
    ):
        print(f"removed a stale git lock no process held: {path}", file=sys.stderr)


def finish_cleanups(it: Integrator) -> None:
    """The worker worktrees of landed items that a kill left before (or in the middle of)
    their cleanup: each recorded as having exported its item goes, under the same proof as
    right after a landing (``clean_after_landing``); one whose folder is gone or half removed
    (no ``.git``) has its registration, trash and record dropped, its branch deleted when
    the target holds it.  A worktree a cleanup retained keeps its reason, and is not tried
    again.  The worktree of an item that ended unlanded (a conflict, failed gates) before a
    kill, whose last export it is, is retained with that reason, as the run's end would
    have done."""
    records = it.ctx.ledger.state()
    if not records:
        return
    landed: dict[str, list[QueueEntry]] = {}
    unlanded: dict[str, QueueEntry] = {}
    for entry in it.queue.entries().values():
        if entry.target not in (None, it.target):
            continue
        if entry.state is EnvelopeState.LANDED:
            landed.setdefault(f"{entry.mission}/{entry.worker}", []).append(entry)
        elif entry.state in UNLANDED:
            unlanded[entry.id] = entry
    outcomes: list[EnvelopeOutcome] = []
    target = default_target(it.ctx)
    for wt_id, record in sorted(records.items()):
        if record.retained:
            continue
        path = Path(record.path)
        last = unlanded.get(record.exports[-1].envelope or "") if record.exports else None
        if last is not None and f"{last.mission}/{last.worker}" == wt_id and path.is_dir():
            # its worktree a kill left unmarked: "retained: <state>", as at a run's end
            outcomes.append(EnvelopeOutcome(last.id, last.mission, last.worker, last.state))
            continue
        mine = [e for e in landed.get(wt_id, []) if record.export_of(e.id) is not None]
        if not mine:
            continue
        if path.is_dir() and not half_removed(path):
            entry = mine[-1]
            outcome = EnvelopeOutcome(
                entry.id, entry.mission, entry.worker, EnvelopeState.LANDED, entry.details
            )
            outcomes.append(outcome)
            continue
        if path.is_dir() and record.session:
            continue  # half removed while a session holds it: that is for doctor and a human
        with contextlib.suppress(DagrunnerError), it.ctx.ledger.exclusive():
            drop_gone(it.ctx, wt_id, record, force=True, target=target)
    if outcomes:
        with it.git_lock:
            clean_after_landing(it.ctx, outcomes, it.queue.load, target, it.env)


def last_landing(it: Integrator) -> StaleCheckout | None:
    """The newest journaled landing onto the current head, as a checkout that should follow.

    A full disk can stop the marker from being written; the journal's landing
    record (written before the ref moved) still says from where to where.
    """
    checkout = it.target_checkout()
    if checkout is None:
        return None
    head = it.head()
    newest = it.queue.index().last_landing()  # kept up as the journal is read: no re-parse
    if newest is not None:
        old, new = newest
        if old and new == head:
            return StaleCheckout(
                checkout=str(checkout),
                target=it.target,
                old=old,
                new=head,
                to=head,
                reason="a landing whose checkout update did not finish",
            )
    return None


# The final states a run's end retains a worker's worktree for, with the state as the reason.
UNLANDED = frozenset({EnvelopeState.CONFLICT, EnvelopeState.GATES_FAILED, EnvelopeState.REJECTED})
GRACE = 6.0  # seconds from SIGTERM (or Ctrl-C) to a forced exit: the promise is 10
SETTLE = 2.0  # for journaling the queue back, before the exit comes regardless


class Deadline:
    """Once armed (the run was interrupted), the process ends within ``GRACE + SETTLE``
    seconds whatever its threads are blocked on: an orderly end disarms it first; past the
    grace every pending item of the target is journaled back (``recover``: queued, or landed
    where its commit is on the target already) and the process exits 130 without waiting
    for any thread (``os._exit``; the lock is a ``flock``, released with the process)."""

    def __init__(self, it: Integrator, grace: float = GRACE) -> None:
        self.it = it
        self.grace = grace
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()
        self.disarmed = False

    def arm(self) -> None:
        with self.lock:
            if self.timer is None and not self.disarmed:
                self.timer = threading.Timer(self.grace, self.expire)
                self.timer.daemon = True
                self.timer.start()

    def disarm(self) -> None:
        with self.lock:
            self.disarmed = True
            if self.timer is not None:
                self.timer.cancel()

    def expire(self) -> None:
        with self.lock:
            if self.disarmed:  # the run ended as the grace did
                return
        hard = threading.Timer(SETTLE, os._exit, (ExitCode.INTERRUPTED,))
        hard.daemon = True
        hard.start()  # a journal or git that blocks too does not hold the exit
        with contextlib.suppress(Exception):
            recover(self.it)
        with contextlib.suppress(OSError):
            sys.stderr.write(
                f"dagrunner: interrupted; a thread was still blocked {self.grace:g}s later, "
                "so the integrator exits without it (its items are queued again)\n"
            )
            sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)
