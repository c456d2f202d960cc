"""A cluster's workers as dagrunner sees them, and which takes an attempt now
(``executors/dask.py`` asks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagrunner.executors.base import Machine


@dataclass(frozen=True)
class WorkerFacts:
    """What a worker has that gates depend on."""

    address: str
    cpu: float
    memory: int
    dagrunner: str  # its dagrunner version ("" when it has none)
    git: str  # its git version ("" when it has none)
    problem: str = ""  # why it cannot run gates ("" when it can)


def worker_size(info: Mapping[str, Any]) -> tuple[float, int]:
    """A worker's (cpu, memory): its declared resources, else its threads and memory limit."""
    resources = info.get("resources") or {}
    return (
        float(resources.get("cpu", info.get("nthreads", 1))),
        int(resources.get("memory", info.get("memory_limit") or 0)),
    )


_EPS = 1e-9


class Placement:
    """Which machine of a cluster takes an attempt now: the one it fits best (least room left
    after it), by what is declared in flight on each.  The governor admits against the sum;
    this keeps a gate off a machine that has the total but not the room free right now."""

    def __init__(self, machines: Sequence[Machine] = ()) -> None:
        self.machines: dict[str, Machine] = {}
        self.busy: dict[str, tuple[float, int]] = {}
        self.update(machines)

    def update(self, machines: Sequence[Machine]) -> None:
        """The machines now (joined ones added, gone ones dropped; in-flight use is kept)."""
        self.machines = {m.name: m for m in machines}

    def take(self, cpu: float, memory: int) -> str | None:
        """Reserve room for an attempt; the machine's name, or None when none has room now."""
        best: tuple[float, str] | None = None
        for name, machine in self.machines.items():
            used_cpu, used_memory = self.busy.get(name, (0.0, 0))
            room = machine.cpu - used_cpu - cpu
            fits_memory = not machine.memory or used_memory + memory <= machine.memory
            if room >= -_EPS and fits_memory and (best is None or room < best[0]):
                best = (room, name)
        if best is None:
            return None
        used_cpu, used_memory = self.busy.get(best[1], (0.0, 0))
        self.busy[best[1]] = (used_cpu + cpu, used_memory + memory)
        return best[1]

    def could_take(self, cpu: float, memory: int) -> bool:
        """Whether some machine there now could take the attempt once it has room free."""
        return any(
            m.cpu >= cpu - _EPS and (not m.memory or memory <= m.memory)
            for m in self.machines.values()
        )

    def give_back(self, name: str, cpu: float, memory: int) -> None:
        used_cpu, used_memory = self.busy.get(name, (0.0, 0))
        self.busy[name] = (max(0.0, used_cpu - cpu), max(0, used_memory - memory))
