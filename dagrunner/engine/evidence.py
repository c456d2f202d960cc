"""Speed-budget evidence: every figure is measured in the run it describes.

wall time vs serial sum (what one slot would have taken) vs the critical path
and the lower bound max(critical path, work / capacity); then the manifest's
``[budget]`` checked against them.
"""

from __future__ import annotations

from dagrunner.engine.graph import Graph, critical_path, spec
from dagrunner.manifest.load import BudgetSpec
from dagrunner.records.evidence import Budget, BudgetMiss, CriticalPath, Speed
from dagrunner.records.run import GateResult, Status
from dagrunner.units import format_duration


def speed_evidence(
    graph: Graph, results: list[GateResult], *, wall: float, capacity_cpu: float
) -> Speed:
    ran = [r for r in results if r.attempts]
    durations = {r.id: r.duration if r.attempts else 0.0 for r in results}
    for node in graph.nodes:
        durations.setdefault(node, 0.0)
    serial = sum(r.duration for r in ran)
    work = sum(r.duration * r.cpu for r in ran)
    path, path_len = critical_path(graph, durations)
    bound = max(path_len, work / capacity_cpu if capacity_cpu else 0.0)
    saved = sum(
        float(r.cache.saved or 0.0) if r.cache else 0.0
        for r in results
        if r.status == Status.CACHED
    )
    return Speed(
        wall=round(wall, 4),
        serial_sum=round(serial, 4),
        speedup=round(serial / wall, 3) if wall > 0 else None,
        critical_path=CriticalPath(tuple(path), round(path_len, 4)),
        work=round(work, 4),
        capacity_cpu=capacity_cpu,
        lower_bound=round(bound, 4),
        efficiency=round(bound / wall, 3) if wall > 0 else None,
        cache_saved=round(saved, 4),
        cache_hits=sum(1 for r in results if r.status == Status.CACHED),
        governor_wait=round(sum(r.waited for r in results), 4),
    )


def check_budget(
    budget: BudgetSpec, graph: Graph, results: list[GateResult], speed: Speed
) -> Budget:
    """The budget verdict: one miss per budget exceeded, naming it and by how much."""
    misses: list[BudgetMiss] = []
    crit = " -> ".join(speed.critical_path.gates)
    if budget.max_wall is not None and speed.wall > budget.max_wall:
        over = speed.wall - budget.max_wall
        misses.append(
            BudgetMiss(
                "max_wall",
                budget.max_wall,
                speed.wall,
                f"wall time {format_duration(speed.wall)} is {format_duration(over)} over "
                f"max_wall {format_duration(budget.max_wall)}; critical path: {crit}",
            )
        )
    speedup = speed.speedup
    if budget.min_speedup is not None and speedup is not None and speedup < budget.min_speedup:
        misses.append(
            BudgetMiss(
                "min_speedup",
                budget.min_speedup,
                speedup,
                f"speedup {speedup:.2f}x is below min_speedup {budget.min_speedup:.2f}x "
                f"(serial sum {format_duration(speed.serial_sum)}, wall "
                f"{format_duration(speed.wall)}); critical path: {crit}",
            )
        )
    for result in results:
        limit = spec(graph, result.id).max_duration if result.id in graph else None
        if limit is not None and result.attempts and result.duration > limit:
            misses.append(
                BudgetMiss(
                    f"gates.{result.id}.max_duration",
                    limit,
                    round(result.duration, 4),
                    f"gate {result.id!r} took {format_duration(result.duration)}, "
                    f"{format_duration(result.duration - limit)} over its max_duration "
                    f"{format_duration(limit)}",
                )
            )
    declared = (
        budget.max_wall is not None
        or budget.min_speedup is not None
        or any(spec(graph, n).max_duration is not None for n in graph.nodes)
    )
    return Budget(declared, tuple(misses))
