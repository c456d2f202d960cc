"""Run gate attempts on a Dask distributed cluster (``--executor dask://HOST:PORT[?timeout=10s]``).

Workers share nothing with the submitter but the network (docs/distributed.md):

- **Source travels with the run.**  The checkout's full state is packed once
  per run as a commit and a git bundle (``ship.pack``) and checked out on
  every worker under its own cache root (``ship.materialise``, out of band:
  the bundle is no task's dependency, so losing a worker loses no data).  A
  worker that joins later answers ``need-source`` and gets it then.  A gate
  runs only in that checkout: a worker that cannot make it fails the attempt
  (``worker-checkout``).
- **Capacity is the cluster's.**  ``machines()`` reads each worker's declared
  resources (``--resources "cpu=N,memory=BYTES"``; else its threads and memory
  limit); the governor admits no more than their sum, and each attempt asks
  Dask for its declared ``cpu``/``memory`` when every worker declares them.
- **Faults are failures.**  An attempt runs at most once: a task that Dask
  starts again because its worker died returns ``worker-lost`` (naming that
  worker) instead of running the gate a second time; any other Dask error is
  a failed attempt with a coded reason.  The manifest's ``retries`` decide.
- **Timing is the gate's.**  The worker measures the attempt from its start;
  time queued in Dask shows as the gate's wait, not its duration.

Cancelling an attempt (Ctrl-C, --fail-fast, a timeout of ours) sets a Dask
``Event`` that the remote task watches; it then ends its process tree there.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.executors import remote
from dagrunner.executors import source as ship
from dagrunner.executors.base import Fingerprint, Machine
from dagrunner.git.command import git
from dagrunner.process.sandbox import AttemptResult, GateJob
from dagrunner.report.logtail import strip_ansi
from dagrunner.version import VERSION

PLACE_POLL = 0.05
STASH_TRIES = 3
GONE = "worker-gone"  # the pinned worker left before the gate started: place it again
WAIT_STEP = 1.0


@dataclass(frozen=True)
class WorkerFacts:
    """What a worker has that gates depend on."""

    address: str
    cpu: float
    memory: int
    dagrunner: str  # its dagrunner version ("" when it has none)
    git: str  # its git version ("" when it has none)
    problem: str = ""  # why it cannot run gates ("" when it can)


def _size(info: Mapping[str, Any]) -> tuple[float, int]:
    """A worker's (cpu, memory): its declared resources, else its threads and memory limit."""
    resources = info.get("resources") or {}
    return (
        float(resources.get("cpu", info.get("nthreads", 1))),
        int(resources.get("memory", info.get("memory_limit") or 0)),
    )


_EPS = 1e-9


