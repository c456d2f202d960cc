"""The cache's place in a run: keys at plan time, lookups as gates become ready, a store
the moment a gate passes, and the proof written into each gate's record.

Runs in one trio loop (the integration pipeline's trees) share :class:`Flights`: a gate
whose key another run is computing now waits for that run's verdict instead of computing
it too (single flight), then is looked up again."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import networkx as nx

from dagrunner.engine.cache import Store
from dagrunner.engine.graph import Graph, spec
from dagrunner.engine.inputs import Snapshot, take_snapshot
from dagrunner.engine.keys import KeyParts, compute_keys, store_keys
from dagrunner.engine.landed import Verified, manifest_digest, read_proof
from dagrunner.engine.landed import clean_tree as landed_tree
from dagrunner.engine.scheduler import Flights, Outcome, Wait
from dagrunner.engine.tools import remembered
from dagrunner.executors.base import Fingerprint
from dagrunner.git.command import git, split_z
from dagrunner.manifest.globs import glob_regex
from dagrunner.manifest.load import Manifest
from dagrunner.process.command import tool_fingerprint
from dagrunner.records.run import CacheProof, GateResult, Status
from dagrunner.units import format_duration


class RunCache:
    def __init__(
        self,
        *,
        manifest: Manifest,
        graph: Graph,
        repo: Path,
        envs: dict[str, dict[str, str]],
        run_dir: Path,
        read: bool,
        store: Store | None = None,
        fingerprint: Fingerprint | None = None,
        remember_tools: bool = True,
        trusted: str | None = None,
        ahead: str | None = None,
        run_id: str = "",
        flights: Flights | None = None,
        whole_tree: bool = False,
        landed: Verified | str | None = None,
    ) -> None:
        self.manifest = manifest
        self.run_id = run_id
        self.flights = flights
        self.claimed: dict[str, str] = {}  # gate -> the key it computes for the others
        self.waited: set[str] = set()  # gates that waited for another run's flight once
        self.run_dir = run_dir
        self.read = read
        self.store = store or Store()
        self.graph = graph
        self.fresh = trusted is not None  # an integration tree: it holds nothing gates left
        self.has_pass: dict[str, bool] = {}  # key -> an entry (read once a run, not per gate)
        self.snapshot_files = 0
        self.hashed_files = 0
        started = time.monotonic()
        # A landed proof (written, or answered from) keys the gates without inputs by the
        # whole tree too, when the checkout is exactly HEAD (``landed.py``).
        self.tree = (
            landed_tree(repo)
            if isinstance(landed, Verified)
            else _head_tree(repo)
            if whole_tree
            else None
        )
        if isinstance(landed, Verified) and landed.proof.manifest_digest != manifest_digest(
            manifest.path
        ):
            landed = f"the landed proof on {landed.proof.commit[:12]} was made with another "
            landed += "manifest; every gate runs"
        self.landed = landed if isinstance(landed, Verified) else None
        self.landed_warning = landed if isinstance(landed, str) else ""
        declared = any(spec(graph, n).inputs and spec(graph, n).kind == "gate" for n in graph.nodes)
        if self.tree or declared:
            # whole-tree keys need the tree id only: no snapshot unless a gate has inputs
            snapshot = take_snapshot(repo) if declared else Snapshot(repo, [], {}, git=True)
            self.snapshot_files, self.hashed_files = len(snapshot.paths), snapshot.hashed
            self.all_keys = compute_keys(
                manifest,
                graph,
                snapshot,
                envs,
                repo,
                hide=self.store.root,
                fingerprint=fingerprint or (self.remembering(repo) if remember_tools else None),
                tree=self.tree,
            )
        else:
            self.all_keys = {n: "not cacheable: the gate declares no inputs" for n in graph.nodes}
        self.keys = store_keys(self.all_keys)
        cacheable = any(isinstance(k, KeyParts) for k in self.keys.values())
        self.scoped = (
            _tree_scoped(graph, self.keys, repo, trusted, ahead) if trusted and cacheable else {}
        )
        self.setup_seconds = time.monotonic() - started
        self.stored = 0

    def remembering(self, repo: Path) -> Fingerprint:
        """Tool fingerprints here, remembered by identity (``toolmemo.py``)."""
        hide = self.store.root
        writable = self.manifest.sandbox.writable

        def fingerprint(command: str, env: Mapping[str, str]) -> tuple[str, str]:
            return remembered(
                command,
                env,
                repo,
                lambda: tool_fingerprint(command, env, repo, hide=hide, writable=writable),
                self.store,
            )

        return fingerprint

    def warnings(self) -> list[str]:
        found = [
            f"gate {gate!r}: input glob {glob!r} matched no file"
            for gate, parts in self.keys.items()
            if isinstance(parts, KeyParts)
            for glob in parts.unmatched
        ]
        return found + self.store.warnings + ([self.landed_warning] if self.landed_warning else [])

    def proof(self, gate: str) -> CacheProof:
        parts = self.keys.get(gate)
        if not isinstance(parts, KeyParts):
            return CacheProof(cacheable=False, reason=parts or "not cacheable")
        scoped = None
        if gate in self.scoped:
            key, outside = self.scoped[gate].own, self.scoped[gate].outside
            scoped = {
                "key": key,
                "reason": "the tree under test differs from the trusted target outside the "
                "gate's inputs, so its verdict is reused only for this exact tree",
                "outside_inputs": list(outside[:20]),
            }
        return CacheProof(cacheable=True, key=parts.key, parts=parts.summary(), tree_scoped=scoped)

    def lookup(self, gate: str) -> Outcome | Wait | None:
        """A CACHED outcome with its proof when a passing entry has this gate's key (or,
        for a tree-scoped gate, its key for this exact tree); a :class:`Wait` when another
        run computes one of those keys now; None when this run must compute it."""
        if not self.all_answered(gate):
            return None  # what needs it will run, and may need what it leaves in the tree
        answered = self.from_landed(gate)
        if answered is not None:
            return answered
        parts = self.keys.get(gate)
        if not self.read or not isinstance(parts, KeyParts):
            return None
        keys = self.answering(gate, parts)
        hit = next((h for h in map(self.store.lookup, keys) if h is not None), None)
        if hit is None:
            flights = self.flights
            if flights is not None and gate not in self.waited:
                for key in keys:
                    if key in flights.running:
                        # once: a flight that ends without a pass leaves this run to compute
                        # it itself, beside the others, not behind them one by one
                        flights.waited += 1
                        self.waited.add(gate)
                        return Wait(done=flights.running[key], key=key)
                mine = self.store_key(gate, parts)
                flights.claim(mine)
                self.claimed[gate] = mine
            return None
        if self.flights is not None:
            self.flights.reused += 1
        log = self.run_dir / "logs" / f"{gate}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            out.write(f"[dagrunner: cached result of run {hit.run_id}; its log follows]\n".encode())
            with hit.log.open("rb") as src:
                shutil.copyfileobj(src, out)
        proof = replace(
            self.proof(gate),
            hit=True,
            stored_by_run=hit.run_id,
            stored_at=hit.stored_at,
            saved=hit.duration,
        )
        return Outcome(
            status=Status.CACHED,
            reason=f"cached: key {parts.key[:12]} passed in run {hit.run_id} "
            f"({hit.stored_at}); saved {format_duration(hit.duration)}",
            cache=proof,
            command=str(hit.result.get("command", "")),
        )

    def answering(self, gate: str, parts: KeyParts) -> list[str]:  # its, this tree's, the head's
        scoped = self.scoped.get(gate)
        return [parts.key, *((scoped.own, *scoped.trusted) if scoped else ())]

    def all_answered(self, gate: str) -> bool:
        """In an integration tree (a checkout keeps what gates left), whether all that needs
        ``gate`` has a pass: a cached pass restores no ``dist/`` for a gate that runs."""
        for later in nx.descendants(self.graph, gate) if self.fresh else ():
            proven = self.landed.proof.gates.get(later) if self.landed is not None else None
            whole = self.all_keys.get(later)  # a landed proof's key (the whole tree's too)
            if proven and isinstance(whole, KeyParts) and proven.key == whole.key:
                continue
            if not self.read or not isinstance(parts := self.keys.get(later), KeyParts):
                return False
            for key in self.answering(later, parts):  # each entry read once a run
                if key not in self.has_pass:
                    self.has_pass[key] = self.store.lookup(key) is not None
                if self.has_pass[key]:
                    break
            else:
                return False
        return True

    def from_landed(self, gate: str) -> Outcome | None:
        """A CACHED outcome when the verified landed proof holds this gate's key exactly."""
        parts = self.all_keys.get(gate)
        verified = self.landed
        if verified is None or not self.read or not isinstance(parts, KeyParts):
            return None
        proven = verified.proof.gates.get(gate)
        if proven is None or proven.key != parts.key:
            return None
        commit = verified.proof.commit
        log = self.run_dir / "logs" / f"{gate}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(
            f"[dagrunner: answered by the landed proof on {commit} (signed by "
            f"{verified.signer}); the gate did not run here]\n"
        )
        if self.flights is not None:
            self.flights.reused += 1
        return Outcome(
            status=Status.CACHED,
            reason=f"cached (landed proof {commit[:12]}): key {parts.key[:12]} {proven.verdict} "
            f"when it landed, signed by {verified.signer}; saved {format_duration(proven.duration)}",
            cache=CacheProof(
                cacheable=True,
                key=parts.key,
                parts=parts.summary(),
                hit=True,
                saved=proven.duration,
                landed={
                    "commit": commit,
                    "signer": verified.signer,
                    "verdict": proven.verdict,
                    "landed_at": verified.proof.landed_at,
                    "runner": dict(verified.proof.runner),
                },
            ),
        )

    def landed_keys(self) -> dict[str, str]:
        """Each gate's key on this tree, for the proof written when it lands."""
        if not self.tree:
            return {}
        return {g: p.key for g, p in self.all_keys.items() if isinstance(p, KeyParts)}

    def miss_proof(self, gate: str) -> CacheProof:
        proof = self.proof(gate)
        if not proof.cacheable:
            return proof
        why = "cache reads disabled (--no-cache)" if not self.read else "no entry"
        return replace(proof, hit=False, reason=why)

    def store_key(self, gate: str, parts: KeyParts) -> str:
        """The key this run stores ``gate``'s pass under: its input key, or this tree's."""
        scoped = self.scoped.get(gate)
        return scoped.own if scoped else parts.key

    def settled(self, result: GateResult) -> None:
        """A gate's result is recorded: a plain pass (not flaky, not cached) of a cacheable
        gate is stored now, so that runs waiting for its key are answered from it."""
        parts = self.keys.get(result.id)
        if result.status is Status.PASSED and isinstance(parts, KeyParts):
            self.store.store(
                manifest_name=self.manifest.name,
                parts=parts,
                result=result,
                run_id=self.run_id,
                log=self.run_dir / "logs" / f"{result.id}.log",
                key=self.store_key(result.id, parts),
            )
            self.stored += 1
        self.land(result.id)

    def land(self, gate: str | None = None) -> None:
        """Waiters on what this run claimed (``gate``'s key, or all) look again."""
        if self.flights is None:
            return
        for name in [gate] if gate is not None else list(self.claimed):
            key = self.claimed.pop(name, None) if name is not None else None
            if key is not None:
                self.flights.land(key)

    def summary(self, results: list[GateResult]) -> dict[str, Any]:
        cacheable = [g for g, p in self.keys.items() if isinstance(p, KeyParts)]
        hits = [r.id for r in results if r.status is Status.CACHED]
        return {
            "dir": str(self.store.root),
            "reads": self.read,
            "cacheable": len(cacheable),
            "hits": len(hits),
            "misses": len(cacheable) - len(hits),
            "stored": self.stored,
            "snapshot_files": self.snapshot_files,
            "hashed_files": self.hashed_files,
            "landed": sum(1 for r in results if r.cache and r.cache.landed),
            "landed_keys": self.landed_keys(),
        }


