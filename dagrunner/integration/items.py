"""What the integration pipeline tracks per queue item: its stage, its speculative head
and tree, and the verdicts its gate runs send back (``pipeline.py`` drives them)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dagrunner.engine.landed import GateProof
from dagrunner.integration.queue import Queue
from dagrunner.manifest.load import Manifest
from dagrunner.records.failures import Failures
from dagrunner.records.integration import (
    Details,
    EnvelopeState,
    Speculation,
    Verdict,
)
from dagrunner.records.run import RunRecord

if TYPE_CHECKING:  # trio in annotations only: the module's records serve processes without a run
    import trio

    from dagrunner.envelope import Envelope

MAX_AUTO_WINDOW = 4


class Stage(enum.Enum):
    WAITING = "waiting"  # to be built on the speculative head
    BUILT = "built"  # applied on it, its gates not started yet
    GATING = "gating"
    PASSED = "passed"
    SUSPECT = "suspect"  # failed while an item ahead was undecided: confirmed once they pass
    FAILED = "failed"  # confirmed: judged when it reaches the front
    DEFERRED = "deferred"  # conflicts on a speculative head: built again at the front


NOT_STARTED = (Stage.WAITING, Stage.BUILT, Stage.DEFERRED)


@dataclass(eq=False)
class Item:
    envelopes: list[Envelope]
    stage: Stage = Stage.WAITING
    generation: int = 0  # a reset makes the runs of earlier generations stale
    base: str = ""  # the speculative head it was applied on
    commit: str = ""  # its tree: what lands
    manifest: Path | None = None
    applied: list[tuple[Envelope, str]] = field(default_factory=list)
    confirms: int = 0
    certain: bool = False  # its last run failed as any re-run would (``Failures.rerunnable``)
    failing: tuple[str, ...] = ()
    flaky: tuple[str, ...] = ()
    # the landing invariant's (``proofs.py``): the gates with a pass on its tree, from any
    # run of that tree; those failing only as the target's head does (differential); and
    # what its confirmation runs (every gate without a pass)
    passed: frozenset[str] = frozenset()
    excused: frozenset[str] = frozenset()
    rerun: tuple[str, ...] = ()
    report: str = ""
    scope: trio.CancelScope | None = None
    slot: Path | None = None  # the worktree it was just built in, until its run takes it
    proven: Mapping[str, GateProof] = field(default_factory=dict)  # its landed proof's gates
    priority: int = 0  # its envelopes' (``--priority``; queue.URGENT pre-empts)
    # its commit's tree, and the manifest judging it: one that failed once in the run is not
    # gated again (by the same manifest: one a landing changed may pass it)
    tree: str = ""
    # suspects and deferred items ahead (``id``) its base leaves out: expected not to land
    excludes: frozenset[int] = frozenset()
    holds: frozenset[str] = frozenset()  # the envelopes its tree holds, landed in the run or not
    # of its batch, not applied here: one that did not apply (put aside), and what is queued
    # behind it or behind one that changes the manifest (``trees.Trees.apply_all``)
    deferred: list[Envelope] = field(default_factory=list)
    behind: list[Envelope] = field(default_factory=list)
    # of its batch, put aside behind a sibling they do not apply on, each with the commit it
    # did not apply on: a conflict there once the item lands (``Trees.judge_skipped``), back
    # in its place when the item is rebuilt or split (``in_order``); and the batch as queued
    skipped: list[tuple[Envelope, str]] = field(default_factory=list)
    queued: list[Envelope] = field(default_factory=list)
    new_failures: tuple[str, ...] = ()  # what it is blamed for (differential: what is new)
    # a differential baseline's: what its failing run failed, what it lands with (all the
    # target's), and the head that excused them
    seen: Failures = field(default_factory=Failures)
    failures: Failures | None = None
    excused_on: str = ""
    named: frozenset[str] = frozenset()  # of its envelopes, what its failure names (a batch's)
    # a piece its batch's failure named, gated apart and first (``batching.pieces``): the rest
    # of its batch, gated without it, and the gates the batch failed (a half: its batch's,
    # for a pair's rest that takes it, ``lengthen``)
    rest: Item | None = None
    batch_failing: tuple[str, ...] = ()
    batch_holds: frozenset[str] = frozenset()  # the envelopes the batch's tree held
    # the halves of a batch whose failure named nothing share a number (0: not such a half):
    # until one of them is decided, the culprit is among them, and nothing behind is gated
    halves: int = 0
    lineage: frozenset[int] = frozenset()  # the splits it is a piece of, its own included
    by_name: bool = False  # a piece of its batch that the batch's failure named
    # the piece of a named split ahead of the named: not gated while the item behind it may
    # pass holding it (it then lands with it), gated alone once that failed (``carrier``)
    carried: bool = False
    # a pair's rest that took what was left of the batches the pair was halved from: its own
    # envelopes, parted from what it took again when the pair's first passes (``lengthen``)
    own: frozenset[str] = frozenset()

    @property
    def suspected(self) -> bool:
        """Expected to fail, so what is behind is built without it: one envelope that failed
        once (waiting for its confirmation, or being confirmed), or a piece its batch's
        failure named (or the first of a pair), until it passes."""
        if (self.rest is not None or self.by_name) and self.stage is not Stage.PASSED:
            return True
        return self.stage is Stage.SUSPECT or (self.stage is Stage.GATING and self.confirms > 0)

    def unconfirmed(self, failing: tuple[str, ...], seen: Failures) -> tuple[str, ...]:
        """Its confirmation failed ``failing``: what it failed, for ``failed``.  When no
        gate failed twice, what failed now ran for the first time (skipped behind the failed
        need, or cancelled by the first failure) and what failed first passed or did not
        finish: no confirmation, so one of its own is due (bounded: each such run is some
        gate's first failure).  What passed now is flaky; what did not finish still fails.
        A run failing with no gate failed (a ``[budget]`` miss) runs nothing for the first
        time: a second failing run of the tree is its confirmation (else: forever)."""
        if not failing or set(failing) & set(self.failing):
            return failing
        self.confirms -= 1
        passed = tuple(g for g in self.failing if g in self.passed)
        self.flaky = tuple(dict.fromkeys(self.flaky + passed))
        self.seen = self.seen.rerun(seen, passed)
        return failing + tuple(g for g in self.failing if g not in self.passed | set(failing))

    def in_order(self) -> list[Envelope]:
        """Its envelopes, those put aside back in their places (the queue's order)."""
        kept = {e.id for e in self.envelopes} | {e.id for e, _ in self.skipped}
        return [e for e in self.queued if e.id in kept] if self.skipped else self.envelopes

    def absorb(self, ahead: Item) -> None:
        """``ahead`` (carried, this item's base) lands with this one: one item from
        ``ahead``'s base to this tree, which holds it."""
        self.envelopes, self.applied = (
            ahead.envelopes + self.envelopes,
            ahead.applied + self.applied,
        )
        self.skipped, self.queued = ahead.skipped + self.skipped, ahead.queued + self.queued
        self.base = ahead.base

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(e.id for e in self.envelopes)

    def reset(self) -> Path | None:
        """Back to waiting, in a newer generation (its run is cancelled);
        the slot it was built in when no run took it (the caller gives it back)."""
        self.generation += 1
        if self.scope is not None:
            self.scope.cancel()  # the run ends its process trees, then frees its slot
        slot, self.slot = self.slot, None
        self.envelopes, self.skipped = self.in_order(), []
        self.stage, self.confirms, self.failing, self.flaky = Stage.WAITING, 0, (), ()
        self.proven, self.applied, self.tree, self.excludes = {}, [], "", frozenset()
        self.holds = frozenset()
        self.passed, self.excused, self.rerun = frozenset(), frozenset(), ()
        # what a run of another tree failed is no verdict of the next (a flake's landing
        # passed run 5's failures of its tree without its need on as the target's own)
        self.seen, self.failures, self.new_failures = Failures(), None, ()
        return slot


def base_for(ahead: list[Item], item: Item, head: str, landed: frozenset[str]) -> str:
    """``item``'s speculative head: the tree of the nearest item ``ahead`` still expected
    to land (else the target's ``head``, holding what ``landed``).  A suspect (one envelope
    that failed once, waiting for its confirmation) is expected to fail: what is behind it is
    built without it (``item.excludes`` says so)."""
    skipped: set[int] = set()
    for before in reversed(ahead):
        if before.suspected or before.stage is Stage.DEFERRED:
            skipped.add(id(before))
        elif before.stage is not Stage.FAILED:
            item.excludes, item.holds = frozenset(skipped | before.excludes), before.holds
            return before.commit
    item.excludes, item.holds = frozenset(skipped), landed
    return head


def put_aside(item: Item, whole: bool) -> list[Item]:
    """The items behind ``item`` that what it did not apply makes (``Trees.apply_all``), in
    the queue's order: the envelope put aside, deferred (``item`` itself when none applied:
    ``whole``), and those queued behind it, gated without it -- never ahead of it: one may
    build on it, and it may apply at the front after all."""
    aside, behind, item.deferred, item.behind = item.deferred, item.behind, [], []
    made = [Item(aside, stage=Stage.DEFERRED, priority=item.priority)] if aside else []
    if whole:
        item.envelopes, item.stage, made = aside, Stage.DEFERRED, []
    if behind:
        made.append(Item(behind, priority=item.priority))
    for piece in made:  # still pieces of what it is a piece of
        piece.halves, piece.lineage, piece.by_name = item.halves, item.lineage, item.by_name
    return made


def put_back(items: list[Item], item: Item) -> None:
    """``item``'s one envelope failed: what it put aside (``Item.skipped``) goes back in the
    queue's order, as deferred items ahead of it and behind it -- never one queued ahead of
    it behind it (it would then be gated without it).  No tree built behind either holds
    it: each is built again if it applies at the front after all (``Item.excludes``)."""
    if not item.skipped or len(item.envelopes) != 1:
        return
    order, (mine,) = item.in_order(), item.envelopes
    at, item.skipped = order.index(mine), []
    item.deferred = order[:at]
    ahead = put_aside(item, False)
    item.deferred = order[at + 1 :]
    behind = put_aside(item, False)
    index = items.index(item)
    items[index : index + 1] = [*ahead, item, *behind]
    for made in ahead + behind:
        for later in items[items.index(made) + 1 :]:
            later.excludes |= {id(made)}


def lengthen(items: list[Item], at: int) -> None:
    """Halving narrowed a failure down to a pair (``items[at]``, its rest right behind it):
    the rest takes what is left behind it of the batches the pair was halved from (their
    waiting halves), all gated beside the first, without it.  When the first fails and the
    rest passes, the outermost batch's failure corroborates the first (that batch's tree
    held the rest's and the first), and all of the rest lands: one run beside the first,
    where the second alone took one and what was left another, once the first was blamed.
    When the first passes, the rest is parted again (``part``): what it took is no longer
    the rest of a failure, the second is its culprit."""
    first, rest = items[at], items[at + 1] if at + 1 < len(items) else None
    if not first.halves or rest is None or first.rest is not rest:
        return  # not a pair of a bisection

    behind: list[Item] = []
    for after in items[at + 2 :]:
        if after.stage not in (Stage.WAITING, Stage.DEFERRED) or after.by_name:
            break
        if after.priority != first.priority:
            break
        behind.append(after)
    # what is left reaches to the batch's last envelope behind it (coalescing may have put
    # others after it); one between two of them was put aside in the batch's tree, which
    # held it not: it is again, or, applying, lets the rest corroborate nothing
    flat = [e for after in behind for e in after.envelopes]
    end = max((i + 1 for i, e in enumerate(flat) if e.id in rest.batch_holds), default=0)
    if not end:
        return
    rest.own = rest.own or frozenset(rest.ids)
    rest.envelopes = rest.envelopes + flat[:end]
    first.batch_holds, first.batch_failing = rest.batch_holds, rest.batch_failing
    taken = {e.id for e in flat[:end]}
    for after in behind:
        kept = [e for e in after.envelopes if e.id not in taken]
        if kept:
            after.envelopes = kept
        else:
            items.remove(after)


def part(items: list[Item], rest: Item | None) -> None:
    """The first of a pair passed: its rest (waiting: the caller reset it), which took what
    was left of its batches (``lengthen``), is the pair's second again, and what it took
    an item of its own right behind it."""
    if rest is None or not rest.own or rest not in items:
        return
    mine = [e for e in rest.envelopes if e.id in rest.own]
    taken = [e for e in rest.envelopes if e.id not in rest.own]
    rest.own = frozenset()
    if mine and taken:  # (else it is whole as it is: nothing lost)
        rest.envelopes = mine
        after = Item(taken, priority=rest.priority)  # the second is the culprit: what is
        after.lineage = rest.lineage  # left is gated as any item is (``narrowing``)
        items.insert(items.index(rest) + 1, after)


def forget_failures(items: list[Item]) -> None:
    """The target moved under the run, or a landing changed its manifest: a batch's failure
    on the head it had, or under the manifest it had, is no evidence on the new one (a fix
    landed around the queue, a gate changed, may have ended it), so it corroborates no
    piece of that batch there (``batching.corroborated``): each is confirmed by a re-run
    of its own tree, as the serial loop confirms it there."""
    for item in items:
        item.batch_holds = frozenset()


def carrier(items: list[Item]) -> Item | Literal[False] | None:
    """The front is carried (``Item.carried``: not gated on its own): the item right behind
    it when it passed on a tree holding the front -- the front lands with it, on its tree;
    None while it is undecided; False when it failed (or failed once), or holds not the
    front: gate the front on its own.  A named piece behind it is never blamed off a later
    tree's pass: the serial loop judges it on the front landed alone, and a tree holding the
    front and the rest says nothing of the front alone (a hostile envelope ahead can fail
    alone, pass beside the rest, and name the one behind it: it would land, and that one
    be blamed for it)."""
    front, into = items[0], items[1] if len(items) > 1 else None
    if into is not None and into.stage in (Stage.WAITING, Stage.BUILT, Stage.GATING):
        return None
    if into is None or into.stage is not Stage.PASSED or not set(front.ids) <= into.holds:
        return False
    return into


def carry(items: list[Item], queue: Queue) -> bool:
    """Land a carried front with what carries it (``carrier``): True when it is now part of
    the front (which passed); False: it waits, or (gated on its own now) it is no longer
    carried -- also when an envelope of the front was withdrawn since (the landing would
    not take it: gated on its own, it is found so, and what was built on it is built again
    without it).  Its envelopes are journaled with the run that passed the tree they land
    on."""
    if (into := carrier(items)) is None:
        return False
    entries = queue.entries()
    gone = any(entries[e.id].state is EnvelopeState.WITHDRAWN for e in items[0].envelopes)
    if into is False or gone:
        items[0].carried = False
        return False
    run = entries[into.envelopes[0].id].details  # the run that passed the tree it lands on
    journal(queue, items[0], Details(gate_run=run.gate_run, head=run.head, position=run.position))
    into.absorb(items.pop(0))
    return True


@dataclass(frozen=True)
class Finished:
    """One gate run's verdict, sent from its task to the controller."""

    item: Item
    generation: int
    passed: bool
    failing: tuple[str, ...]
    report: str
    confirm: bool
    proven: Mapping[str, GateProof] = field(default_factory=dict)  # what passed on its tree
    passes: frozenset[str] = frozenset()  # every gate that passed on it (``proofs.passes``)
    tree: str = ""  # the tree it gated
    record: RunRecord | None = None  # the run's own record (its gates' tests, for a baseline)
    cpu: float = 0.0  # CPU-seconds its gates' processes took


def auto_window(manifest: Manifest, cpu: float) -> int:
    """The adaptive ceiling: as many whole gate runs as the governor's CPU holds (1 to 4)."""
    need = sum(gate.cpu for gate in manifest.gates.values()) or 1.0
    return max(1, min(MAX_AUTO_WINDOW, int(cpu // need)))


@dataclass(frozen=True)
class GateRun:
    """One gate run of an item, as it was when launched (a reset item changes; this does not)."""

    item: Item
    number: int
    position: int
    confirm: bool
    generation: int
    base: str
    commit: str
    manifest: Path | None
    only: tuple[str, ...]
    ids: tuple[str, ...]
    scope: trio.CancelScope
    slot: Path | None  # built there; None: take a free one and move it to ``commit``
    tree: str = ""

    @classmethod
    def of(cls, item: Item, number: int, position: int, *, confirm: bool) -> GateRun:
        """A run of ``item``'s tree as it is now."""
        assert item.scope is not None
        return cls(
            item=item,
            number=number,
            position=position,
            confirm=confirm,
            generation=item.generation,
            base=item.base,
            commit=item.commit,
            manifest=item.manifest,
            only=item.rerun if confirm else (),
            ids=item.ids,
            scope=item.scope,
            slot=item.slot,
            tree=item.tree,
        )

    def account(self, queue: Queue, said: Speculation, finished: Finished | None) -> None:
        """What the run cost, for ``integrate stats``: one ``gate-run`` line per run of an
        item (a run of the target's head has none)."""
        if self.ids:
            cpu = round(finished.cpu, 3) if finished is not None else 0.0
            note = "cancelled" if said.verdict is Verdict.CANCELLED else None
            details = Details(gate_run=self.number, gate_cpu=cpu, note=note)
            queue.record(self.ids[0], EnvelopeState.GATING, details, event="gate-run")

    def speculation(
        self, finished: Finished | None, start: float, end: float, report: str
    ) -> Speculation:
        """This run as the report's timeline draws it."""
        stale = self.generation != self.item.generation
        if finished is None or stale:
            verdict = Verdict.CANCELLED
        elif finished.passed:
            verdict = Verdict.FLAKY if self.confirm else Verdict.PASSED
        else:
            verdict = Verdict.CONFIRMED if self.confirm else Verdict.FAILED
        return Speculation(
            gate_run=self.number,
            envelopes=self.ids,
            head=self.base,
            commit=self.commit,
            position=self.position,
            start=start,
            end=end,
            verdict=verdict,
            confirm=self.confirm,
            gates=finished.failing if finished else (),
            report=report,
        )


def journal(
    queue: Queue,
    item: Item,
    details: Details,
    state: EnvelopeState = EnvelopeState.GATING,
    event: str | None = None,
) -> None:
    """One line per envelope of ``item``."""
    for envelope in item.envelopes:
        queue.record(envelope.id, state, details, event=event)