class Placement:
    """Which machine of a cluster takes an attempt now: the one it fits best (least room left
    after it), by what is declared in flight on each.  The governor admits against the sum;
    this keeps a gate off a machine that has the total but not the room free right now."""

    def __init__(self, machines: Sequence[Machine] = ()) -> None:
        self.machines: dict[str, Machine] = {}
        self.busy: dict[str, tuple[float, int]] = {}
        self.update(machines)

    def update(self, machines: Sequence[Machine]) -> None:
        """The machines now (joined ones added, gone ones dropped; in-flight use is kept)."""
        self.machines = {m.name: m for m in machines}

    def take(self, cpu: float, memory: int) -> str | None:
        """Reserve room for an attempt; the machine's name, or None when none has room now."""
        best: tuple[float, str] | None = None
        for name, machine in self.machines.items():
            used_cpu, used_memory = self.busy.get(name, (0.0, 0))
            room = machine.cpu - used_cpu - cpu
            fits_memory = not machine.memory or used_memory + memory <= machine.memory
            if room >= -_EPS and fits_memory and (best is None or room < best[0]):
                best = (room, name)
        if best is None:
            return None
        used_cpu, used_memory = self.busy.get(best[1], (0.0, 0))
        self.busy[best[1]] = (used_cpu + cpu, used_memory + memory)
        return best[1]

    def give_back(self, name: str, cpu: float, memory: int) -> None:
        used_cpu, used_memory = self.busy.get(name, (0.0, 0))
        self.busy[name] = (max(0.0, used_cpu - cpu), max(0, used_memory - memory))


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
        self._declared: frozenset[str] = frozenset()  # resources every worker declares
        self._ship_lock = threading.Lock()
        self._shipped: dict[str, ship.Shipment] = {}  # checkout -> its source, packed
        self._tops: dict[str, tuple[str, str]] = {}  # a gate's cwd -> (its checkout, path in it)
        self._warnings: list[str] = []
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
                WorkerFacts(address, *_size(info), dagrunner="", git="")
                for address, info in sorted(workers.items())
            ]
        found_versions = self._client.run(remote.facts_here, on_error="return") if workers else {}
        found = []
        declared: set[str] | None = None
        for address, info in sorted(workers.items()):
            resources = info.get("resources") or {}
            names = {k for k in ("cpu", "memory") if k in resources}
            declared = names if declared is None else declared & names
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
                WorkerFacts(address, *_size(info), dagrunner=theirs, git=have_git, problem=problem)
            )
        self._declared = frozenset(declared or ())
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
        self.placement.update(machines)
        return machines

    def following(self) -> list[Machine]:
        """The workers now (no version check: ``machines`` did it), to follow joins and leaves."""
        machines = [Machine(w.address, w.cpu, w.memory) for w in self.workers(versions=False)]
        if machines:
            self.placement.update(machines)
        return machines

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
                common = set.intersection(
                    *(set(h) if isinstance(h, list) else set() for h in holds.values())
                ) if holds else set()  # fmt: skip
                base = ship.known_here(Path(top), sorted(common - {commit}))
                packed = ship.bundle(Path(top), commit, base)
                self._client.run(remote.stash_here, commit, packed, on_error="return")
                self._shipped[top] = ship.Shipment(commit, packed)
            commit = self._shipped[top].commit
        return rel, commit

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
            rel, commit = await trio.to_thread.run_sync(self._ship, job.cwd)
        except (DagrunnerError, OSError) as exc:
            return AttemptResult(exit_code=None, error=f"ship-failed: {exc}")
        key = f"dagrunner-{job.gate}-{uuid.uuid4().hex[:12]}"
        try:
            problem = ""
            for _ in range(STASH_TRIES):
                result, log = await self._placed(job, rel, commit, key)
                if result.error != remote.NEED_SOURCE:
                    break
                problem = await trio.to_thread.run_sync(self._stash, commit, result.worker)
            else:
                result, log = remote.failed(
                    f"worker-checkout: on {result.worker}: {problem or 'no checkout'}",
                    result.worker,
                )
        finally:
            await trio.to_thread.run_sync(self._forget, key)
        Path(job.log_path).write_bytes(log)
        return result

    async def _placed(
        self, job: GateJob, rel: str, commit: str, key: str
    ) -> tuple[AttemptResult, bytes]:
        """The attempt on a worker with room for it now; placed again if that worker leaves
        before the gate starts."""
        while True:
            place = self.placement.take(job.cpu, job.memory)
            if place is None:  # admitted, but no one worker has the room free yet
                await trio.sleep(PLACE_POLL)
                continue
            try:
                result, log = await self._run(job, rel, commit, key, place)
            finally:
                self.placement.give_back(place, job.cpu, job.memory)
            if result.error != GONE:
                return result, log

    async def _run(
        self, job: GateJob, rel: str, commit: str, key: str, place: str
    ) -> tuple[AttemptResult, bytes]:
        """One submission, pinned to ``place``: its result and log.  A Dask error is a failed
        attempt; the worker leaving is ``worker-lost`` when the gate had started there (it is
        never run twice), else ``GONE`` (place it again)."""
        from distributed import Event

        resources = {
            name: value
            for name, value in (("cpu", job.cpu), ("memory", job.memory))
            if name in self._declared and value
        }
        future = self._client.submit(
            remote.run_remote,
            job,
            rel,
            commit,
            key,
            key=f"{key}-{uuid.uuid4().hex[:6]}",
            pure=False,
            retries=0,
            resources=resources or None,
            workers=[place],
            allow_other_workers=False,  # loose restrictions ignore resources on a re-run
        )
        try:
            while True:
                done = await trio.to_thread.run_sync(_wait, future, abandon_on_cancel=True)
                if done is not None:
                    return done
                if place not in self.placement.machines:  # it left (or died and came back)
                    await trio.to_thread.run_sync(future.cancel)
                    return await trio.to_thread.run_sync(self._left, key, place)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                event = Event(f"{key}-cancel", client=self._client)
                await trio.to_thread.run_sync(event.set)
                with trio.move_on_after(job.grace + 5):
                    await trio.to_thread.run_sync(_settle, future, abandon_on_cancel=True)
            raise
        except Exception as exc:  # KilledWorker, a worker's own error ...
            kind = type(exc).__name__
            code = "worker-lost" if kind == "KilledWorker" else "dask-error"
            return remote.failed(f"{code}: {kind}: {str(exc)[:300]}")

    def _left(self, key: str, place: str) -> tuple[AttemptResult, bytes]:
        from distributed import Event

        if Event(f"{key}-started", client=self._client).is_set():
            return remote.failed(f"worker-lost: worker {place} died while running the gate", place)
        return AttemptResult(exit_code=None, error=GONE, worker=place), b""

    def _forget(self, key: str) -> None:
        """Drop the attempt's events and variable from the scheduler."""
        from distributed import Event, Variable

        for name in (f"{key}-started", f"{key}-cancel"):
            Event(name, client=self._client).clear()
        Variable(f"{key}-where", client=self._client).delete()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.close)


def _wait(future: Any) -> tuple[AttemptResult, bytes] | None:
    """The attempt's result, or None when it is not done within a second."""
    from distributed import TimeoutError as DaskTimeout

    try:
        done: tuple[AttemptResult, bytes] = future.result(timeout=WAIT_STEP)
    except (DaskTimeout, TimeoutError):
        return None
    return done


def _settle(future: Any) -> None:
    """Wait for a cancelled attempt's task to end, whatever it ended with."""
    try:
        future.result()
    except Exception:
        return
