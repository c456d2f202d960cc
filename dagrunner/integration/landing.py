"""Landing: move the target with a compare-and-swap from the head the gates saw.

The ref moves only from ``old`` (what was gated) to the integration head; a
target checkout follows with ``git read-tree -m -u``.  When somebody else
moved the target first the outcome is ``moved`` (the integrator rebuilds);
when the checkout is dirty, the ref cannot be written, or the checkout
cannot follow, landing is ``blocked`` and ``IntegrationResult.land_blocked``
says why -- the envelopes stay queued and no user file is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagrunner.files import crash_point
from dagrunner.git.command import git, is_dirty
from dagrunner.integration import target_checkout as checkouts
from dagrunner.records.integration import (
    Details,
    EnvelopeState,
    LandBlocked,
    LandOutcome,
    StaleCheckout,
)

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope
    from dagrunner.integration.needs import IntegratorLike as Integrator

Applied = list[tuple["Envelope", str]]


def land(
    it: Integrator,
    old: str,
    applied: Applied,
    new: str | None = None,
    *,
    flaky: tuple[str, ...] = (),
) -> LandOutcome:
    """Move the target from ``old`` to ``new`` (default: the integration worktree's head):
    landed, moved, or blocked.  ``flaky``: gates that passed only when re-run on that tree."""
    new = new or git(["rev-parse", "HEAD"], cwd=it.wt).text
    checkout = it.target_checkout()
    if checkout is not None and is_dirty(checkout):
        block(
            it,
            applied,
            checkout,
            "target-checkout-dirty",
            "the target branch is checked out there with uncommitted changes",
        )
        return LandOutcome.BLOCKED
    for envelope, _ in applied:
        it.queue.record(envelope.id, EnvelopeState.LANDING, Details(old=old, new=new))
    crash_point("landing")
    moved = git(
        ["update-ref", "-m", f"dagrunner: land {len(applied)} envelope(s)", it.ref, new, old],
        cwd=it.repo,
        check=False,
    )
    if moved.returncode != 0:
        if it.head() != old:
            return LandOutcome.MOVED
        # Not moved by anyone: the ref itself cannot be written (a lock, a full disk).
        block(it, applied, Path(it.repo), "target-ref-unwritable", moved.message)
        return LandOutcome.BLOCKED
    crash_point("landed-ref")
    if checkout is not None:
        synced = git(["read-tree", "-m", "-u", old, new], cwd=checkout, check=False)
        if synced.returncode != 0:
            return failed_sync(it, applied, checkout, old, new, synced.message)
    it.landed(applied, old, new, flaky)
    return LandOutcome.LANDED


def failed_sync(
    it: Integrator, applied: Applied, where: Path, old: str, new: str, why: str
) -> LandOutcome:
    """The ref moved but its checkout could not follow: move the ref back and restore the
    checkout, or -- when the ref cannot move back -- say that the envelopes landed."""
    back = git(["update-ref", it.ref, old, new], cwd=it.repo, check=False)
    to = old if back.returncode == 0 else new
    stale = StaleCheckout(
        checkout=str(where), target=it.target, old=old, new=new, to=to, reason=why
    )
    restored = checkouts.repair(where, old, new, to)
    if not restored:
        checkouts.remember(it.ctx.info.state_dir, stale)
        it.result.checkout_stale = stale
    it.stop = True
    try:
        if to == old:
            note = "the target was moved back" + (
                "; its checkout was restored" if restored else f"; restore it: {stale.command}"
            )
            block(it, applied, where, "target-checkout-blocked", f"{why} ({note})")
            return LandOutcome.BLOCKED
        it.landed(applied, old, new)  # the truth: the target holds them
        return LandOutcome.LANDED
    except OSError as exc:  # a full disk: the journal cannot say it, the result still does
        it.result.land_blocked = LandBlocked(
            "disk-full", str(where), f"{why}; then {exc.strerror}: the target is at {to[:12]}"
        )
        return LandOutcome.BLOCKED


def block(it: Integrator, applied: Applied, checkout: Path, code: str, why: str) -> None:
    """Landing refused: say why, stop the run, and leave the envelopes queued."""
    it.result.land_blocked = LandBlocked(code, str(checkout), why)
    it.stop = True
    for envelope, _ in applied:
        it.queue.record(envelope.id, EnvelopeState.QUEUED, Details(note=f"{code}: {why}"))
        it.outcome(
            envelope.id, EnvelopeState.QUEUED, Details(reason=f"landing refused ({code}): {why}")
        )
