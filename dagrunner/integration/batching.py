"""What enters the pipeline (``Intake``: the queue's pending items, highest priority first)
and how many envelopes one item gates together (``Sizer``).

``--batch N`` (or ``[integrate] batch = N``) fixes it.  ``auto``, the default, sizes each
batch by generalized binary splitting (Hwang): from the rate of culprits among the last
``RECENT`` envelopes the queue judged (a prior of one in ``PRIOR_SEEN``), the largest power
of two at most (1 - rate) / rate, between 1 and ``MOST``: a first batch of ``FIRST``, 8
after 4 landed, 16 after 12; about 16 at one culprit in 20.  A batch that fails is split
at once (``pieces``): what its failure names first, then the rest of it, else it is halved,
and nothing queued behind the halves is gated until the culprit is found (its trees would
hold it; ``narrowing``).  A pair's first is gated on its base and, side by side, the second
with all that is left of the batch (``items.lengthen``): the first failing beside that
passing is blamed with no re-run (``corroborated``), and all of it lands.  Finding d
culprits among n this way costs about d*log2(n/d) + 2d runs, a confirmation each included
(docs/integration.md).

What a failure names (``named``): the envelopes of the batch whose changed paths its failing
gates' log tails or failed test cases mention.  Runners name the file they failed in (a
traceback, ``path:line: error`` of a linter or a type checker, a test id), so the culprit is
usually among them.  The pieces keep the queue's order: what is queued ahead of the named
(carried: not gated while a named one behind may pass and land it, ``items.carry``), the
named (expected to fail), the others between them and behind, built without the named, all
at the same time: a 16-envelope batch with one named culprit costs two runs after its
failure (the culprit, the rest: its confirmation) and one of what is ahead of it, instead
of six.  A name
is a suspicion, never a verdict: an envelope is blamed only for a tree of its own that
failed, confirmed; and no piece's tree holds an envelope queued after it (whose failure
could name it, and frame it) or lacks one queued ahead of it that is to land.
A batch is split by names once per envelope (``Namer``); then by halves.

Each change of size is a decision with its reason, journaled as a ``batch-size`` event on
the first envelope of the batch it sized (``Intake.next``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import trio

from dagrunner.integration.items import NOT_STARTED, Finished, Item, Stage
from dagrunner.integration.queue import URGENT, JournalLine, Queue
from dagrunner.records.integration import Details, EnvelopeState, PipelineTally
from dagrunner.records.run import RunRecord, Status
from dagrunner.report.logtail import Mentions, failing_lines, read_log

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope
    from dagrunner.integration.needs import Batch, IntegratorLike

FIRST = 4  # the first batch of an auto-sized run: ``group_size`` of the prior's rate
MOST = 32  # the auto size's ceiling
RECENT = 64  # envelopes judged, looked back on
PRIOR_SEEN = 8  # the rate's prior: one culprit in this many envelopes (a first batch of 4)
NAMES_READ = 64 * 1024  # of each failing gate's log, its end: where runners say what failed
SPLITS = itertools.count(1)  # the number the halves of one anonymous split share


def named(envelopes: Sequence[Envelope], record: RunRecord, run_dir: Path) -> frozenset[str]:
    """The ids of the envelopes of a failed batch that its failure names (``Mentions``: a file
    one of them changes, in its failing gates' failed test cases or the lines of their log
    tails that say what failed or where), or none when more than half of them are named
    (that names nothing); naming none, the suspects by reads (``read_suspects``).  The
    words are the gates' own, not to be trusted: they only choose which envelopes are gated
    apart first; an envelope is still blamed only for a tree of its own that failed,
    confirmed."""
    return _mentioned(envelopes, record, run_dir) or read_suspects(envelopes, record)


def read_suspects(envelopes: Sequence[Envelope], record: RunRecord) -> frozenset[str]:
    """The envelopes of a failed batch that changed a file its failing gates were seen to
    read (what they read stands for: a module's source for its bytecode), or that add,
    remove, rename or change the mode of any path (what a ``stat`` finds is not seen);
    none when a failing gate was not seen whole, or when more than half are suspects
    (splitting them off then costs more runs than halving: measured).  The others,
    editing only files the failure did not read, are gated apart at once, as the named are
    (the suspects first).  An envelope's own account of its changes is a hostile worker's
    word: it only chooses which are gated apart; a tree is judged by its gates alone."""
    read: set[str] = set()
    for gate in record.gates:
        if gate.status.ok or gate.status in (Status.SKIPPED, Status.CANCELLED):
            continue  # passed, or did not fail on its own: behind a need, or fail-fast
        seen = gate.cache.observed if gate.cache is not None else None
        if not seen or "paths" not in seen:  # not seen whole: anything may be its cause
            return frozenset()
        read.update(seen["paths"])

    def suspect(change: dict[str, object]) -> bool:
        plain = change.get("kind") == "modified" and change.get("mode") == change.get("old_mode")
        return not plain or change.get("path") in read or change.get("old_path") in read

    suspects = frozenset(
        e.id for e in envelopes if any(map(suspect, e.fields.get("changed_files", ())))
    )
    return suspects if len(suspects) <= len(envelopes) // 2 else frozenset()


def _mentioned(envelopes: Sequence[Envelope], record: RunRecord, run_dir: Path) -> frozenset[str]:
    words: list[str] = []
    for gate in record.gates:
        if not gate.status.ok:
            words.append(failing_lines(read_log(run_dir, gate.log, limit=NAMES_READ)))
            if gate.reason.startswith("tree-modified"):  # the files the guard saw changed
                words.append(gate.reason)
            failed = gate.tests.failed if gate.tests is not None else ()
            words += (f"{case.suite} {case.name} {case.message}" for case in failed)
    said = Mentions.of("\n".join(words))  # log lines and JUnit cases are without escapes
    hits = frozenset(e.id for e in envelopes if any(said.name(p) for p in e.touched))
    return hits if len(hits) <= len(envelopes) // 2 else frozenset()


class Namer:
    """What a failed batch's failure names (``named``), once per envelope in a run: a batch
    is split so only when none of its envelopes was split so before.  A failure that names
    one envelope after another (a hostile one can) then costs one run more than halving,
    not a run per envelope."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.split: set[str] = set()  # the envelopes of batches split by their names

    async def name(self, item: Item, done: Finished) -> None:
        """``item.named``, each a ``named`` event on its line (its state stays: a
        suspicion, not a verdict)."""
        ids = set(item.ids)
        if len(ids) < 2 or done.record is None or done.confirm or ids & self.split:
            return
        where = (item.envelopes, done.record, Path(done.report))
        item.named = await trio.to_thread.run_sync(named, *where)
        if not item.named:
            return
        self.split |= ids
        note = f"named by the failure of {where[2].name}: gated apart, ahead of its batch"
        for envelope_id in sorted(item.named):
            self.queue.record(envelope_id, EnvelopeState.GATING, Details(note=note), event="named")


def pieces(item: Item) -> list[Item]:
    """A failed batch split in the queue's order: what its failure named (``Item.named``),
    each run of named envelopes a piece gated apart and expected to fail (what is behind is
    built without it), and each run of the others between them a piece of its own; or,
    naming none, its halves, the second on the first (where, the first passing, its tree is
    the failed batch's: known failed, no run).  Every piece is judged on a tree holding what
    is queued ahead of it and expected to land, as the serial loop judges it (one envelope
    may build on another); none on a tree holding an envelope queued after it (whose
    failure could name it, and frame it).  The last named piece's rest (``Item.rest``:
    what is behind it, built without every named piece) is its corroboration.

    Halves share a number (``Item.halves``): the culprit is among them, so nothing behind
    them is gated until one is decided (``Pipeline.narrowing``).  A pair is gated as a
    named piece and its rest are, each on the batch's base, side by side: when the first
    fails and the second passes, the pair's failure is the first's confirmation
    (``corroborated``), a run fewer; when the first passes, the second is rebuilt on it:
    its tree is the pair's, known failed.  Every half carries the outermost batch of its
    bisection (``batch_holds``, ``batch_failing``): the pair's second takes what is left
    of it (``items.lengthen``), and that batch's failure is then the first's confirmation."""
    envelopes = item.in_order()  # with what it put aside, in its place
    runs = [(n, list(g)) for n, g in itertools.groupby(envelopes, lambda e: e.id in item.named)]
    halved = len(runs) < 2  # named none (or all: never, at most half are named)
    if halved:
        half = len(envelopes) // 2
        runs = [(False, envelopes[:half]), (False, envelopes[half:])]
    split = next(SPLITS) if halved else 0
    made = [Item(part, priority=item.priority) for _, part in runs]
    # the batch whose failure a bisection narrows, its outermost (``items.lengthen``); a
    # pair's rest that took what was left of it failed on its own: a bisection of its own
    ours = item.halves and not item.own
    root = (item.batch_holds, item.batch_failing) if ours else (item.holds, item.failing)
    for (by_name, _), piece in zip(runs, made, strict=True):
        piece.by_name = by_name
        piece.halves = split
        piece.lineage = item.lineage | {split} if split else item.lineage
        piece.batch_holds, piece.batch_failing = root
    last = max(i for i, (by_name, _) in enumerate(runs) if by_name) if not halved else 0
    if last + 1 < len(made) and (not halved or len(envelopes) == 2):
        made[last].rest, made[last].batch_failing = made[last + 1], item.failing
        made[last].batch_holds = item.holds
        # what is ahead of the named lands with a named one that passes (else gated alone)
        made[0].carried = not halved and not runs[0][0]
    return made


def narrowing(ahead: list[Item], item: Item, found: set[int]) -> bool:
    """Halves of a batch whose failure named nothing are ``ahead`` of ``item`` (not its own
    siblings), none decided yet: the culprit is among them, so ``item``'s tree would most
    likely hold it.  It waits rather than spend a run on that; the slots go to the halves.
    A half of a split whose culprit was ``found`` since (an envelope blamed whose lineage
    holds the split) is what is left of its batch, gated as any item is; its own halves, if
    it fails in turn, hold back what is behind them again."""
    undecided = (Stage.WAITING, Stage.BUILT, Stage.GATING)
    return item.stage in (Stage.WAITING, Stage.BUILT) and any(
        x.halves
        and x.halves != item.halves
        and x.stage in undecided
        and not x.suspected
        and x.halves not in found
        for x in ahead
    )


def corroborated(item: Item, items: list[Item], window: int) -> bool | None:
    """A named envelope failed alone (``item``, a suspect): is its batch's own failure the
    confirmation?  True when the rest of the batch passed without it and it failed only gates
    the batch failed: two failing runs of two trees whose one common change is this
    envelope, where the rest passes -- what a re-run of its tree would add, a flake could
    only fake twice.  None while the rest is being gated, or waits for a place in the
    ``window`` that it has; False: confirm it by a re-run (also when the rest cannot be
    gated beside it: a window of 1 gates nothing beside the suspect).  The rest's tree must
    hold every envelope the batch's held but this one: one that leaves out another (a named
    one that failed, one ahead found failing since) may pass for what it left out, and the
    batch's failure may have been that one's -- a flake of this envelope's tree would then
    be blamed on it.  Nor may it hold one the batch's did not (an envelope the batch put
    aside, applying without this one): the rest may pass for it."""
    rest = item.rest
    if rest is None or rest not in items or not set(item.failing) <= set(item.batch_failing):
        return False
    if rest.stage is Stage.PASSED:
        return item.batch_holds - set(item.ids) <= rest.holds <= item.batch_holds
    coming = rest.stage in (Stage.WAITING, Stage.BUILT) and items.index(rest) < window
    return None if rest.stage is Stage.GATING or coming else False


def coalesce(items: list[Item], start: int, size: int) -> None:
    """Items from ``start`` on that wait to be built, of one priority, side by side, are
    gated together again (up to ``size``, at least 2 unless ``size`` is 1): the pieces a
    bisection left behind the failure it found need not be gated one by one."""
    index, most = start, size if size == 1 else max(2, size)
    while index + 1 < len(items):
        item, after = items[index], items[index + 1]
        if (
            item.stage is Stage.WAITING
            and after.stage is Stage.WAITING
            and item.priority == after.priority
            and len(item.envelopes) + len(after.envelopes) <= most
        ):
            item.envelopes += after.envelopes
            del items[index + 1]
            # a batch again, no longer a piece: nothing expected of it, or of its siblings
            item.rest, item.batch_failing, item.halves, item.by_name = None, (), 0, False
            item.carried, item.own, item.batch_holds = False, frozenset(), frozenset()
        else:
            index += 1


def resolve(given: Batch, manifest: int | None) -> int | None:
    """The fixed batch size (None: auto) from ``--batch`` and ``[integrate] batch``."""
    if given == "auto":
        return None
    return given if given is not None else manifest


def group_size(rate: float) -> int:
    """Generalized binary splitting's group for a culprit rate: the largest power of two at
    most (1 - rate) / rate (Hwang), so that a batch holds about one culprit when it fails:
    a passing one lands that many at one run, a failing one costs its bisection."""
    ratio = int((1 - rate) / rate + 1e-9) if rate > 0 else MOST
    return max(1, min(MOST, 1 << max(0, ratio.bit_length() - 1)))


@dataclass
class Sizer:
    """The batch size for the next item, from the rate of culprits among the envelopes the
    queue judged lately (``judged``): generalized binary splitting's group (``group_size``),
    the rate read with a prior of one culprit in ``PRIOR_SEEN`` envelopes, which sizes the
    first batch at ``FIRST``."""

    fixed: int | None = None  # --batch N: always this
    size: int = FIRST
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT))  # per envelope
    said: int = 0  # the size the journal was last told of (0: none yet)
    why: str = "the first batch of the run"

    def __post_init__(self) -> None:
        if self.fixed is not None:
            self.size, self.why = self.fixed, "fixed by --batch or [integrate] batch"

    def judged(self, landed: int = 0, blamed: int = 0, *, named: bool = False) -> None:
        """Envelopes landed, or blamed (a culprit, confirmed): the rate, and the size.  A
        culprit its batch's failure named counts as landed: it cost the same few runs
        whatever the size of its batch, and a batch need not shrink for it."""
        if self.fixed is not None:
            return
        landed, blamed = (landed + blamed, 0) if named else (landed, blamed)
        self.recent.extend([True] * landed + [False] * blamed)
        culprits = self.recent.count(False)
        size = group_size((culprits + 1) / (len(self.recent) + PRIOR_SEEN))
        if size != self.size:
            tally = f"{culprits} culprits among the last {len(self.recent)} envelopes judged"
            self.size, self.why = size, f"{'grew' if size > self.size else 'shrank'}: {tally}"

    def decided(self, admitted: int) -> str | None:
        """The reason to journal for a batch of ``admitted`` envelopes, when the size changed
        since the journal was last told (None: nothing new to say)."""
        if self.size == self.said:
            return None
        self.said = self.size
        fewer = f"; {admitted} were waiting" if admitted < self.size else ""
        return f"batch size {self.size}: {self.why}{fewer}"


