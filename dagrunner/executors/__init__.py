"""Where gate attempts run.  The scheduler sees only the :class:`Executor` protocol.

``local`` runs processes on this machine; ``dask://HOST:PORT`` hands each
attempt to a Dask distributed cluster (``executors/dask.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import trio

from dagrunner.cache import Fingerprint
from dagrunner.errors import DagrunnerError
from dagrunner.governor import Machine
from dagrunner.sandbox import AttemptResult, GateJob


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

    async def execute(self, job: GateJob) -> AttemptResult:
        """Run one attempt; cancellation must end the attempt's process tree."""
        ...

    async def aclose(self) -> None: ...


@contextlib.contextmanager
def executor_for(spec: str) -> Iterator[Executor]:
    """The executor named by ``--executor``, opened now -- an unreachable cluster fails here,
    before anything is written -- and closed when the block ends, whatever happens in it.

    (Not an ``async with``: it must open before the run's trio loop starts and close after
    it ends, and ``release_check`` runs that loop itself.)
    """
    executor = open_executor(spec)
    try:
        yield executor
    finally:
        trio.run(executor.aclose)


def open_executor(spec: str) -> Executor:
    """The executor named by ``--executor``: ``local`` or ``dask://HOST:PORT``."""
    if spec == "local":
        from dagrunner.executors.local import LocalExecutor

        return LocalExecutor()
    if spec.startswith(("dask://", "tcp://")):
        from dagrunner.executors.dask import DaskExecutor

        return DaskExecutor(spec)
    raise DagrunnerError(
        "bad-executor",
        f"unknown executor {spec!r}",
        hint="use --executor local or --executor dask://HOST:PORT (a Dask scheduler address)",
    )
