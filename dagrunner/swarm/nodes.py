"""Workers, integration and landing as nodes of one release-check DAG.

``[workers.X]`` allocates a worktree (mission = the manifest's name), runs its
command there and exports a patch envelope.  ``[integrate.Y]`` submits the
envelopes of its workers to the durable queue (plus what is already queued
when ``queue = true``), applies them with ``git apply --3way`` in the
integration worktree (conflicts are recorded and skipped), and holds the
target's integrator lock until the run ends.  Gates that depend on it run in
that worktree.  ``[land.Y]`` runs after its gates pass and moves the target
with a compare-and-swap.  When the gates fail, the applied envelopes end as
``gates-failed`` (no bisection here: ``integrate run --batch`` bisects).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dagrunner.engine.graph import Graph, integrations_above, spec
from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.manifest.load import LAND_PREFIX, Manifest
from dagrunner.records.integration import Details, EnvelopeState, IntegrationResult, LandOutcome
from dagrunner.records.run import GateResult, Status
from dagrunner.records.summary import RunIntegration
from dagrunner.worktrees import export as exporting

if TYPE_CHECKING:
    from dagrunner.engine.plan import Plan
    from dagrunner.integration.steps import Integrator


@dataclass
class Integration:
    integrator: Integrator
    head: str
    applied: list[tuple[Envelope, str]] = field(default_factory=list)
    landed: bool = False
    moved: bool = False  # the target moved under the landing: the envelopes stay queued


class Swarm:
    """The run-scoped state of worker, integrate and land nodes."""

    @classmethod
    def open(cls, plan: Plan, run_id: str, env: Mapping[str, str]) -> Swarm:
        """The runner's ``NodeKindsFactory`` for manifests with workers, integrate and land."""
        return cls(repo=plan.repo, manifest=plan.manifest, graph=plan.graph, run_id=run_id, env=env)

    def __init__(
        self, *, repo: Path, manifest: Manifest, graph: Graph, run_id: str, env: Mapping[str, str]
    ) -> None:
        self.repo = repo
        self.graph = graph
        self.run_id = run_id
        self.env = env
        self.mission = re.sub(r"[^A-Za-z0-9_.-]", "-", manifest.name).strip("-.") or "swarm"
        self.envelopes: dict[str, Path] = {}
        self.integrations: dict[str, Integration] = {}
        self.locks = contextlib.ExitStack()
        self.mutex = threading.Lock()
        self.allocated: list[str] = []  # worker nodes this run holds a claim on
        self.active = any(spec(graph, n).kind != "gate" for n in graph.nodes)

    # -- where a node runs -----------------------------------------------------------------

    def cwd_root(self, node: str) -> Path:
        """The tree a gate or worker runs in: its worktree, an integration worktree, or the repo."""
        if not self.active:
            return self.repo
        from dagrunner.worktrees import allocate as wt

        gate = spec(self.graph, node)
        if gate.kind == "worker":
            info = wt.allocate_worktree(
                mission=self.mission,
                worker=node,
                base=gate.base,
                repo=self.repo,
                session=f"run-{self.run_id}",
                setup=gate.setup,
                setup_timeout=gate.setup_timeout,
                env=self.env,
            )
            self.allocated.append(node)
            return Path(info.path)
        above = integrations_above(self.graph, node)
        if above and above[0] in self.integrations:
            return self.integrations[above[0]].integrator.wt
        return self.repo

    def export_worker(self, node: str) -> str:
        summary = exporting.export_summary(f"{self.mission}/{node}", repo=self.repo)
        self.envelopes[node] = Path(summary.file)
        if summary.empty:
            return f"no change to export ({summary.id})"
        return f"exported {summary.id}: {summary.changed_files} file(s), {summary.diff_bytes} bytes"

    # -- integrate and land ------------------------------------------------------------------

    def run_node(self, node: str) -> tuple[Status, str]:
        gate = spec(self.graph, node)
        try:
            if gate.kind == "integrate":
                return self.integrate(node)
            return self.land(node.removeprefix(LAND_PREFIX))
        except DagrunnerError as exc:
            return Status.FAILED, f"{exc.code}: {exc.message}"

    def integrate(self, node: str) -> tuple[Status, str]:
        from dagrunner.integration.queue import integrator_lock
        from dagrunner.integration.steps import Integrator
        from dagrunner.integration.submit import submit
        from dagrunner.integration.trees import seed_tree
        from dagrunner.worktrees import allocate as wt
        from dagrunner.worktrees.prepare import base_manifest

        gate = spec(self.graph, node)
        ctx = wt.open_context(self.repo, self.env)
        target = gate.target or wt.default_target(ctx)
        lock = ctx.info.state_dir / f"integrate-{target.replace('/', '--')}.lock"
        with self.mutex:
            self.locks.enter_context(integrator_lock(lock, wait=True))
        integrator = Integrator(
            ctx, target=target, manifest=None, batch=1, env=self.env, run_id=f"{self.run_id}-{node}"
        )
        integrator.recover()
        head = integrator.head()
        integrator.started(head)
        integrator.prepare_worktree(head)
        files = [self.envelopes[w] for w in gate.needs if w in self.envelopes]
        ids = [entry.id for entry in submit(ctx.info, files)] if files else []
        if gate.queue:
            ids += [i for i in integrator.queue.pending() if i not in ids]
        state = Integration(integrator=integrator, head=head)
        self.integrations[node] = state
        conflicts = 0
        for envelope_id in ids:
            envelope = integrator.admit(envelope_id)
            if envelope is None:
                continue
            commit = integrator.apply(envelope)
            if commit is None:
                conflicts += 1
            else:
                state.applied.append((envelope, commit))
                integrator.queue.record(envelope_id, EnvelopeState.GATING, Details(run=self.run_id))
        if state.applied and (seeding := base_manifest(ctx.info.root, head)) is not None:
            # the gates that judge the integrated tree use its own dependencies (issue 35)
            said, own = seed_tree(integrator, seeding, state.applied[-1][1], integrator.wt, head)
            if said:
                integrator.result.warnings.append(said)
            if own:  # the tree's own lock does not build: nothing of it may land (round 16b)
                return Status.FAILED, said
        return Status.PASSED, (
            f"applied {len(state.applied)} envelope(s) on {target} at {head[:12]}; "
            f"{conflicts} conflict(s), {len(ids) - len(state.applied) - conflicts} rejected"
        )

    def land(self, node: str) -> tuple[Status, str]:
        state = self.integrations[node]
        integrator = state.integrator
        if not state.applied:
            return Status.PASSED, "nothing to land"
        outcome = integrator.land(state.head, state.applied)
        integrator.ended()
        if outcome is LandOutcome.LANDED:
            state.landed = True
            integrator.cleanup_landed_workers()
            return Status.PASSED, (
                f"landed {len(state.applied)} envelope(s): {integrator.target} "
                f"{state.head[:12]} -> {integrator.result.end[:12]}"
            )
        if outcome is LandOutcome.MOVED:
            state.moved = True
            for envelope, _ in state.applied:
                integrator.queue.record(
                    envelope.id, EnvelopeState.QUEUED, Details(note="target-moving")
                )
            return (
                Status.FAILED,
                "target-moving: the target moved during the run; envelopes stay queued",
            )
        blocked = integrator.result.land_blocked
        why = f"({blocked.code}): {blocked.reason}" if blocked else "(no reason was given)"
        return Status.FAILED, f"landing refused {why}"

    # -- after the run -------------------------------------------------------------------------

    def release_claims(self) -> None:
        """The run's session lets go of its workers' worktrees: a retained one (a conflict, say)
        must not block the next run, which may reuse it."""
        from dagrunner.worktrees import allocate as wt

        for node in self.allocated:
            with contextlib.suppress(DagrunnerError):
                wt.release(f"{self.mission}/{node}", session=f"run-{self.run_id}", repo=self.repo)

    def finish(self, results: list[GateResult], *, interrupted: bool) -> RunIntegration | None:
        """Final states for envelopes whose land did not happen; release locks; the summary."""
        summary: list[tuple[str | None, IntegrationResult]] = []
        for node, state in self.integrations.items():
            integrator = state.integrator
            if not state.landed and state.applied and not integrator.result.land_blocked:
                failing = [
                    r.id
                    for r in results
                    if (r.id == node or node in integrations_above(self.graph, r.id))
                    and r.status in (Status.FAILED, Status.TIMED_OUT)  # (itself: its own seed)
                ]
                for envelope, _ in state.applied:
                    if interrupted or state.moved or not failing:
                        integrator.queue.record(
                            envelope.id,
                            EnvelopeState.QUEUED,
                            Details(note="the run ended before landing"),
                        )
                    else:
                        integrator.finish(
                            envelope.id,
                            EnvelopeState.GATES_FAILED,
                            Details(failed_gates=tuple(failing), report=self.run_id),
                        )
            if not integrator.result.end:
                integrator.ended()
            summary.append((node, integrator.result))
        self.locks.close()
        self.release_claims()
        return RunIntegration(tuple(summary)) if summary else None
