"""What an integration run reports: each envelope's state and the run's verdict.

The records here cross from the integrator to the queue's journal, the swarm
nodes, the report and the CLI; ``to_json`` turns them into the shapes users
read (``integrate run --json``, ``integration.json``), ``from_json`` reads a
journal line back.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from dagrunner.errors import ExitCode
from dagrunner.files import text_of


class EnvelopeState(enum.StrEnum):
    """An envelope's state on the queue (its last journaled one)."""

    QUEUED = "queued"
    APPLYING = "applying"
    APPLIED = "applied"
    GATING = "gating"
    LANDING = "landing"
    LANDED = "landed"
    CONFLICT = "conflict"
    GATES_FAILED = "gates-failed"
    REJECTED = "rejected"
    WITHDRAWN = "withdrawn"  # taken back by its worker (or the operator) before it landed


class LandOutcome(enum.StrEnum):
    """What one landing attempt did."""

    LANDED = "landed"  # the target moved to the gated commit (and its checkout followed)
    MOVED = "moved"  # somebody else moved the target first: rebuild on the new head
    BLOCKED = "blocked"  # refused or impossible; ``land_blocked`` says why
    WITHDRAWN = "withdrawn"  # an envelope of it was withdrawn while it gated: never lands


FINAL: frozenset[EnvelopeState] = frozenset(
    {
        EnvelopeState.LANDED,
        EnvelopeState.CONFLICT,
        EnvelopeState.GATES_FAILED,
        EnvelopeState.REJECTED,
        EnvelopeState.WITHDRAWN,
    }
)


def _texts(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class Details:
    """What a journal line says beyond the envelope's id and state; every field is optional.

    The field order is the key order of the JSON (and of ``integrate status``)."""

    commit: str | None = None  # applied/landed: the commit that holds the envelope
    gate_run: int | None = None  # gating: which gate run of the integrator
    old: str | None = None  # landing: the target before ...
    new: str | None = None  # ... and after
    run: str | None = None  # gating inside a swarm run: its run id
    conflicts: tuple[str, ...] | None = None  # conflict: the paths
    hunks: str | None = None  # conflict: the conflicting hunks (bounded)
    failed_gates: tuple[str, ...] | None = None  # gates-failed
    report: str | None = None  # gates-failed: the gate run that failed it
    reason: str | None = None  # rejected, conflict, or a refused landing
    manifest_changed: bool | None = None  # it changed the manifest; the target's gated it
    note: str | None = None
    recovered: bool | None = None  # landed, found so after a crash
    recovered_from: str | None = None  # queued again after a crash in this state
    # added with the speculative pipeline (after the older keys, so their order holds)
    head: str | None = None  # gating: the speculative head its item was applied on
    position: int | None = None  # gating: its item's place in the pipeline's window (0: front)
    flaky_gates: tuple[str, ...] | None = None  # failed, then passed when re-run on that tree
    # files it changes that change how git or dagrunner judge later work (.gitattributes,
    # .gitmodules, the manifest): flagged like a manifest change
    judging_changed: tuple[str, ...] | None = None
    # overlap (at submit): the envelope queued ahead that it conflicts with, and the paths
    overlaps_with: str | None = None
    overlap_paths: tuple[str, ...] | None = None
    # added with batches that size themselves and differential gating
    batch: int | None = None  # batch-size: the size chosen for the batch this envelope opens
    # gates-failed under a differential baseline: the failures the target does not have
    # ("gate" or "gate::suite::case"); target-red: what the target's own head fails
    failed_tests: tuple[str, ...] | None = None
    target_red: tuple[str, ...] | None = None
    red_since: str | None = None  # target-red: the first head seen failing them
    gate_cpu: float | None = None  # gate-run: the CPU-seconds its gates' processes took
    # stuck: why the queue cannot move it now (an integrator that cannot start, a refused
    # landing), as a coded error's code and hint; ``note`` holds its message
    stuck: str | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: list(v) if isinstance(v, tuple) else v
            for f in dataclasses.fields(self)
            if (v := getattr(self, f.name)) is not None
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Details:
        gate_run, position = data.get("gate_run"), data.get("position")
        batch, cpu = data.get("batch"), data.get("gate_cpu")
        return cls(
            commit=text_of(data.get("commit")),
            gate_run=gate_run if isinstance(gate_run, int) else None,
            head=text_of(data.get("head")),
            position=position if isinstance(position, int) else None,
            old=text_of(data.get("old")),
            new=text_of(data.get("new")),
            run=text_of(data.get("run")),
            conflicts=_texts(data.get("conflicts")),
            hunks=text_of(data.get("hunks")),
            failed_gates=_texts(data.get("failed_gates")),
            flaky_gates=_texts(data.get("flaky_gates")),
            judging_changed=_texts(data.get("judging_changed")),
            report=text_of(data.get("report")),
            reason=text_of(data.get("reason")),
            manifest_changed=_flag(data.get("manifest_changed")),
            note=text_of(data.get("note")),
            recovered=_flag(data.get("recovered")),
            recovered_from=text_of(data.get("recovered_from")),
            overlaps_with=text_of(data.get("overlaps_with")),
            overlap_paths=_texts(data.get("overlap_paths")),
            batch=batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
            failed_tests=_texts(data.get("failed_tests")),
            target_red=_texts(data.get("target_red")),
            red_since=text_of(data.get("red_since")),
            stuck=text_of(data.get("stuck")),
            hint=text_of(data.get("hint")),
            gate_cpu=float(cpu)
            if isinstance(cpu, int | float) and not isinstance(cpu, bool)
            else None,
        )

    def merged(self, newer: Details, *, attempt: bool = False) -> Details:
        """These details with every field ``newer`` sets taken from it; ``note``, ``stuck``
        and ``hint`` speak of one line only (a speculative reset's note does not follow the
        envelope to its end; a cause that was removed is not one any more).  ``attempt``: a
        new attempt (an ``applying`` line) keeps only the overlap foreseen at submit; the
        commit, head or gate run of a speculative tree it left are not its own (a conflict
        found on the real head after one named that commit)."""
        changes = {
            f.name: v
            for f in dataclasses.fields(newer)
            if (v := getattr(newer, f.name)) is not None
        }
        if attempt:
            kept = {"overlaps_with": self.overlaps_with, "overlap_paths": self.overlap_paths}
            return Details(**{**kept, **changes})
        return dataclasses.replace(self, **{"note": None, "stuck": None, "hint": None, **changes})


NO_DETAILS = Details()


@dataclass(frozen=True)
class EnvelopeOutcome:
    """Where one envelope ended in an integration run (its final journal line, and who made it)."""

    id: str
    mission: str | None
    worker: str | None
    state: EnvelopeState
    details: Details = NO_DETAILS
    worktree: str | None = None  # landed: what became of the worker's worktree
    provenance: str | None = None  # "ledger", or "unproven: why" (queue.provenance)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "mission": self.mission,
            "worker": self.worker,
            "state": str(self.state),
            **self.details.to_json(),
        }
        if self.worktree is not None:
            body["worktree"] = self.worktree
        if self.provenance is not None:
            body["provenance"] = self.provenance
        return body


