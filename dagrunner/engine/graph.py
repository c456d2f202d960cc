"""The gate DAG: built from a manifest, validated, measured and rendered.

Edges point from a dependency to the gate that needs it.  Durations are
passed in (expected ones for planning, measured ones for the report), so the
same functions serve the scheduler's priorities and the run's evidence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

import networkx as nx

from dagrunner.diagnostics import Problems
from dagrunner.errors import DagrunnerError
from dagrunner.manifest.load import DEFAULT_ESTIMATE, LAND_PREFIX, GateSpec, Manifest

Graph: TypeAlias = "nx.DiGraph[str]"  # nodes are gate ids with a "spec" attribute


def build_graph(manifest: Manifest) -> Graph:
    """The validated DAG of ``manifest``.

    Raises DagrunnerError ``manifest-unknown-dependency`` (naming both ends)
    or ``manifest-cycle`` (printing the cycle).
    """
    graph: Graph = nx.DiGraph()
    for gate in manifest.gates.values():
        graph.add_node(gate.id, spec=gate)
    problems = Problems(_text(manifest.path), json=manifest.path.suffix == ".json")
    for gate in manifest.gates.values():
        for need in gate.needs:
            if need not in manifest.gates:
                problems.add(
                    DagrunnerError(
                        "manifest-unknown-dependency",
                        f"{gate.kind} {gate.id!r} needs {need!r}, which is not defined",
                        where=str(manifest.path),
                        key=f"{manifest_key(gate)}.needs",
                        hint=f"define [gates.{need}] or remove it from needs; "
                        f"defined: {', '.join(sorted(manifest.gates))}",
                    )
                )
            graph.add_edge(need, gate.id)
    problems.raise_if_any()
    if nx.is_directed_acyclic_graph(graph):  # O(n + e); find_cycle alone is quadratic
        _check_kinds(manifest, graph)
        return graph
    knot = next(c for c in nx.strongly_connected_components(graph) if len(c) > 1 or _loop(graph, c))
    cycle = nx.find_cycle(graph.subgraph(knot))
    names = [edge[0] for edge in cycle] + [cycle[0][0]]
    raise DagrunnerError(
        "manifest-cycle",
        f"the gates depend on each other in a cycle: {' -> '.join(names)}",
        where=str(manifest.path),
        key=f"{manifest_key(spec(graph, cycle[0][1]))}.needs",
        hint="remove one of these needs so the order has a start",
    )


def manifest_key(gate: GateSpec) -> str:
    """Where ``gate`` is defined in the manifest, for error messages (``gates.lint``)."""
    section = {"gate": "gates", "worker": "workers", "integrate": "integrate", "land": "land"}
    return f"{section[gate.kind]}.{gate.id.removeprefix(LAND_PREFIX)}"


def _loop(graph: Graph, component: set[str]) -> bool:
    node = next(iter(component))
    return graph.has_edge(node, node)


def _text(path: Path) -> str:
    try:
        return path.read_text("utf-8", "replace")
    except OSError:
        return ""


def _check_kinds(manifest: Manifest, graph: Graph) -> None:
    """Workers feed integrate nodes; gates that depend on one run in its worktree."""
    above = integration_map(graph)
    for node in graph.nodes:
        gate = spec(graph, node)
        wrong = None
        if gate.kind == "integrate":
            wrong = next((n for n in gate.needs if spec(graph, n).kind != "worker"), None)
            why = "an integrate node needs only workers"
        elif gate.kind == "worker":
            wrong = next(
                (n for n in gate.needs if spec(graph, n).kind in ("integrate", "land")), None
            )
            why = "a worker cannot wait for an integration"
        elif gate.kind == "gate" and len(above[node]) > 1:
            wrong = sorted(above[node])[1]
            why = "a gate can run inside one integration worktree only"
        if wrong is not None:
            raise DagrunnerError(
                "manifest-value",
                f"{gate.kind} {gate.id!r} needs {wrong!r}: {why}",
                where=str(manifest.path),
                key=f"{manifest_key(gate)}.needs",
                hint="see dagrunner's manifest reference (docs/manifest.md: workers, integrate, land)",
            )


def integration_map(graph: Graph) -> dict[str, frozenset[str]]:
    """For every node, the integrate nodes it depends on: one pass in topological order."""
    above: dict[str, frozenset[str]] = {}
    for node in nx.topological_sort(graph):
        found: set[str] = set()
        for pred in graph.predecessors(node):
            found |= above[pred]
            if spec(graph, pred).kind == "integrate":
                found.add(pred)
        above[node] = frozenset(found)
    return above


def integrations_above(graph: Graph, node: str) -> list[str]:
    """The integrate nodes ``node`` depends on (directly or not)."""
    return sorted(n for n in nx.ancestors(graph, node) if spec(graph, n).kind == "integrate")


def spec(graph: Graph, node: str) -> GateSpec:
    value: GateSpec = graph.nodes[node]["spec"]
    return value


def select(graph: Graph, only: Iterable[str], *, where: str = "") -> Graph:
    """The subgraph holding the gates in ``only`` and everything they need."""
    keep: set[str] = set()
    for name in only:
        if name not in graph:
            raise DagrunnerError(
                "unknown-gate",
                f"--only names {name!r}, which the manifest does not define",
                where=where or None,
                hint=f"choose from: {', '.join(sorted(graph.nodes))}",
            )
        keep.add(name)
        keep.update(nx.ancestors(graph, name))
    sub: Graph = graph.subgraph(keep).copy()
    return sub


def topological_order(graph: Graph) -> list[str]:
    """A stable order: dependencies first, ties broken by name."""
    return list(nx.lexicographical_topological_sort(graph))


def levels(graph: Graph) -> list[list[str]]:
    """Gates grouped by depth: level 0 needs nothing, level k needs something at k-1."""
    return [sorted(generation) for generation in nx.topological_generations(graph)]


def expected_durations(graph: Graph, history: Mapping[str, float]) -> dict[str, float]:
    """Each gate's expected seconds: the last measured, else its estimate, else a default."""
    result: dict[str, float] = {}
    for node in graph.nodes:
        gate = spec(graph, node)
        if gate.shard_of and gate.estimate is not None:  # its files' recorded times, summed
            result[node] = gate.estimate
        elif node in history:
            result[node] = history[node]
        elif gate.estimate is not None:
            result[node] = gate.estimate
        else:
            result[node] = DEFAULT_ESTIMATE
    return result


