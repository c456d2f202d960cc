"""What runs on a Dask worker (``executors/dask.py`` submits it): the attempt, in a
checkout of the run's shipped source, at most once; and the small functions the
submitter runs on every worker (versions, tool fingerprints, the source's checkout).

Nothing here reads the submitter's filesystem: what a worker knows comes in the
arguments, and what it keeps lives under its own remote root (``DAGRUNNER_REMOTE_DIR``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from dagrunner.errors import DagrunnerError
from dagrunner.executors import source as ship
from dagrunner.git.repo import remote_root
from dagrunner.process.sandbox import AttemptResult, GateJob, run_job
from dagrunner.records.run import TestRun
from dagrunner.report.testresults import read_junit

CANCEL_WAIT = 2.0  # seconds between looks at the scheduler's cancel event of an attempt
NEED_SOURCE = "need-source"  # the worker has no checkout of the source yet: nothing ran
SLOT_THREADS = 256  # attempts at once on one worker (its declared cpu bounds them first)
# The threads attempts run on, in a worker process: made as attempts need them, kept for the
# next run's (at most SLOT_THREADS at once).
_POOL = ThreadPoolExecutor(SLOT_THREADS, thread_name_prefix="dagrunner-attempt")
MARKS_KEPT = 86400.0  # seconds an attempt's "ran here" mark is kept (Dask re-runs come sooner)
MARKS_SWEEP = 600.0  # seconds between looks for old marks, in one worker process
_SWEPT: dict[Path, float] = {}  # marks folder -> when this process last looked there
_SWEPT_LOCK = threading.Lock()


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


class Cancel:
    """How a cancel reaches one running attempt, from any thread: set before the attempt
    starts, it never starts; set while it runs, its trio loop is told at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._hook: Callable[[], None] | None = None

    def set(self) -> None:
        with self._lock:
            self._set, hook = True, self._hook
        if hook is not None:
            hook()

    def hook(self, hook: Callable[[], None] | None) -> bool:
        """Call ``hook`` when set (None: no longer); False when it is set already."""
        with self._lock:
            self._hook = hook
            return not self._set


class Slots:
    """The attempts of one run on one worker: a Dask actor (``executors/dask.py`` makes one
    per worker).  The submitter calls it straight, one round trip an attempt; the scheduler's
    task machinery (submission, placement, a result kept in memory there) is not on the way.

    Each attempt runs on a thread of its own, from one pool for every run this worker
    process serves (a pool per actor would leave its idle threads behind after each run);
    ``cancel`` ends one at once."""

    def __init__(self) -> None:
        from distributed import get_worker

        self.here = str(get_worker().address)
        self._cancels: dict[str, Cancel] = {}

    async def run(self, job: GateJob, rel_cwd: str, commit: str, key: str) -> Returned:
        cancel = self._cancels.setdefault(key, Cancel())
        context = contextvars.copy_context()  # the worker, for the Dask event's client
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                _POOL, context.run, run_remote, job, rel_cwd, commit, key, self.here, cancel
            )
        finally:
            self._cancels.pop(key, None)

    async def cancel(self, key: str) -> None:
        self._cancels.setdefault(key, Cancel()).set()


def run_remote(
    job: GateJob, rel_cwd: str, commit: str, key: str, here: str, cancel: Cancel
) -> Returned:
    """Executed on a Dask worker (by its ``Slots``): at most once per attempt, in a checkout
    of the run's source.

    At most once: an actor's call is never run again by Dask, save when the worker at that
    address died and its actor was made again there -- on this machine, with this remote
    root.  A mark made there (``O_EXCL``) before the gate starts is what the second call finds.

    A worker without the checkout (one that joined after the source was shipped) answers
    ``need-source`` without starting anything; the submitter stashes it there and asks again."""
    checkout = ship.ready(commit, remote_root())
    if checkout is None:
        return Returned(AttemptResult(exit_code=None, error=NEED_SOURCE, worker=here), b"")
    with ship.using(checkout, commit) as still_there:
        if not still_there:  # moved to another source between the look and the lock
            return Returned(AttemptResult(exit_code=None, error=NEED_SOURCE, worker=here), b"")
        if not _mark(key):  # this ran before, on the worker that died here: never twice
            return failed(f"worker-lost: worker {here} died while running the gate", here)
        return _attempt_in(job, checkout, rel_cwd, here, key, cancel)


