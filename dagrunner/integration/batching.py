"""What enters the pipeline (``Intake``: the queue's pending items, highest priority first)
and how many envelopes one item gates together (``Sizer``).

``--batch N`` (or ``[integrate] batch = N``) fixes it.  ``auto``, the default, sizes each
batch from the queue's recent outcomes: it starts at ``FIRST``, doubles while the recent
batches pass (at least ``GROW_AT`` of the last ``RECENT`` of them) and halves on a failure
when fewer than ``SHRINK_BELOW`` of them passed, between 1 and ``MOST``.  A batch that
fails is split at once (``pieces``): what its failure names goes behind the rest of it, else
it is halved; the pieces' outcomes do not count here (they say where the culprit is, not how
often batches fail).

What a failure names (``named``): the envelopes of the batch whose changed paths its failing
gates' log tails or failed test cases mention.  Runners name the file they failed in (a
traceback, ``path:line: error`` of a linter or a type checker, a test id), so the culprit is
usually among them; gated behind the rest of the batch, the named piece's tree is the failed
batch's own (the rest passing): its verdict is known without a run, and a single named
envelope goes straight to its one confirmation.  A 16-envelope batch with one culprit costs
two runs after its failure instead of five.

Each change of size is a decision with its reason, journaled as a ``batch-size`` event on
the first envelope of the batch it sized (``Pipeline.admit_item``).
"""

from __future__ import annotations

import contextlib
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
from dagrunner.records.run import RunRecord
from dagrunner.report.logtail import Mentions, failing_lines, read_log, strip_ansi

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope
    from dagrunner.integration.needs import Batch, IntegratorLike

FIRST = 4  # the first batch of an auto-sized run
MOST = 32  # the auto size's ceiling
RECENT = 5  # batches looked back on
GROW_AT = 0.8  # grow while at least this share of them passed
SHRINK_BELOW = 0.6  # shrink on a failure when fewer than this share passed
NAMES_READ = 64 * 1024  # of each failing gate's log, its end: where runners say what failed


def named(envelopes: Sequence[Envelope], record: RunRecord, run_dir: Path) -> frozenset[str]:
    """The ids of the envelopes of a failed batch that its failure names (``Mentions``: a file
    one of them changes, in its failing gates' failed test cases or the lines of their log
    tails that say what failed or where), or none when more than half of them are named
    (that names nothing).  The words are the gates' own, not to be trusted: they only choose
    which envelopes are gated apart first; an envelope is still blamed only for a tree of
    its own that failed, confirmed."""
    words: list[str] = []
    for gate in record.gates:
        if not gate.status.ok:
            words.append(failing_lines(read_log(run_dir, gate.log, limit=NAMES_READ)))
            failed = gate.tests.failed if gate.tests is not None else ()
            words += (f"{case.suite} {case.name} {case.message}" for case in failed)
    said = Mentions.of(strip_ansi("\n".join(words)))
    hits = frozenset(e.id for e in envelopes if any(said.name(p) for p in e.touched))
    return hits if len(hits) <= len(envelopes) // 2 else frozenset()


async def name_suspects(item: Item, done: Finished, queue: Queue) -> None:
    """A batch's own run failed: what its failure names (``item.named``), each a ``named``
    event on its line (its state stays: it is a suspicion, not a verdict)."""
    if len(item.envelopes) < 2 or done.record is None or done.confirm:
        return
    where = (item.envelopes, done.record, Path(done.report))
    item.named = await trio.to_thread.run_sync(named, *where)
    note = f"named by the failure of {where[2].name}: gated apart, behind the rest of its batch"
    for envelope in item.envelopes:
        if envelope.id in item.named:
            queue.record(envelope.id, EnvelopeState.GATING, Details(note=note), event="named")


def pieces(item: Item) -> list[Item]:
    """A failed batch split in two: the rest of it, then what its failure named
    (``Item.named``); or, naming none, its halves.  Either way the second piece is gated on
    the first, where (the first passing) its tree is the failed batch's: known failed."""
    rest = [e for e in item.envelopes if e.id not in item.named]
    last = [e for e in item.envelopes if e.id in item.named]
    if not rest or not last:
        half = len(item.envelopes) // 2
        rest, last = item.envelopes[:half], item.envelopes[half:]
    return [Item(rest, priority=item.priority), Item(last, priority=item.priority)]


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
            item.fresh = item.fresh and after.fresh
            del items[index + 1]
        else:
            index += 1


def resolve(given: Batch, manifest: int | None) -> int | None:
    """The fixed batch size (None: auto) from ``--batch`` and ``[integrate] batch``."""
    if given == "auto":
        return None
    return given if given is not None else manifest


@dataclass
class Sizer:
    """The batch size for the next item, from how the recent batches ended."""

    fixed: int | None = None  # --batch N: always this
    size: int = FIRST
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT))
    said: int = 0  # the size the journal was last told of (0: none yet)
    why: str = "the first batch of the run"

    def __post_init__(self) -> None:
        if self.fixed is not None:
            self.size, self.why = self.fixed, "fixed by --batch or [integrate] batch"

    def outcome(self, passed: bool) -> None:
        """A batch admitted from the queue passed, or failed (once: not its halves)."""
        if self.fixed is not None:
            return
        self.recent.append(passed)
        share = sum(self.recent) / len(self.recent)
        tally = f"{sum(self.recent)} of the last {len(self.recent)} batches passed"
        if passed and share >= GROW_AT and self.size < MOST:
            self.size, self.why = min(MOST, self.size * 2), f"grew: {tally}"
        elif not passed and share < SHRINK_BELOW and self.size > 1:
            self.size, self.why = max(1, self.size // 2), f"shrank: {tally}"

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
            item.fresh = True
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
