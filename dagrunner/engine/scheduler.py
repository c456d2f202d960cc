"""Critical-path list scheduling of the gate DAG, on trio, under the governor.

Among the ready gates that fit the free capacity, the one with the longest
remaining (duration-weighted) path to a sink starts first.  When the top gate
does not fit, smaller ones may backfill the gap only if they do not delay it
(EASY backfilling against the running gates' expected ends), and never once
it has waited ``backfill_limit``.  A gate that does not pass skips everything
downstream of it; independent branches go on.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

import networkx as nx
import trio

from dagrunner.engine.governor import Governor
from dagrunner.engine.graph import Graph, bottom_levels, spec
from dagrunner.records.run import (
    Attempt,
    CacheProof,
    GateResult,
    GovernorSample,
    Status,
    TestRun,
)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What running (or looking up) one gate produced; the scheduler adds the timing."""

    status: Status
    reason: str = ""
    attempts: tuple[Attempt, ...] = ()
    memory_exceeded: bool = False
    cache: CacheProof | None = None
    command: str = ""
    tests: TestRun | None = None


@dataclass(frozen=True, kw_only=True)
class Wait:
    """A lookup's answer "another run computes this key now": look again once it is set."""

    done: trio.Event
    key: str


@dataclass
class Flights:
    """Cache keys some run in this trio loop is computing now, each with the event its
    waiters wait on; ``reused`` and ``waited`` count what they saved."""

    running: dict[str, trio.Event] = field(default_factory=dict)
    reused: int = 0  # gates answered from a verdict computed in this loop or before
    waited: int = 0  # lookups that waited for a key in flight instead of computing it

    def claim(self, key: str) -> None:
        self.running[key] = trio.Event()

    def land(self, key: str) -> None:
        event = self.running.pop(key, None)
        if event is not None:
            event.set()


RunGate = Callable[[str, float], Awaitable[Outcome]]  # (gate id, run start) -> outcome
Lookup = Callable[[str], Outcome | Wait | None]
Settled = Callable[[GateResult], None]  # each result, the moment it is recorded
Listener = Callable[[str, GateResult], None]  # ("start" | "end", result so far)


CHEAP_SHARE = 0.05  # a gate nothing waits for, under this share of the critical path ...


def cheap_checks(
    graph: Graph, expected: Mapping[str, float], priority: Mapping[str, float]
) -> set[str]:
    """The gates nothing waits for whose expected duration (the history's, else the
    manifest's estimate) is under ``CHEAP_SHARE`` of the critical path."""
    cheap = max(priority.values(), default=0.0) * CHEAP_SHARE
    return {
        node
        for node in graph.nodes
        if (took := expected.get(node)) is not None
        and took <= cheap
        and graph.out_degree(node) == 0
    }


def short_first(
    graph: Graph, expected: Mapping[str, float], priority: dict[str, float]
) -> dict[str, float]:
    """Priorities where a cheap check (lint beside test shards) goes first, whatever its
    absolute size: it fails fastest, and it can lengthen the makespan by at most its own
    duration, which is at most ``CHEAP_SHARE`` of the critical path."""
    longest = max(priority.values(), default=0.0)
    for node in cheap_checks(graph, expected, priority):
        priority[node] = longest + expected[node]
    return priority


