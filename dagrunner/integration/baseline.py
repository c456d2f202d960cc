"""What an item is blamed for: ``[integrate] baseline``; and the target's own failures,
under either baseline.

``absolute`` (the default): every failure of its tree -- but never the target's own: an
item whose run failed only gates the target's head fails too is *held* (``theirs``: queued
again, not ``gates-failed``; nothing can land on a red target under this baseline, and its
own failures, if any, are judged once the target is green).  ``differential``: only the
failures the target's own head does not have -- per JUnit test case where the gate writes
JUnit (``junit = ...``) and the file was read, else per gate.  An item whose failures are
all the target's lands (the target is no worse); one that adds a failure is
``gates-failed``, naming what it adds (``failed_tests``).

The head's own verdict is known once per head and shared by every item: the first time an
item fails on a head, the head itself is gated once (``Baseline.of``: a trusted run, its
failures confirmed by one more, as an item's: ``Baseline.confirmed``); a commit that lands
passes its verdict on (``landed``), so a run gates the head at most once plus once per
foreign move of the target.  The first time
the target is seen red, a ``target-red`` event names what it fails and since which head,
with one line for people (``line``); ``target-green`` when a later head fails nothing
(``integrate status`` shows the colour in between).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagrunner.git.command import git
from dagrunner.integration.items import Finished, Item
from dagrunner.integration.queue import Queue
from dagrunner.records.failures import WHOLE, Failures, named
from dagrunner.records.integration import Details, EnvelopeState, PipelineTally
from dagrunner.records.run import RunRecord

if TYPE_CHECKING:  # trio at run time only in a run: `red_now` serves status and serve's tools
    import trio


class Baseline:
    """The target heads' own failures, each found once, for a differential judgement."""

    def __init__(
        self,
        mode: str,
        gate_head: Callable[[str, tuple[str, ...]], Awaitable[RunRecord]],
        queue: Queue | None = None,
        target: str = "",
        tally: PipelineTally | None = None,
    ) -> None:
        self.differential = mode == "differential"
        self.gate_head = gate_head  # one gate run of a head's tree (only those gates): its record
        self.known: dict[str, Failures] = {}
        # the gates each known head was gated on (None: all of them; an absolute baseline
        # asks only about the gates an item failed)
        self.covered: dict[str, frozenset[str] | None] = {}
        self.pending: dict[str, trio.Event] = {}
        self.head_runs = 0
        self.queue, self.target = queue, target
        self.tally = tally or PipelineTally()  # its target_red: the colour last said
        # the first head seen red ('' while green); a red an earlier run said, from the journal
        said = red_targets(queue).get(target, {}) if queue is not None else {}
        self.red_since: str = said.get("since") or ""
        self.red: tuple[str, ...] = tuple(said.get("fails", ()))  # what it failed, last said
        self.said: str = said.get("said") or ""  # the line last said
        self.tally.target_red = self.red

    async def of(self, head: str, gates: tuple[str, ...] = ()) -> Failures:
        """``head``'s failures (of ``gates`` and what they need, when given; else of every
        gate): known, being found by another item, or found now."""
        while (want := self.unknown(head, gates)) is not None:
            if head in self.pending:
                await self.pending[head].wait()
                continue
            import trio

            done = self.pending[head] = trio.Event()
            try:
                first = await self.confirmed(head, want)
                self.head_runs += 1
                had = self.known.get(head, Failures())
                found = {**had.gates, **first.gates}, had.hard | first.hard
                self.known[head] = Failures(*found, {**had.said, **first.said})
                covered = self.covered.get(head, frozenset())
                self.covered[head] = None if not want or covered is None else covered | set(want)
            finally:
                del self.pending[head]
                done.set()
        return self.known[head]

    async def confirmed(self, head: str, want: tuple[str, ...]) -> Failures:
        """``head``'s failures of ``want``, confirmed as an item's are: only a gate that ran
        and failed twice is the target's (a flake of the head's own run would excuse a real
        break).  One that failed in one run and did not run in the other (skipped behind a
        need that flaked, cancelled) failed once: it gets a run of its own (fuzzer seed
        5216: lint flaked, tests skipped, then tests flaked in the confirmation, and an
        item's real failure of tests was excused as the target's)."""
        record = await self.gate_head(head, want)
        first = Failures.of(record)
        if not first.gates:
            return first
        again_record = await self.gate_head(head, tuple(first.gates))
        again, ran = Failures.of(again_record), (failed(record), failed(again_record))
        found = first.confirmed_by(again)
        once = tuple(g for g in found.gates if (g in ran[0]) != (g in ran[1]))
        if once:
            third_record = await self.gate_head(head, once)
            third, thrice = Failures.of(third_record), failed(third_record)
            for gate in once:
                where = again if gate in ran[1] else first
                alone = where.without(set(where.gates) - {gate})
                found = found.rerun(
                    alone.confirmed_by(third) if gate in thrice else Failures(), (gate,)
                )
        return found

    def unknown(self, head: str, gates: tuple[str, ...]) -> tuple[str, ...] | None:
        """What of ``gates`` (() : all of them) ``head`` is still to be gated on (() : all);
        None: nothing, its verdict on them is known."""
        covered = self.covered.get(head, frozenset())
        if covered is None:
            return None
        if not gates:
            return ()
        return tuple(g for g in gates if g not in covered) or None

    async def judge(self, done: Finished, head: str) -> tuple[Finished, Failures]:
        """A failed run judged against ``head``: passed when it adds nothing, else failing
        only the gates with something new; and what it adds."""
        if done.record is None:  # nothing to compare: every failure is new
            return done, Failures({g: WHOLE for g in done.failing}, frozenset(done.failing))
        new = Failures.of(done.record).beyond(await self.of(head))
        if not new.gates:
            return replace(done, passed=True, failing=()), new
        return replace(done, failing=tuple(g for g in done.failing if g in new.gates)), new

    async def weigh(self, item: Item, done: Finished, head: str) -> Finished | None:
        """A failed run of ``item`` judged against the target's ``head`` (its verdict found
        once: ``of``), and what the item is blamed for (``item.new_failures``).  Differential:
        passed when it adds nothing, else failing only what it adds.  Absolute: None when
        every gate it failed (ran and failed: not skipped or cancelled by its first failure)
        fails the same way on ``head`` -- the target's own, and ``item`` is held -- else as
        it is.  A change of the target's colour is announced on ``item``'s line."""
        if self.differential:
            done, new = await self.judge(done, head)
            item.new_failures = named(done.record, new)
            item.excused_on = head if done.passed else ""
        elif done.record is not None:
            record = done.record
            failed = [g for g in record.gates if g.status.failed]
            ran = {g.id for g in failed}
            asked = tuple(sorted({g.shard_of or g.id for g in failed}))
            mine = Failures.of(record)
            new = mine.without(set(mine.gates) - ran).beyond(await self.of(head, asked))
            if ran and not new.gates:
                self.announce(item.ids[0], EnvelopeState.GATING, head)
                return None
            item.new_failures = tuple(n for n in named(record, new) if "::" in n)
        self.announce(item.ids[0], EnvelopeState.GATING, head)
        return done

    def added(self, failing: tuple[str, ...]) -> tuple[str, ...]:
        """Of the gates a blamed item failed, those the target's head does not fail too (all
        of them when it fails every one): a gate failing at once beside its own was named."""
        return tuple(g for g in failing if g not in self.tally.target_red) or failing

    async def rejudged(self, front: Item, head: str) -> tuple[str, ...]:
        """The failures excused on ``front`` on an earlier head, judged again on ``head`` (an
        item ahead may have fixed them since): the gates with something new there (named in
        ``front.new_failures``), or () when nothing is (or nothing changed)."""
        on, failures = front.excused_on, front.failures
        front.excused_on = head if on else ""
        if not on or on == head or failures is None:
            return ()
        new = failures.beyond(await self.of(head))
        front.new_failures = new.names()
        return tuple(new.gates)

    def landed(self, commit: str, failures: Failures | None) -> None:
        """``commit`` landed with these failures (the target's, excused; none under an
        absolute baseline, where every gate passed on it): the new head's."""
        if failures is not None:
            self.known[commit], self.covered[commit] = failures, None

    def announce(self, item: str, state: EnvelopeState, head: str) -> None:
        """A change of colour at ``head`` journaled on ``item``'s line (``colour``): what it
        fails, since when, the line said and of which head (``integrate status`` shows it
        while the target is there); and what the target fails now in the tally (() when it
        turned green)."""
        news = self.colour(head)
        if news is None or self.queue is None:
            return
        event, seen = news
        fails = seen.names()
        note = self.line(fails) if fails else f"on {head}"
        said = Details(target_red=fails, red_since=self.red_since or None, note=note, head=head)
        self.queue.record(item, state, said, event=event)
        self.said = note if fails else ""
        self.tally.target_red = fails

    def warn(self) -> None:
        """At a run's end: a red target's line among the run's warnings."""
        if self.tally.target_red:
            self.tally.warnings.append(self.line(self.tally.target_red))

    def line(self, fails: tuple[str, ...]) -> str:
        """The one line a red target is said in: what it fails, and what that means."""
        gates = ", ".join(dict.fromkeys(name.split("::", 1)[0] for name in fails))
        means = (
            "items are blamed only for what they add (baseline = differential)"
            if self.differential
            else "nothing can land until they pass (or see baseline = differential)"
        )
        return f"{self.target or 'the target'} itself fails {gates}: {means}"

    def colour(self, head: str) -> tuple[str, Failures] | None:
        """A change of the target's colour to announce: ('target-red', what it fails) the
        first time a head is seen red, ('target-green', nothing) when it is green again."""
        seen = self.known.get(head)
        if seen is None:
            return None
        if seen.gates and not self.red_since:
            self.red_since = head
            return "target-red", seen
        if seen.gates and self.line(seen.names()) != self.said:
            return "target-red", seen  # what it fails, or what that means here, changed
        if not seen.gates and self.red_since:
            self.red_since = ""
            return "target-green", seen
        return None


def failed(record: RunRecord) -> set[str]:
    """The gates of ``record`` that ran and failed (not skipped, cancelled, interrupted)."""
    return {g.id for g in record.gates if g.status.failed}


def red_targets(queue: Queue) -> dict[str, dict[str, Any]]:
    """Each target last said red (``target-red``, not ``target-green`` since): what it fails
    and since which head (the next run starts from it)."""
    return queue.index().red_targets()


def red_now(queue: Queue, root: Path) -> dict[str, dict[str, Any]]:
    """What ``integrate status`` says: each target last said red whose head is still the
    one it was said of, or a commit the queue landed since (it knew that head's colour, and
    would have said ``target-green``).  A line of a head the target moved from by other
    hands is stale: its colour there is not known."""
    shown = {}
    landed: set[str] | None = None
    for goal, red in red_targets(queue).items():
        said = red.get("head")
        ref = f"refs/heads/{goal}"
        head = git(["rev-parse", "--verify", "-q", ref], cwd=root, check=False).text
        if said and said != head and landed is None:
            landed = {
                e.details.commit
                for e in queue.entries().values()
                if e.state is EnvelopeState.LANDED and e.details.commit
            }
        if not said or said == head or head in (landed or ()):
            shown[goal] = red
    return shown
