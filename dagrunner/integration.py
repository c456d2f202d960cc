"""Drain the integration queue: apply envelopes with ``git apply --3way``, gate, land atomically.

One integrator per repository and target at a time (a lock in the common git
dir).  It keeps its own detached worktree under the cache root, reset to the
target's head before every attempt.  For each batch: every envelope is applied
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
import fcntl
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dagrunner import checkout as checkouts
from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import read_lines
from dagrunner.git import IDENTITY, GitResult, git
from dagrunner.gitlocks import check_locks
from dagrunner.ledger import Ledger, now
from dagrunner.manifest import DEFAULT_MANIFEST, load_manifest
from dagrunner.names import is_safe_id
from dagrunner.queue import FINAL, Queue, same_repository
from dagrunner.records import RunStatus
from dagrunner.runner import RunOptions, release_check
from dagrunner.snapshot import state_tree
from dagrunner.worktrees import Context, open_context

MAX_REBUILDS = 3
HUNK_LIMIT = 16 * 1024
TRAILER = "Dagrunner-Envelope"
SHA_TRAILER = "Dagrunner-Envelope-Sha256"


def crash_point(name: str) -> None:
    """Fault injection for the durability tests: SIGKILL ourselves at a named point."""
    if os.environ.get("DAGRUNNER_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class IntegrationResult:
    target: str
    start: str
    end: str
    envelopes: list[dict[str, Any]] = field(default_factory=list)
    gate_runs: int = 0
    rebuilds: int = 0
    land_blocked: dict[str, Any] | None = None
    target_moving: bool = False
    report_dir: str = ""
    checkout_stale: dict[str, str] | None = None  # landed, but the checkout could not follow

    @property
    def ok(self) -> bool:
        return self.land_blocked is None and not self.target_moving and not self.checkout_stale

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "start": self.start,
            "end": self.end,
            "envelopes": self.envelopes,
            "gate_runs": self.gate_runs,
            "rebuilds": self.rebuilds,
            "land_blocked": self.land_blocked,
            "target_moving": self.target_moving,
            "checkout_stale": self.checkout_stale,
            "report_dir": self.report_dir,
            "counts": {
                s: sum(1 for e in self.envelopes if e["state"] == s)
                for s in sorted({e["state"] for e in self.envelopes})
            },
        }


@contextlib.contextmanager
def integrator_lock(path: Path, *, wait: bool) -> Iterator[None]:
    """Hold the per-target integrator lock; say who holds it when it is taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.with_suffix(".holder")
            who = holder.read_text() if holder.exists() else "unknown"
            if not wait:
                raise DagrunnerError(
                    "integrator-busy",
                    f"another integrator holds {path.name}: {who}",
                    exit_code=ExitCode.REFUSED,
                    hint="wait for it, or run without --no-wait to queue behind it",
                ) from None
            print(f"waiting for the integrator that holds the lock ({who})", file=sys.stderr)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        path.with_suffix(".holder").write_text(f"pid {os.getpid()} since {now()}")
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


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
        """The manifest's path inside the repository (``--manifest`` relative, or the default)."""
        arg = self.manifest_arg
        return DEFAULT_MANIFEST if arg is None or arg.is_absolute() else arg

    def trusted_manifest(self, head: str) -> Path:
        """The gates that judge envelopes: the target's own manifest at ``head``, never the tree
        under test (an envelope could rewrite it to approve itself).  An absolute ``--manifest``
        is the caller's file; ``trust_envelope_manifest`` opts back into the tree under test.
        """
        arg = self.manifest_arg
        if arg is not None and arg.is_absolute():
            return arg
        if self.trust_envelope_manifest:
            return self.wt / self.manifest_rel()
        rel = self.manifest_rel().as_posix()
        blob = git(["show", f"{head}:{rel}"], cwd=self.repo, check=False)
        if blob.returncode != 0:
            raise DagrunnerError(
                "manifest-not-found",
                f"the target {self.target!r} has no {rel} at {head[:12]}",
                key="--manifest",
                hint="commit the manifest on the target branch, or pass --manifest /absolute/path",
            )
        dest = self.reports / "manifest" / head[:12] / Path(rel).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(blob.stdout)
        return dest

    def recover(self) -> None:
        """After a crash: envelopes whose commit is already on the target are landed; the rest requeue."""
        pending = {i: e for i, e in self.queue.entries().items() if e.get("state") not in FINAL}
        if not pending:
            return
        landed = self.landed_on_target()
        for envelope_id, entry in pending.items():
            commit = self.landed_commit(envelope_id, landed)
            if commit is not None:
                self.queue.record(envelope_id, "landed", commit=commit, recovered=True)
                if entry.get("state") == "landing":
                    self.finish_checkout_sync(entry["old"], entry["new"])
            elif entry.get("state") != "queued":
                self.queue.record(envelope_id, "queued", recovered_from=entry.get("state"))

    def finish_checkout_sync(self, old: str, new: str) -> None:
        """A crash between moving the ref and updating its checkout: finish the update."""
        checkout = self.target_checkout()
        if checkout is None or self.head() != new:
            return
        index_at_old = git(
            ["diff-index", "--cached", "--quiet", old, "--"], cwd=checkout, check=False
        )
        worktree_at_index = git(["diff-files", "--quiet"], cwd=checkout, check=False)
        if index_at_old.returncode == 0 and worktree_at_index.returncode == 0:
            git(["read-tree", "-m", "-u", old, new], cwd=checkout, check=False)

    def landed_on_target(self) -> dict[str, tuple[str, str]]:
        """Envelope id -> (commit, diff sha256) for commits on the target that carry both trailers.

        Parsed strictly: a commit counts only with exactly one id and one hash,
        as the integrator writes them; anything else is somebody else's text.
        """
        fmt = "%H%x1f" + "%x1f".join(
            f"%(trailers:key={key},valueonly,separator=%x1e)" for key in (TRAILER, SHA_TRAILER)
        )
        log = git(
            ["log", f"--format={fmt}%x1d", "-n", "5000", self.ref], cwd=self.repo
        ).stdout.decode("utf-8", "replace")
        found: dict[str, tuple[str, str]] = {}
        for entry in log.split("\x1d"):
            parts = entry.strip().split("\x1f")
            if len(parts) != 3:
                continue
            commit, ids, shas = parts
            ids_list, sha_list = ids.strip().split("\x1e"), shas.strip().split("\x1e")
            if len(ids_list) == 1 and len(sha_list) == 1 and is_safe_id(ids_list[0].strip()):
                found.setdefault(ids_list[0].strip(), (commit, sha_list[0].strip()))
        return found

    def landed_commit(self, envelope_id: str, landed: dict[str, tuple[str, str]]) -> str | None:
        """The target commit that landed exactly this envelope (same id and diff hash), if any."""
        if envelope_id not in landed:
            return None
        commit, sha = landed[envelope_id]
        try:
            envelope = self.queue.load(envelope_id)
        except DagrunnerError:
            return None
        return commit if envelope.fields["diff_sha256"] == sha else None

    # -- the run -------------------------------------------------------------------------

    def preflight(self) -> None:
        """Before any gate run: a checkout left half-updated is repaired (or named), and stale
        git locks are cleared where ours (or named): no gate run is spent on a ref that cannot
        move."""
        stale = checkouts.recall(self.ctx.info.state_dir, self.target) or self.last_landing()
        if stale is not None:
            where = Path(stale.checkout)
            if not where.is_dir() or not checkouts.at_tree_of(where, stale.old):
                checkouts.forget(self.ctx.info.state_dir, self.target)  # synced, or moved on
            elif self.head() == stale.to and checkouts.repair(
                where, stale.old, stale.new, stale.to
            ):
                checkouts.forget(self.ctx.info.state_dir, self.target)
            else:
                raise DagrunnerError(
                    "target-checkout-stale",
                    f"the checkout {stale.checkout} was left between two trees ({stale.reason})",
                    where=stale.checkout,
                    exit_code=ExitCode.FAILED,
                    details=stale.to_json(),
                    hint="it was clean before landing: free what blocked it (disk space) and run "
                    f"again, and dagrunner repairs it; or restore it yourself: {stale.command}",
                )
        for path in check_locks(
            common_dir=self.ctx.info.common_dir,
            ref=self.ref,
            checkout=self.target_checkout(),
            own_worktree=self.wt,
        ):
            print(f"removed a stale lock of the integration worktree: {path}", file=sys.stderr)

    def last_landing(self) -> checkouts.StaleCheckout | None:
        """The newest journaled landing onto the current head, as a checkout that should follow.

        A full disk can stop the marker from being written; the journal's landing
        record (written before the ref moved) still says from where to where.
        """
        checkout = self.target_checkout()
        if checkout is None:
            return None
        head = self.head()
        for entry in reversed(read_lines(self.queue.journal)):
            if entry.get("state") == "landing":
                old, new = entry.get("old"), entry.get("new")
                if isinstance(old, str) and new == head:
                    return checkouts.StaleCheckout(
                        checkout=str(checkout),
                        target=self.target,
                        old=old,
                        new=head,
                        to=head,
                        reason="a landing whose checkout update did not finish",
                    )
                return None
        return None

    def run(self) -> IntegrationResult:
        self.recover()
        self.preflight()
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
            if outcome == "moved":
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
            message = (
                f"dagrunner: integrate {fields['mission']}/{fields['worker']}\n\n"
                f"{TRAILER}: {envelope.id}\nDagrunner-Mission: {fields['mission']}\n"
                f"Dagrunner-Worker: {fields['worker']}\nDagrunner-Base: {fields['base']}\n"
                f"{SHA_TRAILER}: {fields['diff_sha256']}\n"
            )
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
        listing = git(["worktree", "list", "--porcelain"], cwd=self.repo).text
        for block in listing.split("\n\n"):
            lines = block.splitlines()
            if f"branch {self.ref}" in lines and lines and lines[0].startswith("worktree "):
                return Path(lines[0][len("worktree ") :])
        return None

    def land(self, old: str, applied: list[tuple[Envelope, str]]) -> str:
        """Move the target from ``old`` to the integration head: landed, moved, or blocked."""
        new = git(["rev-parse", "HEAD"], cwd=self.wt).text
        checkout = self.target_checkout()
        if checkout is not None:
            dirty = git(
                ["status", "--porcelain", "-z", "--untracked-files=no"], cwd=checkout
            ).stdout
            if dirty:
                self.block(
                    applied,
                    checkout,
                    "target-checkout-dirty",
                    "the target branch is checked out there with uncommitted changes",
                )
                return "blocked"
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
                return "moved"
            # Not moved by anyone: the ref itself cannot be written (a lock, a full disk).
            self.block(applied, Path(self.repo), "target-ref-unwritable", _first_line(moved))
            return "blocked"
        crash_point("landed-ref")
        if checkout is not None:
            synced = git(["read-tree", "-m", "-u", old, new], cwd=checkout, check=False)
            if synced.returncode != 0:
                return self.failed_sync(applied, checkout, old, new, _first_line(synced))
        self.landed(applied, old, new)
        return "landed"

    def landed(self, applied: list[tuple[Envelope, str]], old: str, new: str) -> None:
        chain = git(["rev-list", "--reverse", f"{old}..{new}"], cwd=self.repo).text.split()
        for (envelope, _), commit in zip(applied, chain, strict=False):
            self.finish(envelope.id, "landed", commit=commit)

    def failed_sync(
        self, applied: list[tuple[Envelope, str]], where: Path, old: str, new: str, why: str
    ) -> str:
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
                return "blocked"
            self.landed(applied, old, new)  # the truth: the target holds them
            return "landed"
        except OSError as exc:  # a full disk: the journal cannot say it, the result still does
            self.result.land_blocked = {
                "code": "disk-full",
                "checkout": str(where),
                "reason": f"{why}; then {exc.strerror}: the target is at {to[:12]}",
            }
            return "blocked"

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
        """A landed envelope's worktree goes only when it provably produced that envelope.

        Proof: the ledger records an export of exactly this envelope (id, tree and
        diff hash) from that worktree, no other session has claimed it since, and
        its full state is still that tree -- so everything it holds has landed.
        Anything less and the worktree is left alone with a note: an envelope's
        mission, worker and tree are a worker's claims, not facts.
        """
        from dagrunner.lifecycle import cleanup_recorded
        from dagrunner.worktrees import default_target

        states = self.ledger.state()
        for outcome in self.outcomes.values():
            wt_id = f"{outcome.get('mission')}/{outcome.get('worker')}"
            state = states.get(wt_id)
            if state is None or not Path(state["path"]).is_dir():
                continue
            if outcome["state"] != "landed":
                self.ledger.append(
                    "retained", wt_id, reason=f"envelope {outcome['id']} {outcome['state']}"
                )
                continue
            envelope = self.queue.load(outcome["id"])
            why = self.unproven(envelope, state)
            if why:
                self.ledger.append("retained", wt_id, reason=why)
                outcome["worktree"] = f"retained: {why}"
                continue
            try:
                with self.ledger.exclusive():
                    done = cleanup_recorded(
                        self.ctx,
                        wt_id,
                        state,
                        force=False,
                        target=default_target(self.ctx),
                        env=self.env,
                        assume_landed=True,
                    )
                outcome["worktree"] = done["action"]
            except DagrunnerError as exc:
                outcome["worktree"] = f"retained: {exc.message}"

    @staticmethod
    def unproven(envelope: Envelope, state: dict[str, Any]) -> str:
        """Why the worktree of ``state`` is not proven to hold exactly ``envelope`` ('' if it is)."""
        fields = envelope.fields
        exported = state.get("exports", {}).get(envelope.id)
        if (
            not exported
            or exported.get("tree") != fields["tree"]
            or exported.get("diff_sha256") != fields["diff_sha256"]
        ):
            return "no export of this envelope from this worktree is recorded"
        owner = state.get("session")
        if owner and owner != exported.get("session"):
            return f"claimed by session {owner!r}, not the exporting session"
        if state_tree(Path(state["path"])) != fields["tree"]:
            return "holds work beyond the landed envelope"
        return ""

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