def _mark(key: str) -> bool:
    """Mark ``key`` as run on this machine; False when it already was.  Marks older than
    ``MARKS_KEPT`` go, looked for at most every ``MARKS_SWEEP`` seconds, beside the attempt:
    a scan of a day's marks on every attempt's way would grow with the worker's work."""
    marks = remote_root() / "attempts"
    marks.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(marks / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    now = time.monotonic()
    with _SWEPT_LOCK:
        due = now - _SWEPT.get(marks, -MARKS_SWEEP) >= MARKS_SWEEP
        if due:
            _SWEPT[marks] = now
    if due:
        _POOL.submit(sweep_marks, marks)
    return True


def sweep_marks(marks: Path) -> int:
    """Remove the marks in ``marks`` older than ``MARKS_KEPT``; how many went."""
    now, gone = time.time(), 0
    with contextlib.suppress(OSError), os.scandir(marks) as entries:
        for old in entries:
            with contextlib.suppress(OSError):
                if now - old.stat(follow_symlinks=False).st_mtime > MARKS_KEPT:
                    os.unlink(old.path)
                    gone += 1
    return gone


def _attempt_in(
    job: GateJob, checkout: Path, rel_cwd: str, here: str, key: str, cancel: Cancel
) -> Returned:
    """The attempt, run in ``rel_cwd`` of this worker's checkout: its result, log and JUnit.
    It ends early when ``cancel`` is set (the submitter's call) or, looked at every
    ``CANCEL_WAIT`` seconds, the scheduler's cancel event (set while the submitter could not
    reach this worker)."""
    cwd = checkout / rel_cwd
    cwd.mkdir(parents=True, exist_ok=True)  # git keeps no empty folder
    tmp = tempfile.mkdtemp(prefix="dagrunner-remote-")
    try:
        local = replace(
            job,
            cwd=str(cwd),
            log_path=str(Path(tmp) / "gate.log"),
            sandbox_dir=str(Path(tmp) / "sb"),
            tree=str(checkout),
            read_only=(str(ship.store_of(checkout)),),  # git in the checkout reads it
            hide=None,  # the submitter's cache store is not here
        )

        async def main() -> AttemptResult:
            result: AttemptResult | None = None
            async with trio.open_nursery() as nursery:
                token, scope = trio.lowlevel.current_trio_token(), nursery.cancel_scope

                def told() -> None:
                    with contextlib.suppress(trio.RunFinishedError):
                        token.run_sync_soon(scope.cancel)

                async def watch() -> None:
                    while True:
                        await trio.sleep(CANCEL_WAIT)
                        if await trio.to_thread.run_sync(_cancelled, key, abandon_on_cancel=True):
                            scope.cancel()

                if cancel.hook(told):
                    nursery.start_soon(watch)
                    result = await run_job(local)
                cancel.hook(None)
                scope.cancel()
            return result or AttemptResult(exit_code=None, interrupted=True, error="cancelled")

        began_wall, began = time.time(), time.monotonic()
        result = trio.run(main)
        ran = time.monotonic() - began
        log = Path(local.log_path).read_bytes() if Path(local.log_path).exists() else b""
        # Read here, as a local run reads it (bounded; only if this attempt wrote it).
        tests: TestRun | None = read_junit(cwd / job.junit, since=began_wall) if job.junit else None
        return Returned(replace(result, worker=here, ran=ran, tests=tests), log)
    finally:  # beside the answer's way back, as a local run removes its gates' HOMEs at its end
        _POOL.submit(shutil.rmtree, tmp, ignore_errors=True)


def _cancelled(key: str) -> bool:
    """Whether the scheduler holds this attempt's cancel event set (False when it cannot be
    asked: the next look asks again).  Looking creates nothing there."""
    from distributed import Event

    try:
        return bool(Event(f"{key}-cancel").is_set())
    except Exception:
        return False
