"""A worker's worktree after its envelope landed: cleaned only on proof -- the ledger
records an export of exactly that envelope (id, tree, diff) from that worktree, no other
session has claimed it since, and its full state is still that tree.  Otherwise it is left
alone, and the outcome says why (``retained: ...``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.git.statetree import state_tree
from dagrunner.records.integration import EnvelopeOutcome, EnvelopeState
from dagrunner.worktrees.allocate import Context
from dagrunner.worktrees.ledger import WorktreeRecord
from dagrunner.worktrees.lifecycle import cleanup_recorded


def clean_after_landing(
    ctx: Context,
    outcomes: Iterable[EnvelopeOutcome],
    load: Callable[[str], Envelope],
    target: str,
    env: Mapping[str, str],
) -> dict[str, str]:
    """A landed envelope's worktree goes only when it provably produced that envelope.

    Proof: the ledger records an export of exactly this envelope (id, tree and
    diff hash) from that worktree, no other session has claimed it since, and
    its full state is still that tree -- so everything it holds has landed.
    Anything less and the worktree is left alone with a note: an envelope's
    mission, worker and tree are a worker's claims, not facts.  Returns what
    became of each envelope's worktree, by envelope id (one that did not land: retained).
    """
    states = ctx.ledger.state()
    done: dict[str, str] = {}
    for outcome in outcomes:
        wt_id = f"{outcome.mission}/{outcome.worker}"
        state = states.get(wt_id)
        if state is None or not Path(state.path).is_dir():
            continue
        if outcome.state is not EnvelopeState.LANDED:
            ctx.ledger.append("retained", wt_id, reason=f"envelope {outcome.id} {outcome.state}")
            done[outcome.id] = f"retained: its envelope ended {outcome.state}"
            continue
        why = unproven(load(outcome.id), state)
        if why:
            ctx.ledger.append("retained", wt_id, reason=why)
            done[outcome.id] = f"retained: {why}"
            continue
        try:
            with ctx.ledger.exclusive():
                cleaned = cleanup_recorded(
                    ctx, wt_id, state, force=False, target=target, env=env, assume_landed=True
                )
            done[outcome.id] = cleaned["action"]
        except DagrunnerError as exc:
            done[outcome.id] = f"retained: {exc.message}"
    return done


def unproven(envelope: Envelope, state: WorktreeRecord) -> str:
    """Why the worktree of ``state`` is not proven to hold exactly ``envelope`` ('' if it is)."""
    exported = state.exported(envelope.exported_id, envelope.tree, envelope.diff_sha256)
    if exported is None:
        return "no export of this envelope from this worktree is recorded"
    owner = state.session
    if owner and owner != exported.session:
        return f"claimed by session {owner!r}, not the exporting session"
    if state_tree(Path(state.path)) != envelope.tree:
        return "holds work beyond the landed envelope"
    return ""
