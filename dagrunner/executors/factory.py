"""The executor that ``--executor`` names, opened for a run and closed after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dagrunner.errors import DagrunnerError, ExitCode

if TYPE_CHECKING:  # light to import: `integrate serve`'s process checks the name only
    from dagrunner.executors.base import Executor


@contextlib.contextmanager
def executor_for(spec: str) -> Iterator[Executor]:
    """The executor named by ``--executor``, opened now -- an unreachable cluster fails here,
    before anything is written -- and closed when the block ends, whatever happens in it.

    (Not an ``async with``: it must open before the run's trio loop starts and close after
    it ends, and ``release_check`` runs that loop itself.)
    """
    import trio

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


def check_integration_executor(spec: str) -> None:
    """``dask-integration-unsupported`` for an integrator (``integrate run``, ``serve``) on
    any executor but ``local``: remote gates do not yet get what local ones do -- the tree
    guard, the tool caches, and the tree's own environment (its seeds, built and relocated
    in the tree, first on PATH) -- so a gate there would judge an integrated tree without
    its dependencies (docs/distributed.md, "Integration")."""
    if spec == "local":
        return
    raise DagrunnerError(
        "dask-integration-unsupported",
        f"integration does not run its gates on {spec}: remote gates lack the tree guard, "
        "the tool caches and the tree's own environment (its seeds first on PATH) that "
        "integration gates get here",
        key="--executor",
        exit_code=ExitCode.BAD_INPUT,
        hint="integrate with --executor local (the default); release-check --executor "
        "dask://... still runs on the cluster",
    )
