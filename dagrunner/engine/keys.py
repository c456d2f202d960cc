"""A gate's cache key: a sha256 over a canonical encoding of its components.

The components are the resolved definition (run, cwd, timeout), the hermetic environment
(names and hashes of the values), the manifest's ``cache_salt``, the content ids of every
input file, the keys of the gates it needs, the output of its declared ``tools`` commands,
and :data:`CACHE_FORMAT`.  ``cache.py`` stores verdicts under these keys; ``landed.py``
proves them.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dagrunner.engine.graph import Graph, integration_map, spec, topological_order
from dagrunner.engine.inputs import Snapshot, input_files
from dagrunner.executors.base import Fingerprint
from dagrunner.manifest.load import GateSpec, Manifest
from dagrunner.process.command import tool_fingerprint
from dagrunner.process.sandbox import tree_environment

CACHE_FORMAT = 2  # 2: entries are signed (HMAC) instead of carrying a plain digest
# Derived from the commit, so it would miss every entry on every commit; it is
# recorded in the proof instead (docs/cache.md says why).
NOT_KEYED_ENV = frozenset({"SOURCE_DATE_EPOCH"})


def _digest(value: object) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _hash_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class KeyParts:
    """The components of one gate's key, in the form kept in the store."""

    gate: str
    definition: dict[str, Any]
    env: dict[str, str]  # name -> sha256 of the value
    salt: str
    inputs: dict[str, str]  # path -> content id
    unmatched: list[str]
    needs: dict[str, str]  # gate -> its key
    tools: dict[str, str]  # command -> sha256 of its output
    tool_lines: dict[str, str] = field(default_factory=dict)  # command -> its output, for people
    # Keyed by the whole tree (``inputs`` is {TREE: tree id}) for a landed proof only: why the
    # gate is not cacheable in the store (it declares no inputs, or needs such a gate).
    whole_tree: str = ""

    @property
    def key(self) -> str:
        return _digest(
            {
                "format": CACHE_FORMAT,
                "definition": self.definition,
                "env": self.env,
                "salt": _hash_text(self.salt),
                "inputs": self.inputs,
                "needs": self.needs,
                "tools": self.tools,
            }
        )

    def summary(self) -> dict[str, Any]:
        """The proof shown in a gate's record: counts and digests, not the whole file list."""
        return {
            "inputs": {"count": len(self.inputs), "digest": _digest(self.inputs)},
            "unmatched_globs": self.unmatched,
            "env_digest": _digest(self.env),
            "env_names": sorted(self.env),
            "definition_digest": _digest(self.definition),
            "needs": self.needs,
            "tools": {cmd: self.tool_lines.get(cmd, "").split("\n")[0] for cmd in self.tools},
            "format": CACHE_FORMAT,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "definition": self.definition,
            "env": self.env,
            "salt": _hash_text(self.salt),
            "inputs": self.inputs,
            "unmatched": self.unmatched,
            "needs": self.needs,
            "tools": self.tools,
            "tool_lines": self.tool_lines,
            "format": CACHE_FORMAT,
        }


"""(command, the gate's environment) -> (hash of its output, the output for people)."""


def compute_keys(
    manifest: Manifest,
    graph: Graph,
    snapshot: Snapshot,
    envs: Mapping[str, Mapping[str, str]],
    repo: Path,
    *,
    hide: Path | None = None,
    fingerprint: Fingerprint | None = None,
    tree: str | None = None,
) -> dict[str, KeyParts | str]:
    """Each gate's key parts, or a sentence saying why it is not cacheable.

    ``fingerprint`` takes the tools' fingerprints where the gates run (a cluster's
    workers); by default here, in ``repo``.  With ``tree`` (the id of the clean tree under
    test), a gate that would not be cacheable only for want of inputs is keyed by that
    whole tree instead, with ``whole_tree`` saying why (a landed proof's keys, ``landed.py``)."""
    result: dict[str, KeyParts | str] = {}
    tools: dict[tuple[str, str], tuple[str, str]] = {}
    above = integration_map(graph)
    outputs = declared_outputs(graph)
    seeds = [seed.path for seed in manifest.worktrees.seeds]
    for node in topological_order(graph):
        gate = spec(graph, node)
        if gate.kind != "gate":
            result[node] = f"not cacheable: a {gate.kind} node always runs"
            continue
        if above[node]:
            result[node] = "not cacheable: it runs in an integration worktree"
            continue
        whole = "" if gate.inputs else "not cacheable: the gate declares no inputs"
        if whole and tree is None:
            result[node] = whole
            continue
        blocked = [n for n in gate.needs if not isinstance(result.get(n), KeyParts)]
        if blocked:
            result[node] = f"not cacheable: it needs {blocked[0]!r}, which is not cacheable"
            continue
        below = [n for n in gate.needs if _whole(result[n])]
        if below and not whole:
            whole = f"not cacheable: it needs {below[0]!r}, which is not cacheable"
        env = envs[node]
        runs = tree_environment(dict(env), repo, seeds)  # the programs the gate runs
        fingerprints: dict[str, str] = {}
        lines: dict[str, str] = {}
        for command in gate.tools:
            cache_key = (command, _digest(runs))
            if cache_key not in tools:
                tools[cache_key] = (
                    fingerprint(command, runs)
                    if fingerprint is not None
                    else tool_fingerprint(
                        command, runs, repo, hide=hide, writable=manifest.sandbox.writable
                    )
                )
            fingerprints[command], lines[command] = tools[cache_key]
        files, unmatched = (
            ({TREE: tree}, []) if whole and tree else input_files(snapshot, gate.inputs)
        )
        files = {path: ident for path, ident in files.items() if path not in outputs}
        needs: dict[str, str] = {}
        for need in gate.needs:
            parts = result[need]
            assert isinstance(parts, KeyParts)
            needs[need] = parts.key
        result[node] = KeyParts(
            gate=node,
            definition=_definition(gate),
            env={k: _hash_text(v) for k, v in env.items() if k not in NOT_KEYED_ENV},
            salt=manifest.cache_salt,
            inputs=files,
            unmatched=unmatched,
            needs=needs,
            tools=fingerprints,
            tool_lines=lines,
            whole_tree=whole or "",
        )
    return result


TREE = "(the whole tree)"  # the one "input" of a gate keyed by its tree


def declared_outputs(graph: Graph) -> set[str]:
    """The files gates declare they write (their ``junit``), repository-relative: no gate's
    key holds them, since each run writes them again (a ``**`` gate would never hit)."""
    found = set()
    for node in graph.nodes:
        gate = spec(graph, node)
        if gate.junit:
            found.add(posixpath.normpath(posixpath.join(gate.cwd or ".", gate.junit)))
    return found


def _whole(parts: KeyParts | str) -> bool:
    return isinstance(parts, KeyParts) and bool(parts.whole_tree)


def store_keys(keys: Mapping[str, KeyParts | str]) -> dict[str, KeyParts | str]:
    """The keys the store answers: a gate keyed by its whole tree is not cacheable there."""
    return {
        g: p.whole_tree if isinstance(p, KeyParts) and p.whole_tree else p for g, p in keys.items()
    }


def _definition(gate: GateSpec) -> dict[str, Any]:
    return {
        "run": gate.run if isinstance(gate.run, str) else list(gate.run),
        "cwd": gate.cwd,
        "timeout": gate.timeout,
    }
