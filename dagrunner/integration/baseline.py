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

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import trio

from dagrunner.integration.items import Finished
from dagrunner.integration.queue import Queue
from dagrunner.records.failures import WHOLE, Failures
from dagrunner.records.integration import Details, EnvelopeState
from dagrunner.records.run import RunRecord


class Baseline:
    """The target heads' own failures, each found once, for a differential judgement."""

    def __init__(
        self,
        mode: str,
        gate_head: Callable[[str, tuple[str, ...]], Awaitable[RunRecord]],
        queue: Queue | None = None,
        target: str = "",
    ) -> None:
        self.differential = mode == "differential"
        self.gate_head = gate_head  # one gate run of a head's tree (only those gates): its record
        self.known: dict[str, Failures] = {}
        self.pending: dict[str, trio.Event] = {}
        self.head_runs = 0
        # the first head seen red ('' while green); a red an earlier run said, from the journal
        said = red_targets(queue).get(target, {}) if queue is not None and self.differential else {}
        self.red_since: str = said.get("since") or ""
        self.red: tuple[str, ...] = tuple(said.get("fails", ()))  # what it failed, last said

    async def of(self, head: str) -> Failures:
        """``head``'s failures: known, being found by another item, or found now."""
        while head not in self.known:
            if head in self.pending:
                await self.pending[head].wait()
                continue
            done = self.pending[head] = trio.Event()
            try:
                # its failures are confirmed as an item's are: only what fails twice is
                # the target's (a flake of the head's own run would excuse a real break)
                first = Failures.of(await self.gate_head(head, ()))
                if first.gates:
                    again = Failures.of(await self.gate_head(head, tuple(first.gates)))
                    first = first.confirmed_by(again)
                self.head_runs += 1
                self.known[head] = first
            finally:
                del self.pending[head]
                done.set()
        return self.known[head]

    async def judge(self, done: Finished, head: str) -> tuple[Finished, Failures]:
        """A failed run judged against ``head``: passed when it adds nothing, else failing
        only the gates with something new; and what it adds."""
        if done.record is None:  # nothing to compare: every failure is new
            return done, Failures({g: WHOLE for g in done.failing}, frozenset(done.failing))
        new = Failures.of(done.record).beyond(await self.of(head))
        if not new.gates:
            return replace(done, passed=True, failing=()), new
        return replace(done, failing=tuple(g for g in done.failing if g in new.gates)), new

    async def rejudge(self, failures: Failures | None, on: str, head: str) -> Failures | None:
        """Failures excused on head ``on``, judged again on ``head`` (an item ahead may have
        fixed them since): what is new there, or None when nothing is (or nothing changed)."""
        if not on or on == head or failures is None:
            return None
        new = failures.beyond(await self.of(head))
        return new if new.gates else None

    def landed(self, commit: str, failures: Failures | None) -> None:
        """``commit`` landed with these failures (the target's, excused): the new head's."""
        if self.differential and failures is not None:
            self.known[commit] = failures

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
    return queue.index().red_targets()
