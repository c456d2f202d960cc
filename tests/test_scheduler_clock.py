"""The scheduler on trio's MockClock with an injected gate runner: exact times, no sleeps.

Beside the real-process tests in test_scheduler.py, these pin the scheduling rules
themselves -- critical-path order, packing, skips, fail-fast -- deterministically:
a gate "runs" by sleeping on a virtual clock that jumps when every task waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import trio
import trio.testing

from dagrunner.engine.governor import Capacity, Governor
from dagrunner.engine.graph import Graph, build_graph
from dagrunner.engine.scheduler import Outcome, Scheduler
from dagrunner.manifest.load import GateSpec, Manifest
from dagrunner.records.run import GateResult, Status

UNLIMITED = 1 << 40


def graph_of(needs: Mapping[str, tuple[str, ...]]) -> Graph:
    gates = {g: GateSpec(id=g, run=("true",), needs=n, memory=0) for g, n in needs.items()}
    return build_graph(Manifest(path=Path("virtual.toml"), digest="", name="v", gates=gates))


def run(
    needs: Mapping[str, tuple[str, ...]],
    seconds: Mapping[str, float],
    *,
    slots: float = 2,
    failing: frozenset[str] = frozenset(),
    fail_fast: bool = False,
) -> dict[str, GateResult]:
    capacity = Capacity(
        cpu=slots, memory=UNLIMITED, jobs=None, max_load=1e9, min_available_memory=0
    )

    async def run_gate(node: str, t0: float) -> Outcome:
        await trio.sleep(seconds[node])
        return Outcome(status=Status.FAILED if node in failing else Status.PASSED)

    scheduler = Scheduler(
        graph_of(needs),
        Governor(capacity),
        run_gate=run_gate,
        expected=seconds,
        fail_fast=fail_fast,
        sample_interval=3600,  # no live sampling inside the virtual run
    )
    results = trio.run(scheduler.run, clock=trio.testing.MockClock(autojump_threshold=0))
    return {r.id: r for r in results}


def span(result: GateResult) -> tuple[float | None, float | None]:
    return (
        None if result.started is None else round(result.started, 6),
        None if result.finished is None else round(result.finished, 6),
    )


def test_longest_remaining_path_starts_first_and_the_makespan_is_optimal() -> None:
    # a -> b -> c (3 s of chain) beside d (2 s) and e (1 s), on 2 slots: optimum 3 s.
    results = run(
        {"a": (), "b": ("a",), "c": ("b",), "d": (), "e": ()},
        {"a": 1, "b": 1, "c": 1, "d": 2, "e": 1},
    )
    assert span(results["a"]) == (0, 1)  # the chain's head first: its remaining path is 3 s
    assert span(results["d"]) == (0, 2)
    assert span(results["b"]) == (1, 2)
    assert span(results["c"]) == (2, 3)
    assert span(results["e"]) == (2, 3)  # fills the slot d frees, not before the chain
    assert max(r.finished or 0 for r in results.values()) == pytest.approx(3.0)


def test_one_slot_runs_in_priority_order_not_name_order() -> None:
    results = run(
        {"aa": (), "zz": (), "zz2": ("zz",)},
        {"aa": 1, "zz": 1, "zz2": 5},
        slots=1,
    )
    order = sorted(results, key=lambda g: results[g].started or 0)
    assert order == ["zz", "zz2", "aa"]


def test_a_failure_skips_exactly_what_depends_on_it() -> None:
    results = run(
        {"a": (), "b": ("a",), "c": ("b",), "d": ()},
        {"a": 1, "b": 1, "c": 1, "d": 4},
        failing=frozenset({"a"}),
    )
    assert results["a"].status is Status.FAILED
    assert results["b"].status is Status.SKIPPED and results["b"].skipped_because == "a"
    assert results["c"].status is Status.SKIPPED
    assert results["d"].status is Status.PASSED and span(results["d"]) == (0, 4)


def test_fail_fast_stops_the_run_at_the_first_failure() -> None:
    results = run(
        {"quick": (), "long": (), "after": ("long",)},
        {"quick": 1, "long": 100, "after": 1},
        failing=frozenset({"quick"}),
        fail_fast=True,
    )
    assert results["quick"].status is Status.FAILED
    assert results["long"].status is Status.CANCELLED
    assert results["long"].finished == pytest.approx(1.0)  # cancelled when quick failed
    assert results["after"].status is Status.SKIPPED


def test_a_short_gate_nothing_waits_for_starts_before_long_shards() -> None:
    """lint (50 ms) beside four 60 s test shards on 2 slots: it runs first (it fails fastest),
    and the makespan grows by its own duration at most."""
    shards = {f"shard{i}": 60.0 for i in range(4)}
    results = run({**{s: () for s in shards}, "lint": ()}, {**shards, "lint": 0.05})
    assert span(results["lint"]) == (0, 0.05)
    assert max(r.finished or 0 for r in results.values()) <= 120.05 + 1e-6


def test_a_cheap_check_starts_first_whatever_its_absolute_size() -> None:
    """This repository's fresh-clone case: lint (2 s, its estimate) beside types (40 s) and
    three 110 s test shards on 2 slots ran after types, at 127 s.  Under 5% of the critical
    path, it goes first; a gate that is a large share (types) keeps critical-path order."""
    seconds = {"lint": 2.0, "types": 40.0, "t1": 110.0, "t2": 110.0, "t3": 110.0}
    results = run(dict.fromkeys(seconds, ()), seconds)
    assert results["lint"].started == 0
    assert (results["types"].started or 0) >= 110.0  # behind the shards, as before
    makespan = max(r.finished or 0 for r in results.values())
    without = run(dict.fromkeys(seconds, ()), {**seconds, "lint": 0.0})
    assert makespan <= max(r.finished or 0 for r in without.values()) + 2.0  # at most its own


def test_cheap_checks_share_one_lane_while_long_work_is_ready() -> None:
    """The public project's cold run: lint and format (0.25 s each) took both slots first,
    and both test shards started 0.25 s late.  Cheap checks go first on one slot, one after
    the other; the other slot starts the long work at once."""
    seconds = {"lint": 0.25, "format": 0.25, "t1": 7.0, "t2": 6.5, "docs": 5.5}
    results = run(dict.fromkeys(seconds, ()), seconds)
    checks = sorted([results["lint"], results["format"]], key=lambda r: r.started or 0)
    assert [c.started for c in checks] == [0, pytest.approx(0.25)]  # one after the other
    assert checks[0].lane == checks[1].lane
    assert results["t1"].started == 0  # not behind a cheap check
    # With nothing long ready, cheap checks still run side by side.
    alone = run({"lint": (), "format": ()}, {"lint": 0.25, "format": 0.25})
    assert alone["format"].started == 0
