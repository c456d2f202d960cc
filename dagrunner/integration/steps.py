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

import dataclasses
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import trio

from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.executors.factory import executor_for
from dagrunner.files import crash_point
from dagrunner.git.command import IDENTITY, git
from dagrunner.git.link import pin_gitfile
from dagrunner.git.repo import out_of_disk
from dagrunner.integration import admission, landing, recovery
from dagrunner.integration import landing as checkouts
from dagrunner.integration.admission import flagged, judging_files, refusal
from dagrunner.integration.landing import commit_message
from dagrunner.integration.needs import Batch
from dagrunner.integration.pipeline import Pipeline
from dagrunner.integration.queue import Queue, QueueEntry
from dagrunner.integration.submit import journal_submission, unsubmitted
from dagrunner.manifest.load import load_manifest
from dagrunner.records.integration import (
    Details,
    EnvelopeOutcome,
    EnvelopeState,
    IntegrationResult,
    LandOutcome,
)
from dagrunner.worktrees.allocate import Context, default_target
from dagrunner.worktrees.landed import clean_after_landing
from dagrunner.worktrees.ledger import Ledger
from dagrunner.worktrees.prepare import release_seeds

HUNK_LIMIT = 16 * 1024


class Integrator:
    def __init__(
        self,
        ctx: Context,
        *,
        target: str,
        manifest: Path | None,
        batch: Batch,
        env: Mapping[str, str],
        run_id: str,
        trust_envelope_manifest: bool = False,
        executor: str = "local",
        window: int | None = None,
        confirm_failures: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.repo = ctx.info.root
        self.target = target
        self.ref = f"refs/heads/{target}"
        self.batch = batch  # None: the manifest's [integrate] batch, else auto
        self.env = env
        self.queue = Queue.of(ctx.info, target=target)
        self.ledger = Ledger(ctx.info.state_dir)
        slug = target.replace("/", "--")
        self.wt = ctx.root / ".integration" / slug
        # ".reports": no target's folder can be named so (a ref component never starts with
        # a dot), where "reports" was the integration worktree of a branch named reports
        self.reports = ctx.root / ".integration" / ".reports" / run_id
        self.manifest_arg = manifest
        self.trust_envelope_manifest = trust_envelope_manifest
        self.executor = executor
        self.window = window  # None: the manifest's [integrate] window, else adaptive
        self.confirm_failures = confirm_failures  # None: the manifest's (default 1)
        reports = str(self.reports)
        self.result = IntegrationResult(target=target, start="", end="", report_dir=reports)
        self.outcomes: dict[str, EnvelopeOutcome] = {}
        self.meta: dict[str, QueueEntry] = {}  # the queue's entries, read when one is unknown
        self.protected: tuple[str, ...] = ()  # the target manifest's [integrate] protected
        self.message = ""  # and its [integrate] message ('': the default)
        self.judging: dict[str, tuple[str, ...]] = {}  # envelope -> files that judge work
        self.drain: Pipeline | None = None  # the run's, once it drains: its tally says why it stops
        self.deadline, self.stop = recovery.Deadline(self), False
        self.cleaned: set[str] = set()  # envelopes whose worker worktree was seen to
        self.admins: dict[Path, Path | None] = {}  # integration worktree -> its admin folder
        # Held by whatever moves refs or worktree registrations (landing, a new integration
        # worktree, a landed worker's cleanup) while the pipeline runs them in threads.
        self.git_lock = threading.Lock()
        # What an envelope's gates may read but never write: the common git dir (refs,
        # objects, the queue, the ledger) and every worktree under the root -- all but the
        # integration worktree under test (``contain.jail``).  The user's checkout they do
        # not see at all (``Trees.gate``: concealed), where the machine can hide it.
        self.guarded: tuple[Path, ...] = (ctx.info.common_dir, ctx.root)

    @property
    def stop(self) -> bool:
        return self._stop

    @stop.setter
    def stop(self, value: bool) -> None:  # on a signal: ends even with a thread stuck for good
        self._stop = value
        if value and self.drain is not None and self.drain.tally.interrupted:
            self.deadline.arm()

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

    def prepare_worktree(self, head: str, path: Path | None = None) -> None:
        """The integration worktree at ``path`` (default: the first one) exists, at ``head``."""
        path = path or self.wt
        with self.git_lock:
            self.add_worktree(path, head)
        self.reset(head, path)

    def add_worktree(self, path: Path, head: str) -> None:
        if not (path / ".git").exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # A registration whose folder was deleted by hand is locked: unlock, then prune it.
            git(["worktree", "unlock", str(path)], cwd=self.repo, check=False)
            git(["worktree", "prune"], cwd=self.repo, check=False)
            git(
                [
                    "worktree",
                    "add",
                    "--detach",
                    "--lock",
                    "--reason",
                    "dagrunner: integration",
                    str(path),
                    head,
                ],
                cwd=self.repo,
            )

    def reset(self, commit: str, path: Path | None = None) -> None:
        """Exactly ``commit`` and nothing else (no stage entries, no stray file) -- in the
        repository git registered for that worktree, whatever a gate wrote in its ``.git``."""
        path = path or self.wt
        self.admins[path] = pin_gitfile(self.ctx.info.common_dir, path, self.admins.get(path))
        release_seeds(self.ctx.root, path)  # a tree's seeds are its own: placed anew to gate it
        git(["reset", "-q", "--hard", commit], cwd=path)
        git(["clean", "-q", "-ffdx"], cwd=path)

    def started(self, head: str) -> None:
        """This run integrates onto ``head`` (a swarm run's integrate node starts it so)."""
        self.result.start = head

    def ended(self) -> None:
        """This run is over (for now): the target's head is where it ended."""
        self.result.end = self.head()

    def slots(self) -> list[Path]:
        """Every integration worktree of this target: the main one and the pipeline's."""
        speculative = self.wt.parent / ".speculative" / self.wt.name
        extra = (
            sorted(p for p in speculative.iterdir() if p.is_dir()) if speculative.is_dir() else []
        )
        return [self.wt, *extra]

    def manifest_rel(self) -> Path:
        return admission.manifest_rel(self.manifest_arg)

    def trusted_manifest(self, head: str, tree: Path | None = None) -> Path:
        """See ``admission.trusted_manifest``: never the tree under test (at ``tree``, default
        the first integration worktree) unless the caller opted in."""
        return admission.trusted_manifest(
            repo=self.repo,
            head=head,
            target=self.target,
            given=self.manifest_arg,
            tree_under_test=(tree or self.wt) if self.trust_envelope_manifest else None,
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
        manifest = load_manifest(self.trusted_manifest(start))
        self.protected = manifest.integrate.protected
        self.message = manifest.integrate.message
        window = self.window or manifest.integrate.window
        confirm = self.confirm_failures
        if confirm is None:
            confirm = manifest.integrate.confirm_failures
        with executor_for(self.executor) as executor:
            drain = Pipeline(self, executor, manifest, window=window, confirm=confirm)
            self.drain = drain
            try:
                trio.run(drain.run)
            finally:
                self.deadline.disarm()
                self.result.count(drain.tally)
        self.result.end = self.head()
        self.cleanup_landed_workers()
        # a lazy import: the report's page (jinja2) is not loaded before the run needs it
        from dagrunner.report.rundir import write_integration

        write_integration(self.result, self.reports)
        return self.result

    def outcome(self, envelope_id: str, state: EnvelopeState, details: Details) -> None:
        """Say where an envelope ended in this run (with who made it: the journal is read once)."""
        entry = self.entry(envelope_id)
        self.outcomes[envelope_id] = EnvelopeOutcome(
            envelope_id,
            entry.mission if entry else None,
            entry.worker if entry else None,
            state,
            details,
            provenance=entry.provenance if entry else None,
        )
        self.result.envelopes = list(self.outcomes.values())

    def entry(self, envelope_id: str) -> QueueEntry | None:
        """The queue's entry of ``envelope_id`` (the journal is read once, and again for an
        envelope submitted since)."""
        if envelope_id not in self.meta:
            self.meta = self.queue.entries()
        return self.meta.get(envelope_id)

    def finish(self, envelope_id: str, state: EnvelopeState, details: Details) -> None:
        """Journal an envelope's final state and report it."""
        details = flagged(details, self.judging.get(envelope_id, ()), self.manifest_rel())
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
        entry = self.entry(envelope_id)
        if entry is not None and unsubmitted(entry):  # its submission line missing (submit.py)
            journal_submission(self.queue, envelope_id, envelope)
            self.meta = self.queue.entries()  # its outcome names its mission and worker
            entry = self.entry(envelope_id)
        why = refusal(
            envelope,
            info=self.ctx.info,
            protected=self.protected,
            allow_protected=bool(entry and entry.allow_protected),
        )
        if why:
            self.reject(envelope_id, why)
            return None
        return envelope

    def apply(
        self,
        envelope: Envelope,
        wt: Path | None = None,
        *,
        final: bool = True,
    ) -> str | None:
        """Apply and commit one envelope in ``wt`` (default: the first integration worktree);
        the new commit, or None.  ``final``: a conflict or corrupt patch is its outcome
        (recorded); otherwise (a speculative head) it is queued again, to be judged later."""
        wt = wt or self.wt
        record = self.queue.record
        record(envelope.id, EnvelopeState.APPLYING)
        crash_point("applying")
        before = git(["rev-parse", "HEAD"], cwd=wt).text
        with tempfile.NamedTemporaryFile(
            prefix="dagrunner-", suffix=".patch", delete=False
        ) as handle:
            handle.write(envelope.diff)  # raw bytes: no line-ending conversion ever touches them
            patch = Path(handle.name)
        try:
            result = git(
                ["apply", "--3way", "--index", "--whitespace=nowarn", str(patch)],
                cwd=wt,
                check=False,
            )
        finally:
            patch.unlink(missing_ok=True)
        if result.returncode == 0:
            self.judging[envelope.id] = judging_files(envelope.touched, self.manifest_rel())
            message = commit_message(envelope, self.message)
            git(
                # no automatic gc/maintenance here: it would repack refs under a landing
                [
                    "-c",
                    "gc.auto=0",
                    "-c",
                    "maintenance.auto=false",
                    "commit",
                    "-q",
                    "--no-verify",
                    "--no-gpg-sign",
                    "--allow-empty",
                    "-m",
                    message,
                ],
                cwd=wt,
                env=IDENTITY,
            )
            commit = git(["rev-parse", "HEAD"], cwd=wt).text
            record(envelope.id, EnvelopeState.APPLIED, Details(commit=commit))
            return commit
        stderr = result.stderr.decode("utf-8", "replace").strip()
        if out_of_disk(stderr, (wt, self.ctx.info.common_dir)):
            # The integrator's disk, not the envelope: nothing is judged; a rerun resumes
            raise DagrunnerError(
                "disk-full",
                f"applying {envelope.id}: {stderr.splitlines()[-1][:300]}",
                where=str(wt),
                exit_code=ExitCode.ENVIRONMENT,
                hint="free disk space there, then run again; the envelope stays queued",
            )
        unmerged = sorted(
            {
                line.split("\t", 1)[1]
                for line in git(["ls-files", "-u"], cwd=wt).text.splitlines()
                if "\t" in line
            }
        )
        hunks = git(
            ["diff", "--no-ext-diff", "--no-textconv", "--no-color"], cwd=wt, check=False
        ).stdout[:HUNK_LIMIT]
        self.reset(before, wt)  # leave nothing of this envelope behind for the next one
        if not final:
            record(
                envelope.id,
                EnvelopeState.QUEUED,
                Details(note="does not apply on the speculative head; retried at the front"),
            )
            return None
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

    def target_checkout(self) -> Path | None:
        return checkouts.checkout_of(self.repo, self.ref)

    def land(
        self,
        old: str,
        applied: list[tuple[Envelope, str]],
        new: str | None = None,
        *,
        flaky: tuple[str, ...] = (),
    ) -> LandOutcome:
        """Move the target from ``old`` to ``new`` (default: the integration worktree's head):
        landed, moved, or blocked; what it did is recorded in this run's result."""
        done = landing.land(self, old, applied, new, flaky=flaky)
        self.result.land_blocked = done.blocked or self.result.land_blocked
        self.result.checkout_stale = done.stale or self.result.checkout_stale
        self.stop = self.stop or done.stops
        return done.outcome

    def landed(
        self,
        applied: list[tuple[Envelope, str]],
        old: str,
        new: str,
        flaky: tuple[str, ...] = (),
    ) -> None:
        chain = git(["rev-list", "--reverse", f"{old}..{new}"], cwd=self.repo).text.split()
        for (envelope, _), commit in zip(applied, chain, strict=False):
            self.finish(
                envelope.id, EnvelopeState.LANDED, Details(commit=commit, flaky_gates=flaky or None)
            )

    # -- after the run ----------------------------------------------------------------------

    def cleanup_landed_workers(self) -> None:
        """Every outcome's worker worktree not seen to yet (the end of a run)."""
        self.note_workers(self.clean_workers(list(self.outcomes)))

    def clean_workers(self, ids: list[str]) -> dict[str, str]:
        """See ``landedwork.clean_after_landing``: only a provably producing worktree goes.
        What became of each (the pipeline runs this in a thread after each landing)."""
        chosen = [i for i in ids if i not in self.cleaned]
        self.cleaned.update(chosen)
        return clean_after_landing(
            self.ctx,
            [self.outcomes[i] for i in chosen],
            self.queue.load,
            default_target(self.ctx),
            self.env,
        )

    def note_workers(self, kept: dict[str, str]) -> None:
        for envelope_id, worktree in kept.items():
            outcome = self.outcomes[envelope_id]
            self.outcomes[envelope_id] = dataclasses.replace(outcome, worktree=worktree)
        self.result.envelopes = list(self.outcomes.values())
