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
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from dagrunner import checkout as checkouts
from dagrunner import judges, recovery
from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import locked
from dagrunner.git import IDENTITY, git, is_dirty
from dagrunner.ledger import Ledger
from dagrunner.lifecycle import clean_after_landing
from dagrunner.manifest import load_manifest
from dagrunner.outcomes import IntegrationResult, LandOutcome
from dagrunner.plan import RunOptions
from dagrunner.queue import Queue, same_repository
from dagrunner.records import RunStatus
from dagrunner.runner import release_check
from dagrunner.trailers import commit_message
from dagrunner.worktrees import Context, default_target

MAX_REBUILDS = 3
HUNK_LIMIT = 16 * 1024


def crash_point(name: str) -> None:
    """Fault injection for the durability tests: SIGKILL ourselves at a named point."""
    if os.environ.get("DAGRUNNER_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


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
        self.manifest_file: Path | None = None
        self.manifest_changers: set[str] = set()
        self.result = IntegrationResult(
            target=target, start="", end="", report_dir=str(self.reports)
        )
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, dict[str, Any]] = {}
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
        self.result.envelopes = list(self.outcomes.values())
        self.cleanup_landed_workers()
        self.write_report()
        return self.result

    def who(self, envelope_id: str) -> dict[str, Any]:
        """Mission and worker of a queued envelope (the journal is read once per run)."""
        if envelope_id not in self.meta:
            self.meta = {
                i: {"mission": e.get("mission"), "worker": e.get("worker")}
                for i, e in self.queue.entries().items()
            }
        return self.meta.get(envelope_id, {"mission": None, "worker": None})

    def finish(self, envelope_id: str, state: str, **details: Any) -> None:
        if envelope_id in self.manifest_changers:
            details["manifest_changed"] = True
            details.setdefault(
                "note", f"it changes {self.manifest_rel()}; it was gated by the target's own"
            )
        entry = self.queue.record(envelope_id, state, **details)
        self.outcomes[envelope_id] = {
            "id": envelope_id,
            **self.who(envelope_id),
            **{k: v for k, v in entry.items() if k not in ("at", "id")},
        }

    def admit(self, envelope_id: str) -> Envelope | None:
        """The envelope, re-validated; otherwise it is rejected with the reason."""
        try:
            envelope = self.queue.load(envelope_id)
        except DagrunnerError as exc:
            self.finish(envelope_id, "rejected", reason=f"{exc.code}: {exc.message}")
            return None
        if not same_repository(envelope.fields["repo"], self.ctx.info):
            self.finish(envelope_id, "rejected", reason="envelope-foreign-repo")
            return None
        if git(
            ["cat-file", "-e", f"{envelope.fields['base']}^{{commit}}"], cwd=self.repo, check=False
        ).returncode:
            self.finish(
                envelope_id, "rejected", reason="envelope-unknown-base: its base commit is not here"
            )
            return None
        if envelope.fields["empty"] or not envelope.diff:
            self.finish(envelope_id, "rejected", reason="empty: the envelope holds no change")
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
            self.queue.record(envelope.id, "gating", gate_run=self.result.gate_runs + 1)
        crash_point("gating")
        passed, failing, report = self.gate()
        if passed:
            outcome = self.land(head, applied)
            if outcome is LandOutcome.MOVED:
                if rebuilds >= MAX_REBUILDS:
                    self.result.target_moving = True
                    self.stop = True
                    for envelope, _ in applied:
                        self.queue.record(envelope.id, "queued", note="target-moving")
                    return
                self.result.rebuilds += 1
                self.process([e for e, _ in applied], rebuilds=rebuilds + 1)
            return
        if len(applied) == 1:
            envelope = applied[0][0]
            self.finish(envelope.id, "gates-failed", failed_gates=failing, report=report)
            return
        half = len(applied) // 2
        self.process([e for e, _ in applied[:half]], rebuilds=rebuilds)
        self.process([e for e, _ in applied[half:]], rebuilds=rebuilds)

    def apply(self, envelope: Envelope) -> str | None:
        """Apply and commit one envelope; the new commit, or None (conflict or rejection recorded)."""
        self.queue.record(envelope.id, "applying")
        crash_point("applying")
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
            fields = envelope.fields
            paths = {c.get("path") for c in fields["changed_files"]}
            paths |= {c.get("old_path") for c in fields["changed_files"]}
            if self.manifest_rel().as_posix() in paths:
                self.manifest_changers.add(envelope.id)
            message = commit_message(fields)
            git(
                ["commit", "-q", "--no-verify", "--no-gpg-sign", "--allow-empty", "-m", message],
                cwd=self.wt,
                env=IDENTITY,
            )
            commit = git(["rev-parse", "HEAD"], cwd=self.wt).text
            self.queue.record(envelope.id, "applied", commit=commit)
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
            self.finish(
                envelope.id,
                "rejected",
                reason=f"corrupt patch: {stderr.splitlines()[0] if stderr else ''}",
            )
            return None
        touched = sorted({c["path"] for c in envelope.fields["changed_files"]})
        self.finish(
            envelope.id,
            "conflict",
            conflicts=unmerged or touched,
            hunks=hunks.decode("utf-8", "replace"),
            reason=(stderr.splitlines() or ["does not apply"])[-1][:500],
        )
        return None

    def gate(self) -> tuple[bool, list[str], str]:
        self.result.gate_runs += 1
        run_dir = self.reports / f"gates-{self.result.gate_runs:02d}"
        manifest = self.manifest_file or self.trusted_manifest(self.head())
        record, _ = release_check(
            RunOptions(repo=self.wt, manifest=manifest, report_dir=run_dir, environ=self.env)
        )
        failing = [g.id for g in record.gates if not g.status.ok]
        return record.status is RunStatus.PASSED, failing, str(run_dir)

    def target_checkout(self) -> Path | None:
        return checkouts.checkout_of(self.repo, self.ref)

    def land(self, old: str, applied: list[tuple[Envelope, str]]) -> LandOutcome:
        """Move the target from ``old`` to the integration head: landed, moved, or blocked."""
        new = git(["rev-parse", "HEAD"], cwd=self.wt).text
        checkout = self.target_checkout()
        if checkout is not None and is_dirty(checkout):
            self.block(
                applied,
                checkout,
                "target-checkout-dirty",
                "the target branch is checked out there with uncommitted changes",
            )
            return LandOutcome.BLOCKED
        for envelope, _ in applied:
            self.queue.record(envelope.id, "landing", old=old, new=new)
        crash_point("landing")
        moved = git(
            ["update-ref", "-m", f"dagrunner: land {len(applied)} envelope(s)", self.ref, new, old],
            cwd=self.repo,
            check=False,
        )
        if moved.returncode != 0:
            if self.head() != old:
                return LandOutcome.MOVED
            # Not moved by anyone: the ref itself cannot be written (a lock, a full disk).
            self.block(applied, Path(self.repo), "target-ref-unwritable", moved.message)
            return LandOutcome.BLOCKED
        crash_point("landed-ref")
        if checkout is not None:
            synced = git(["read-tree", "-m", "-u", old, new], cwd=checkout, check=False)
            if synced.returncode != 0:
                return self.failed_sync(applied, checkout, old, new, synced.message)
        self.landed(applied, old, new)
        return LandOutcome.LANDED

    def landed(self, applied: list[tuple[Envelope, str]], old: str, new: str) -> None:
        chain = git(["rev-list", "--reverse", f"{old}..{new}"], cwd=self.repo).text.split()
        for (envelope, _), commit in zip(applied, chain, strict=False):
            self.finish(envelope.id, "landed", commit=commit)

    def failed_sync(
        self, applied: list[tuple[Envelope, str]], where: Path, old: str, new: str, why: str
    ) -> LandOutcome:
        """The ref moved but its checkout could not follow: move the ref back and restore the
        checkout, or -- when the ref cannot move back -- say that the envelopes landed."""
        back = git(["update-ref", self.ref, old, new], cwd=self.repo, check=False)
        to = old if back.returncode == 0 else new
        stale = checkouts.StaleCheckout(
            checkout=str(where), target=self.target, old=old, new=new, to=to, reason=why
        )
        restored = checkouts.repair(where, old, new, to)
        if not restored:
            checkouts.remember(self.ctx.info.state_dir, stale)
            self.result.checkout_stale = stale.to_json()
        self.stop = True
        try:
            if to == old:
                note = "the target was moved back" + (
                    "; its checkout was restored" if restored else f"; restore it: {stale.command}"
                )
                self.block(applied, where, "target-checkout-blocked", f"{why} ({note})")
                return LandOutcome.BLOCKED
            self.landed(applied, old, new)  # the truth: the target holds them
            return LandOutcome.LANDED
        except OSError as exc:  # a full disk: the journal cannot say it, the result still does
            self.result.land_blocked = {
                "code": "disk-full",
                "checkout": str(where),
                "reason": f"{why}; then {exc.strerror}: the target is at {to[:12]}",
            }
            return LandOutcome.BLOCKED

    def block(
        self, applied: list[tuple[Envelope, str]], checkout: Path, code: str, why: str
    ) -> None:
        self.result.land_blocked = {"code": code, "checkout": str(checkout), "reason": why}
        self.stop = True
        for envelope, _ in applied:
            self.queue.record(envelope.id, "queued", note=f"{code}: {why}")
            self.outcomes[envelope.id] = {
                "id": envelope.id,
                **self.who(envelope.id),
                "state": "queued",
                "reason": f"landing refused ({code}): {why}",
            }

    # -- after the run ----------------------------------------------------------------------

    def cleanup_landed_workers(self) -> None:
        """See ``lifecycle.clean_after_landing``: only a provably producing worktree goes."""
        clean_after_landing(
            self.ctx, self.outcomes.values(), self.queue.load, default_target(self.ctx), self.env
        )

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
