"""The cache's place in a run: keys at plan time, lookups as gates become ready, a store
the moment a gate passes, and the proof written into each gate's record.

Runs in one trio loop (the integration pipeline's trees) share :class:`Flights`: a gate
whose key another run is computing now waits for that run's verdict instead of computing
it too (single flight), then is looked up again."""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import networkx as nx

from dagrunner.engine.cache import Store, reads_account, reads_warnings, undeclared_reads
from dagrunner.engine.graph import Graph, spec
from dagrunner.engine.inputs import (
    Before,
    Snapshot,
    held_before,
    neutral,
    stands_for,
    take_snapshot,
)
from dagrunner.engine.keys import (
    Candidate,
    KeyParts,
    Listing,
    Placement,
    compute_keys,
    store_keys,
    tree_scope,
)
from dagrunner.engine.landed import Verified, head_tree, landed_answer, manifest_digest
from dagrunner.engine.landed import clean_tree as landed_tree
from dagrunner.engine.scheduler import Flights, Outcome, Wait
from dagrunner.engine.tools import remembering
from dagrunner.executors.base import Fingerprint
from dagrunner.manifest.load import Manifest
from dagrunner.process.toolcaches import linked_worktree
from dagrunner.records.run import CacheProof, GateResult, Observation, Status
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
            else head_tree(repo)
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
        if fingerprint is None and remember_tools:
            fingerprint = remembering(repo, self.store, manifest.sandbox.writable)
        declared = any(spec(graph, n).inputs and spec(graph, n).kind == "gate" for n in graph.nodes)
        # whole-tree keys need the tree id only: no snapshot unless a gate has inputs
        self.snapshot = take_snapshot(repo) if declared else Snapshot(repo, [], {}, git=True)
        if self.tree or declared:
            self.snapshot_files, self.hashed_files = len(self.snapshot.paths), self.snapshot.hashed
            self.all_keys = compute_keys(
                manifest,
                graph,
                self.snapshot,
                envs,
                repo,
                hide=self.store.root,
                fingerprint=fingerprint,
                tree=self.tree,
            )
        else:
            self.all_keys = {n: "not cacheable: the gate declares no inputs" for n in graph.nodes}
        self.keys = store_keys(self.all_keys)
        cacheable = any(isinstance(k, KeyParts) for k in self.keys.values())
        # An untrusted tree (an envelope's): which verdicts hold for this exact tree only
        self.scope = tree_scope(repo, trusted, ahead) if trusted and cacheable else None
        self.scoped = {  # gate -> the changed paths outside its inputs (the reuse rule)
            g: outside
            for g, p in self.keys.items()
            if isinstance(p, KeyParts)
            and self.scope
            and (outside := self.scope.outside(spec(graph, g).inputs))
        }
        # a linked worktree's own check (a worker's): its passes answer its later runs alone
        self.place = Placement(self.scope, self.scoped, None if trusted else linked_worktree(repo))
        self.effective: dict[str, str] = {}  # gate -> the key its dependants hold, once settled
        self.seen: dict[str, Observation] = {}  # gate -> what its last attempt was seen to read
        self.stands: dict[str, frozenset[str]] = {}  # gate -> the files its reads stand for
        observes = any(isinstance(p, KeyParts) and p.names for p in self.keys.values())
        self.before = held_before(repo, manifest, self.snapshot) if observes else Before()
        self.by_reads = 0  # passes and hits keyed by what the gate read
        self.listing = Listing(repo, time.time_ns())  # a listed folder's names, but the run's
        self.setup_seconds = time.monotonic() - started
        self.stored = 0

    # -- keys from what a gate read (issue 46) ----------------------------------------------

    def observes(self, gate: str) -> bool:
        """Whether ``gate``'s reads are recorded: to key it (its inputs are the whole tree),
        or to report the files it read outside narrower inputs."""
        return isinstance(self.keys.get(gate), KeyParts) and spec(self.graph, gate).observe

    def by_read(self, gate: str, parts: KeyParts) -> bool:
        """Keyed by its reads: its inputs are the whole tree, and the reuse rule does not
        scope it to this tree (a tree that could not be compared)."""
        return bool(parts.names) and gate not in self.scoped

    def current(self, gate: str, known: Mapping[str, str] | None = None) -> KeyParts | str:
        """``gate``'s key parts with the keys its needs settled on (an observed need's
        verdict key is known only once it was answered or ran)."""
        parts = self.keys.get(gate)
        if not isinstance(parts, KeyParts):
            return parts or "not cacheable"
        known = self.effective if known is None else known
        needs = {need: known.get(need, key) for need, key in parts.needs.items()}
        return parts if needs == parts.needs else replace(parts, needs=needs)

    def candidates(self, gate: str, parts: KeyParts) -> list[Candidate]:
        """The stored keys that answer ``gate`` now, in order: a verdict key per read set
        kept under its shape (each also as scoped to the trees whose verdicts hold here),
        then its whole key (an incomplete observation's pass, or a gate keyed by inputs)."""
        sets = self.store.read_sets(parts.shape) if self.by_read(gate, parts) else []
        verdicts = [(parts.verdict(read, self.listing)[0], read) for read in sets]
        answering = self.place.answering
        found = [Candidate(k, v, read) for v, read in verdicts for k in answering(v)]
        return found + [Candidate(k, parts.key, None) for k in answering(parts.key, gate)]

    def seen_reading(self, gate: str, seen: Observation | None, *, warm: bool = False) -> None:
        """What ``gate``'s attempt was seen to read, and whether its tool caches were warm
        (a cache trusted by ``stat`` stands for files it did not open: keyed by the whole
        tree); the reads of a run keyed by them become the files they stand for."""
        if seen is None:
            return
        parts = self.keys.get(gate)
        if isinstance(parts, KeyParts) and self.by_read(gate, parts) and seen.complete:
            why = "its tool caches were warm (what a cache validated by stat holds is not seen)"
            found: frozenset[str] = frozenset()
            if not warm:
                ran = (self.seen.get(a) for a in nx.ancestors(self.graph, gate))
                # what needs wrote, not what they opened (a cache may stand for stat-ed files)
                written = frozenset(path for need in ran if need for path in need.wrote)
                at = (self.before, written, neutral(spec(self.graph, gate), self.before))
                found, why = stands_for(seen, parts.inputs, *at, self.listing.made)
            if why:
                seen = replace(seen, complete=False, why=why)
            self.stands[gate] = found
        self.seen[gate] = seen

    def undeclared(self, gate: str) -> list[str]:
        """Files of the tree ``gate`` read that its narrower inputs do not name."""
        return undeclared_reads(self.keys.get(gate), self.seen.get(gate), self.snapshot.ids)

    def observation(self, gate: str, *, read: int | None = None) -> dict[str, Any] | None:
        """The proof's account of what ``gate`` was seen to read, and what it is keyed by."""
        parts = self.keys.get(gate)
        if not isinstance(parts, KeyParts) or not spec(self.graph, gate).observe:
            return None
        by_read = self.by_read(gate, parts)
        seen, stands = self.seen.get(gate), self.stands.get(gate)
        return reads_account(parts, seen, self.snapshot.ids, by_read, read, stands)

    def warnings(self) -> list[str]:
        found = [
            f"gate {gate!r}: input glob {glob!r} matched no file"
            for gate, parts in self.keys.items()
            if isinstance(parts, KeyParts)
            for glob in parts.unmatched
        ]
        by_read = {
            g: p for g, p in self.keys.items() if isinstance(p, KeyParts) and self.by_read(g, p)
        }
        found += reads_warnings(self.seen, by_read, self.undeclared)
        return found + self.store.warnings + ([self.landed_warning] if self.landed_warning else [])

    def ran_key(self, gate: str, parts: KeyParts) -> tuple[str, frozenset[str] | None]:
        """The key a run of ``gate`` holds, and the read set it is made of: the verdict key
        of the files its reads stand for, or (no complete observation) its whole key."""
        seen = self.seen.get(gate)
        if not (self.by_read(gate, parts) and seen is not None and seen.complete):
            return parts.key, None
        stands = self.stands.get(gate, ())
        read = frozenset(p for p in stands if p in parts.inputs or p.endswith("/"))
        return parts.verdict(read, self.listing)[0], read

    def proof(self, gate: str, *, read: int | None = None) -> CacheProof:
        parts = self.current(gate)
        if not isinstance(parts, KeyParts):
            return CacheProof(cacheable=False, reason=parts)
        scoped = None
        if gate in self.scoped and self.scope is not None:
            scoped = {
                "key": self.scope.own(parts.key),
                "reason": "the tree under test differs from the trusted target outside the "
                "gate's inputs, so its verdict is reused only for this exact tree",
                "outside_inputs": list(self.scoped[gate][:20]),
            }
        return CacheProof(
            cacheable=True,
            key=self.ran_key(gate, parts)[0],  # a run's; a hit's is the key that answered
            parts=parts.summary(),
            tree_scoped=scoped,
            observed=self.observation(gate, read=read),
        )

    def lookup(self, gate: str) -> Outcome | Wait | None:
        """A CACHED outcome with its proof when a passing entry answers this gate (a verdict
        key of a read set kept under its shape, its whole key, or either scoped to a tree
        whose verdicts hold here); a :class:`Wait` when another run computes one of those
        now; None when this run must compute it.  Its needs have settled."""
        if not self.all_answered(gate):
            return None  # what needs it will run, and may need what it leaves in the tree
        answered = self.from_landed(gate)
        if answered is not None:
            whole = self.all_keys.get(gate)
            self.effective[gate] = whole.key if isinstance(whole, KeyParts) else ""
            return answered
        parts = self.current(gate)
        if not self.read or not isinstance(parts, KeyParts):
            return None
        found = self.candidates(gate, parts)
        hit, chosen = None, None
        for chosen in found:
            if (hit := self.store.lookup(chosen.key)) is not None:
                break
        if hit is None or chosen is None:
            flights = self.flights
            if flights is not None and gate not in self.waited:
                # not in the queue: its trees' envelopes are mostly read (made it serial)
                shaped = self.by_read(gate, parts) and self.scope is None
                flight = [c.key for c in found] + [parts.flight] * shaped
                for key in flight:
                    if key in flights.running:
                        # once: a flight that ends without a pass leaves this run to compute
                        # it itself, beside the others, not behind them one by one
                        flights.waited += 1
                        self.waited.add(gate)
                        return Wait(done=flights.running[key], key=key)
                keyed = self.by_read(gate, parts)
                mine = parts.flight if keyed else self.place.store_key(gate, parts.key)
                flights.claim(mine)
                self.claimed[gate] = mine
            return None
        self.effective[gate] = chosen.counts
        if chosen.read is not None:
            self.store.used_read_set(parts.shape, chosen.read)
            self.by_reads += 1
            if self.scope is not None and chosen.key == self.scope.keys(chosen.counts)[0]:
                self.store.alias(hit, chosen.counts)  # the target's own tree: trusted now
        if self.flights is not None:
            self.flights.reused += 1
        log = self.run_dir / "logs" / f"{gate}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            out.write(f"[dagrunner: cached result of run {hit.run_id}; its log follows]\n".encode())
            with hit.log.open("rb") as src:
                shutil.copyfileobj(src, out)
        read = len(chosen.read) if chosen.read is not None else None
        proof = replace(
            self.proof(gate, read=read),
            key=chosen.counts,
            hit=True,
            stored_by_run=hit.run_id,
            stored_at=hit.stored_at,
            saved=hit.duration,
        )
        said = f"none of the {read} files it read changed; " if read is not None else ""
        return Outcome(
            status=Status.CACHED,
            reason=f"cached: {said}key {chosen.counts[:12]} passed in run {hit.run_id} "
            f"({hit.stored_at}); saved {format_duration(hit.duration)}",
            cache=proof,
            command=str(hit.result.get("command", "")),
        )

    def all_answered(self, gate: str) -> bool:
        """In an integration tree (a checkout keeps what gates left), whether all that needs
        ``gate`` has a pass: a cached pass restores no ``dist/`` for a gate that runs."""
        if not self.fresh:
            return True
        predicted: dict[str, str] = {}
        for later in nx.descendants(self.graph, gate):
            proven = self.landed.proof.gates.get(later) if self.landed is not None else None
            whole = self.all_keys.get(later)  # a landed proof's key (the whole tree's too)
            if proven and isinstance(whole, KeyParts) and proven.key == whole.key:
                predicted[later] = whole.key
                continue
            if not self.read or not isinstance(self.keys.get(later), KeyParts):
                return False
            answer = self.predict(later, predicted)
            if answer is None:
                return False
            predicted[later] = answer
        return True

    def predict(self, gate: str, predicted: dict[str, str]) -> str | None:
        """The key ``gate`` would be answered under (what its dependants would hold), its
        needs settled or ``predicted`` (None: it would run); each entry read once a run."""
        for need in spec(self.graph, gate).needs:
            if need not in self.effective and need not in predicted:
                answer = self.predict(need, predicted) if self.read else None
                if answer is None:
                    return None
                predicted[need] = answer
        parts = self.current(gate, {**self.effective, **predicted})
        if not isinstance(parts, KeyParts):
            return None
        for candidate in self.candidates(gate, parts):
            if candidate.key not in self.has_pass:
                self.has_pass[candidate.key] = self.store.lookup(candidate.key) is not None
            if self.has_pass[candidate.key]:
                return candidate.counts
        return None

    def from_landed(self, gate: str) -> Outcome | None:
        """A CACHED outcome when the verified landed proof holds this gate's key exactly."""
        parts = self.all_keys.get(gate)
        if self.landed is None or not self.read or not isinstance(parts, KeyParts):
            return None
        found = landed_answer(self.landed, gate, parts.key, self.run_dir / "logs" / f"{gate}.log")
        if found is None:
            return None
        if self.flights is not None:
            self.flights.reused += 1
        proof = CacheProof(cacheable=True, key=parts.key, parts=parts.summary(), hit=True)
        return Outcome(
            status=Status.CACHED,
            reason=found.reason,
            cache=replace(proof, saved=found.saved, landed=found.landed),
        )

    def landed_keys(self) -> dict[str, str]:
        """Each gate's key on this tree, for the proof written when it lands."""
        if not self.tree:
            return {}
        return {g: p.key for g, p in self.all_keys.items() if isinstance(p, KeyParts)}

    def miss_proof(self, gate: str, *, failed: bool = False) -> CacheProof:
        """A run's proof; a failed run seen whole lists what it read (``read_suspects``)."""
        proof = self.proof(gate)
        why = "cache reads disabled (--no-cache)" if not self.read else "no entry"
        if failed and proof.observed and proof.observed.get("keyed_by") == "reads":
            paths = sorted(self.stands.get(gate, ()))
            proof = replace(proof, observed={**proof.observed, "paths": paths})
        return replace(proof, hit=False, reason=why) if proof.cacheable else proof

    def settled(self, result: GateResult) -> None:
        """A gate's result is recorded: the key its dependants hold is known (an observed
        gate's verdict key, from what it read), and a plain pass (not flaky, not cached) of a
        cacheable gate is stored now, so that runs waiting for its key are answered from it.
        A complete observation stores the pass under its verdict key, with the read set
        kept under its shape key; an incomplete one under its whole key, as without it."""
        gate = result.id
        parts = self.current(gate)
        if result.status is Status.CACHED or not isinstance(parts, KeyParts):
            self.land(gate)
            return
        key, read = self.ran_key(gate, parts)
        ids = parts.verdict(read, self.listing)[1] if read is not None else None
        self.by_reads += read is not None
        self.effective[gate] = key
        if result.status is Status.PASSED:
            if read is not None:  # an untrusted tree's verdict holds for itself until it lands
                self.store.keep_read_set(parts.shape, gate, read)
            self.store.store(
                manifest_name=self.manifest.name,
                parts=parts,
                result=result,
                run_id=self.run_id,
                log=self.run_dir / "logs" / f"{gate}.log",
                key=self.place.store_key(gate, parts.key)
                if read is None
                else self.place.verdict_key(key),
                read=ids,
            )
            self.stored += 1
        self.land(gate)

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
            "by_reads": self.by_reads,
            "landed_keys": self.landed_keys(),
        }
