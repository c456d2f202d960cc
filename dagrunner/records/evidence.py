"""A run's speed evidence and its budget (``engine/evidence``): what ``run.json`` says of
how fast the run went and which of the manifest's ``[budget]`` it missed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) else default


def _ratio(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class CriticalPath:
    gates: tuple[str, ...] = ()
    duration: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"gates": list(self.gates), "duration": self.duration}


@dataclass(frozen=True, kw_only=True)
class Speed:
    """The run's speed evidence, each figure measured in the run (``evidence.py``)."""

    wall: float = 0.0
    serial_sum: float = 0.0  # what one slot would have taken
    speedup: float | None = None  # serial sum / wall
    critical_path: CriticalPath = CriticalPath()
    work: float = 0.0  # duration x declared cpu, summed
    capacity_cpu: float = 0.0
    lower_bound: float = 0.0  # max(critical path, work / capacity)
    efficiency: float | None = None  # lower bound / wall
    cache_saved: float = 0.0  # what the cached gates took when they last ran
    cache_hits: int = 0
    governor_wait: float = 0.0  # summed over gates

    def to_json(self) -> dict[str, Any]:
        body = {f: getattr(self, f) for f in self.__dataclass_fields__}
        body["critical_path"] = self.critical_path.to_json()
        return body

    @classmethod
    def from_json(cls, body: Any) -> Speed:
        if not isinstance(body, dict):
            return cls()
        crit = body.get("critical_path")
        crit = crit if isinstance(crit, dict) else {}
        return cls(
            wall=_num(body.get("wall")),
            serial_sum=_num(body.get("serial_sum")),
            speedup=_ratio(body.get("speedup")),
            critical_path=CriticalPath(
                tuple(str(g) for g in crit.get("gates", ())), _num(crit.get("duration"))
            ),
            work=_num(body.get("work")),
            capacity_cpu=_num(body.get("capacity_cpu")),
            lower_bound=_num(body.get("lower_bound")),
            efficiency=_ratio(body.get("efficiency")),
            cache_saved=_num(body.get("cache_saved")),
            cache_hits=int(_num(body.get("cache_hits"))),
            governor_wait=_num(body.get("governor_wait")),
        )


@dataclass(frozen=True)
class BudgetMiss:
    budget: str  # max_wall | min_speedup | gates.<id>.max_duration
    limit: float
    measured: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "limit": self.limit,
            "measured": self.measured,
            "message": self.message,
        }


@dataclass(frozen=True)
class Budget:
    """The manifest's ``[budget]`` checked against the evidence."""

    declared: bool = False
    misses: tuple[BudgetMiss, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.misses

    def to_json(self) -> dict[str, Any]:
        return {
            "declared": self.declared,
            "ok": self.ok,
            "misses": [m.to_json() for m in self.misses],
        }

    @classmethod
    def from_json(cls, body: Any) -> Budget:
        if not isinstance(body, dict):
            return cls()
        misses = tuple(
            BudgetMiss(
                str(m.get("budget")),
                _num(m.get("limit")),
                _num(m.get("measured")),
                str(m.get("message")),
            )
            for m in body.get("misses", ())
            if isinstance(m, dict)
        )
        return cls(bool(body.get("declared")), misses)
