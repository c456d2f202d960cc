"""What runs on a Dask worker (``executors/dask.py`` submits it): the attempt, in a
checkout of the run's shipped source, at most once; and the small functions the
submitter runs on every worker (versions, tool fingerprints, the source's checkout).

Nothing here reads the submitter's filesystem: what a worker knows comes in the
arguments, and what it keeps lives under its own remote root (``DAGRUNNER_REMOTE_DIR``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from dagrunner.errors import DagrunnerError
from dagrunner.executors import source as ship
from dagrunner.git.repo import remote_root
from dagrunner.process.sandbox import AttemptResult, GateJob, run_job
from dagrunner.records.run import TestRun
from dagrunner.report.testresults import read_junit

CANCEL_WAIT = 1.0  # the cancel event is long-polled: at most this long per look
NEED_SOURCE = "need-source"  # the worker has no checkout of the source yet: nothing ran
MARKS_KEPT = 86400.0  # seconds an attempt's "ran here" mark is kept (Dask re-runs come sooner)


@dataclass(frozen=True)
class Returned:
    """What an attempt sends back: its result (with its JUnit file read there) and its log."""

    result: AttemptResult
    log: bytes


def failed(error: str, worker: str = "") -> Returned:
    """A failed attempt that never ran a gate, with its reason as its log."""
    return Returned(
        AttemptResult(exit_code=None, error=error, worker=worker), f"{error}\n".encode()
    )


def unreachable(place: str, patience: float) -> Returned:
    """An attempt the submitter gave up on (``timed-out``): no result within ``patience``."""
    why = (
        f"worker-unreachable: no result from {place} within {patience:g}s (the gate's timeout "
        "+ grace + [executor] margin); cancelled there, its tree ends when the worker is back"
    )
    return Returned(
        AttemptResult(exit_code=None, timed_out=True, error=why, worker=place), f"{why}\n".encode()
    )


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


STORE_MAX_AGE = 7 * 86400.0  # a worker's checkouts unused this long go (DAGRUNNER_REMOTE_MAX_AGE)
STORE_MAX_SIZE = 20 << 30  # and beyond this size, the least recently used (..._MAX_SIZE)


def prune_here(
    max_age: float | None = None, max_size: int | None = None, full: bool = False
) -> ship.Pruned:
    """Run on workers by ``client.run``: bound this worker's store (``source.prune``), by the
    bounds given, else the worker's own (``DAGRUNNER_REMOTE_MAX_AGE``/``_MAX_SIZE``)."""
    from dagrunner.units import parse_duration, parse_size

    age = os.environ.get("DAGRUNNER_REMOTE_MAX_AGE")
    size = os.environ.get("DAGRUNNER_REMOTE_MAX_SIZE")
    return ship.prune(
        remote_root(),
        max_age=max_age if max_age is not None else parse_duration(age) if age else STORE_MAX_AGE,
        max_size=max_size if max_size is not None else parse_size(size) if size else STORE_MAX_SIZE,
        full=full,
    )


def run_remote(job: GateJob, rel_cwd: str, commit: str, key: str) -> Returned:
    """Executed on a Dask worker: at most once per attempt, in a checkout of the run's source.

    At most once: the task is pinned to one worker's address, so Dask can run it again only
    at that address, after the worker there died -- on this machine, with this remote root.
    A mark made there (``O_EXCL``) before the gate starts is what the second run finds; the
    one scheduler round trip is ``started``, which tells the submitter the gate may have begun
    (a worker lost before it is placed again, one lost after it ends ``worker-lost``).

    A worker without the checkout (one that joined after the source was shipped) answers
    ``need-source`` without starting anything; the submitter stashes it there and asks again."""
    from distributed import Event, get_worker

    here = str(get_worker().address)
    checkout = ship.ready(commit, remote_root())
    if checkout is None:
        return Returned(AttemptResult(exit_code=None, error=NEED_SOURCE, worker=here), b"")
    with ship.using(checkout, commit) as still_there:
        if not still_there:  # moved to another source between the look and the lock
            return Returned(AttemptResult(exit_code=None, error=NEED_SOURCE, worker=here), b"")
        if not _mark(key):  # Dask ran this before, on the worker that died here: never twice
            return failed(f"worker-lost: worker {here} died while running the gate", here)
        Event(f"{key}-started").set()
        return _attempt_in(job, checkout, rel_cwd, here, key)


def _mark(key: str) -> bool:
    """Mark ``key`` as run on this machine; False when it already was."""
    marks = remote_root() / "attempts"
    marks.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(marks / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    if not key.endswith("0"):  # about one attempt in sixteen drops the old marks
        return True
    now = time.time()
    for old in marks.iterdir():
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > MARKS_KEPT:
                old.unlink()
    return True


def _attempt_in(job: GateJob, checkout: Path, rel_cwd: str, here: str, key: str) -> Returned:
    """The attempt, run in ``rel_cwd`` of this worker's checkout: its result, log and JUnit."""
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
                    while not await trio.to_thread.run_sync(
                        cancel.wait, CANCEL_WAIT, abandon_on_cancel=True
                    ):
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                result = await run_job(local)
                nursery.cancel_scope.cancel()
            return result or AttemptResult(exit_code=None, interrupted=True, error="cancelled")

        began_wall, began = time.time(), time.monotonic()
        result = trio.run(main)
        ran = time.monotonic() - began
        log = Path(local.log_path).read_bytes() if Path(local.log_path).exists() else b""
        # Read here, as a local run reads it (bounded; only if this attempt wrote it).
        tests: TestRun | None = read_junit(cwd / job.junit, since=began_wall) if job.junit else None
        return Returned(replace(result, worker=here, ran=ran, tests=tests), log)
