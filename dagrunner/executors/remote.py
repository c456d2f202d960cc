"""What runs on a Dask worker (``executors/dask.py`` submits it): the attempt, in a
checkout of the run's shipped source, at most once; and the small functions the
submitter runs on every worker (versions, tool fingerprints, the source's checkout).

Nothing here reads the submitter's filesystem: what a worker knows comes in the
arguments, and what it keeps lives under its own remote root (``DAGRUNNER_REMOTE_DIR``).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import trio

from dagrunner.errors import DagrunnerError
from dagrunner.executors import source as ship
from dagrunner.git.repo import remote_root
from dagrunner.process.sandbox import AttemptResult, GateJob, run_job

CANCEL_POLL = 0.2
NEED_SOURCE = "need-source"  # the worker has no checkout of the source yet: nothing ran


def failed(error: str, worker: str = "") -> tuple[AttemptResult, bytes]:
    """A failed attempt that never ran a gate, with its reason as its log."""
    return AttemptResult(exit_code=None, error=error, worker=worker), f"{error}\n".encode()


def facts_here() -> tuple[str, str]:
    """Run on each worker by ``client.run``: its dagrunner and git versions."""
    from dagrunner.git.repo import git_version
    from dagrunner.version import VERSION

    try:
        have_git = ".".join(map(str, git_version()))
    except DagrunnerError:
        have_git = ""
    return VERSION, have_git


def fingerprint_here(command: str, env: dict[str, str]) -> tuple[str, str]:
    """Run on each worker by ``client.run``: a tool's fingerprint there."""
    from dagrunner.process.command import tool_fingerprint

    where = remote_root()
    where.mkdir(parents=True, exist_ok=True)
    return tool_fingerprint(command, env, where)


def stash_here(commit: str, bundle: bytes) -> str:
    """Run on workers by ``client.run``: check the run's source out here, before any gate."""
    return str(ship.materialise(commit, bundle, remote_root()))


def held_here() -> list[str]:
    """Run on workers by ``client.run``: the sources this worker holds checkouts of."""
    return ship.held(remote_root())


def run_remote(job: GateJob, rel_cwd: str, commit: str, key: str) -> tuple[AttemptResult, bytes]:
    """Executed on a Dask worker: at most once per attempt, in a checkout of the run's source.

    A worker without the checkout (one that joined after the source was shipped) answers
    ``need-source`` without starting anything; the submitter stashes it there and asks again."""
    from distributed import Event, Variable, get_worker

    here = str(get_worker().address)
    started, where = Event(f"{key}-started"), Variable(f"{key}-where")
    if started.is_set():  # Dask ran this before, on a worker that died: never twice
        lost = str(where.get(timeout=5))
        return failed(f"worker-lost: worker {lost} died while running the gate", lost)
    checkout = ship.ready(commit, remote_root())
    if checkout is None:
        return AttemptResult(exit_code=None, error=NEED_SOURCE, worker=here), b""
    with ship.using(checkout, commit) as still_there:
        if not still_there:  # moved to another source between the look and the lock
            return AttemptResult(exit_code=None, error=NEED_SOURCE, worker=here), b""
        where.set(here)
        started.set()
        return _attempt_in(job, checkout, rel_cwd, here, key)


def _attempt_in(
    job: GateJob, checkout: Path, rel_cwd: str, here: str, key: str
) -> tuple[AttemptResult, bytes]:
    """The attempt, run in ``rel_cwd`` of this worker's checkout; its result and log."""
    from distributed import Event

    cwd = checkout / rel_cwd
    cwd.mkdir(parents=True, exist_ok=True)  # git keeps no empty folder
    with tempfile.TemporaryDirectory(prefix="dagrunner-remote-") as tmp:
        local = replace(
            job,
            cwd=str(cwd),
            log_path=str(Path(tmp) / "gate.log"),
            sandbox_dir=str(Path(tmp) / "sb"),
            tree=str(checkout),
            read_only=(str(ship.store_of(checkout)),),  # git in the checkout reads it
            hide=None,  # the submitter's cache store is not here
        )
        cancel = Event(f"{key}-cancel")

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

        began = time.monotonic()
        result = trio.run(main)
        ran = time.monotonic() - began
        log = Path(local.log_path).read_bytes() if Path(local.log_path).exists() else b""
        return replace(result, worker=here, ran=ran), log
