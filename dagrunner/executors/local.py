"""Run gate attempts as local processes through the sandbox."""

from __future__ import annotations

from dagrunner.sandbox import AttemptResult, GateJob, run_job


class LocalExecutor:
    name = "local"

    async def execute(self, job: GateJob) -> AttemptResult:
        return await run_job(job)

    async def aclose(self) -> None:
        return None
