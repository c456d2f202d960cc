"""``release-check --dry-run``: what a run would do, without running a gate.

Loads and plans exactly as a run does, computes every cacheable gate's key and
looks it up (the ``tools`` fingerprint commands do run: a key cannot be known
without them), and says per gate whether it would run or be a cache hit (with
the proof), the order a run would start them in, and the expected critical
path once the hits are taken out.  Nothing is written (no report, no cache
entry, no history).
"""

from __future__ import annotations

import heapq
from typing import Any

from dagrunner.engine.cache import Store
from dagrunner.engine.graph import bottom_levels, critical_path, spec
from dagrunner.engine.inputs import take_snapshot
from dagrunner.engine.keys import KeyParts, compute_keys
from dagrunner.engine.plan import RunOptions
from dagrunner.engine.steps import load_step, plan_step
from dagrunner.records.run import CacheProof


def dry_run(options: RunOptions) -> dict[str, Any]:
    """The plan of a run as plain data (the ``--dry-run --json`` body)."""
    repo, manifest = load_step(options)
    plan = plan_step(repo, manifest, options)
    graph = plan.graph
    store = Store(options.cache_root) if options.cache_root else Store()
    cacheable = any(spec(graph, n).inputs and spec(graph, n).kind == "gate" for n in graph.nodes)
    keys = (
        compute_keys(manifest, graph, take_snapshot(repo), plan.envs, repo, hide=store.root)
        if cacheable
        else {}
    )
    gates: dict[str, dict[str, Any]] = {}
    for node in graph.nodes:
        parts = keys.get(node, "not cacheable: the gate declares no inputs")
        hit = (
            isinstance(parts, KeyParts)
            and not options.no_cache
            and store.lookup(parts.key) is not None
        )
        proof = (
            CacheProof(cacheable=True, key=parts.key, parts=parts.summary(), hit=hit)
            if isinstance(parts, KeyParts)
            else CacheProof(cacheable=False, reason=parts)
        )
        gates[node] = {
            "action": "cached" if hit else "run",
            "needs": sorted(graph.predecessors(node)),
            "expected": round(plan.expected[node], 3),
            "kind": spec(graph, node).kind,
            "cache": proof.to_json(),
        }
        if spec(graph, node).shard_of:  # a split gate's shard: which files, balanced how
            gates[node] |= {
                "shard_of": spec(graph, node).shard_of,
                "files": list(spec(graph, node).shard_files),
            }
    remaining = {n: 0.0 if gates[n]["action"] == "cached" else plan.expected[n] for n in graph}
    path, length = critical_path(graph, remaining)
    return {
        "dry_run": True,
        "manifest": str(manifest.path),
        "order": start_order(plan.graph, remaining),
        "gates": gates,
        "would_run": sum(1 for g in gates.values() if g["action"] == "run"),
        "cached": sum(1 for g in gates.values() if g["action"] == "cached"),
        "critical_path": {"gates": path, "expected": round(length, 3)},
    }


def start_order(graph: Any, durations: dict[str, float]) -> list[str]:
    """The order a run starts gates in with unlimited slots: ready gates by the longest
    remaining path first (the scheduler's priority), ties by name."""
    priority = bottom_levels(graph, durations)
    waiting = {n: graph.in_degree(n) for n in graph.nodes}
    ready = [(-priority[n], n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for user in graph.successors(node):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (-priority[user], user))
    return order
