"""Where the pipeline's trees are made and gated: integration worktrees (slots) taken and
given back, an item applied on its speculative head, one gate run of a tree, and the proof
written when a tree lands.  ``pipeline.py`` decides which tree, when, and what counts."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import trio

from dagrunner.engine.governor import Governor
from dagrunner.engine.plan import RunOptions
from dagrunner.engine.scheduler import Flights
from dagrunner.engine.steps import gate_run
from dagrunner.errors import DagrunnerError
from dagrunner.executors.base import Executor
from dagrunner.git.command import git
from dagrunner.git.repo import cache_root, remove_worktrees
from dagrunner.integration import proofs
from dagrunner.integration.items import Finished, GateRun, Item
from dagrunner.manifest.load import Manifest
from dagrunner.process import share
from dagrunner.records.integration import (
    EnvelopeState,
    LandOutcome,
    PipelineTally,
    Speculation,
    Verdict,
)
from dagrunner.records.run import RunRecord, RunStatus, Status
from dagrunner.starter.venvs import in_place
from dagrunner.worktrees import seeds
from dagrunner.worktrees.prepare import provision_seeds, release_seeds

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope
    from dagrunner.integration.needs import IntegratorLike as Integrator


class Trees:
    def __init__(
        self, it: Integrator, executor: Executor, governor: Governor, manifest: Manifest
    ) -> None:
        self.it = it
        self.executor = executor
        self.governor = governor
        self.free: list[Path] = [it.wt]
        self.made = 1
        self.flights = Flights()  # cache keys one tree's run computes for the others
        self.signing_key = proofs.signing_key(manifest, it.env, it.repo)
        self.manifest = manifest  # the target's, at the run's start: its seeds
        self.warnings: list[str] = []  # trees gated without a seed, and why
        if not manifest.worktrees.seeds and (said := editable_from(it.env, it.repo)):
            self.warnings.append(said)

    async def take(self, head: str) -> Path:
        """A free integration worktree (made on ``head`` when none is free).  Slots are taken
        and given back in the trio thread only, so two tasks never hold one."""
        if self.free:
            return self.free.pop()
        slot = self.it.wt.parent / ".speculative" / self.it.wt.name / str(self.made)
        self.made += 1
        await trio.to_thread.run_sync(self.it.prepare_worktree, head, slot)
        return slot

    def give(self, slot: Path | None) -> None:
        """``slot`` is free again (None: nothing to give back)."""
        if slot is not None:
            self.free.append(slot)

    def unused(self) -> list[Path]:
        """Slots an earlier, wider run made and this one did not use."""
        return [p for p in self.it.slots()[1:] if p.name.isdigit() and int(p.name) >= self.made]

    def remove_unused(self) -> None:
        """The unused slots go, their seeds first (an overlay mount holds a folder)."""
        unused = self.unused()
        for slot in unused:
            release_seeds(self.it.ctx.root, slot)
        remove_worktrees(self.it.repo, unused)

    async def build(
        self, item: Item, head: str, *, final: bool
    ) -> Literal["built", "deferred", "gone"]:
        """Apply ``item`` on its base in a slot of its own: built (``item.slot`` holds it,
        exactly its tree); deferred (it conflicts behind the front); or gone (its envelopes
        all ended at the front: conflict, rejected).  Only a built item keeps its slot."""
        slot = await self.take(head)
        try:
            built = await trio.to_thread.run_sync(lambda: self.apply_all(item, slot, final, head))
        except BaseException:
            self.give(slot)
            raise
        if not built or not item.applied:
            self.give(slot)
            return "deferred" if not built else "gone"
        item.slot = slot  # its first gate run uses it as it is
        return "built"

    def apply_all(self, item: Item, slot: Path, final: bool, head: str) -> bool:
        """Apply the item's envelopes on its base in ``slot``.  A conflict is final only on
        the target's head itself (the front, nothing of its batch applied before it); behind
        the front (``final`` False), or behind an envelope of its batch (which may never
        land), an envelope that does not apply is put aside (``item.skipped``) and the rest
        applied without it, as the serial loop applies them once what is ahead of it landed
        (then it is a conflict there: ``judge_skipped``); if the item fails, it goes back in
        its place (``Item.in_order``).  What is queued behind one that changes the target's
        manifest is not applied (``item.behind``: an item of its own, behind; judged by that
        manifest once it landed, as the serial loop judges it).  False: none applied
        (``item.deferred``: all put aside, retried at the front)."""
        it = self.it
        it.reset(item.base, slot)
        item.applied, item.deferred, item.behind, item.skipped = [], [], [], []
        item.queued = list(item.envelopes)
        manifest = it.manifest_rel().as_posix()
        for index, envelope in enumerate(item.envelopes):
            settled = final and not item.applied
            commit = it.apply(envelope, slot, final=settled)
            if commit is not None:
                item.applied.append((envelope, commit))
            elif not settled:  # gated without it: where it would be judged if all ahead land
                item.skipped.append((envelope, item.applied[-1][1] if item.applied else item.base))
            if commit is not None and manifest in envelope.touched:
                item.behind = item.envelopes[index + 1 :]
                break
        if item.skipped and not item.applied:
            item.deferred, item.skipped = [e for e, _ in item.skipped], []
            return False
        item.envelopes = [e for e, _ in item.applied]  # the rest ended, or were put aside
        item.holds |= set(item.ids)  # on what its base holds (``items.base_for``)
        item.commit = item.applied[-1][1] if item.applied else item.base
        item.manifest = it.trusted_manifest(head, slot)
        # the tree with the manifest that judges it: another manifest's verdict is not its own
        tree = git(["rev-parse", f"{item.commit}^{{tree}}"], cwd=it.repo).text
        item.tree = f"{tree} {hashlib.sha256(item.manifest.read_bytes()).hexdigest()}"
        return True

    async def judge_skipped(self, landed: Item, head: str) -> list[Envelope]:
        """``landed`` landed: each envelope it put aside (``Item.skipped``, still queued) is
        applied where the serial loop applies it, on the commit of its batch it did not
        apply on -- final now: a conflict (or a corrupt patch).  Those that apply there
        after all (the same patch on the same tree: never) are returned, to be queued."""
        again: list[Envelope] = []
        entries = self.it.queue.entries()
        for envelope, on in landed.skipped:
            if entries[envelope.id].state is not EnvelopeState.QUEUED:
                continue  # withdrawn meanwhile
            slot = await self.take(head)
            try:
                await trio.to_thread.run_sync(self.it.reset, on, slot)
                commit = await trio.to_thread.run_sync(self.it.apply, envelope, slot)
            finally:
                self.give(slot)
            again += [envelope] if commit is not None else []
        landed.skipped = []
        return again

    async def gate(self, run: GateRun, run_dir: Path, head: str) -> RunRecord:
        """One gate run of the run's tree: in the slot it was built in, or (a confirmation)
        in any free slot moved to its commit.  The slot is given back however it ends."""
        slot = run.slot
        try:
            if slot is None:
                slot = await self.take(head)
                await trio.to_thread.run_sync(self.it.reset, run.commit, slot)
            self.executor.fresh(slot)
            trusted = await trio.to_thread.run_sync(self.it.head)
            said, own = await trio.to_thread.run_sync(
                seed_tree, self.it, self.manifest, run.commit, slot, trusted
            )
            if said and said not in self.warnings:
                self.warnings.append(said)
            record, _ = await gate_run(
                RunOptions(
                    repo=slot,
                    manifest=run.manifest,
                    report_dir=run_dir,
                    environ=self.it.env,
                    executor=self.it.executor,
                    only=run.only,
                    read_only=self.it.guarded,
                    conceal=(self.it.repo,),
                    layered=True,
                    trusted=trusted,
                    ahead=run.base,
                    flights=self.flights,
                    # a tree's first failing gate is its verdict: the rest stop (a
                    # differential baseline compares every gate's failures: they all run)
                    fail_fast=self.manifest.integrate.baseline == "absolute" and bool(run.ids),
                ),
                self.executor,
                self.governor,
            )
            return unseeded(record, said) if own else record
        finally:
            if slot is not None:
                self.give(slot)  # the run is over (a cancelled one ended its trees)

    async def verdict(
        self, run: GateRun, run_dir: Path, head: str, tally: PipelineTally
    ) -> Finished:
        """One gate run of the run's tree (``gate``), as the pipeline's verdict; what it
        reused and the CPU its gates took are counted in ``tally``."""
        record = await self.gate(run, run_dir, head)
        cached = sum(g.status is Status.CACHED for g in record.gates)
        cpu = sum(a.cpu_seconds for g in record.gates for a in g.attempts)
        tally.gate_cpu += cpu
        tally.gates_reused += cached
        tally.gates_waited = self.flights.waited
        if record.gates and cached == len(record.gates):
            tally.cached_runs += 1
        failed = tuple(g.id for g in record.gates if g.status.failed)
        return Finished(
            run.item,
            run.generation,
            record.status is RunStatus.PASSED,
            failed or tuple(g.id for g in record.gates if not g.status.ok),
            str(run_dir),
            run.confirm,
            proofs.proven_gates(record),
            proofs.passes(record),
            run.tree,
            record,
            cpu,
        )

    async def gate_head(
        self, head: str, tally: PipelineTally, t0: float, only: tuple[str, ...] = ()
    ) -> RunRecord:
        """One more gate run: the target's head itself, in any free slot (a baseline's), on
        the report's timeline as a run of no envelope (``t0``: the pipeline's start)."""
        tally.gate_runs += 1
        number = tally.gate_runs
        run_dir, start = self.it.reports / f"gates-{number:02d}", trio.current_time() - t0
        manifest = await trio.to_thread.run_sync(self.it.trusted_manifest, head)
        run = GateRun(
            item=Item([]),
            number=0,
            position=-1,
            confirm=False,
            generation=0,
            base=head,
            commit=head,
            manifest=manifest,
            only=only,
            ids=(),
            scope=trio.CancelScope(),
            slot=None,
        )
        record = await self.gate(run, run_dir, head)
        tally.gate_cpu += sum(a.cpu_seconds for g in record.gates for a in g.attempts)
        passed = record.status is RunStatus.PASSED
        tally.pipeline.append(
            Speculation(
                gate_run=number,
                envelopes=(),
                head=head,
                commit=head,
                position=0,
                start=start,
                end=trio.current_time() - t0,
                verdict=Verdict.PASSED if passed else Verdict.FAILED,
                gates=tuple(g.id for g in record.gates if not g.status.ok),
                report=str(run_dir),
            )
        )
        return record

    def land(self, front: Item) -> LandOutcome:
        """Move the target to ``front``'s tree (``Integrator.land``, under the git lock); its
        landed proof written once it is there (a warning when it could not be)."""
        with self.it.git_lock:
            landed = self.it.land(front.base, front.applied, front.commit, flaky=front.flaky)
            if landed is LandOutcome.LANDED and (said := self.prove(front)):
                self.warnings.append(said)
            return landed

    def prove(self, landed: Item) -> str | None:
        """The landed commit's proof in refs/notes/dagrunner; a warning when not written."""
        return proofs.write_landed(
            self.it.repo,
            commit=landed.commit,
            target=self.it.target,
            manifest=landed.manifest,
            gates=landed.proven,
            executor=self.executor.name,
            key=self.signing_key,
        )


