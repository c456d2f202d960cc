"""Run gate attempts on a Dask distributed cluster (``--executor dask://HOST:PORT[?timeout=10s]``).

Each attempt becomes one Dask task that runs the same sandbox as the local
executor, on whichever worker the Dask scheduler picks; our own scheduler and
governor still decide *when* a gate starts.  Requirements on the cluster: the
repository is at the same path on every worker (a shared or identical
checkout), and workers have the gates' tools.  The bounded log travels back
with the result and is written into the local run directory.

Cancelling an attempt (Ctrl-C, --fail-fast, a timeout of ours) sets a Dask
``Event`` that the remote task watches; it then ends its process tree there.
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.sandbox import AttemptResult, GateJob, run_job

CANCEL_POLL = 0.2


def run_remote(job: GateJob, cancel_name: str) -> tuple[AttemptResult, bytes]:
    """Executed on a Dask worker: run the attempt in a local sandbox there."""
    from distributed import Event

    with tempfile.TemporaryDirectory(prefix="dagrunner-remote-") as tmp:
        local = replace(
            job, log_path=str(Path(tmp) / "gate.log"), sandbox_dir=str(Path(tmp) / "sb")
        )
        cancel = Event(cancel_name)

        async def main() -> AttemptResult:
            result: AttemptResult | None = None
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    while not await trio.to_thread.run_sync(cancel.is_set):
                        await trio.sleep(CANCEL_POLL)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                result = await run_job(local)
                nursery.cancel_scope.cancel()
            return result or AttemptResult(exit_code=None, interrupted=True, error="cancelled")

        result = trio.run(main)
        return result, Path(local.log_path).read_bytes()


class DaskExecutor:
    name = "dask"

    def __init__(self, address: str) -> None:
        """Connect now, so that an unreachable cluster is an error before any gate runs."""
        target, _, query = address.split("://", 1)[1].partition("?")
        self.address = "tcp://" + target
        self.timeout = "10s"
        for pair in filter(None, query.split("&")):
            name, _, value = pair.partition("=")
            if name != "timeout" or not value:
                raise DagrunnerError(
                    "bad-executor",
                    f"unknown option {pair!r} in the Dask address",
                    hint="use dask://HOST:PORT or dask://HOST:PORT?timeout=5s",
                )
            self.timeout = value
        self._client: Any = self._connect()

    def _connect(self) -> Any:
        try:
            from distributed import Client
        except ImportError:
            raise DagrunnerError(
                "dask-missing",
                "the Dask executor needs the 'distributed' package",
                exit_code=ExitCode.ENVIRONMENT,
                hint="pip install 'dagrunner[dask]'",
            ) from None
        try:
            return Client(self.address, timeout=self.timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise DagrunnerError(
                "dask-unreachable",
                f"cannot reach the Dask scheduler at {self.address}: {exc}",
                exit_code=ExitCode.ENVIRONMENT,
                hint="start one (dask scheduler; dask worker ADDRESS) or check the address",
            ) from None

    async def execute(self, job: GateJob) -> AttemptResult:
        from distributed import Event

        cancel_name = f"dagrunner-cancel-{uuid.uuid4().hex}"
        future = self._client.submit(
            run_remote, job, cancel_name, pure=False, key=f"{job.gate}-{uuid.uuid4().hex[:8]}"
        )
        try:
            result, log = await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                event = Event(cancel_name, client=self._client)
                await trio.to_thread.run_sync(event.set)
                with trio.move_on_after(job.grace + 5):
                    await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)
            raise
        Path(job.log_path).write_bytes(log)
        typed: AttemptResult = result
        return typed

    async def aclose(self) -> None:
        if self._client is not None:
            await trio.to_thread.run_sync(self._client.close)
            self._client = None
