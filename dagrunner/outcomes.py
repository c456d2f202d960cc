"""What an integration run reports: each envelope's state and the run's verdict."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from dagrunner.errors import ExitCode


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


class LandOutcome(enum.StrEnum):
    """What one landing attempt did."""

    LANDED = "landed"  # the target moved to the gated commit (and its checkout followed)
    MOVED = "moved"  # somebody else moved the target first: rebuild on the new head
    BLOCKED = "blocked"  # refused or impossible; ``land_blocked`` says why


FINAL: frozenset[str] = frozenset(
    {
        EnvelopeState.LANDED,
        EnvelopeState.CONFLICT,
        EnvelopeState.GATES_FAILED,
        EnvelopeState.REJECTED,
    }
)


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
    def gates_failed(self) -> bool:
        return any(e["state"] == EnvelopeState.GATES_FAILED for e in self.envelopes)

    @property
    def ok(self) -> bool:
        """The run's verdict, as the CLI's exit code gives it: nothing failed its gates, landing
        was not refused, the target did not keep moving, and its checkout followed."""
        return (
            self.land_blocked is None
            and not self.target_moving
            and not self.checkout_stale
            and not self.gates_failed
        )

    @property
    def exit_code(self) -> ExitCode:
        """0, or 1 when not ``ok`` (conflicts and rejections are outcomes, not failures)."""
        return ExitCode.OK if self.ok else ExitCode.FAILED

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
