"""``release-check --dry-run`` and ``cache explain``: what a run would do, and why, without
running a gate.

Loads and plans exactly as a run does, computes every cacheable gate's key and
looks it up (the ``tools`` fingerprint commands do run: a key cannot be known
without them), and says per gate whether it would run or be a cache hit (with
the proof), the order a run would start them in, and the expected critical
path once the hits are taken out.  Nothing is written (no report, no cache
entry, no history).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dagrunner.engine.cache import Store
from dagrunner.engine.graph import Graph, bottom_levels, critical_path, spec, topological_order
from dagrunner.engine.inputs import take_snapshot
from dagrunner.engine.keys import CACHE_FORMAT, KeyParts, compute_keys, listing, store_keys
from dagrunner.engine.landed import clean_tree as landed_tree
from dagrunner.engine.landed import manifest_digest, read_proof
from dagrunner.engine.plan import RunOptions
from dagrunner.engine.steps import load_step, plan_step
from dagrunner.manifest.load import Manifest
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
    answered = answers(graph, keys, store, repo, read=not options.no_cache)
    for node in graph.nodes:
        parts, answer = answered[node]
        hit = answer is not None
        proof = (
            CacheProof(cacheable=True, key=answer or parts.key, parts=parts.summary(), hit=hit)
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


# -- cache explain ------------------------------------------------------------------


def explain_gate(
    *,
    manifest: Manifest,
    graph: Graph,
    repo: Path,
    envs: dict[str, dict[str, str]],
    gate: str,
    store: Store | None = None,
    target: str = "main",
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What ``cache explain GATE`` prints: the current key, what changed since the newest
    entry, and whether HEAD's landed proof would answer it (``landed.py``)."""
    from dagrunner.engine.graph import select

    sub = select(graph, [gate], where=str(manifest.path))
    snapshot = take_snapshot(repo)
    store = store or Store()
    tree = landed_tree(repo)
    environ = os.environ if environ is None else environ
    every = compute_keys(
        manifest, sub, snapshot, {n: envs[n] for n in sub.nodes}, repo, hide=store.root, tree=tree
    )
    current, answer = answers(sub, store_keys(every), store, repo)[gate]
    stored = store.newest_parts(manifest.name, gate)
    # A hit is a hit, whichever entry is newest (after a revert, an older one matches).
    changes = (
        [f"hit: the current key {answer[:12]} has a stored entry"]
        if answer
        else explain(current, stored)
    )
    return {
        "gate": gate,
        "cacheable": isinstance(current, KeyParts),
        "key": answer or (current.key if isinstance(current, KeyParts) else None),
        "stored_key": stored.get("key") if stored else None,
        "hit": answer is not None,
        "changes": changes,
        "landed": _landed_answer(repo, manifest, gate, every[gate], target, environ),
    }