def _head_tree(repo: Path) -> str | None:
    """HEAD's tree, for a tree the integrator has just reset to exactly its commit (an
    integration slot: ``reset --hard`` and ``clean -ffdx``), so no status is needed."""
    done = git(["rev-parse", "--verify", "-q", "HEAD^{tree}"], cwd=repo, check=False)
    return done.text if done.returncode == 0 else None


@dataclass(frozen=True)
class Scoped:
    """A gate the reuse rule scopes to this exact tree: its key for this tree, the changed
    paths outside its inputs, and its keys for the trees whose verdicts hold here too."""

    own: str
    outside: tuple[str, ...]
    trusted: tuple[str, ...]


def _tree_scoped(
    graph: Graph, keys: Mapping[str, KeyParts | str], repo: Path, trusted: str, ahead: str | None
) -> dict[str, Scoped]:
    """The reuse rule for an untrusted tree (an envelope's): a verdict computed on it may be
    reused by input key only when the tree equals the ``trusted`` commit outside the gate's
    declared inputs; otherwise only for this exact tree (docs/security.md).

    Trees whose tree-scoped verdicts hold here too: the trusted commit's (judged while it
    was an envelope's, it has landed since), and, in the pipeline, the trees of the commits
    between it and ``ahead`` (this tree's speculative base): this tree lands only after every
    one of them has landed, so only once their verdicts are trusted ones; when one does not
    land, this tree is built and gated again without it.  A tree that cannot be compared
    scopes every gate."""
    tree = git(["rev-parse", "--verify", "-q", "HEAD^{tree}"], cwd=repo, check=False)
    head = git(["rev-parse", "--verify", "-q", f"{trusted}^{{tree}}"], cwd=repo, check=False)
    diff = git(
        ["diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", trusted, "HEAD", "--"],
        cwd=repo,
        check=False,
    )
    dirty = git(["status", "--porcelain", "-z", "--untracked-files=all"], cwd=repo, check=False)
    chain = git(["log", "--format=%T", f"{trusted}..{ahead}", "--"], cwd=repo, check=False)
    known = tree.returncode == 0 and diff.returncode == 0 and not dirty.stdout
    changed = tuple(split_z(diff.stdout)) if known else ("(the tree could not be compared)",)
    ident = tree.text if known else "unknown"
    trees = [head.text, *(chain.text.split() if ahead and chain.returncode == 0 else ())]
    scoped = {}
    for gate, parts in keys.items():
        if not isinstance(parts, KeyParts):
            continue
        patterns = [glob_regex(g) for g in spec(graph, gate).inputs]
        outside = tuple(p for p in changed if not any(r.match(p) for r in patterns))
        if outside or not known:
            also = tuple(_scoped(parts.key, t) for t in trees)
            scoped[gate] = Scoped(_scoped(parts.key, ident), outside, also)
    return scoped


