"""The speculative integration pipeline: several queue items gated at once, landed in order.

An item is a batch of envelopes (``batching``: sized from the queue's outcomes, or fixed).
The first ``window`` items that run a gate (one decided or put aside takes no place) are
each applied, in their own integration worktree, on the speculative head "target + every
item ahead of it still expected to land", gated at once under one governor, and landed in
queue order by compare-and-swap when all ahead passed.

- A failed batch is split at once (``batching.pieces``): what its failure names first, else
  halves, nothing behind gated until its culprit is found; a failed tree is not gated again.
- One envelope that fails is a suspect: what is behind it is built without it, and every
  gate without a pass on its tree is re-run there once every item ahead passed
  (``confirm_failures``).  All passing marks the failed ones ``flaky``; a confirmed failure
  halves the window (never below 2), and it is ``gates-failed`` at the front.
- Nothing lands without a pass of every gate on exactly its tree (``proofs``); nothing
  withdrawn while it gated lands (``landing.land`` checks, under the queue's lock).
- A failure the target's head has too is never the item's (``baseline``): excused under
  ``baseline = "differential"``, else held (gated again once the target's head moves).  A
  failure a re-run cannot change (``Failures.rerunnable``: a missing program) is not confirmed.
- A conflict on the target's head is final; behind the front or a batch sibling, it waits.
  The window grows by one after each landing; an urgent item pre-empts (``batching``).
Every step is journaled before it takes effect (``queue.py``); after a crash,
``recovery.recover`` discards the speculation (only commits on the target count).
"""

from __future__ import annotations

import math
import signal
import threading
from typing import TYPE_CHECKING, Literal

import trio

from dagrunner.engine.governor import Governor, resolve_capacity
from dagrunner.errors import DagrunnerError
from dagrunner.executors.base import Executor
from dagrunner.files import crash_point
from dagrunner.integration import batching, items, landing, proofs
from dagrunner.integration.baseline import Baseline
from dagrunner.integration.batching import Intake, Sizer, coalesce, resolve
from dagrunner.integration.items import Finished, GateRun, Item, Stage, auto_window, journal
from dagrunner.integration.trees import Trees
from dagrunner.manifest.load import Manifest
from dagrunner.records.failures import Failures, named, rerunnable
from dagrunner.records.integration import (
    Details,
    EnvelopeState,
    LandOutcome,
    PipelineTally,
)

if TYPE_CHECKING:
    from dagrunner.integration.needs import IntegratorLike as Integrator

WINDOW_FLOOR = 2  # a confirmed failure halves the window, never below this (Zuul's floor: 3)
DECIDED = (Stage.PASSED, Stage.FAILED, Stage.DEFERRED)  # a front that ``settle`` takes on
MAX_REBUILDS = 3  # landings lost to somebody else moving the target, then target-moving


