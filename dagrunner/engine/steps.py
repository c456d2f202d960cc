"""``release_check``: the run as a pipeline of named steps.

load (manifest) -> plan (graph, capacity, priorities) -> schedule (trio, governor,
executor) -> record (evidence, budget) -> report (run directory).
Each step is a plain function, testable alone; ``release_check`` chains them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import shutil
import signal
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import trio

from dagrunner.engine import shards
from dagrunner.engine.attempts import GateRunner, check_programs
from dagrunner.engine.cache import Store
from dagrunner.engine.cachestep import RunCache
from dagrunner.engine.evidence import check_budget, speed_evidence
from dagrunner.engine.governor import Governor, check_fits, resolve_capacity
from dagrunner.engine.graph import build_graph, expected_durations, select, spec
from dagrunner.engine.history import history_path, read_history, read_splits, record_history
from dagrunner.engine.keys import declared_outputs
from dagrunner.engine.landed import read_proof
from dagrunner.engine.plan import NodeKinds, PlainGates, Plan, RunOptions, check_network
from dagrunner.engine.scheduler import Scheduler
from dagrunner.executors.base import Executor, Machine
from dagrunner.executors.factory import executor_for
from dagrunner.git.command import head_info
from dagrunner.git.repo import cache_root, resolve_repo
from dagrunner.manifest.load import Manifest, default_manifest, load_manifest
from dagrunner.process import layers, racy
from dagrunner.process.contain import detect, disable_dumping, network_isolation
from dagrunner.process.logs import secret_values
from dagrunner.process.prove import last_proof
from dagrunner.process.sandbox import gate_environment
from dagrunner.process.tree import sweep_orphans
from dagrunner.records.run import GateResult, GovernorSample, RunRecord, RunStatus
from dagrunner.report.rundir import prepare_run_dir, write_run_dir
from dagrunner.version import VERSION

# -- steps --------------------------------------------------------------------


def load_step(options: RunOptions) -> tuple[Path, Manifest]:
    """The repository and its manifest (loaded once: a caller that has it passes ``loaded``)."""
    repo = resolve_repo(options.repo)
    if options.loaded is not None:
        return repo, options.loaded
    path = options.manifest if options.manifest is not None else default_manifest(repo)
    return repo, split_gates(repo, load_manifest(path), options)


def split_gates(repo: Path, manifest: Manifest, options: RunOptions) -> Manifest:
    """Each split gate as its shards (``engine/shards``), balanced by the history."""
    if not any(g.split is not None for g in manifest.gates.values()):
        return manifest
    cpu = resolve_capacity(manifest.governor, jobs=options.jobs).cpu
    history = history_path(repo, manifest.name, options.history_root)
    before = read_splits(history)
    cases, durations = read_history(history, "cases"), read_history(history)
    return shards.expand(manifest, repo, cpu, cases, before, durations)[0]


def plan_step(
    repo: Path, manifest: Manifest, options: RunOptions, machines: Sequence[Machine] = ()
) -> Plan:
    """``machines``: where a cluster runs the gates (empty: this machine)."""
    graph = build_graph(manifest)
    if options.only:
        graph = select(graph, shards.only(options.only, manifest), where=str(manifest.path))
    capacity = resolve_capacity(manifest.governor, jobs=options.jobs, machines=machines)
    check_fits(
        [spec(graph, n) for n in graph.nodes],
        capacity,
        where=str(manifest.path),
        machines=machines,
    )
    check_network(graph, manifest, options.executor)
    history = history_path(repo, manifest.name, options.history_root)
    git_info = head_info(repo)
    commit_time = git_info.get("commit_time")
    caller = options.environ if options.environ is not None else os.environ
    envs = {
        node: gate_environment(
            common=manifest.env,
            gate=spec(graph, node).env,
            caller=caller,
            source_date_epoch=commit_time if isinstance(commit_time, int) else 0,
        )
        for node in graph.nodes
    }
    return Plan(
        repo=repo,
        manifest=manifest,
        graph=graph,
        capacity=capacity,
        expected=expected_durations(graph, read_history(history)),
        history=history,
        envs=envs,
        git=git_info,
        secrets=secret_values(caller, envs),
        read_only=options.read_only,
        conceal=options.conceal,
        layered=options.layered,
    )


FOLLOW_INTERVAL = 2.0


async def _follow_cluster(
    plan: Plan, options: RunOptions, executor: Executor, scheduler: Scheduler
) -> None:
    """Workers that join or leave mid-run change the capacity the governor admits against."""
    governor = scheduler.governor
    while True:
        await trio.sleep(FOLLOW_INTERVAL)
        try:
            machines = await trio.to_thread.run_sync(executor.following)
        except Exception:
            continue
        if not machines:
            continue  # every worker gone for now: what runs ends worker-lost; wait for one
        grown = resolve_capacity(plan.manifest.governor, jobs=options.jobs, machines=machines)
        # Never below the largest gate: one the machines left cannot take still reaches the
        # executor, which waits [executor] wait_for_workers for a worker and then fails it.
        gates = [spec(plan.graph, n) for n in plan.graph.nodes]
        grown = replace(
            grown,
            cpu=max([grown.cpu, *(g.cpu for g in gates)]),
            memory=max([grown.memory, *(g.memory for g in gates)]),
        )
        bigger = grown.cpu > governor.capacity.cpu or grown.memory > governor.capacity.memory
        governor.capacity = grown
        if bigger:
            scheduler.wake()


@dataclass(frozen=True, kw_only=True)
class Scheduled:
    results: list[GateResult]
    governor: Governor
    samples: list[GovernorSample]  # this run's, on its own clock
    wall: float
    interrupted: bool
    warnings: list[str]


async def _sweep_orphans(interval: float, warnings: list[str]) -> None:
    """Periodically end processes that escaped a finished gate's group (setsid + orphaned)."""
    while True:
        await trio.sleep(interval)
        for pid, token in await trio.to_thread.run_sync(sweep_orphans):
            warnings.append(f"ended process {pid} left running by a finished gate (token {token})")