def _scoped(key: str, tree: str) -> str:
    """The cache key of a verdict that holds for one exact tree only."""
    return hashlib.sha256(f"tree-scoped\0{key}\0{tree}".encode()).hexdigest()


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
    from dagrunner.engine.cache import explain
    from dagrunner.engine.graph import select

    sub = select(graph, [gate], where=str(manifest.path))
    snapshot = take_snapshot(repo)
    store = store or Store()
    tree = landed_tree(repo)
    environ = os.environ if environ is None else environ
    every = compute_keys(
        manifest, sub, snapshot, {n: envs[n] for n in sub.nodes}, repo, hide=store.root, tree=tree
    )
    current = store_keys(every)[gate]
    stored = store.newest_parts(manifest.name, gate)
    hit = isinstance(current, KeyParts) and store.lookup(current.key) is not None
    # A hit is a hit, whichever entry is newest (after a revert, an older one matches).
    changes = (
        [f"hit: the current key {current.key[:12]} has a stored entry"]
        if hit and isinstance(current, KeyParts)
        else explain(current, stored)
    )
    return {
        "gate": gate,
        "cacheable": isinstance(current, KeyParts),
        "key": current.key if isinstance(current, KeyParts) else None,
        "stored_key": stored.get("key") if stored else None,
        "hit": hit,
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