def _first_line(result: GitResult) -> str:
    lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[0] if lines else f"git exited with {result.returncode}"


def integrate(
    *,
    repo: Path | None = None,
    target: str | None = None,
    manifest: Path | None = None,
    batch: int = 1,
    wait: bool = True,
    env: Mapping[str, str] | None = None,
    trust_envelope_manifest: bool = False,
) -> IntegrationResult:
    """Drain the queue of ``repo`` onto ``target`` (default: the main checkout's branch)."""
    from dagrunner.runner import new_run_id
    from dagrunner.worktrees import default_target

    env = os.environ if env is None else env
    ctx = open_context(repo, env)
    goal = target or default_target(ctx)
    lock = ctx.info.state_dir / f"integrate-{goal.replace('/', '--')}.lock"
    with integrator_lock(lock, wait=wait):
        return Integrator(
            ctx,
            target=goal,
            manifest=manifest,
            batch=batch,
            env=env,
            run_id=new_run_id(),
            trust_envelope_manifest=trust_envelope_manifest,
        ).run()


def queue_status(*, repo: Path | None = None) -> dict[str, Any]:
    ctx = open_context(repo)
    entries = list(Queue.of(ctx.info).entries().values())
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.get("state", "?")] = counts.get(entry.get("state", "?"), 0) + 1
    return {"envelopes": entries, "counts": counts}