def seed_tree(
    it: Integrator, manifest: Manifest, commit: str, tree: Path, trusted: str
) -> tuple[str, bool]:
    """The target manifest's seeds in ``tree`` (exactly ``commit``, reset since its last
    gate run: ``Integrator.reset`` releases them), each this tree's own copy with this tree's
    paths, as a worker's worktree gets them (``seeds.for_tree``: a seed whose key files the
    tree changed is built from the tree and serves nothing else).  '' or why a seed is
    missing, and whether the tree's own build failed (its key files, as the tree changed
    them: the project's CI fails there too -- the tree fails, ``unseeded``); a trusted seed
    missing, its gates run without it and fail where they need it."""
    if not manifest.worktrees.seeds:
        return "", False
    root = it.ctx.root
    try:
        built = seeds.for_tree(root, it.repo, commit, trusted, manifest, it.env, hide=cache_root())
        how = share.choose(seeds.seeds_dir(root), it.env)
        provision_seeds(root, tree.relative_to(root).as_posix(), tree, built, how)
    except DagrunnerError as exc:
        said = f"the tree at {commit[:12]} was gated without its seeds: {exc.code}: {exc.message}"
        return said, exc.details.get("from_tree") is True
    return "", False


def unseeded(record: RunRecord, why: str) -> RunRecord:
    """``record`` of a tree whose own seed did not build: no gate of it passed (what passed
    without the seed ran on tools the tree's lock does not say, round 16b)."""
    gates = [
        replace(g, status=Status.FAILED, reason=why[:300]) if g.status.ok else g
        for g in record.gates
    ]
    return replace(record, status=RunStatus.FAILED, gates=gates, warnings=[*record.warnings, why])


def editable_from(env: Mapping[str, str], checkout: Path) -> str:
    """'' or a warning: the caller's venv (``VIRTUAL_ENV``) imports a folder of ``checkout``
    in place (``starter.venvs.in_place``), which integration gates do not see (the checkout
    is concealed from them): where the target declares no seed, their imports of it fail."""
    venv = env.get("VIRTUAL_ENV")
    where = in_place(Path(venv), checkout) if venv else None
    if where is None:
        return ""
    return (
        f"the caller's venv {venv} imports {where} in place, which integration gates do not "
        "see; without a [[worktrees.seed]] for a venv (docs/worktrees.md) their imports of "
        "the project fail"
    )