async def schedule_step(
    plan: Plan,
    options: RunOptions,
    run_dir: Path,
    cache: RunCache,
    executor: Executor,
    nodes: NodeKinds,
    governor: Governor | None = None,
) -> Scheduled:
    """Run the plan through the executor, under the governor (``governor``: one shared with
    other runs in this trio loop, which then also owns Ctrl-C)."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    shared = governor is not None
    governor = governor or Governor(plan.capacity)
    runner = GateRunner(plan, executor, run_dir, cache, nodes)
    scheduler = Scheduler(
        plan.graph,
        governor,
        run_gate=runner,
        lookup=cache.lookup,
        settled=cache.settled,
        expected=plan.expected,
        fail_fast=options.fail_fast,
        sample_interval=plan.manifest.governor.sample_interval,
        backfill_limit=plan.manifest.governor.backfill_limit,
        listener=options.listener,
    )
    start = trio.current_time()
    warnings: list[str] = []
    in_main_thread = threading.current_thread() is threading.main_thread()
    own_signals = in_main_thread and not shared
    signals = trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) if own_signals else None
    try:
        with signals or contextlib.nullcontext() as received:
            async with trio.open_nursery() as nursery:
                if received is not None:
                    nursery.start_soon(_interrupt_on_signal, received, scheduler)
                if executor.name == "local":
                    interval = max(plan.manifest.governor.sample_interval, 0.5)
                    nursery.start_soon(_sweep_orphans, interval, warnings)
                else:
                    nursery.start_soon(_follow_cluster, plan, options, executor, scheduler)
                results = await scheduler.run()
                nursery.cancel_scope.cancel()
        wall = trio.current_time() - start
        if executor.name == "local":
            for pid, token in await trio.to_thread.run_sync(sweep_orphans):
                warnings.append(f"ended process {pid} left running by a finished gate ({token})")
    finally:
        cache.land()  # whatever this run claimed and did not settle: its waiters look again
        runner.drop_layers()  # before the sandbox folder: a layer mounted in it goes first
        shutil.rmtree(runner.sandbox_root, ignore_errors=True)
        runner.tools.close()  # the run's private tool cache layers go with it
    return Scheduled(
        results=results,
        governor=governor,
        samples=scheduler.samples,
        wall=wall,
        interrupted=scheduler.interrupted,
        warnings=warnings,
    )


async def _interrupt_on_signal(signals: Any, scheduler: Scheduler) -> None:
    async for _ in signals:
        scheduler.interrupt()
        return


def record_step(
    plan: Plan,
    options: RunOptions,
    *,
    run_id: str,
    started_at: str,
    scheduled: Scheduled,
) -> RunRecord:
    results, governor, wall = scheduled.results, scheduled.governor, scheduled.wall
    speed = speed_evidence(plan.graph, results, wall=wall, capacity_cpu=plan.capacity.cpu)
    budget = check_budget(plan.manifest.budget, plan.graph, results, speed)
    if scheduled.interrupted:
        status = RunStatus.INTERRUPTED
    elif all(r.status.ok for r in results) and budget.ok:
        status = RunStatus.PASSED
    else:
        status = RunStatus.FAILED
    memory = psutil.virtual_memory()
    return RunRecord(
        run_id=run_id,
        status=status,
        started_at=started_at,
        wall=round(wall, 4),
        manifest={
            "path": str(plan.manifest.path),
            "name": plan.manifest.name,
            "digest": plan.manifest.digest,
        },
        git=plan.git,
        machine={
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "memory_total": memory.total,
            "dagrunner": VERSION,
            "containment": {
                **detect().to_json(),
                "network_isolation": _isolation(plan),
                "proof": last_proof(detect()),  # doctor --prove's last verdict here
            },
        },
        governor={
            "capacity": plan.capacity.to_json(),
            "peak_declared_cpu": governor.peak_cpu,
            "peak_declared_memory": governor.peak_memory,
            "samples": [s.__dict__ for s in scheduled.samples],
        },
        gates=results,
        speed=speed,
        budget=budget,
        options={
            "jobs": options.jobs,
            "only": list(options.only),
            "fail_fast": options.fail_fast,
            "no_cache": options.no_cache,
            "executor": options.executor,
            "expected": {k: round(v, 4) for k, v in plan.expected.items()},
        },
        warnings=scheduled.warnings,
    )


def new_run_id() -> str:
    now = dt.datetime.now(dt.UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


def _isolation(plan: Plan) -> bool | None:
    """Whether gates may get a network of their own; None (not probed: 40 ms of processes)
    when no gate of the run asks for one."""
    nodes = plan.graph.nodes
    return (
        network_isolation()
        if any(spec(plan.graph, n).network == "isolated" for n in nodes)
        else None
    )


def release_check(options: RunOptions) -> tuple[RunRecord, Path]:
    """Run the manifest's gates; the run's record and its directory.

    Raises DagrunnerError for bad input before anything runs.
    """
    disable_dumping()  # gates (and anything else of our user) cannot read our /proc
    repo, manifest = load_step(options)
    with executor_for(options.executor) as executor:
        machines = executor.machines()
        executor.ahead(repo)  # beside the plan and the keys: the first gate need not wait
        plan = plan_step(repo, manifest, options, machines)
        if options.executor == "local":
            check_programs(plan)
        return _run(plan, options, executor)


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A run's set-up before its gates are scheduled."""

    run_id: str
    run_dir: Path
    started_at: str
    cache: RunCache
    nodes: NodeKinds
    settled: racy.Settled | None  # its set-up in the tree (``racy.prepare``): end it