class Scheduler:
    def __init__(
        self,
        graph: Graph,
        governor: Governor,
        *,
        run_gate: RunGate,
        expected: Mapping[str, float],
        lookup: Lookup | None = None,
        settled: Settled | None = None,
        fail_fast: bool = False,
        sample_interval: float = 0.5,
        backfill_limit: float = 60.0,
        listener: Listener | None = None,
    ) -> None:
        self.graph = graph
        self.governor = governor
        self.run_gate = run_gate
        self.lookup = lookup
        self.settled = settled
        self.expected = dict(expected)
        levels = bottom_levels(graph, expected)
        self._cheap = cheap_checks(graph, self.expected, levels)
        self.priority = short_first(graph, self.expected, levels)
        self.fail_fast = fail_fast
        self.sample_interval = sample_interval
        self.backfill_limit = backfill_limit
        self.listener = listener
        self.results: dict[str, GateResult] = {}
        self.interrupted = False
        # This run's own samples, on its own clock (a governor shared by an integration
        # pipeline's runs samples for each of them).
        self.samples: list[GovernorSample] = []
        self._waiting_needs = {node: graph.in_degree(node) for node in graph.nodes}
        self._ready: dict[str, float] = {}  # gate -> when it became ready
        self._order: list[tuple[float, str]] = []  # the ready gates, highest priority first
        self._running: dict[str, tuple[float, int]] = {}  # gate -> (start, lane)
        self._blocked_since: dict[str, float] = {}
        self._stopping = ""
        self._wake = trio.Event()
        self._t0 = 0.0
        self._nursery: trio.Nursery | None = None

    # -- public -------------------------------------------------------------

    async def run(self) -> list[GateResult]:
        """Run every gate (or skip it) and return the results in topological order."""
        self._t0 = trio.current_time()
        self.samples.append(self.governor.sample(0.0))  # pressure is known before a start
        self.governor.wakers.append(self.wake)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._sample_loop)
                # The roots first: a cache hit among them makes its dependents ready at once.
                for node in [n for n in self.graph.nodes if self._waiting_needs[n] == 0]:
                    self._make_ready(node)
                while len(self.results) < self.graph.number_of_nodes():
                    self._start_what_fits(nursery)
                    if len(self.results) == self.graph.number_of_nodes():
                        break
                    await self._wake.wait()
                    self._wake = trio.Event()
                nursery.cancel_scope.cancel()
        finally:
            self.governor.wakers.remove(self.wake)
        if self.interrupted:
            self._skip_rest(Status.SKIPPED, "the run was interrupted before it started")
        order = list(self.graph.nodes)
        return [self.results[node] for node in order if node in self.results]

    def wake(self) -> None:
        """Look again at what can start (the capacity grew)."""
        self._wake.set()

    def interrupt(self) -> None:
        """End the run now: running gates' trees are ended, the rest are skipped."""
        self.interrupted = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def now(self) -> float:
        return trio.current_time() - self._t0

    # -- choosing what starts -----------------------------------------------

    def _start_what_fits(self, nursery: trio.Nursery) -> None:
        if self._stopping:
            return
        ordered = [node for _, node in self._order]  # a copy: starting a gate edits the list
        now = self.now()
        top_blocked: str | None = None
        extra_cpu = extra_mem = 0.0
        shadow = float("inf")
        for node in ordered:
            if self.governor.pressured and self._running:
                return  # live pressure: hold new starts, never kill running ones
            if self.governor.full():
                return
            gate = spec(self.graph, node)
            fits = self.governor.fits(gate.cpu, gate.memory)
            if node in self._cheap and self._cheap_lane_taken():
                continue  # cheap checks go first on one slot, one after the other
            if top_blocked is None:
                if fits:
                    self._start(nursery, node)
                    continue
                top_blocked = node
                self._blocked_since.setdefault(node, now)
                if now - self._blocked_since[node] >= self.backfill_limit:
                    return  # the big gate has waited long enough: let capacity drain to it
                shadow, extra_cpu, extra_mem = self._reservation(node)
                continue
            if not fits:
                continue
            if now + self.expected[node] <= shadow:
                self._start(nursery, node)  # ends before the top gate could start anyway
            elif gate.cpu <= extra_cpu and gate.memory <= extra_mem:
                extra_cpu -= gate.cpu  # uses only what the top gate will leave free
                extra_mem -= gate.memory
                self._start(nursery, node)

    def _cheap_lane_taken(self) -> bool:
        """A cheap check runs, and a gate that is not one is ready and fits now: the other
        slots are the long work's (two checks of 0.2 s on two slots delay every lane)."""
        return any(n in self._cheap for n in self._running) and any(
            n not in self._cheap
            and self.governor.fits(spec(self.graph, n).cpu, spec(self.graph, n).memory)
            for _, n in self._order
        )

    def _reservation(self, node: str) -> tuple[float, float, float]:
        """When ``node`` will fit if running gates end as expected, and what it leaves free then."""
        gate = spec(self.graph, node)
        cap = self.governor.capacity
        free_cpu = cap.cpu - self.governor.used_cpu
        free_mem = float(cap.memory - self.governor.used_memory)
        ends = sorted(
            (start + self.expected[name], name) for name, (start, _) in self._running.items()
        )
        shadow = float("inf")
        for end, name in ends:
            other = spec(self.graph, name)
            free_cpu += other.cpu
            free_mem += other.memory
            if free_cpu >= gate.cpu and free_mem >= gate.memory:
                shadow = end
                break
        return shadow, free_cpu - gate.cpu, free_mem - gate.memory

    # -- life of one gate ----------------------------------------------------

    def _unready(self, node: str) -> float:
        """Take ``node`` off the ready set; when it had become ready (0 if it was not ready)."""
        if node not in self._ready:
            return 0.0
        index = bisect.bisect_left(self._order, (-self.priority[node], node))
        del self._order[index]
        return self._ready.pop(node)

    def _make_ready(self, node: str) -> None:
        if node in self._ready or node in self._running or node in self.results:
            return
        if self.lookup is not None:
            hit = self.lookup(node)
            if isinstance(hit, Wait):
                assert self._nursery is not None
                self._nursery.start_soon(self._after_flight, node, hit)
                return
            if hit is not None:
                now = self.now()
                self._record(node, hit, ready=now, started=now, finished=now, lane=None)
                return
        self._ready[node] = self.now()
        bisect.insort(self._order, (-self.priority[node], node))

    async def _after_flight(self, node: str, wait: Wait) -> None:
        """``node``'s key is being computed by another run: it takes no capacity until that
        ends, then is looked up again (a pass answers it; otherwise it runs here)."""
        await wait.done.wait()
        if node not in self.results and not self._stopping and not self.interrupted:
            self._make_ready(node)
        self._wake.set()

    def _start(self, nursery: trio.Nursery, node: str) -> None:
        gate = spec(self.graph, node)
        self.governor.acquire(gate.cpu, gate.memory)
        used_lanes = {lane for _, lane in self._running.values()}
        lane = next(i for i in range(len(used_lanes) + 1) if i not in used_lanes)
        self._running[node] = (self.now(), lane)
        ready_at = self._unready(node)
        self._blocked_since.pop(node, None)
        if self.listener is not None:
            self.listener("start", self._partial(node, ready_at))
        nursery.start_soon(self._run_one, node, ready_at)

    async def _run_one(self, node: str, ready_at: float) -> None:
        gate = spec(self.graph, node)
        started, lane = self._running[node]
        outcome: Outcome | None = None
        try:
            outcome = await self.run_gate(node, self._t0)
        finally:
            self.governor.release(gate.cpu, gate.memory)
            del self._running[node]
            self._wake.set()
            if outcome is None:  # cancelled (or crashed): still accounted for
                if self.interrupted:
                    outcome = Outcome(status=Status.INTERRUPTED, reason="interrupted")
                else:
                    outcome = Outcome(
                        status=Status.CANCELLED, reason=f"cancelled: {self._stopping}"
                    )
            self._record(
                node, outcome, ready=ready_at, started=started, finished=self.now(), lane=lane
            )

    def _record(
        self,
        node: str,
        outcome: Outcome,
        *,
        ready: float,
        started: float,
        finished: float,
        lane: int | None,
    ) -> None:
        gate = spec(self.graph, node)
        attempts = tuple(
            replace(a, started=a.started - self._t0, finished=a.finished - self._t0)
            for a in outcome.attempts
        )
        result = GateResult(
            id=node,
            status=outcome.status,
            reason=outcome.reason,
            needs=gate.needs,
            cpu=gate.cpu,
            memory=gate.memory,
            ready=ready,
            started=started,
            finished=finished,
            lane=lane,
            attempts=attempts,
            memory_exceeded=outcome.memory_exceeded,
            cache=outcome.cache,
            command=outcome.command,
            kind=gate.kind,
            tests=outcome.tests,
            shard_of=gate.shard_of,
        )
        self.results[node] = result
        if self.settled is not None:
            self.settled(result)
        if self.listener is not None:
            self.listener("end", result)
        if result.status.ok:
            for succ in self.graph.successors(node):
                self._waiting_needs[succ] -= 1
                if self._waiting_needs[succ] == 0 and succ not in self.results:
                    self._make_ready(succ)
        elif result.status not in (Status.INTERRUPTED, Status.CANCELLED):
            self._skip_downstream(node)
            if self.fail_fast and not self._stopping:
                self._stopping = f"--fail-fast after {node!r} {result.status}"
                self._skip_rest(Status.SKIPPED, self._stopping, pending_only=True)
                if self._nursery is not None:
                    # Running gates end as cancelled; their trees are ended by the sandbox.
                    self._nursery.cancel_scope.cancel()
        self._wake.set()

    def _skip_downstream(self, failed: str) -> None:
        for node in nx.descendants(self.graph, failed):
            if node in self.results:
                continue
            self._unready(node)
            self.results[node] = replace(
                self._partial(node, None),
                status=Status.SKIPPED,
                reason=f"skipped: upstream {failed!r} {self.results[failed].status}",
                skipped_because=failed,
            )
            if self.listener is not None:
                self.listener("end", self.results[node])

    def _skip_rest(self, status: Status, reason: str, *, pending_only: bool = False) -> None:
        for node in self.graph.nodes:
            if node in self.results or (pending_only and node in self._running):
                continue
            self._unready(node)
            self.results[node] = replace(self._partial(node, None), status=status, reason=reason)

    def _partial(self, node: str, ready: float | None) -> GateResult:
        gate = spec(self.graph, node)
        started = self._running.get(node, (None, None))
        return GateResult(
            id=node,
            status=Status.SKIPPED,
            kind=gate.kind,
            shard_of=gate.shard_of,
            needs=gate.needs,
            cpu=gate.cpu,
            memory=gate.memory,
            ready=ready,
            started=started[0],
            lane=started[1],
        )

    async def _sample_loop(self) -> None:
        while True:
            await trio.sleep(self.sample_interval)
            was = self.governor.pressured
            self.samples.append(self.governor.sample(self.now()))
            if was and not self.governor.pressured:
                self._wake.set()