@dataclass(frozen=True)
class LandBlocked:
    """Why landing was refused or impossible (the target did not take the envelopes)."""

    code: str
    checkout: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "checkout": self.checkout, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class Landing:
    """What one landing attempt did, for the integrator to record: its outcome, why it was
    refused, a checkout it left stale, and whether the run stops there."""

    outcome: LandOutcome
    blocked: LandBlocked | None = None
    stale: StaleCheckout | None = None
    stops: bool = False


class Verdict(enum.StrEnum):
    """What one gate run of the pipeline said about its item's tree."""

    PASSED = "passed"
    FAILED = "failed"
    FLAKY = "flaky"  # a confirmation re-run passed what had failed
    CONFIRMED = "confirmed"  # a confirmation re-run failed again: the item is blamed
    CANCELLED = "cancelled"  # an item ahead failed or the target moved: it is rebuilt


@dataclass(frozen=True)
class Speculation:
    """One gate run of the pipeline: which envelopes, on which speculative head, how it ended
    (``start``/``end`` in seconds from the run's start): the report's timeline."""

    gate_run: int
    envelopes: tuple[str, ...]
    head: str
    commit: str
    position: int
    start: float
    end: float
    verdict: Verdict
    confirm: bool = False  # a re-run of failed gates on the same tree
    gates: tuple[str, ...] = ()  # the failing (or flaky) gates
    report: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "gate_run": self.gate_run,
            "envelopes": list(self.envelopes),
            "head": self.head,
            "commit": self.commit,
            "position": self.position,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "verdict": str(self.verdict),
            "confirm": self.confirm,
            "gates": list(self.gates),
            "report": self.report,
        }


@dataclass(frozen=True, kw_only=True)
class StaleCheckout:
    """A checkout left between two trees: it should be at ``to``."""

    checkout: str
    target: str
    old: str
    new: str
    to: str
    reason: str

    @property
    def command(self) -> str:
        return f"git -C {shlex.quote(self.checkout)} reset --hard {self.to[:12]}"

    def to_json(self) -> dict[str, str]:
        return {**asdict(self), "command": self.command}