def _prepare(plan: Plan, options: RunOptions, executor: Executor) -> Prepared:
    run_id = new_run_id()
    run_dir = prepare_run_dir(plan.repo, options.report_dir, run_id, plan.manifest.report.dir)
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    env = options.environ if options.environ is not None else os.environ
    # files rewritten in the second a gate read them (an integration tree is checked out
    # afresh, and its tool caches name other paths: nothing of an earlier run is stale there)
    racy_state = (options.cache_root or cache_root()) / "racy"
    outputs = declared_outputs(plan.graph)  # rewritten by every run: no tool trusts their time
    settled = None if options.trusted else racy.prepare(racy_state, plan.repo, outputs)
    cache = RunCache(
        manifest=plan.manifest,
        graph=plan.graph,
        repo=plan.repo,
        envs=plan.envs,
        run_dir=run_dir,
        read=not options.no_cache,
        store=Store(
            options.cache_root,
            layered=layers.in_force(options.layered, local=executor.name == "local"),
        ),
        fingerprint=executor.fingerprinter(),
        # An envelope's tree (its gates see the repository read-only) is the tools' cwd: a
        # `pip/` or a module it adds there shadows what `python -m pip` imports, which no
        # identity read from outside covers -- so there its tools run every time.
        remember_tools=not plan.read_only,
        trusted=options.trusted,
        ahead=options.ahead,
        run_id=run_id,
        flights=options.flights,
        # what lands gets a proof of these keys; the integrator reset that tree just now
        whole_tree=options.trusted is not None,
        landed=read_proof(plan.repo, options.target, env) if options.reuse_landed else None,
    )
    nodes = (options.node_kinds or PlainGates.open)(plan, run_id, env)
    return Prepared(
        run_id=run_id,
        run_dir=run_dir,
        started_at=started_at,
        cache=cache,
        nodes=nodes,
        settled=settled,
    )


