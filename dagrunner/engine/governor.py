"""The resource governor: declared capacity (CPU slots, memory) and live pressure.

A gate is admitted only when its declared ``cpu`` and ``memory`` fit in what
is free, so declared use never exceeds capacity.  Live pressure (available
memory or load past a threshold, read with psutil) holds back new starts but
never kills what runs.  Each run keeps its own samples for its report
(``Scheduler.samples``): a pipeline's runs share one governor, not one clock.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from dagrunner.errors import DagrunnerError
from dagrunner.executors.base import Machine
from dagrunner.manifest.load import GateSpec, GovernorSpec
from dagrunner.records.run import GovernorSample

_EPS = 1e-9


@dataclass(frozen=True, kw_only=True)
class Capacity:
    cpu: float
    memory: int
    jobs: int | None  # --jobs: at most this many gates at once
    max_load: float  # 1-minute load average per core
    min_available_memory: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_now() -> tuple[float, float]:
    """(1-minute load average, tasks runnable right now); the second is the first off Linux."""
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    try:
        fields = Path("/proc/loadavg").read_text().split()
        return load1, float(int(fields[3].split("/")[0]) - 1)  # less the reader itself
    except (OSError, IndexError, ValueError):
        return load1, load1


def machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return psutil.cpu_count() or 1


def resolve_capacity(
    spec: GovernorSpec, *, jobs: int | None = None, machines: Sequence[Machine] = ()
) -> Capacity:
    """The run's capacity: ``auto`` values read from this machine -- or, when gates run on a
    cluster's ``machines``, their sum (this machine's load and memory then hold nothing back)."""
    if machines:
        return Capacity(
            cpu=spec.cpu if spec.cpu is not None else sum(m.cpu for m in machines),
            memory=spec.memory if spec.memory is not None else sum(m.memory for m in machines),
            jobs=jobs,
            max_load=math.inf,
            min_available_memory=0,
        )
    memory = psutil.virtual_memory()
    cpus = machine_cpus()
    return Capacity(
        cpu=spec.cpu if spec.cpu is not None else float(cpus),
        memory=spec.memory
        if spec.memory is not None
        else int(memory.available * spec.memory_fraction),
        jobs=jobs,
        max_load=spec.max_load if spec.max_load is not None else 2.0,
        min_available_memory=(
            spec.min_available_memory
            if spec.min_available_memory is not None
            else int(memory.total * 0.05)
        ),
    )


def check_fits(
    gates: list[GateSpec], capacity: Capacity, *, where: str, machines: Sequence[Machine] = ()
) -> None:
    """Raise ``gate-never-fits`` (exit 2) for a gate larger than the whole capacity, or than
    the largest of the cluster's ``machines`` (a gate runs on one of them)."""
    for gate in gates:
        if machines and not any(
            gate.cpu <= m.cpu + _EPS and gate.memory <= m.memory for m in machines
        ):
            big = max(machines, key=lambda m: (m.cpu, m.memory))
            raise DagrunnerError(
                "gate-never-fits",
                f"gate {gate.id!r} declares cpu={gate.cpu:g}, memory={gate.memory} bytes; "
                f"no worker of the cluster holds that (the largest, {big.name}, has "
                f"cpu={big.cpu:g}, memory={big.memory} bytes)",
                where=where,
                key=f"gates.{gate.id}",
                hint="lower the gate's cpu/memory, or start a worker with "
                '--resources "cpu=N,memory=BYTES" that holds it',
            )
        if gate.cpu > capacity.cpu + _EPS or gate.memory > capacity.memory:
            raise DagrunnerError(
                "gate-never-fits",
                f"gate {gate.id!r} declares cpu={gate.cpu:g}, memory={gate.memory} bytes, "
                f"more than the governor's capacity (cpu={capacity.cpu:g}, "
                f"memory={capacity.memory} bytes); it could never start",
                where=where,
                key=f"gates.{gate.id}",
                hint="lower the gate's cpu/memory, or raise [governor] cpu/memory",
            )


class Governor:
    """Book-keeping of declared use against capacity, plus live pressure samples."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.used_cpu = 0.0
        self.used_memory = 0
        self.running = 0
        self.pressured = False
        self.peak_cpu = 0.0
        self.peak_memory = 0
        # Schedulers sharing this governor (an integration pipeline gates several trees at
        # once): each is woken when any of them frees capacity.
        self.wakers: list[Callable[[], None]] = []
        psutil.cpu_percent(interval=None)  # prime: the first real reading covers the run

    def fits(self, cpu: float, memory: int) -> bool:
        if self.capacity.jobs is not None and self.running >= self.capacity.jobs:
            return False
        return (
            self.used_cpu + cpu <= self.capacity.cpu + _EPS
            and self.used_memory + memory <= self.capacity.memory
        )

    def full(self) -> bool:
        """True when no gate at all could start now (every slot or the job cap is used)."""
        if self.capacity.jobs is not None and self.running >= self.capacity.jobs:
            return True
        return self.used_cpu >= self.capacity.cpu - _EPS

    def acquire(self, cpu: float, memory: int) -> None:
        if not self.fits(cpu, memory):
            raise RuntimeError("acquire() without fits(): the scheduler broke its contract")
        self.used_cpu += cpu
        self.used_memory += memory
        self.running += 1
        self.peak_cpu = max(self.peak_cpu, self.used_cpu)
        self.peak_memory = max(self.peak_memory, self.used_memory)

    def release(self, cpu: float, memory: int) -> None:
        self.used_cpu = max(0.0, self.used_cpu - cpu)
        self.used_memory = max(0, self.used_memory - memory)
        self.running -= 1
        for wake in self.wakers:
            wake()

    def sample(self, t: float) -> GovernorSample:
        """Read the machine now and update ``pressured``; the sample, for the caller to keep."""
        memory = psutil.virtual_memory()
        load1, runnable = load_now()
        cpus = machine_cpus()
        # The 1-minute average lags by design: right after a busy minute it still reads
        # high on an idle machine.  Count it only while the runnable tasks right now
        # agree, so that the machine's past (often our own earlier work) holds nothing.
        overloaded = (
            load1 / cpus > self.capacity.max_load and runnable / cpus > self.capacity.max_load
        )
        self.pressured = memory.available < self.capacity.min_available_memory or overloaded
        sample = GovernorSample(
            t=round(t, 3),
            cpu_percent=psutil.cpu_percent(interval=None),
            load1=round(load1, 2),
            runnable=runnable,
            memory_available=memory.available,
            declared_cpu=self.used_cpu,
            declared_memory=self.used_memory,
            running=self.running,
            pressured=self.pressured,
        )
        return sample