@dataclass
class PipelineTally:
    """What the speculative pipeline counted in one run; the integrator adds it to its
    result when the pipeline ends (``IntegrationResult.count``)."""

    window: int = 1
    gate_runs: int = 0
    cached_runs: int = 0
    gates_reused: int = 0  # gates answered from a verdict instead of run (the cache, its flights)
    gates_waited: int = 0  # of those, gates that waited for a key another tree computed then
    confirm_runs: int = 0
    rebuilds: int = 0
    resets: int = 0
    interrupted: bool = False
    target_moving: bool = False
    pipeline: list[Speculation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # a landed proof not written, ...
    gate_cpu: float = 0.0  # CPU-seconds of every gate process tree run (reused ones: none)
    batches: list[int] = field(default_factory=list)  # the batch sizes chosen, in order
    target_red: tuple[str, ...] = ()  # what the target's head failed, last seen
    held: list[str] = field(default_factory=list)  # queued again: failing only as the target does


@dataclass
class IntegrationResult:
    target: str
    start: str
    end: str
    envelopes: list[EnvelopeOutcome] = field(default_factory=list)
    gate_runs: int = 0  # including confirmation re-runs
    cached_runs: int = 0  # gate runs where every gate was a cache hit (said, not in the JSON)
    gates_reused: int = 0  # gates answered from a verdict, in every tree and rebuild
    gates_waited: int = 0  # lookups that waited for the same key in flight in another tree
    warnings: list[str] = field(default_factory=list)
    confirm_runs: int = 0  # re-runs of failed gates on the same tree (flake confirmation)
    rebuilds: int = 0
    resets: int = 0  # items rebuilt because one ahead of them failed
    window: int = 1  # the pipeline's ceiling: queue items gated at once
    pipeline: list[Speculation] = field(default_factory=list)
    interrupted: bool = False
    land_blocked: LandBlocked | None = None
    target_moving: bool = False
    report_dir: str = ""
    checkout_stale: StaleCheckout | None = None  # landed, but the checkout could not follow
    gate_cpu: float = 0.0  # CPU-seconds of every gate process tree the run ran
    batches: list[int] = field(default_factory=list)  # the batch sizes it chose, in order
    target_red: tuple[str, ...] = ()  # what the target's head failed, last seen
    held: list[str] = field(default_factory=list)  # queued again: failing only as the target does

    @property
    def gates_failed(self) -> bool:
        return any(e.state is EnvelopeState.GATES_FAILED for e in self.envelopes)

    @property
    def ok(self) -> bool:
        """The run's verdict, as the CLI's exit code gives it: nothing failed its gates, landing
        was not refused, the target did not keep moving, and its checkout followed."""
        return (
            self.land_blocked is None
            and not self.interrupted
            and not self.target_moving
            and not self.checkout_stale
            and not self.gates_failed
            and not self.held
        )

    @property
    def exit_code(self) -> ExitCode:
        """0, or 1 when not ``ok`` (conflicts and rejections are outcomes, not failures);
        130 when interrupted."""
        if self.interrupted:
            return ExitCode.INTERRUPTED
        return ExitCode.OK if self.ok else ExitCode.FAILED

    def count(self, tally: PipelineTally) -> None:
        """Take the pipeline's counts (the pipeline never writes this result itself)."""
        for name in PipelineTally.__dataclass_fields__:
            setattr(self, name, getattr(tally, name))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "start": self.start,
            "end": self.end,
            "envelopes": [e.to_json() for e in self.envelopes],
            "gate_runs": self.gate_runs,
            "rebuilds": self.rebuilds,
            "land_blocked": self.land_blocked and self.land_blocked.to_json(),
            "target_moving": self.target_moving,
            "checkout_stale": self.checkout_stale.to_json() if self.checkout_stale else None,
            "report_dir": self.report_dir,
            "counts": {
                str(s): sum(1 for e in self.envelopes if e.state is s)
                for s in sorted({e.state for e in self.envelopes})
            },
            "confirm_runs": self.confirm_runs,
            "resets": self.resets,
            "window": self.window,
            "interrupted": self.interrupted,
            "pipeline": [p.to_json() for p in self.pipeline],
            "gates_reused": self.gates_reused,
            "gates_waited": self.gates_waited,
            "warnings": self.warnings,
            "gate_cpu": round(self.gate_cpu, 3),
            "batches": self.batches,
            "target_red": list(self.target_red),
            "held": self.held,
        }