class Intake:
    """What enters the pipeline: the queue's pending items, highest priority first, read
    again at each admission, so that what is submitted while the run goes, and its
    priority, counts.  An item is admitted once per run."""

    def __init__(self, it: IntegratorLike, sizer: Sizer) -> None:
        self.it = it
        self.sizer = sizer
        self.taken: set[str] = set()
        self.prioritized = False  # an item with a priority above 0 was submitted since the start
        self.known: list[tuple[str, int]] = []  # the pending items as last read
        self.stale = True  # something was submitted since they were read

    def fresh(self) -> list[tuple[str, int]]:
        """The pending items not admitted yet, with their priorities, highest first.  The
        queue is read again only when something was submitted since (``news`` saw it), or
        when everything read before is taken."""
        fresh = [(i, p) for i, p in self.known if i not in self.taken]
        if self.stale or not fresh:
            pending, entries = self.it.queue.pending_entries()
            self.known, self.stale = [(i, entries[i].priority) for i in pending], False
            fresh = [(i, p) for i, p in self.known if i not in self.taken]
        return fresh

    def admit(self, ids: list[str], priority: int = 0, size: int = 1) -> Item | None:
        """An item of the first of ``ids`` that the target lets in (up to ``size`` of them);
        None when none is (each rejection is journaled)."""
        envelopes: list[Envelope] = []
        for envelope_id in ids:
            if len(envelopes) == size:
                break
            self.taken.add(envelope_id)
            envelope = self.it.admit(envelope_id)
            if envelope is not None:
                envelopes.append(envelope)
        return Item(envelopes, priority=priority) if envelopes else None

    def place(self, items: list[Item]) -> tuple[int, Item] | None:
        """Where a pending item of a higher priority than ``items`` not started goes (before
        them; an urgent one before every item not yet passed), admitted; None: nowhere (it
        comes next anyway).  The pipeline resets what was gating behind it."""
        if not self.prioritized:
            return None  # nothing with a priority was submitted since the run began
        fresh = self.fresh()
        if not fresh:
            return None
        top, priority = fresh[0]
        started = [i for i, x in enumerate(items) if x.stage not in NOT_STARTED]
        floor = next((i for i, x in enumerate(items) if x.stage is not Stage.PASSED), 0)
        index = floor if priority >= URGENT else (started[-1] + 1 if started else 0)
        while index < len(items) and items[index].priority >= priority:
            index += 1
        if index == len(items) or not (item := self.admit([top], priority)):
            return None
        return index, item

    def next(self, tally: PipelineTally) -> Item | None:
        """The next batch to gate, of the size the sizer says (a change of size journaled as
        a ``batch-size`` event), or None when the queue holds no more."""
        while fresh := self.fresh():
            same = [i for i, p in fresh if p == fresh[0][1]]  # a batch is of one priority
            item = self.admit(same, fresh[0][1], self.sizer.size)
            if item is None:
                continue
            tally.batches.append(len(item.envelopes))
            if why := self.sizer.decided(len(item.envelopes)):
                self.it.queue.record(
                    item.ids[0],
                    EnvelopeState.QUEUED,
                    Details(batch=self.sizer.size, note=why),
                    event="batch-size",
                )
            return item
        return None

    async def news(self, send: Callable[[None], None], every: float = 0.5) -> None:
        """While the run goes: wake the controller (``send(None)``) when an item with a
        priority above 0 is submitted, so that it can go before what has not started.  Only
        the journal's new lines are read."""
        journal = self.it.queue.journal
        offset = journal.stat().st_size if journal.exists() else 0
        while True:
            await trio.sleep(every)
            with contextlib.suppress(OSError), journal.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
                end = data.rfind(b"\n") + 1
                offset += end
                for raw in data[:end].splitlines():
                    with contextlib.suppress(orjson.JSONDecodeError):
                        line = JournalLine.from_json(orjson.loads(raw))
                        self.stale = self.stale or (line is not None and line.source is not None)
                        if line is not None and (line.priority or 0) > 0:
                            self.prioritized = True
                            send(None)

    def requeue(self, items: list[Item], tally: PipelineTally) -> None:
        """The run stopped early: what it applied of ``items`` and did not finish is queued
        again, with a note saying why."""
        note = (
            "interrupted"
            if tally.interrupted
            else "target-moving"
            if tally.target_moving
            else "the run stopped before it"
        )
        for item in items:
            if item.stage is Stage.DEFERRED or (item.stage is Stage.WAITING and not item.applied):
                continue  # its journal says queued already
            for envelope in item.envelopes:
                if envelope.id not in self.it.outcomes:
                    self.it.queue.record(envelope.id, EnvelopeState.QUEUED, Details(note=note))