def bottom_levels(graph: Graph, durations: Mapping[str, float]) -> dict[str, float]:
    """For each gate, the longest duration-weighted path from it to a sink, itself included.

    This is the scheduling priority: starting the gate with the largest value
    first is the classic critical-path list-scheduling rule.
    """
    result: dict[str, float] = {}
    for node in reversed(list(nx.topological_sort(graph))):
        tail = max((result[succ] for succ in graph.successors(node)), default=0.0)
        result[node] = durations.get(node, 0.0) + tail
    return result


def critical_path(graph: Graph, durations: Mapping[str, float]) -> tuple[list[str], float]:
    """The heaviest path through the DAG and its total duration."""
    if graph.number_of_nodes() == 0:
        return [], 0.0
    bottom = bottom_levels(graph, durations)
    sources = [n for n in graph.nodes if graph.in_degree(n) == 0]
    node: str | None = max(sources, key=lambda n: (bottom[n], n))
    path: list[str] = []
    while node is not None:
        path.append(node)
        succs = list(graph.successors(node))
        node = max(succs, key=lambda n: (bottom[n], n)) if succs else None
    return path, bottom[path[0]]


def describe(graph: Graph, durations: Mapping[str, float]) -> dict[str, Any]:
    """Order, levels and critical path as plain data (the ``graph --format json`` body)."""
    path, length = critical_path(graph, durations)
    bottom = bottom_levels(graph, durations)
    return {
        "order": topological_order(graph),
        "levels": levels(graph),
        "critical_path": {"gates": path, "duration": round(length, 3)},
        "gates": {
            node: {
                "needs": sorted(graph.predecessors(node)),
                "expected": round(durations[node], 3),
                "priority": round(bottom[node], 3),
                "kind": spec(graph, node).kind,
                "cpu": spec(graph, node).cpu,
                "memory": spec(graph, node).memory,
            }
            for node in topological_order(graph)
        },
    }


def render_text(graph: Graph, durations: Mapping[str, float]) -> str:
    info = describe(graph, durations)
    lines = [f"{graph.number_of_nodes()} nodes, {graph.number_of_edges()} edges"]

    def label(node: str) -> str:
        kind = spec(graph, node).kind
        return node if kind == "gate" else f"{node}[{kind}]"

    for depth, names in enumerate(info["levels"]):
        lines.append(f"level {depth}: {' '.join(label(n) for n in names)}")
    crit = info["critical_path"]
    lines.append(f"critical path ({crit['duration']:.1f}s expected): {' -> '.join(crit['gates'])}")
    lines.append("order: " + " ".join(info["order"]))
    return "\n".join(lines)


def render_dot(graph: Graph, durations: Mapping[str, float]) -> str:
    path, _ = critical_path(graph, durations)
    on_path = set(itertools.pairwise(path))
    lines = ["digraph dagrunner {", "  rankdir=LR;"]
    for node in topological_order(graph):
        style = ", color=red, penwidth=2" if node in path else ""
        lines.append(f'  "{node}" [label="{node}\\n{durations[node]:.1f}s"{style}];')
    for a, b in sorted(graph.edges):
        style = " [color=red, penwidth=2]" if (a, b) in on_path else ""
        lines.append(f'  "{a}" -> "{b}"{style};')
    lines.append("}")
    return "\n".join(lines)
