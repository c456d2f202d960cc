"""Run gate attempts on a Dask distributed cluster (``--executor dask://HOST:PORT[?timeout=10s]``).

Workers share nothing with the submitter but the network (docs/distributed.md):

- **Source travels with the run.**  The checkout's full state is packed once per run as a
  commit and a git bundle (``source.bundle``) and checked out on every worker under its own
  cache root, out of band (no task depends on it: losing a worker loses no data).  A worker
  that joins later answers ``need-source`` and gets it then; one that cannot make the
  checkout fails the attempt (``worker-checkout``).
- **Capacity is the cluster's.**  ``machines()`` reads each worker's declared resources
  (``--resources "cpu=N,memory=BYTES"``; else its threads and memory limit); the governor
  admits no more than their sum, ``placement`` pins each attempt to one worker with room.
- **One round trip an attempt.**  Each worker holds one ``remote.Slots`` actor for the run;
  an attempt is a call to it, straight to the worker when every worker answers the
  submitter (``Actors.route``; else through the scheduler): the scheduler's task machinery
  is not on the way (1-2 ms a call against 10-15 ms a task here).
- **Faults are failures, and end.**  An attempt runs at most once (``remote.run_remote``);
  its worker leaving ends it ``worker-lost``, and none left is none: a gate no worker
  could take waits ``[executor] wait_for_workers`` and ends ``dask-no-capacity``.  The
  submitter keeps every deadline itself: no result by timeout + grace + ``[executor]
  margin`` is ``timed-out`` (worker-unreachable).  The manifest's ``retries`` decide.
- **Timing is the gate's.**  The worker measures the attempt from its start; time queued in
  Dask shows as the gate's wait, not its duration.  Its JUnit file is read there.

Cancelling an attempt (Ctrl-C, --fail-fast, a deadline) calls the worker's ``Slots`` and sets
a Dask ``Event`` it looks at every 2 s: the attempt ends its process tree there at once, or,
if the worker is unreachable, when it is back.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import trio

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.executors import remote
from dagrunner.executors import source as ship
from dagrunner.executors.actors import WAIT_STEP, Actors, Answer, settle
from dagrunner.executors.base import Fingerprint, Machine
from dagrunner.executors.placement import Placement, WorkerFacts, worker_size
from dagrunner.git.command import git
from dagrunner.names import is_object_id
from dagrunner.process.sandbox import AttemptResult, GateJob
from dagrunner.report.logtail import strip_ansi
from dagrunner.version import VERSION

PLACE_POLL = 0.05
STASH_TRIES = 3
ABANDON_WAIT = 5.0  # seconds the scheduler has to take an attempt's cancel event
GONE = "worker-gone"  # the worker left before the attempt was sent there: place it again


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
        self._ship_lock = threading.Lock()
        self._shipped: dict[str, ship.Shipment] = {}  # checkout -> its source, packed
        self._tops: dict[str, tuple[str, str]] = {}  # a gate's cwd -> (its checkout, path in it)
        self._warnings: list[str] = []
        self._pruned = False
        self._janitor = ThreadPoolExecutor(1, thread_name_prefix="dagrunner-dask-prune")
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="dagrunner-dask-ship")
        self._actors = Actors(self._client)
        self.placement = Placement()

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
        # A lost scheduler is said once, in the run's warnings and its attempts' reasons --
        # not as the client's own traceback on stderr.
        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
        logging.getLogger("distributed.batched").setLevel(logging.WARNING)  # its INFO has one
        logging.getLogger("asyncio").addFilter(_not_all_exit)  # the client's own, on loss
        try:
            return Client(self.address, timeout=self.timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise DagrunnerError(
                "dask-unreachable",
                f"cannot reach the Dask scheduler at {self.address}: {exc}",
                exit_code=ExitCode.ENVIRONMENT,
                hint="start one (dask scheduler; dask worker ADDRESS) or check the address",
            ) from None

    def workers(self, *, versions: bool = True) -> list[WorkerFacts]:
        """Every worker: what it declares (``cpu``/``memory`` resources, else its threads and
        memory limit) and its dagrunner and git versions (what ``doctor`` lists)."""
        workers = self._client.scheduler_info(n_workers=-1).get("workers", {})
        if not versions:
            return [
                WorkerFacts(address, *worker_size(info), dagrunner="", git="")
                for address, info in sorted(workers.items())
            ]
        found_versions = self._client.run(remote.facts_here, on_error="return") if workers else {}
        found = []
        for address, info in sorted(workers.items()):
            facts = found_versions.get(address)
            if isinstance(facts, tuple) and len(facts) == 2:
                (theirs, have_git), problem = facts, ""
            else:
                theirs, have_git = "", ""
                problem = f"dagrunner cannot run there: {type(facts).__name__}: {facts}"[:300]
            if not problem and theirs != VERSION:
                problem = f"dagrunner {theirs} there, {VERSION} here"
            if not problem and not have_git:
                problem = "git is not installed there"
            found.append(
                WorkerFacts(
                    address, *worker_size(info), dagrunner=theirs, git=have_git, problem=problem
                )
            )
        return found

    def machines(self) -> list[Machine]:
        """Where the gates will run; no worker, or one that cannot run them (another dagrunner
        version, no git), is an environment error before any gate runs."""
        workers = self.workers()
        if not workers:
            raise DagrunnerError(
                "dask-no-workers",
                f"the Dask scheduler at {self.address} has no workers",
                exit_code=ExitCode.ENVIRONMENT,
                hint="start one: dask worker " + self.address,
            )
        unfit = [w for w in workers if w.problem]
        if unfit:
            raise DagrunnerError(
                "dask-worker-unfit",
                "; ".join(f"{w.address}: {w.problem}" for w in unfit[:5]),
                exit_code=ExitCode.ENVIRONMENT,
                hint=f"install dagrunner {VERSION} and git on every worker "
                "(see dagrunner doctor --executor ...)",
            )
        machines = [Machine(w.address, w.cpu, w.memory) for w in workers]
        self._route(machines)
        self.placement.update(machines)
        for machine in machines:  # made now, beside the plan: the first gates do not wait
            self._actors.make(machine.name)
        if not self._pruned:  # each worker bounds its store once a run, beside the run
            self._pruned = True
            self._janitor.submit(self._client.run, remote.prune_here, on_error="return")
        return machines

    def prune_stores(
        self, max_age: float | None, max_size: int | None
    ) -> dict[str, ship.Pruned | str]:
        """Bound every worker's store now (``dagrunner cache prune --executor``): what each
        did, or why it could not."""
        done = self._client.run(remote.prune_here, max_age, max_size, True, on_error="return")
        return {
            address: found if isinstance(found, ship.Pruned) else f"{type(found).__name__}: {found}"
            for address, found in sorted(done.items())
        }

    def following(self) -> list[Machine]:
        """The workers now (no version check: ``machines`` did it), to follow joins and leaves:
        when none is left, none is -- what ran on them ends ``worker-lost``."""
        if self._lost():
            machines = []
        else:
            machines = [Machine(w.address, w.cpu, w.memory) for w in self.workers(versions=False)]
            self._route(machines)
        self.placement.update(machines)
        self._actors.keep({m.name for m in machines})
        return machines

    def _route(self, machines: list[Machine]) -> None:
        """Calls go straight to the workers while each answers from here (``Actors.route``)."""
        if warning := self._actors.route([m.name for m in machines]):
            self._warnings.append(warning)

    def _lost(self) -> str:
        """Why the scheduler is lost to this run ('' while it is not): the client gave up
        reconnecting to it and closed."""
        status = getattr(self._client, "status", "closed")
        if status not in ("closing", "closed"):
            return ""
        why = f"lost the Dask scheduler at {self.address} (no reconnect within {self.timeout})"
        if why not in self._warnings:
            self._warnings.append(why)
        return why

    def fingerprinter(self) -> Fingerprint:
        return self.fingerprint

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    def fingerprint(self, command: str, env: Mapping[str, str]) -> tuple[str, str]:
        """A tool's fingerprint on every worker: theirs when all agree; when they differ, one
        made of all of them (so no entry is shared between workers that disagree) and a
        warning naming who differs."""
        found = self._client.run(remote.fingerprint_here, command, dict(env), on_error="return")
        prints = {  # a tool's output is untrusted, like a gate's: no escape sequences
            a: (f[0], strip_ansi(f[1]))
            if isinstance(f, tuple)
            else ("error", strip_ansi(f"{type(f).__name__}: {f}"))
            for a, f in found.items()
        }
        if len({h for h, _ in prints.values()}) <= 1 and prints:
            return next(iter(prints.values()))
        by_worker = sorted(prints.items())
        self._warnings.append(
            f"tool {command!r} differs across workers: "
            + "; ".join(
                f"{a}: {text.splitlines()[0] if text else ''}" for a, (_, text) in by_worker
            )
            + " -- their cache entries are not shared"
        )
        combined = hashlib.sha256("\n".join(sorted({h for h, _ in prints.values()})).encode())
        return combined.hexdigest(), "\n".join(f"{a}: {text}" for a, (_, text) in by_worker)

    def _ship(self, cwd: str) -> tuple[str, str]:
        """The checkout holding ``cwd``, packed once per run and checked out on every worker:
        (the path of ``cwd`` inside it, the commit).  The bundle leaves out the sources every
        worker already holds."""
        if cwd not in self._tops:
            top = git(["rev-parse", "--show-toplevel"], cwd=Path(cwd)).text
            self._tops[cwd] = top, Path(cwd).resolve().relative_to(Path(top).resolve()).as_posix()
        top, rel = self._tops[cwd]
        with self._ship_lock:
            if top not in self._shipped:
                commit = ship.source_commit(Path(top))
                holds = self._client.run(remote.held_here, on_error="return")
                common = {c for c in set.intersection(
                    *(set(h) if isinstance(h, list) else set() for h in holds.values())
                ) if is_object_id(c)} if holds else set()  # fmt: skip
                packed = b""  # every worker has this state checked out already: none to send
                if commit not in common:
                    base = ship.known_here(Path(top), sorted(common))
                    packed = ship.bundle(Path(top), commit, base)
                    self._client.run(remote.stash_here, commit, packed, on_error="return")
                self._shipped[top] = ship.Shipment(commit, packed)
            commit = self._shipped[top].commit
        return rel, commit

    def _shipped_already(self, cwd: str) -> tuple[str, str] | None:
        """What ``_ship`` would answer, when it needs no git and no lock (the source of
        ``cwd`` is shipped already); None otherwise."""
        top, rel = self._tops.get(cwd, ("", ""))
        shipped = self._shipped.get(top) if top else None
        return None if shipped is None else (rel, shipped.commit)

    def ahead(self, checkout: Path) -> None:
        """Pack and ship ``checkout``'s source now, beside the run's plan, keys and tool
        fingerprints, so that its first gate does not wait for it (a failure is the first
        gate's again)."""
        self._ahead.submit(self._ship_quietly, str(checkout))

    def _ship_quietly(self, cwd: str) -> None:
        with contextlib.suppress(DagrunnerError, OSError):
            self._ship(cwd)

    def fresh(self, checkout: Path) -> None:
        """The source of ``checkout`` is packed again for its next gate (a pipeline slot)."""
        top = checkout.resolve()
        with self._ship_lock:
            for known in [k for k in self._shipped if Path(k).resolve() == top]:
                del self._shipped[known]

    def _stash(self, commit: str, worker: str) -> str:
        """Check ``commit`` out on one worker (it joined after the source was shipped, with the
        whole source); why it could not ('' when it could)."""
        top = next(t for t, s in self._shipped.items() if s.commit == commit)
        whole = ship.bundle(Path(top), commit)
        done = self._client.run(
            remote.stash_here, commit, whole, workers=[worker], on_error="return"
        )
        problem = done.get(worker)
        return "" if isinstance(problem, str) else f"{type(problem).__name__}: {problem}"[:300]

    async def execute(self, job: GateJob) -> AttemptResult:
        try:
            shipped = self._shipped_already(job.cwd)
            if shipped is None:
                shipped = await trio.to_thread.run_sync(self._ship, job.cwd)
            rel, commit = shipped
        except (DagrunnerError, OSError) as exc:
            return AttemptResult(exit_code=None, error=f"ship-failed: {exc}")
        key = f"dagrunner-{job.gate}-{uuid.uuid4().hex[:12]}"
        problem = ""
        for _ in range(STASH_TRIES):
            returned = await self._placed(job, rel, commit, key)
            if returned.result.error != remote.NEED_SOURCE:
                break
            worker = returned.result.worker
            problem = await trio.to_thread.run_sync(self._stash, commit, worker)
        else:
            returned = remote.failed(
                f"worker-checkout: on {worker}: {problem or 'no checkout'}", worker
            )
        Path(job.log_path).write_bytes(returned.log)
        return returned.result

    async def _placed(self, job: GateJob, rel: str, commit: str, key: str) -> remote.Returned:
        """The attempt on a worker with room for it now; placed again if that worker leaves
        before the gate starts.  While no worker there could ever take it (none is left, or
        none is big enough), it waits ``job.wait_for_workers`` for one, then fails
        ``dask-no-capacity`` -- it never ran."""
        lacking_since: float | None = None
        while True:
            if lost := self._lost():
                return remote.failed(f"dask-no-capacity: {lost}; the gate never started")
            place = self.placement.take(job.cpu, job.memory)
            if place is None:  # admitted, but no one worker has the room free yet
                now = trio.current_time()
                if self.placement.could_take(job.cpu, job.memory):
                    lacking_since = None  # one is busy: it frees as what runs there ends
                elif lacking_since is None:
                    lacking_since = now
                elif now - lacking_since >= job.wait_for_workers:
                    return remote.failed(self._no_capacity(job))
                await trio.sleep(PLACE_POLL)
                continue
            try:
                returned = await self._run(job, rel, commit, key, place)
            finally:
                self.placement.give_back(place, job.cpu, job.memory)
            if returned.result.error != GONE:
                return returned

    def _no_capacity(self, job: GateJob) -> str:
        have = ", ".join(
            f"{m.name} (cpu={m.cpu:g}, memory={m.memory})" for m in self.placement.machines.values()
        )
        return (
            f"dask-no-capacity: no worker of {self.address} can take cpu={job.cpu:g}, "
            f"memory={job.memory} (workers now: {have or 'none'}) after waiting "
            f"{job.wait_for_workers:g}s ([executor] wait_for_workers); the gate never started"
        )

    async def _run(
        self, job: GateJob, rel: str, commit: str, key: str, place: str
    ) -> remote.Returned:
        """One call of ``place``'s actor: its result and log.  A Dask error is a failed
        attempt; the worker leaving once the call is sent is ``worker-lost`` (the gate may
        have started: it is never run twice), before it ``GONE`` (place it again).  The
        submitter keeps the deadline too: no result by timeout + grace + margin is
        ``timed-out`` (worker-unreachable)."""
        slots = await self._actors.get(
            place, lambda: place in self.placement.machines and not self._lost()
        )
        if slots is None:
            return remote.Returned(AttemptResult(exit_code=None, error=GONE, worker=place), b"")
        call = slots.run(job, rel, commit, key)
        patience = None if job.timeout is None else job.timeout + job.grace + job.margin
        deadline = None if patience is None else trio.current_time() + patience
        try:
            waiting = Answer(call, self._client.loop.asyncio_loop)
            while True:
                done = await waiting.within(WAIT_STEP)
                if done is not None:
                    return done
                if lost := self._lost():
                    return remote.failed(f"worker-lost: {lost} while the gate ran on {place}")
                if place not in self.placement.machines:  # it left (or died and came back)
                    await self._abandoning(key, slots)
                    return remote.failed(f"worker-lost: worker {place} left during the gate", place)
                if deadline is not None and trio.current_time() > deadline:
                    await self._abandoning(key, slots)
                    return remote.unreachable(place, patience or 0.0)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await self._abandoning(key, slots)
                with trio.move_on_after(job.grace + 5) as waited:
                    await trio.to_thread.run_sync(settle, call, abandon_on_cancel=True)
                if not waited.cancelled_caught:  # it ended there: nothing to leave set
                    with trio.move_on_after(ABANDON_WAIT):
                        await trio.to_thread.run_sync(self._forget, key, abandon_on_cancel=True)
            raise
        except Exception as exc:  # the worker's connection closed under the call ...
            self._actors.drop(place)
            kind = type(exc).__name__
            gone = isinstance(exc, OSError)  # CommClosedError, "Unable to contact Actor's worker"
            code = f"worker-lost: worker {place}:" if gone else "dask-error:"
            return remote.failed(f"{code} {kind}: {str(exc)[:300]}", place if gone else "")

    async def _abandoning(self, key: str, slots: Any) -> None:
        """``_abandon``, given up after ``ABANDON_WAIT``: a frozen scheduler holds no one."""
        with trio.move_on_after(ABANDON_WAIT):
            await trio.to_thread.run_sync(self._abandon, key, slots, abandon_on_cancel=True)

    def _abandon(self, key: str, slots: Any) -> None:
        """End the attempt where it runs: a call to its actor, and its cancel event left set
        on the scheduler (a worker unreachable now ends the gate's tree when back)."""
        from distributed import Event

        with contextlib.suppress(Exception):  # a lost scheduler takes the task with it
            slots.cancel(key)  # not waited for: an unreachable worker would hold us
            Event(f"{key}-cancel", client=self._client).set()

    def _forget(self, key: str) -> None:
        """Drop an attempt's cancel event from the scheduler once it ended there."""
        from distributed import Event

        with contextlib.suppress(Exception):
            Event(f"{key}-cancel", client=self._client).clear()

    def close(self) -> None:
        self._ahead.shutdown(wait=True)
        self._janitor.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.close)


def _not_all_exit(record: logging.LogRecord) -> bool:
    """Drop asyncio's "never retrieved" traceback of the client's ``AllExit`` (a lost scheduler)."""
    return type(record.exc_info[1] if record.exc_info else None).__name__ != "AllExit"
