"""What an integration run reports: each envelope's outcome and the run's verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
