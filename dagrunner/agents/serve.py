"""``dagrunner integrate serve``: the integrator as a long-lived service.

It holds the target's integrator lock for its whole life (a second ``serve`` or ``run`` for
the target is ``integrator-busy``), drains the queue, and then waits for the journal to
change -- inotify on the queue's folder where the kernel has it, a stat of the journal
every half second where not -- and drains again.  Each drain runs in a child process
(``agents/drain``): the service holds the HTTP and MCP faces, the journal's index and the
lock, never the engine.  SIGTERM or SIGINT stops it within seconds: a run in flight is
interrupted by the pipeline's own handler in the child (its items are queued again, never
lost or failed) and the service ends; the next ``serve`` or ``run`` takes them.

It never spins: a run that cannot start (no manifest on the target, an integration worktree
it cannot use) is a ``stuck`` event on the target's items and waits until the target or the
queue changes; a refused landing (the target's checkout dirty) was said on its items once,
and nothing is gated again until the checkout or the target changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from dagrunner.agents.drain import Drained, drain_in_child, watch
from dagrunner.errors import DagrunnerError
from dagrunner.executors.factory import check_integration_executor
from dagrunner.integration.queue import Queue, integrator_lock
from dagrunner.worktrees.allocate import Context, default_target, open_context

if TYPE_CHECKING:
    from dagrunner.agents.http import Gauges

IDLE_TICK = 0.5  # seconds between looks for a stop request while nothing changes
# glibc's mallopt parameters (malloc.h): a long-lived service with a thread per HTTP request
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8
MMAP_THRESHOLD = 128 * 1024  # glibc's own default, kept from rising
ARENAS = 2


@dataclass
class Served:
    """What a service did before it stopped."""

    target: str
    # how many runs, not their results: a service lives for weeks, and each result (every
    # item's outcome) went to ``on_run`` already
    runs: int = 0
    stopped_by: str = ""
    errors: list[DagrunnerError] = field(default_factory=list)  # runs that could not start


def serve(
    *,
    repo: Path | None = None,
    target: str | None = None,
    env: Mapping[str, str] | None = None,
    on_run: Callable[[Drained], None] | None = None,
    executor: str = "local",
    http: str | None = None,
    token_file: Path | None = None,
    on_ready: Callable[[str], None] | None = None,
    on_error: Callable[[DagrunnerError], None] | None = None,
    prune_every: float | None = None,
    prune_keep: float | None = None,
) -> Served:
    """Drain ``target``'s queue whenever it has work, until SIGTERM or SIGINT; with ``http``
    (``HOST:PORT``), ``/metrics``, ``/healthz`` and the tools at ``/mcp`` beside it; with
    ``prune_every`` (seconds), ``integrate prune`` (keeping ``prune_keep``) whenever the queue
    is idle and that long has passed since the last."""
    check_integration_executor(executor)
    _bound_malloc()
    env = os.environ if env is None else env
    ctx = open_context(repo, env)
    goal = target or default_target(ctx)
    served = Served(target=goal)
    queue = Queue.of(ctx.info, target=goal)
    lock = ctx.info.state_dir / f"integrate-{goal.replace('/', '--')}.lock"
    with integrator_lock(lock, wait=False) as lock_fd, _stop_requests() as stop:
        gauges, stop_http = None, None
        if http is not None:
            from dagrunner.agents import http as face
            from dagrunner.agents.tools import Binding

            gauges = face.Gauges()
            stop_http = face.start(Binding(repo=repo, drive=False), http, token_file, gauges)
        if on_ready is not None:  # the lock is held: a second integrator is refused from now
            on_ready(goal)
        pruner = None
        if prune_every is not None:
            pruner = Pruner(repo, lock, prune_every, prune_keep)
        try:
            drain = Drain(repo, goal, executor, env, lock_fd, queue)
            _drain(ctx, drain, on_run, on_error, served, stop, gauges, pruner)
        finally:
            if stop_http is not None:
                stop_http()
    served.stopped_by = stop[0] if stop else ""
    return served


@dataclass(frozen=True)
class Drain:
    """How serve starts a drain: in a child process (``agents/drain``), under its lock."""

    repo: Path | None
    goal: str
    executor: str
    env: Mapping[str, str]
    lock_fd: int
    queue: Queue

    def __call__(self, stop: list[str], *, cleanups: bool = False) -> Drained:
        index = self.queue.index()
        return drain_in_child(
            repo=self.repo, target=self.goal, executor=self.executor, env=self.env,
            lock_fd=self.lock_fd, stop=stop, journal=self.queue.journal,
            on_change=index.refresh, cleanups=cleanups,
        )  # fmt: skip


def _drain(
    ctx: Context,
    drain: Drain,
    on_run: Callable[[Drained], None] | None,
    on_error: Callable[[DagrunnerError], None] | None,
    served: Served,
    stop: list[str],
    gauges: Gauges | None,
    pruner: Pruner | None = None,
) -> None:
    goal, queue = drain.goal, drain.queue
    cleanups = True  # the first child finishes what a killed predecessor left
    while not stop:
        if not cleanups and not queue.pending():
            if pruner is not None:
                pruner.when_due()
            _wait_for_change(queue.journal, stop, pruner.every if pruner else None)
            continue
        if gauges is not None:
            gauges.in_flight = 1
        try:
            result = drain(stop, cleanups=cleanups)
        finally:
            if gauges is not None:
                gauges.in_flight = 0
        cleanups = False
        if result.body is None and result.error is None:
            continue  # the queue had nothing (or a stop came first)
        if gauges is not None:
            gauges.runs += 1
        if result.error is not None:
            served.errors.append(result.error)
            if on_error is not None:
                on_error(result.error)
            # the target cannot be gated: not again until something changes
            _back_off(lambda: _state_of(ctx, goal, queue.journal), stop, STUCK_BACKOFF)
            continue
        served.runs += 1
        if on_run is not None:
            on_run(result)
        if result.interrupted:
            stop.append("signal")
        elif result.land_blocked:
            # landing was refused (the target's checkout dirty, its ref unwritable): the
            # run said so on its items once; gating again before the cause changes would
            # only be refused again, so wait for the checkout or the target to change
            _back_off(lambda: _checkout_state(ctx, goal), stop, REFUSED_BACKOFF)


STUCK_BACKOFF = 300.0  # seconds a stuck target waits, at most, when nothing it reads changes
REFUSED_BACKOFF = 600.0  # the same for a refused landing


def _back_off(state: Callable[[], object], stop: list[str], most: float) -> None:
    """Until ``state()`` changes, a stop is requested, or ``most`` seconds passed."""
    before, deadline = state(), time.monotonic() + most
    while not stop and time.monotonic() < deadline and state() == before:
        time.sleep(IDLE_TICK * 2)


def _ref(ctx: Context, goal: str) -> str:
    from dagrunner.git.command import git

    return git(["rev-parse", "-q", "--verify", f"refs/heads/{goal}"], cwd=ctx.info.root,
               check=False).text  # fmt: skip


def _state_of(ctx: Context, goal: str, journal: Path) -> object:
    """What a stuck integrator's cause may depend on: the target (a manifest committed) and
    the queue (an item withdrawn or submitted)."""
    return _ref(ctx, goal), _stamp(journal)


def _checkout_state(ctx: Context, goal: str) -> object:
    """What a refused landing depends on: the target, and its checkout's HEAD, index and
    whether it is dirty (cleaned, committed or stashed: each changes it)."""
    from dagrunner.git.command import is_dirty
    from dagrunner.integration.landing import checkout_of

    checkout = checkout_of(ctx.info.root, f"refs/heads/{goal}")
    if checkout is None:
        return _ref(ctx, goal)
    from dagrunner.git.command import git

    # the index's entries, not its file's time: ``git status`` refreshes that by itself
    staged = git(["ls-files", "--stage", "-z"], cwd=checkout, check=False).stdout
    head = git(["rev-parse", "-q", "--verify", "HEAD"], cwd=checkout, check=False).text
    return _ref(ctx, goal), is_dirty(checkout), hash(staged), head


@dataclass
class Pruner:
    """``integrate prune`` between drains, every ``every`` seconds (this service holds its
    target's integrator lock; another target's integrator running skips a turn)."""

    repo: Path | None
    lock: Path
    every: float
    keep: float | None
    last: float = field(default_factory=time.monotonic)

    def when_due(self) -> None:
        from dagrunner.errors import DagrunnerError
        from dagrunner.integration.run import DEFAULT_KEEP, prune

        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        try:
            done = prune(
                repo=self.repo,
                held=self.lock,
                keep=DEFAULT_KEEP if self.keep is None else self.keep,
            )
        except DagrunnerError as exc:
            print(f"prune skipped: {exc.message}", file=sys.stderr, flush=True)
            return
        print(
            f"pruned {done.items_before - done.items_after} final item(s); journal "
            f"{done.journal_bytes_before} -> {done.journal_bytes_after} bytes",
            file=sys.stderr,
            flush=True,
        )


@contextlib.contextmanager
def _stop_requests() -> Iterator[list[str]]:
    """A list that gets the signal's name when SIGTERM or SIGINT arrives (handlers restored
    after); the pipeline installs its own for a run's duration."""
    said: list[str] = []

    def note(number: int, _frame: FrameType | None) -> None:
        said.append(signal.Signals(number).name)

    before = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield said
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _bound_malloc() -> None:
    """Keep freed memory from staying in the service's RSS (glibc only; elsewhere nothing).

    Each ``dagrunner_wait`` reads the journal in chunks of a few hundred KiB on a worker
    thread.  glibc serves blocks that large from mmap at first, but raises that threshold to
    the size of every mmapped block freed, so later chunks come from the thread's own arena
    (one per thread, up to 8 per core) and stay there, fragmented, after the call: with ten
    waiters on a 10k-line journal, 5-6 MiB of serve's RSS (docs/benchmarks.md).  A fixed
    threshold hands such blocks back at once, and two arenas bound what threads keep."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_ARENA_MAX, ARENAS)


def _wait_for_change(journal: Path, stop: list[str], most: float | None = None) -> None:
    """Until the journal changes (or a stop is requested, or ``most`` seconds pass): inotify
    on its folder, else a stat of it every ``IDLE_TICK``."""
    journal.parent.mkdir(parents=True, exist_ok=True)
    until = None if most is None else time.monotonic() + most
    fd = watch(journal.parent)
    if fd is None:
        before = _stamp(journal)
        while (
            not stop and _stamp(journal) == before and (until is None or time.monotonic() < until)
        ):
            time.sleep(IDLE_TICK)
        return
    try:
        while not stop and (until is None or time.monotonic() < until):
            ready, _, _ = select.select([fd], [], [], IDLE_TICK)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 64 * 1024)
                return
    except InterruptedError:
        return
    finally:
        os.close(fd)


def _stamp(path: Path) -> tuple[int, int]:
    try:
        info = path.stat()
    except OSError:
        return (0, 0)
    return info.st_size, info.st_mtime_ns