def _landed_answer(
    repo: Path,
    manifest: Manifest,
    gate: str,
    parts: KeyParts | str,
    target: str,
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """Whether HEAD's landed proof would answer ``gate`` under ``--reuse-landed``, and why."""
    verified = read_proof(repo, target, environ)
    if isinstance(verified, str):
        return {"answers": False, "why": verified}
    proof = verified.proof
    said: dict[str, Any] = {"commit": proof.commit, "signer": verified.signer}
    proven = proof.gates.get(gate)
    if proof.manifest_digest != manifest_digest(manifest.path):
        return {**said, "answers": False, "why": "the proof was made with another manifest"}
    if proven is None:
        return {**said, "answers": False, "why": "the proof does not hold this gate"}
    key = parts.key if isinstance(parts, KeyParts) else None
    why = "the key matches" if proven.key == key else "this run computes another key"
    return {**said, "answers": proven.key == key, "why": why, "proof_key": proven.key, "key": key}


def explain(current: KeyParts | str, stored: dict[str, Any] | None) -> list[str]:
    """Sentences saying why the gate's current key differs from its newest stored entry."""
    if isinstance(current, str):
        return [current]
    if stored is None:
        return ["no stored entry for this gate yet: the next passing run stores one"]
    if stored.get("key") == current.key:
        return [f"no change: the current key {current.key[:12]} has a stored entry (a hit)"]
    found: list[str] = []
    now = current.to_json()
    if current.names and isinstance(read := stored.get("read"), dict):
        found += _observed(current, stored, read)  # by reads: not every file is an input
        now["inputs"], stored = {}, {**stored, "inputs": {}}
    if stored.get("format") != CACHE_FORMAT:
        found.append(f"cache format changed ({stored.get('format')} -> {CACHE_FORMAT})")
    if stored.get("salt") != now["salt"]:
        found.append("cache_salt changed")
    for name in sorted(set(now["definition"]) | set(stored.get("definition", {}))):
        old, new = stored.get("definition", {}).get(name), now["definition"].get(name)
        if old != new:
            found.append(f"definition: {name} changed ({old!r} -> {new!r})")
    found += _differences(
        stored.get("env", {}),
        now["env"],
        "env: {} now reaches the gate",
        "env: {} no longer reaches the gate",
        "env: {} has a different value",
    )
    found += _differences(
        stored.get("inputs", {}),
        now["inputs"],
        "input added: {}",
        "input removed: {}",
        "input changed: {}",
    )
    for need in sorted(set(stored.get("needs", {})) | set(now["needs"])):
        if stored.get("needs", {}).get(need) != now["needs"].get(need):
            found.append(f"upstream key changed: {need}")
    old_tools, lines = stored.get("tools", {}), stored.get("tool_lines", {})
    for command in sorted(set(old_tools) | set(now["tools"])):
        if old_tools.get(command) != now["tools"].get(command):
            found.append(
                f"tool changed: {command}"
                + _tool_difference(lines.get(command, ""), now["tool_lines"].get(command, ""))
            )
    return found or ["the key differs but no component does (a stored entry from another tool?)"]


def _observed(current: KeyParts, stored: dict[str, Any], read: dict[str, Any]) -> list[str]:
    """What changed of an observed gate's key: a file it read (against the newest stored
    read set), or the tree's name set (a file added, removed, renamed, its mode)."""
    found = [
        f"observed file changed: {path} (the gate read it)"
        for path, ident in sorted(read.items())
        if current.inputs.get(path) != ident
    ]
    if stored.get("names") != current.names:
        old, new = set(stored.get("inputs", {})), set(current.inputs)
        found += [f"file added: {p} (the tree's name set changed)" for p in sorted(new - old)]
        found += [f"file removed: {p} (the tree's name set changed)" for p in sorted(old - new)]
        if old == new:
            found.append("the tree's name set changed: a file's mode or a symlink's target")
    return found


def answers(
    graph: Graph,
    keys: Mapping[str, KeyParts | str],
    store: Store,
    root: Path,
    *,
    read: bool = True,
) -> dict[str, tuple[KeyParts | str, str | None]]:
    """Each gate's key parts with its needs' keys as they would settle here, and the stored
    key that would answer it (None: it would run).  A need that would run holds its whole
    key here: what it will read is not known before it runs, so its dependants count as
    running unless that key answers them (never a hit a run would not give)."""
    settled: dict[str, str] = {}
    found: dict[str, tuple[KeyParts | str, str | None]] = {}
    names = listing(root)
    for node in topological_order(graph):
        parts = keys.get(node, "not cacheable: the gate declares no inputs")
        if not isinstance(parts, KeyParts):
            found[node] = (parts, None)
            continue
        parts = replace(parts, needs={n: settled.get(n, k) for n, k in parts.needs.items()})
        sets = store.read_sets(parts.shape) if parts.names and read else []
        tried = [parts.verdict(r, names)[0] for r in sets] + [parts.key] * read
        answer = next((k for k in tried if store.lookup(k) is not None), None)
        settled[node] = answer or parts.key
        found[node] = (parts, answer)
    return found


def _tool_difference(old: str, new: str, most: int = 6) -> str:
    """The lines of a tool's output that differ (``-old`` / ``+new``), not just its first line."""
    from dagrunner.report.logtail import strip_ansi  # only explain needs it; not on a run's path

    old, new = strip_ansi(old), strip_ansi(new)  # a tool's output is untrusted, like a gate's
    old_lines, new_lines = old.splitlines(), new.splitlines()
    removed = [line for line in old_lines if line not in set(new_lines)]
    added = [line for line in new_lines if line not in set(old_lines)]
    shown = [f"-{line}" for line in removed[:most]] + [f"+{line}" for line in added[:most]]
    if not shown:
        return " (the same lines in another order, or only its exit status differs)"
    more = len(removed) + len(added) - len(shown)
    return ": " + "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


def _differences(
    old: dict[str, Any], new: dict[str, Any], added: str, removed: str, changed: str
) -> list[str]:
    """One sentence per key that appeared, vanished or changed value, in key order."""
    found = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            found.append(added.format(key))
        elif key not in new:
            found.append(removed.format(key))
        elif old[key] != new[key]:
            found.append(changed.format(key))
    return found
