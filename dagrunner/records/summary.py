"""What a run's integration did, as ``run.json`` carries it for the report: ``RunIntegration``,
the results of a swarm run's integrate nodes or of one ``integrate run``, built once and
read back whole (``report html RUN_DIR`` re-renders from it).  The JSON keeps the two shapes
users read: ``integrate run``'s own result, or ``{"integrations": [...], "envelopes": [...]}``
for a swarm run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagrunner.files import text_of
from dagrunner.records.integration import (
    Details,
    EnvelopeOutcome,
    EnvelopeState,
    IntegrationResult,
    LandBlocked,
    Speculation,
    StaleCheckout,
    Verdict,
)


@dataclass(frozen=True)
class RunIntegration:
    """One run's integration results, each with its integrate node (None: ``integrate run``)."""

    results: tuple[tuple[str | None, IntegrationResult], ...]

    @property
    def envelopes(self) -> list[EnvelopeOutcome]:
        return [e for _, result in self.results for e in result.envelopes]

    @property
    def pipelined(self) -> IntegrationResult | None:
        """The result whose gate runs make the pipeline's timeline (``integrate run``'s)."""
        return next((r for _, r in self.results if r.pipeline), None)

    def to_json(self) -> dict[str, Any]:
        if len(self.results) == 1 and self.results[0][0] is None:
            return self.results[0][1].to_json()
        return {
            "integrations": [{"node": node, **r.to_json()} for node, r in self.results],
            "envelopes": [e.to_json() for e in self.envelopes],
        }

    @classmethod
    def from_json(cls, body: Any) -> RunIntegration | None:
        if not isinstance(body, dict):
            return None
        if isinstance(body.get("integrations"), list):
            parts = [p for p in body["integrations"] if isinstance(p, dict)]
            return cls(tuple((text_of(p.get("node")), _result(p)) for p in parts))
        return cls(((None, _result(body)),))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _outcome(body: Mapping[str, Any]) -> EnvelopeOutcome:
    try:
        state = EnvelopeState(str(body.get("state")))
    except ValueError:
        state = EnvelopeState.QUEUED
    return EnvelopeOutcome(
        str(body.get("id", "")),
        text_of(body.get("mission")),
        text_of(body.get("worker")),
        state,
        Details.from_json(body),
        worktree=text_of(body.get("worktree")),
        provenance=text_of(body.get("provenance")),
    )


def _speculation(body: Mapping[str, Any]) -> Speculation:
    try:
        verdict = Verdict(str(body.get("verdict")))
    except ValueError:
        verdict = Verdict.FAILED
    return Speculation(
        gate_run=_int(body.get("gate_run")),
        envelopes=tuple(str(e) for e in body.get("envelopes") or ()),
        head=str(body.get("head", "")),
        commit=str(body.get("commit", "")),
        position=_int(body.get("position")),
        start=float(body.get("start") or 0.0),
        end=float(body.get("end") or 0.0),
        verdict=verdict,
        confirm=body.get("confirm") is True,
        gates=tuple(str(g) for g in body.get("gates") or ()),
        report=str(body.get("report", "")),
    )


def _result(body: Mapping[str, Any]) -> IntegrationResult:
    blocked, stale = body.get("land_blocked"), body.get("checkout_stale")
    return IntegrationResult(
        target=str(body.get("target", "")),
        start=str(body.get("start") or ""),
        end=str(body.get("end") or ""),
        envelopes=[_outcome(e) for e in body.get("envelopes") or () if isinstance(e, dict)],
        gate_runs=_int(body.get("gate_runs")),
        confirm_runs=_int(body.get("confirm_runs")),
        rebuilds=_int(body.get("rebuilds")),
        resets=_int(body.get("resets")),
        window=_int(body.get("window")) or 1,
        pipeline=[_speculation(p) for p in body.get("pipeline") or () if isinstance(p, dict)],
        interrupted=body.get("interrupted") is True,
        land_blocked=LandBlocked(**blocked) if isinstance(blocked, dict) else None,
        target_moving=body.get("target_moving") is True,
        report_dir=str(body.get("report_dir") or ""),
        checkout_stale=StaleCheckout(
            **{k: v for k, v in stale.items() if k in StaleCheckout.__dataclass_fields__}
        )
        if isinstance(stale, dict)
        else None,
    )
