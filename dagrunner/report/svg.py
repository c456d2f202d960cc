"""Pictures for the HTML report, computed here and drawn by the template as inline SVG:
the layered DAG with the critical path over it, and the timeline with governor samples."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from dagrunner.records.run import GateResult, RunRecord
from dagrunner.records.summary import RunIntegration

NODE_W, NODE_H, COL_GAP, ROW_GAP = 150, 26, 60, 12
SMALL = 300  # past this many gates, nodes are dots (their names stay in tooltips)


@dataclass(frozen=True)
class Box:
    id: str
    x: float
    y: float
    w: float
    h: float
    status: str
    label: str
    tip: str
    critical: bool
    kind: str


@dataclass(frozen=True)
class Edge:
    path: str
    critical: bool


def _tip(gate: GateResult) -> str:
    parts = [
        f"{gate.id} ({gate.kind}): {gate.status}"
        if gate.kind != "gate"
        else f"{gate.id}: {gate.status}"
    ]
    if gate.attempts:
        parts.append(f"{gate.duration:.2f}s")
    if gate.reason:
        parts.append(gate.reason)
    return " | ".join(parts)


def _levels(needs: dict[str, list[str]]) -> dict[str, int]:
    """Longest chain of needs below each gate, without recursion (a 10,000-gate chain is fine).

    Kahn's order over the needs; a gate left in a cycle (never in a validated run) gets 0.
    """
    waiting = {name: len(deps) for name, deps in needs.items()}
    users: dict[str, list[str]] = {}
    for name, deps in needs.items():
        for dep in deps:
            users.setdefault(dep, []).append(name)
    level = {name: 0 for name in needs}
    ready = [name for name, count in waiting.items() if count == 0]
    while ready:
        name = ready.pop()
        for user in users.get(name, []):
            level[user] = max(level[user], level[name] + 1)
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return level


def dag_layout(record: RunRecord) -> dict[str, Any]:
    """Layered layout: column = longest chain of needs, row order by the barycenter of needs."""
    gates = {g.id: g for g in record.gates}
    level = _levels({name: [n for n in g.needs if n in gates] for name, g in gates.items()})
    columns: dict[int, list[str]] = {}
    for name in gates:
        columns.setdefault(level[name], []).append(name)
    small = len(gates) > SMALL
    w, h = (14, 14) if small else (NODE_W, NODE_H)
    col_gap, row_gap = (24, 4) if small else (COL_GAP, ROW_GAP)
    row: dict[str, float] = {}
    for col in sorted(columns):
        names = columns[col]

        def barycenter(name: str, names: list[str] = names) -> tuple[float, str]:
            rows = [row[n] for n in gates[name].needs if n in row]
            return (sum(rows) / len(rows) if rows else float(names.index(name)), name)

        for index, name in enumerate(sorted(names, key=barycenter)):
            row[name] = float(index)
    critical = list(record.speed.critical_path.gates)
    crit_edges = set(itertools.pairwise(critical))
    boxes = {
        name: Box(
            id=name,
            x=8 + level[name] * (w + col_gap),
            y=8 + row[name] * (h + row_gap),
            w=w,
            h=h,
            status=str(gates[name].status),
            label="" if small else (name if len(name) <= 20 else name[:19] + "…"),
            tip=_tip(gates[name]),
            critical=name in critical,
            kind=gates[name].kind,
        )
        for name in gates
    }
    edges = []
    for name, gate in gates.items():
        for need in gate.needs:
            if need not in boxes:
                continue
            a, b = boxes[need], boxes[name]
            x1, y1, x2, y2 = a.x + a.w, a.y + a.h / 2, b.x, b.y + b.h / 2
            mid = (x1 + x2) / 2
            edges.append(
                Edge(
                    path=f"M{x1:.0f},{y1:.0f} C{mid:.0f},{y1:.0f} {mid:.0f},{y2:.0f} {x2:.0f},{y2:.0f}",
                    critical=(need, name) in crit_edges,
                )
            )
    width = 16 + max((b.x + b.w for b in boxes.values()), default=0)
    height = 16 + max((b.y + b.h for b in boxes.values()), default=0)
    return {
        "boxes": sorted(boxes.values(), key=lambda b: b.critical),
        "edges": sorted(edges, key=lambda e: e.critical),
        "width": width,
        "height": height,
        "small": small,
    }


def timeline(record: RunRecord, width: int = 960) -> dict[str, Any]:
    """Gantt bars per lane, and governor samples scaled under them."""
    wall = max(record.wall, max((g.finished or 0.0 for g in record.gates), default=0.0), 1e-6)
    scale = width / wall
    lane_h = 16
    ran = [
        g
        for g in record.gates
        if g.started is not None and g.finished is not None and g.lane is not None
    ]
    lanes = 1 + max((g.lane or 0 for g in ran), default=0)
    bars = [
        {
            "id": g.id,
            "x": round((g.started or 0.0) * scale, 1),
            "w": round(max(((g.finished or 0.0) - (g.started or 0.0)) * scale, 1.0), 1),
            "y": (g.lane or 0) * lane_h,
            "status": str(g.status),
            "tip": _tip(g) + f" | started {g.started:.2f}s, waited {g.waited:.2f}s",
            "label": g.id if _labelled(g, scale) else "",
        }
        for g in ran
    ]
    gantt_h = lanes * lane_h
    samples = record.governor.get("samples", [])
    cap = record.governor.get("capacity", {})
    chart_h = 60
    cpu_cap = float(cap.get("cpu") or 1)
    mem_cap = float(cap.get("memory") or 1)

    def line(values: list[tuple[float, float]]) -> str:
        return " ".join(f"{t * scale:.1f},{chart_h - min(v, 1.0) * chart_h:.1f}" for t, v in values)

    return {
        "width": width,
        "gantt_h": gantt_h,
        "lane_h": lane_h,
        "bars": bars,
        "chart_h": chart_h,
        "declared_cpu": line([(s["t"], s["declared_cpu"] / cpu_cap) for s in samples]),
        "system_cpu": line([(s["t"], s["cpu_percent"] / 100.0) for s in samples]),
        "declared_mem": line([(s["t"], s["declared_memory"] / mem_cap) for s in samples]),
        "pressured": [{"x": round(s["t"] * scale, 1)} for s in samples if s.get("pressured")],
        "ticks": [
            {
                "x": round(t * scale, 1),
                "label": f"{t:.1f}s",
                "anchor": "end" if t * scale > width - 60 else "start",  # the last one not cut
            }
            for t in _ticks(wall)
        ],
        "samples": len(samples),
        "sampled": len(samples) >= MIN_SAMPLES,
        "unlabeled": [{"id": g.id, "took": g.duration} for g in ran if not _labelled(g, scale)],
    }


MIN_SAMPLES = 3  # fewer governor samples draw a meaningless ramp

VERDICT_STATUS = {  # a pipeline gate run's verdict, drawn in the colour of a gate status
    "passed": "passed",
    "failed": "failed",
    "confirmed": "failed",
    "flaky": "flaky",
    "cancelled": "cancelled",
}


def pipeline_layout(integration: RunIntegration | None, width: int = 960) -> dict[str, Any]:
    """The integration pipeline's gate runs as bars, one row each in start order: which
    envelopes on which speculative head, how each ended (resets show as cancelled runs)."""
    result = integration.pipelined if integration else None
    runs = sorted(result.pipeline if result else [], key=lambda r: (r.start, r.gate_run))
    states = {e.id: e.state for e in integration.envelopes} if integration else {}
    end = max((r.end for r in runs), default=0.0) or 1e-6
    label_w = 340  # a column of labels, so that no label covers a bar or is cut off
    scale, row = (width - label_w) / end, 18
    bars = []
    for index, run in enumerate(runs):
        ids = run.envelopes
        who = ".".join(ids[0].split(".")[:2]) if ids else "the target's head"
        name = who + (f" +{len(ids) - 1}" if len(ids) > 1 else "")
        landed = bool(ids) and all(states.get(i) == "landed" for i in ids)
        mark = " (re-run)" if run.confirm else ""
        verdict = str(run.verdict)
        label = f"#{run.gate_run} {name}{mark} · {verdict}" + (
            " · landed" if landed and verdict in ("passed", "flaky") else ""
        )
        gates = f"; gates: {', '.join(run.gates)}" if run.gates else ""
        bars.append(
            {
                "x": round(label_w + run.start * scale, 1),
                "w": round(max((run.end - run.start) * scale, 2.0), 1),
                "y": index * row,
                "status": VERDICT_STATUS.get(verdict, "skipped"),
                "verdict": verdict,
                "label": label,
                "tip": f"gate run {run.gate_run}: {', '.join(ids)} on {run.head[:12]} "
                f"(position {run.position}) -> {run.commit[:12]}: {verdict}{gates}",
            }
        )
    return {
        "width": width,
        "height": max(len(bars), 1) * row,
        "row": row,
        "bars": bars,
        "label_w": label_w,
        "ticks": [{"x": round(label_w + t * scale, 1), "label": f"{t:.1f}s"} for t in _ticks(end)],
    }


def _labelled(gate: GateResult, scale: float) -> bool:
    """Whether a Gantt bar is wide enough to carry its gate's name."""
    return ((gate.finished or 0.0) - (gate.started or 0.0)) * scale > 8 * len(gate.id)


def _ticks(wall: float, count: int = 8) -> list[float]:
    raw = wall / count
    step = min(
        (s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600) if s >= raw),
        default=raw,
    )
    return [i * step for i in range(int(wall / step) + 1)]
