"""Where gate attempts run.  The scheduler sees only the :class:`Executor` protocol.

``local`` runs processes on this machine; ``dask://HOST:PORT`` hands each
attempt to a Dask distributed cluster (``executors/dask.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dagrunner.process.sandbox import AttemptResult, GateJob

# Takes a tool's fingerprint (sha256, first line) for a command and environment.
Fingerprint = Callable[[str, Mapping[str, str]], tuple[str, str]]


@dataclass(frozen=True)
class Machine:
    """One place gates run, as a cluster declares it (a Dask worker and its resources)."""

    name: str
    cpu: float
    memory: int


class Executor(Protocol):
    name: str

    def machines(self) -> list[Machine]:
        """Where gates run, when that is not this machine (empty: this machine)."""
        ...

    def following(self) -> list[Machine]:
        """Where gates run now (a cluster's workers join and leave); quick, no checks."""
        ...

    def fingerprinter(self) -> Fingerprint | None:
        """Takes tool fingerprints where gates run (None: here)."""
        ...

    @property
    def warnings(self) -> list[str]:
        """What the run should say about where its gates ran."""
        ...

    def fresh(self, checkout: Path) -> None:
        """``checkout`` holds another tree now: nothing taken from it before is reused."""
        ...

    def ahead(self, checkout: Path) -> None:
        """Gates will run in ``checkout``: start readying it where they run (not waited for)."""
        ...

    async def execute(self, job: GateJob) -> AttemptResult:
        """Run one attempt; cancellation must end the attempt's process tree."""
        ...

    async def aclose(self) -> None: ...