class Pipeline:
    def __init__(
        self,
        it: Integrator,
        executor: Executor,
        manifest: Manifest,
        *,
        window: int | None,
        confirm: int,
    ) -> None:
        self.it, self.executor = it, executor
        capacity = resolve_capacity(manifest.governor, machines=executor.machines())
        self.governor = Governor(capacity)
        self.trees = Trees(it, executor, self.governor, manifest)
        self.ceiling = self.window = window or auto_window(manifest, capacity.cpu)
        self.confirm = confirm
        self.items: list[Item] = []
        self.head = it.head()
        self.moves, self.t0 = 0, 0.0
        self.error: DagrunnerError | None = None
        self.in_flight = 0  # gate runs started and not ended
        self.tally = PipelineTally(window=self.ceiling)  # what the integrator's result takes
        self.sizer = Sizer(resolve(it.batch, manifest.integrate.batch))
        self.intake = Intake(it, self.sizer)
        self.namer = batching.Namer(it.queue)
        head_run = lambda head, only: self.trees.gate_head(head, self.tally, self.t0, only)  # noqa: E731
        mode = manifest.integrate.baseline
        self.baseline = Baseline(mode, head_run, it.queue, it.target, self.tally)
        self.held: list[Item] = []  # failing only as the target's head does (absolute)
        # trees failed in this run: one built to the very same tree has its verdict, no run
        self.failed_trees: dict[str, tuple[tuple[str, ...], str]] = {}
        self.found: set[int] = set()  # anonymous splits whose culprit was blamed
        self.landed: frozenset[str] = frozenset()  # the envelopes landed in this run

    # -- the controller ----------------------------------------------------------------------

    async def run(self) -> None:
        self.t0 = trio.current_time()
        send, self.receive = trio.open_memory_channel[Finished | None](math.inf)
        self.send = send
        # Landed workers are cleaned while later items are gated, all before the run returns.
        async with trio.open_nursery() as cleaners:
            self.cleaners = cleaners
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                if threading.current_thread() is threading.main_thread():
                    nursery.start_soon(self.on_signal)
                nursery.start_soon(self.intake.news, self.send.send_nowait)
                while not self.it.stop:
                    await self.settle()
                    if self.it.stop:
                        break
                    self.preempt()
                    self.confirm_next()
                    await self.fill()
                    self.confirm_next()  # fill may have put a suspect at the front
                    if not self.items:
                        break
                    if self.items[0].stage in DECIDED:
                        continue  # fill settled what was at the front: settle what is now
                    if not (self.in_flight or self.receive.statistics().current_buffer_used):
                        # a carried front waits on what is not gated: gated on its own
                        # (else nothing decided would wait forever: a bug, not a hang)
                        assert self.items[0].carried
                        if not items.carry(self.items, self.it.queue):
                            self.items[0].carried = False
                        continue
                    done = await self.receive.receive()
                    if done is not None:  # None: a priority item, or a run cancelled
                        await self.take(done)
                nursery.cancel_scope.cancel()
        self.intake.requeue(self.items, self.tally)
        self.tally.held = [i for item in self.held for i in item.ids]
        self.baseline.warn()  # a red target's line among the warnings
        self.tally.warnings.extend(self.trees.warnings)
        # Slots an earlier, wider run made and this one did not use: nothing is kept there.
        await trio.to_thread.run_sync(self.trees.remove_unused)
        if self.error is not None:
            raise self.error

    async def on_signal(self) -> None:
        """Ctrl-C or SIGTERM: every gate run ends, and what was in flight is queued again."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for _ in received:
                self.tally.interrupted = True
                self.it.stop = True
                self.nursery.cancel_scope.cancel()
                return

    async def settle(self) -> None:
        """Land or judge at the front while the front is decided."""
        while self.items and not self.it.stop:
            front = self.items[0]
            if front.stage is Stage.PASSED:  # an excused front may add failures on this head
                if new := await self.baseline.rejudged(front, self.head):
                    self.failed(front, new, front.report, inferred=True)
                else:
                    await self.land(front)
            elif front.stage is Stage.FAILED:
                self.blame(front)
            elif front.stage is Stage.DEFERRED:
                front.stage = Stage.WAITING  # at the front its conflicts are its own
                return
            elif not (
                front.carried
                and front.stage is Stage.BUILT
                and items.carry(self.items, self.it.queue)
            ):
                return  # undecided (a carried front: until what is behind lands it)

    async def fill(self) -> None:
        """Build and start every item in the window that waits (in queue order); build the
        next one ahead, so that its gates start the moment the window has room."""
        position = aside = 0
        while not self.it.stop:
            if position == len(self.items):
                if (admitted := self.intake.next(self.tally)) is None:
                    return
                self.items.append(admitted)
            item = self.items[position]
            if batching.narrowing(self.items[:position], item, self.found):
                return  # its tree would hold a culprit not found yet: gated once it is
            if item.stage is Stage.WAITING:
                built = await self.build(item, position)
                if built == "gone":
                    continue  # nothing of it to gate: it left the pipeline
            if item.stage in (Stage.DEFERRED, Stage.PASSED, Stage.FAILED):
                # decided, or built again at the front: no run, no place in the window
                position, aside = position + 1, aside + 1
                continue
            item.stage = Stage.BUILT if item.stage is Stage.WAITING else item.stage
            if item.carried and item.stage is Stage.BUILT:  # gated with what is behind it
                self.trees.give(item.slot)
                position, aside, item.slot = position + 1, aside + 1, None
                continue
            if position - aside >= self.window:
                return
            if item.stage is Stage.BUILT and not self.known(item):
                self.launch(item, position)
            if item not in self.items:
                continue  # a known failure split it where it stood: its pieces come next
            position += 1

    def known(self, item: Item) -> bool:
        """The item's tree failed a gate run already in this run: that verdict is its own,
        without a run (a single envelope's is still confirmed before it is blamed)."""
        seen = self.failed_trees.get(item.tree)
        if seen is None or not item.tree:
            return False
        item.stage = Stage.GATING
        self.failed(item, *seen, inferred=True)
        return True

    def preempt(self) -> None:
        """A pending item of a higher priority than admitted ones that have not started
        goes before them; an urgent one before every item not yet passed, and what was
        gating behind it is reset (built and gated again on top of it)."""
        if (placed := self.intake.place(self.items)) is not None:
            index, item = placed
            self.items.insert(index, item)
            self.reset_from(index + 1, cause=None, why=f"reset behind {', '.join(item.ids)}")

    # -- building and gating -----------------------------------------------------------------

    async def build(self, item: Item, position: int) -> Literal["built", "deferred", "gone"]:
        """Apply the item on its speculative head: built; deferred (it conflicts behind the
        front); or gone (its envelopes all ended at the front: conflict, rejected)."""
        item.base = items.base_for(self.items[:position], item, self.head, self.landed)
        built = await self.trees.build(item, self.head, final=position == 0)
        if built == "gone":
            self.items.remove(item)
        elif item.deferred or item.behind:  # not all of it applied here: items behind
            self.items[position + 1 : position + 1] = items.put_aside(item, built == "deferred")
        if built == "built" and any(id(item) in x.excludes for x in self.items):
            # it applied at the front after all: what was built without it is built again
            self.reset_from(position + 1, cause=None, why=f"rebuilt on {item.ids[0]}")
        return built

    def launch(self, item: Item, position: int, *, confirm: bool = False) -> None:
        """Start a gate run of ``item``'s tree."""
        self.tally.gate_runs += 1
        self.in_flight += 1
        number = self.tally.gate_runs
        item.stage = Stage.GATING
        # a confirmation is journaled too: its run, not an abandoned attempt's, judged it
        journal(self.it.queue, item, Details(gate_run=number, head=item.base, position=position))
        if confirm:
            self.tally.confirm_runs += 1
        else:
            crash_point("gating")
            if position > 0:
                crash_point("speculating")
        # The scope exists before the task starts: a reset right after this cancels it.
        item.scope = trio.CancelScope()
        run = GateRun.of(item, number, position, confirm=confirm)
        item.slot = None  # the run owns it now, and gives it back when it ends
        self.nursery.start_soon(self.gate, run)

    async def gate(self, run: GateRun) -> None:
        """One gate run of an item's tree in a slot of its own; its verdict to the controller."""
        start = trio.current_time() - self.t0
        run_dir = self.it.reports / f"gates-{run.number:02d}"
        finished: Finished | None = None
        try:
            with run.scope:
                finished = await self.trees.verdict(run, run_dir, self.head, self.tally)
        except DagrunnerError as exc:  # the run could not start (a bad manifest): stop, say it
            self.error = self.error or exc
            self.it.stop = True
            self.nursery.cancel_scope.cancel()
        self.in_flight -= 1
        said = run.speculation(finished, start, trio.current_time() - self.t0, str(run_dir))
        self.tally.pipeline.append(said)
        run.account(self.it.queue, said, finished)
        # None (cancelled): a wake all the same -- a carried front may wait on nothing else
        self.send.send_nowait(finished)

    # -- verdicts ----------------------------------------------------------------------------

    async def take(self, done: Finished) -> None:
        item = done.item
        if done.generation != item.generation or item not in self.items:
            return  # a run of a tree that was reset since
        seen = Failures.of(done.record) if done.record is not None else Failures()
        item.passed |= done.passes  # a run of exactly its tree (the generation says so)
        item.proven = {**item.proven, **done.proven}
        if not done.passed:  # what failed, by test case
            item.seen = seen if not done.confirm else item.seen
            item.new_failures = tuple(n for n in named(done.record) if "::" in n)
        if not done.passed:  # the target's head's own failures are not the item's
            judged = await self.baseline.weigh(item, done, self.head)
            if done.generation != item.generation or item not in self.items:
                return  # reset while the target's head was gated
            if judged is None:
                return self.hold(item)
            done = judged
        if done.passed:
            item.failures = seen  # its own failures are all the target's (or none)
            item.excused |= proofs.failures(done.record)  # judged so: the target's own
            if done.confirm:
                item.flaky = tuple(dict.fromkeys(item.flaky + item.failing))
                item.failures = item.seen.rerun(seen, item.flaky)  # the target's, still
                details = Details(flaky_gates=item.flaky, report=done.report)
                journal(self.it.queue, item, details, event="flaky")
            if item.suspected:  # what is behind was built without it: it lands after all
                why = "rebuilt on a flake" if done.confirm else f"rebuilt on {item.ids[0]}+"
                self.reset_from(self.items.index(item) + 1, cause=None, why=why)
                items.part(self.items, item.rest)
            item.stage = Stage.PASSED
            return
        if done.tree:
            self.failed_trees[done.tree] = (done.failing, done.report)
        await self.namer.name(item, done)
        item.certain = done.record is not None and not rerunnable(done.record)
        failing = item.unconfirmed(done.failing, seen) if done.confirm else done.failing
        self.failed(item, failing, done.report)

    def failed(
        self, item: Item, failing: tuple[str, ...], report: str, *, inferred: bool = False
    ) -> None:
        """A gate run failed ``item``'s tree (``inferred``: one of the very same tree did,
        or its verdict no longer holds on the target's head)."""
        item.failing, item.report = failing, report
        items.put_back(self.items, item)  # what it put aside, back in its place
        item.rerun = proofs.rerun(item.manifest, item.passed)  # not only what failed
        certain, item.certain = item.certain and not inferred, False  # a re-run: no use
        if len(item.envelopes) == 1 and item.confirms < self.confirm and not certain:
            # Confirmed only when every item ahead passed: until then the failure may be
            # theirs, and a re-run would be spent on it.  A batch is not confirmed: it is
            # split, and the envelope it is narrowed down to is.
            item.stage = Stage.SUSPECT
            self.reset_from(self.items.index(item) + 1, cause=item)  # built on, without it
            coalesce(self.items, self.items.index(item) + 1, self.sizer.fixed or self.sizer.size)
            self.confirm_next()
            return
        item.stage = Stage.FAILED
        if not inferred:  # a run failed: fewer trees at once until they pass again
            self.window = max(min(WINDOW_FLOOR, self.ceiling), self.window // 2)
        if len(item.envelopes) > 1:
            self.split(item)
            return
        self.reset_from(self.items.index(item) + 1, cause=item)

    def split(self, item: Item) -> None:
        """A failed batch is split where it stands, at once (``batching.pieces``: what its
        failure names first, apart, else halves); what was behind is built on them again."""
        index, pieces = self.items.index(item), batching.pieces(item)
        self.trees.give(item.reset())
        self.items[index : index + 1] = pieces
        behind = index + len(pieces)
        self.reset_from(behind, cause=None, why=f"rebuilt behind the pieces of {item.ids[0]}+")
        items.lengthen(self.items, index)  # a pair: what is left of the batch beside it
        coalesce(self.items, behind, self.sizer.fixed or self.sizer.size)

    def confirm_next(self) -> None:
        """Re-run the failed gates of the first undecided item, when it failed (unless its
        batch's failure confirms it: ``batching.corroborated``)."""
        for item in self.items:  # a corroboration needs no run: taken wherever it stands
            if item.stage is Stage.SUSPECT and batching.corroborated(item, self.items, 0):
                item.stage = Stage.FAILED
        for index, item in enumerate(self.items):
            if item.stage is Stage.PASSED or item.carried:
                continue
            suspect = item.stage is Stage.SUSPECT  # (None: its rest gates, or will)
            if suspect and batching.corroborated(item, self.items, self.window) is False:
                item.confirms += 1
                crash_point("confirming")
                self.launch(item, index, confirm=True)
            return

    def reset_from(self, index: int, *, cause: Item | None, why: str = "") -> None:
        """Every item from ``index`` on that was built on ``cause`` (any, when None) is
        built again."""
        why = why or (
            f"rebuilt without {', '.join(cause.ids)}"
            if cause is not None
            else "rebuilt on the target's new head"
        )
        reset = False
        for item in self.items[index:]:
            if item.stage is Stage.WAITING or (cause is not None and id(cause) in item.excludes):
                continue  # nothing built, or built without the cause already
            built = item.stage is not Stage.DEFERRED
            self.trees.give(item.reset())
            if built:
                reset = True
                self.tally.resets += 1
                said = Details(note=why)
                journal(self.it.queue, item, said, EnvelopeState.QUEUED, event="speculation-reset")
        if reset:
            crash_point("speculation-reset")

    def hold(self, item: Item) -> None:
        """Its tree failed only as the target's head does (absolute baseline): not blamed,
        queued again (a ``held`` event) and gated again once the target's head moves."""
        index = self.items.index(item)
        self.items.pop(index)
        self.trees.give(item.reset())
        self.held.append(item)
        self.reset_from(index, cause=item)  # what was built on it is built without it
        said = Details(target_red=self.tally.target_red, note="the target's own failure")
        journal(self.it.queue, item, said, EnvelopeState.QUEUED, event="held")

    def blame(self, front: Item) -> None:
        """A confirmed failure at the front: judge the one envelope (a batch was split)."""
        self.items.remove(front)
        (envelope,), tests = front.envelopes, front.new_failures or None
        self.found |= front.lineage
        self.sizer.judged(blamed=1, named=front.by_name)
        failing = self.baseline.added(front.failing)
        details = Details(failed_gates=failing, report=front.report, failed_tests=tests)
        self.it.finish(envelope.id, EnvelopeState.GATES_FAILED, details)

    async def land(self, front: Item) -> None:
        it = self.it
        required = await trio.to_thread.run_sync(proofs.required, front.manifest)
        if missing := proofs.gaps(required, front.passed, front.excused):
            return self.failed(front, missing, front.report, inferred=True)
        outcome = await trio.to_thread.run_sync(self.trees.land, front)
        if outcome is LandOutcome.LANDED:
            self.baseline.landed(front.commit, front.failures)
            self.sizer.judged(landed=len(front.envelopes))
            self.items.pop(0)
            self.head, self.moves, self.landed = front.commit, 0, self.landed | set(front.ids)
            if again := await self.trees.judge_skipped(front, self.head):
                self.items.insert(0, Item(again, priority=front.priority))
            self.items += self.held  # gated again, after what is in flight
            self.held.clear()
            stale = await trio.to_thread.run_sync(landing.stale, it, self.head, self.items, front)
            if stale is not None:  # judged by a manifest the target no longer holds
                self.reset_from(stale, cause=None, why=f"judged by the manifest of {front.ids[-1]}")
            self.baseline.announce(front.ids[0], EnvelopeState.LANDED, self.head)
            self.window = min(self.ceiling, self.window + 1)
            self.cleaners.start_soon(landing.clean, self.it, [e.id for e in front.envelopes])
        elif outcome is LandOutcome.MOVED:
            self.moves += 1
            if self.moves > MAX_REBUILDS:
                self.tally.target_moving = True
                it.stop = True
                return
            self.tally.rebuilds += 1
            self.head = it.head()
            self.reset_from(0, cause=None)
            items.forget_failures(self.items + self.held)  # what failed on the old head
            self.items += self.held  # gated again, after what is in flight
            self.held.clear()
        elif outcome is LandOutcome.WITHDRAWN:  # (BLOCKED: landing.block said why, stopped)
            self.items[0:1] = await trio.to_thread.run_sync(landing.remains, it, self.trees, front)
            self.reset_from(0, cause=None, why=f"rebuilt without the withdrawn {front.ids[0]}")
