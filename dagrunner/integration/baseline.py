"""What an item is blamed for: ``[integrate] baseline``.

``absolute`` (the default): every failure of its tree.  ``differential``: only the failures
the target's own head does not have -- per JUnit test case where the gate writes JUnit
(``junit = ...``) and the file was read, else per gate.  An item whose failures are all the
target's lands (the target is no worse); one that adds a failure is ``gates-failed``, naming
what it adds (``failed_tests``).

The head's own verdict is known once per head and shared by every item: the first time an
item fails on a head, the head itself is gated once (``Baseline.of``); a commit that lands
under a differential verdict passes its verdict on (``landed``), so a run gates the head at
most once plus once per foreign move of the target.  The first time the target is seen red,
a ``target-red`` event names what it fails and since which head; ``target-green`` when a
later head fails nothing (``integrate status`` shows the colour in between).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from dagrunner.integration.items import Finished
from dagrunner.integration.queue import Queue
from dagrunner.records.integration import Details, EnvelopeState
from dagrunner.records.run import RunRecord

WHOLE: frozenset[str] = frozenset()  # a gate that failed without cases to compare


@dataclass(frozen=True)
class Failures:
    """What one gate run failed: per gate, its failed test cases (``WHOLE``: the gate failed
    with no JUnit case to compare, judged as a whole)."""

    gates: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, record: RunRecord) -> Failures:
        gates: dict[str, frozenset[str]] = {}
        for gate in record.gates:
            if gate.status.ok:
                continue
            tests = gate.tests
            failed = tests.failed if tests is not None and not tests.problem else ()
            gates[gate.id] = frozenset(f"{c.suite}::{c.name}" for c in failed) or WHOLE
        return cls(gates)

    def names(self) -> tuple[str, ...]:
        """``gate`` or ``gate::suite::case``, sorted."""
        return tuple(
            sorted(
                name
                for gate, cases in self.gates.items()
                for name in ([f"{gate}::{c}" for c in cases] or [gate])
            )
        )

    def beyond(self, base: Failures) -> Failures:
        """What fails here and not at ``base``: a gate that passed there; a case that did
        not fail there (a gate judged as a whole where either side has no cases)."""
        new: dict[str, frozenset[str]] = {}
        for gate, cases in self.gates.items():
            theirs = base.gates.get(gate)
            if theirs is None:
                new[gate] = cases
            elif cases and theirs and (extra := cases - theirs):
                new[gate] = extra
        return Failures(new)


class Baseline:
    """The target heads' own failures, each found once, for a differential judgement."""

    def __init__(
        self, mode: str, gate_head: Callable[[str], Awaitable[RunRecord]], red_since: str = ""
    ) -> None:
        self.differential = mode == "differential"
        self.gate_head = gate_head  # one gate run of a head's tree: its record
        self.known: dict[str, Failures] = {}
        self.pending: dict[str, trio.Event] = {}
        self.head_runs = 0
        # the first head seen red ('' while green); a red an earlier run said, from the journal
        self.red_since = red_since

    async def of(self, head: str) -> Failures:
        """``head``'s failures: known, being found by another item, or found now."""
        while head not in self.known:
            if head in self.pending:
                await self.pending[head].wait()
                continue
            done = self.pending[head] = trio.Event()
            try:
                self.head_runs += 1
                self.known[head] = Failures.of(await self.gate_head(head))
            finally:
                del self.pending[head]
                done.set()
        return self.known[head]

    async def judge(self, done: Finished, head: str) -> tuple[Finished, Failures]:
        """A failed run judged against ``head``: passed when it adds nothing, else failing
        only the gates with something new; and what it adds."""
        mine = Failures.of(done.record) if done.record is not None else Failures()
        new = mine.beyond(await self.of(head))
        if not new.gates:
            return replace(done, passed=True, failing=()), new
        return replace(done, failing=tuple(g for g in done.failing if g in new.gates)), new

    def landed(self, commit: str, record: RunRecord | None) -> None:
        """``commit`` landed with this run's record: its failures are the new head's own."""
        if self.differential and record is not None:
            self.known[commit] = Failures.of(record)

    def announce(
        self, queue: Queue, item: str, state: EnvelopeState, head: str
    ) -> tuple[str, ...] | None:
        """A change of colour at ``head`` journaled on ``item``'s line (``colour``); what
        the target fails now (() when it turned green; None when nothing changed)."""
        news = self.colour(head) if self.differential else None
        if news is None:
            return None
        event, failures = news
        queue.record(
            item,
            state,
            Details(
                target_red=failures.names(), red_since=self.red_since or None, note=f"on {head}"
            ),
            event=event,
        )
        return failures.names()

    def colour(self, head: str) -> tuple[str, Failures] | None:
        """A change of the target's colour to announce: ('target-red', what it fails) the
        first time a head is seen red, ('target-green', nothing) when it is green again."""
        seen = self.known.get(head)
        if seen is None:
            return None
        if seen.gates and not self.red_since:
            self.red_since = head
            return "target-red", seen
        if not seen.gates and self.red_since:
            self.red_since = ""
            return "target-green", seen
        return None


def red_targets(queue: Queue) -> dict[str, dict[str, Any]]:
    """Each target last said red (``target-red``, not ``target-green`` since): what it fails
    and since which head (``integrate status``; the next run starts from it)."""
    red: dict[str, dict[str, Any]] = {}
    for line in queue.lines():
        goal = line.target or ""
        if line.event == "target-red":
            red[goal] = {
                "fails": list(line.details.target_red or ()),
                "since": line.details.red_since,
                "at": line.at,
            }
        elif line.event == "target-green":
            red.pop(goal, None)
    return red