def _finish(
    plan: Plan, options: RunOptions, executor: Executor, prepared: Prepared, scheduled: Scheduled
) -> tuple[RunRecord, Path]:
    cache, run_dir = prepared.cache, prepared.run_dir
    # Tool fingerprints ran before the schedule: the user waited for them too.
    scheduled = replace(scheduled, wall=scheduled.wall + cache.setup_seconds)
    integration = prepared.nodes.finish(scheduled.results, interrupted=scheduled.interrupted)
    record = record_step(
        plan, options, run_id=prepared.run_id, started_at=prepared.started_at, scheduled=scheduled
    )
    record.cache = cache.summary(scheduled.results)
    record.integration = integration
    racy_warnings = prepared.settled.warnings if prepared.settled else []
    record.warnings = cache.warnings() + executor.warnings + racy_warnings + record.warnings
    write_run_dir(record, run_dir)
    record_history(plan.history, scheduled.results, shards.assignment(plan.manifest))
    return record, run_dir


def _run(plan: Plan, options: RunOptions, executor: Executor) -> tuple[RunRecord, Path]:
    prepared = _prepare(plan, options, executor)
    try:
        scheduled = trio.run(
            schedule_step, plan, options, prepared.run_dir, prepared.cache, executor, prepared.nodes
        )
    except BaseException:
        prepared.nodes.finish([], interrupted=True)  # requeue what was applied, release the locks
        raise
    finally:  # the gates are over: a write in a later second came after every read of theirs
        if prepared.settled:
            prepared.settled.end()
    return _finish(plan, options, executor, prepared, scheduled)


async def gate_run(
    options: RunOptions, executor: Executor, governor: Governor
) -> tuple[RunRecord, Path]:
    """``release_check`` inside a running trio loop, under a ``governor`` shared with the
    loop's other runs and on an ``executor`` it opened: an integration pipeline gates several
    trees at once this way.  Blocking steps (git, fingerprints, the report) run in threads."""
    disable_dumping()
    repo, manifest = await trio.to_thread.run_sync(load_step, options)
    machines = await trio.to_thread.run_sync(executor.machines)
    executor.ahead(repo)
    plan = await trio.to_thread.run_sync(plan_step, repo, manifest, options, machines)
    prepared = await trio.to_thread.run_sync(_prepare, plan, options, executor)
    try:
        scheduled = await schedule_step(
            plan, options, prepared.run_dir, prepared.cache, executor, prepared.nodes, governor
        )
    except BaseException:  # cancelled by a reset, or Ctrl-C: as _run does
        prepared.nodes.finish([], interrupted=True)
        raise
    finally:  # as _run does; not awaited: a cancelled run must still record it
        if prepared.settled:
            prepared.settled.end()
    return await trio.to_thread.run_sync(_finish, plan, options, executor, prepared, scheduled)


__all__ = ["Plan", "RunOptions", "gate_run", "load_step", "plan_step", "release_check"]
