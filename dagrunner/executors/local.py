"""Run gate attempts as local processes through the sandbox."""

from __future__ import annotations

from pathlib import Path

from dagrunner.executors.base import Fingerprint, Machine
from dagrunner.process.sandbox import AttemptResult, GateJob, run_job


class LocalExecutor:
    name = "local"

    def machines(self) -> list[Machine]:
        return []  # this machine: the governor reads it

    def following(self) -> list[Machine]:
        return []

    def fingerprinter(self) -> Fingerprint | None:
        return None

    @property
    def warnings(self) -> list[str]:
        return []

    def fresh(self, checkout: Path) -> None:
        return None  # gates run in the checkout itself

    def ahead(self, checkout: Path) -> None:
        return None

    async def execute(self, job: GateJob) -> AttemptResult:
        return await run_job(job)

    async def aclose(self) -> None:
        return None
