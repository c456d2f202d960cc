"""The integrator's steps: apply envelopes with ``git apply --3way``, gate, land atomically.

One integrator per repository and target at a time (a lock in the common git
dir), in its own detached worktree reset to the target's head before every attempt.  For each batch: every envelope is applied
and committed (message trailers name the envelope, mission and worker); one
that conflicts is rolled back, marked ``conflict`` with its files and hunks,
and the rest go on.  Then the manifest's gates run in the integration worktree
through the same scheduler, governor and sandbox as ``release-check``.  A pass
lands with a compare-and-swap ref update from the head it started on; if the
target moved, the batch is rebuilt on the new head (a bounded number of
times, then ``target-moving``).  A failing batch is bisected until the
culprits are found and the rest land.  Every state change is journaled before
it takes effect (``queue.py``), so SIGKILL at any point followed by a rerun
ends with every envelope in one final state and no commit twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path

import orjson

from dagrunner import checkout as checkouts
from dagrunner import judges, landing, recovery
from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import locked
from dagrunner.git import IDENTITY, git
from dagrunner.ledger import Ledger
from dagrunner.lifecycle import clean_after_landing
from dagrunner.manifest import load_manifest
from dagrunner.outcomes import (
    Details,
    EnvelopeOutcome,
    EnvelopeState,
    IntegrationResult,
    LandOutcome,
)
from dagrunner.plan import RunOptions
from dagrunner.queue import Queue, same_repository
from dagrunner.records import RunStatus, Status
from dagrunner.runner import release_check
from dagrunner.trailers import commit_message
from dagrunner.worktrees import Context, default_target

MAX_REBUILDS = 3
HUNK_LIMIT = 16 * 1024


def integrator_lock(path: Path, *, wait: bool) -> contextlib.AbstractContextManager[None]:
    """Hold the per-target integrator lock; say who holds it when it is taken."""
    return locked(
        path,
        wait=wait,
        busy=lambda who: DagrunnerError(
            "integrator-busy",
            f"another integrator holds {path.name}: {who}",
            exit_code=ExitCode.REFUSED,
            hint="wait for it, or run without --no-wait to queue behind it",
        ),
        waiting="waiting for the integrator that holds the lock ({})",
    )


class Integrator:
    def __init__(
        self,
        ctx: Context,
        *,
        target: str,
        manifest: Path | None,
        batch: int,
        env: Mapping[str, str],
        run_id: str,
        trust_envelope_manifest: bool = False,
        executor: str = "local",
    ) -> None:
        self.ctx = ctx
        self.repo = ctx.info.root
        self.target = target
        self.ref = f"refs/heads/{target}"
        self.batch = max(1, batch)
        self.env = env
        self.queue = Queue.of(ctx.info)
        self.ledger = Ledger(ctx.info.state_dir)
        slug = target.replace("/", "--")
        self.wt = ctx.root / ".integration" / slug
        self.reports = ctx.root / ".integration" / "reports" / run_id
        self.manifest_arg = manifest
        self.trust_envelope_manifest = trust_envelope_manifest
        self.executor = executor
        self.manifest_file: Path | None = None
        self.manifest_changers: set[str] = set()
        self.result = IntegrationResult(
            target=target, start="", end="", report_dir=str(self.reports)
        )
        self.outcomes: dict[str, EnvelopeOutcome] = {}
        self.meta: dict[str, tuple[str | None, str | None]] = {}
        self.stop = False

    # -- set-up --------------------------------------------------------------------------

    def head(self) -> str:
        probe = git(["rev-parse", "--verify", "-q", self.ref], cwd=self.repo, check=False)
        if probe.returncode != 0:
            raise DagrunnerError(
                "unknown-target",
                f"no branch {self.target!r} in this repository",
                key="--target",
                hint="pass an existing branch with --target",
            )
        return probe.text

    def prepare_worktree(self, head: str) -> None:
        if not (self.wt / ".git").exists():
            self.wt.parent.mkdir(parents=True, exist_ok=True)
            # A registration whose folder was deleted by hand is locked: unlock, then prune it.
            git(["worktree", "unlock", str(self.wt)], cwd=self.repo, check=False)
            git(["worktree", "prune"], cwd=self.repo, check=False)
            git(
                [
                    "worktree",
                    "add",
                    "--detach",
                    "--lock",
                    "--reason",
                    "dagrunner: integration",
                    str(self.wt),
                    head,
                ],
                cwd=self.repo,
            )
        self.reset(head)

    def reset(self, commit: str) -> None:
        """Exactly ``commit`` and nothing else (no stage entries, no stray file)."""
        git(["reset", "-q", "--hard", commit], cwd=self.wt)
        git(["clean", "-q", "-ffdx"], cwd=self.wt)

    def manifest_rel(self) -> Path:
        return judges.manifest_rel(self.manifest_arg)

    def trusted_manifest(self, head: str) -> Path:
        """See ``judges.trusted_manifest``: never the tree under test."""
        return judges.trusted_manifest(
            repo=self.repo,
            head=head,
            target=self.target,
            given=self.manifest_arg,
            tree_under_test=self.wt if self.trust_envelope_manifest else None,
            folder=self.reports / "manifest",
        )

    def recover(self) -> None:
        """After a crash: see ``recovery.recover``."""
        recovery.recover(self)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> IntegrationResult:
        self.recover()
        recovery.preflight(self)
        start = self.head()
        self.result.start = start
        self.prepare_worktree(start)
        # a bad or missing manifest fails before anything is applied
        load_manifest(self.trusted_manifest(start))
        pending = self.queue.pending()
        while pending and not self.stop:
            batch, pending = pending[: self.batch], pending[self.batch :]
            envelopes = [e for e in (self.admit(i) for i in batch) if e is not None]
            if envelopes:
                self.process(envelopes, rebuilds=0)
        self.result.end = self.head()
        self.cleanup_landed_workers()
        self.write_report()
        return self.result

    def outcome(self, envelope_id: str, state: EnvelopeState, details: Details) -> None:
        """Say where an envelope ended in this run (with who made it: the journal is read once)."""
        if envelope_id not in self.meta:
            self.meta = {i: (e.mission, e.worker) for i, e in self.queue.entries().items()}
        mission, worker = self.meta.get(envelope_id, (None, None))
        self.outcomes[envelope_id] = EnvelopeOutcome(envelope_id, mission, worker, state, details)
        self.result.envelopes = list(self.outcomes.values())

    def finish(self, envelope_id: str, state: EnvelopeState, details: Details) -> None:
        """Journal an envelope's final state and report it."""
        if envelope_id in self.manifest_changers:
            details = dataclasses.replace(
                details,
                manifest_changed=True,
                note=details.note
                or f"it changes {self.manifest_rel()}; it was gated by the target's own",
            )
        self.queue.record(envelope_id, state, details)
        self.outcome(envelope_id, state, details)

    def reject(self, envelope_id: str, reason: str) -> None:
        self.finish(envelope_id, EnvelopeState.REJECTED, Details(reason=reason))

    def admit(self, envelope_id: str) -> Envelope | None:
        """The envelope, re-validated; otherwise it is rejected with the reason."""
        try:
            envelope = self.queue.load(envelope_id)
        except DagrunnerError as exc:
            self.reject(envelope_id, f"{exc.code}: {exc.message}")
            return None
        if not same_repository(envelope, self.ctx.info):
            self.reject(envelope_id, "envelope-foreign-repo")
            return None
        if git(
            ["cat-file", "-e", f"{envelope.base}^{{commit}}"], cwd=self.repo, check=False
        ).returncode:
            self.reject(envelope_id, "envelope-unknown-base: its base commit is not here")
            return None
        if envelope.empty or not envelope.diff:
            self.reject(envelope_id, "empty: the envelope holds no change")
            return None
        return envelope

    def process(self, envelopes: list[Envelope], *, rebuilds: int) -> None:
        """Apply ``envelopes`` on the target's head, gate once, land -- or bisect the failure."""
        if self.stop:
            return
        head = self.head()
        self.reset(head)
        self.manifest_file = self.trusted_manifest(head)
        applied: list[tuple[Envelope, str]] = []
        for envelope in envelopes:
            commit = self.apply(envelope)
            if commit:
                applied.append((envelope, commit))
        if not applied:
            return
        for envelope, _ in applied:
            self.queue.record(
                envelope.id, EnvelopeState.GATING, Details(gate_run=self.result.gate_runs + 1)
            )
        recovery.crash_point("gating")
        passed, failing, report = self.gate()
        if passed:
            outcome = self.land(head, applied)
            if outcome is LandOutcome.MOVED:
                if rebuilds >= MAX_REBUILDS:
                    self.result.target_moving = True
                    self.stop = True
                    for envelope, _ in applied:
                        self.queue.record(
                            envelope.id, EnvelopeState.QUEUED, Details(note="target-moving")
                        )
                    return
                self.result.rebuilds += 1
                self.process([e for e, _ in applied], rebuilds=rebuilds + 1)
            return
        if len(applied) == 1:
            envelope = applied[0][0]
            self.finish(
                envelope.id,
                EnvelopeState.GATES_FAILED,
                Details(failed_gates=tuple(failing), report=report),
            )
            return
        half = len(applied) // 2
        self.process([e for e, _ in applied[:half]], rebuilds=rebuilds)
        self.process([e for e, _ in applied[half:]], rebuilds=rebuilds)

    def apply(self, envelope: Envelope) -> str | None:
        """Apply and commit one envelope; the new commit, or None (conflict or rejection recorded)."""
        self.queue.record(envelope.id, EnvelopeState.APPLYING)
        recovery.crash_point("applying")
        before = git(["rev-parse", "HEAD"], cwd=self.wt).text
        with tempfile.NamedTemporaryFile(
            prefix="dagrunner-", suffix=".patch", delete=False
        ) as handle:
            handle.write(envelope.diff)  # raw bytes: no line-ending conversion ever touches them
            patch = Path(handle.name)
        try:
            result = git(
                ["apply", "--3way", "--index", "--whitespace=nowarn", str(patch)],
                cwd=self.wt,
                check=False,
            )
        finally:
            patch.unlink(missing_ok=True)
        if result.returncode == 0:
            if self.manifest_rel().as_posix() in envelope.touched:
                self.manifest_changers.add(envelope.id)
            message = commit_message(envelope)
            git(
                ["commit", "-q", "--no-verify", "--no-gpg-sign", "--allow-empty", "-m", message],
                cwd=self.wt,
                env=IDENTITY,
            )
            commit = git(["rev-parse", "HEAD"], cwd=self.wt).text
            self.queue.record(envelope.id, EnvelopeState.APPLIED, Details(commit=commit))
            return commit
        stderr = result.stderr.decode("utf-8", "replace").strip()
        unmerged = sorted(
            {
                line.split("\t", 1)[1]
                for line in git(["ls-files", "-u"], cwd=self.wt).text.splitlines()
                if "\t" in line
            }
        )
        hunks = git(["diff", "--no-ext-diff", "--no-color"], cwd=self.wt, check=False).stdout[
            :HUNK_LIMIT
        ]
        self.reset(before)  # leave nothing of this envelope behind for the next one
        if result.returncode == 128 and not unmerged:
            self.reject(envelope.id, f"corrupt patch: {stderr.splitlines()[0] if stderr else ''}")
            return None
        touched = sorted(set(envelope.paths))
        self.finish(
            envelope.id,
            EnvelopeState.CONFLICT,
            Details(
                conflicts=tuple(unmerged or touched),
                hunks=hunks.decode("utf-8", "replace"),
                reason=(stderr.splitlines() or ["does not apply"])[-1][:500],
            ),
        )
        return None

    def gate(self) -> tuple[bool, list[str], str]:
        self.result.gate_runs += 1
        run_dir = self.reports / f"gates-{self.result.gate_runs:02d}"
        manifest = self.manifest_file or self.trusted_manifest(self.head())
        record, _ = release_check(
            RunOptions(
                repo=self.wt,
                manifest=manifest,
                report_dir=run_dir,
                environ=self.env,
                executor=self.executor,
            )
        )
        failing = [g.id for g in record.gates if not g.status.ok]
        if record.gates and all(g.status is Status.CACHED for g in record.gates):
            self.result.cached_runs += 1
        return record.status is RunStatus.PASSED, failing, str(run_dir)

    def target_checkout(self) -> Path | None:
        return checkouts.checkout_of(self.repo, self.ref)

    def land(self, old: str, applied: list[tuple[Envelope, str]]) -> LandOutcome:
        """Move the target from ``old`` to the integration head: landed, moved, or blocked."""
        return landing.land(self, old, applied)

    def landed(self, applied: list[tuple[Envelope, str]], old: str, new: str) -> None:
        chain = git(["rev-list", "--reverse", f"{old}..{new}"], cwd=self.repo).text.split()
        for (envelope, _), commit in zip(applied, chain, strict=False):
            self.finish(envelope.id, EnvelopeState.LANDED, Details(commit=commit))

    # -- after the run ----------------------------------------------------------------------

    def cleanup_landed_workers(self) -> None:
        """See ``lifecycle.clean_after_landing``: only a provably producing worktree goes."""
        kept = clean_after_landing(
            self.ctx, self.outcomes.values(), self.queue.load, default_target(self.ctx), self.env
        )
        for envelope_id, worktree in kept.items():
            self.outcomes[envelope_id] = dataclasses.replace(
                self.outcomes[envelope_id], worktree=worktree
            )
        self.result.envelopes = list(self.outcomes.values())

    def write_report(self) -> None:
        from dagrunner.report import read_run_dir, write_run_dir

        self.reports.mkdir(parents=True, exist_ok=True)
        summary = self.result.to_json()
        (self.reports / "integration.json").write_bytes(
            orjson.dumps(summary, option=orjson.OPT_INDENT_2)
        )
        runs = sorted(self.reports.glob("gates-*"))
        if runs:
            record = read_run_dir(runs[-1])
            record.integration = summary
            write_run_dir(record, runs[-1])
