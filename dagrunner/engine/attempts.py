"""A node's attempts: jobs for the executor, retries, and the verdict on them.

``GateRunner`` is the scheduler's gate runner: plain gates and workers run as
commands through the executor (workers in their own worktree, gates that
depend on an integrate node in its worktree), integrate and land nodes as git
work through the run's ``NodeKinds``.  ``judge`` turns attempts into a status
and a one-line reason.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import networkx as nx
import trio

from dagrunner.engine.cachestep import RunCache
from dagrunner.engine.graph import spec
from dagrunner.engine.keys import WHOLE_TREE_GLOBS, declared_outputs
from dagrunner.engine.plan import NodeKinds, Plan
from dagrunner.engine.scheduler import Outcome
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.executors.base import Executor
from dagrunner.executors.local import LocalExecutor
from dagrunner.files import is_inside
from dagrunner.git import guard
from dagrunner.git.command import git
from dagrunner.manifest.load import GateSpec
from dagrunner.process import layers, toolcaches
from dagrunner.process.logs import redact_file
from dagrunner.process.sandbox import AttemptResult, GateJob, tree_environment
from dagrunner.process.toolcaches import ToolCaches, with_tool_caches, with_tree_caches
from dagrunner.records.run import Attempt, Status, TestRun
from dagrunner.report.logtail import read_log
from dagrunner.report.testnames import from_output
from dagrunner.report.testresults import read_junit
from dagrunner.units import format_duration

MEMORY_FLAG_RATIO = 1.5  # a gate's peak RSS this far past its declared memory is flagged
SANDBOX = "dagrunner-sandbox-"  # a run's folder of its gates' HOMEs and layers, in /tmp
OUTPUT_READ = 1 << 20  # the last bytes of a failed gate's log its failing tests are named from


def check_programs(plan: Plan) -> None:
    """Each gate whose ``run`` is an argv names a program this machine has (on its PATH,
    the tree's seeds first), or the run does not start (``gate-program-missing``, exit 3):
    not 95 s in, when the scheduler reaches it.  A program named by a path, or run by a
    shell string, is found when it starts (an earlier gate may make it)."""
    missing = []
    for node in plan.graph.nodes:
        gate = spec(plan.graph, node)
        if gate.kind != "gate" or isinstance(gate.run, str) or "/" in gate.run[0]:
            continue
        env = tree_environment(
            plan.envs[node], plan.repo, [s.path for s in plan.manifest.worktrees.seeds]
        )
        if shutil.which(gate.run[0], path=env.get("PATH", "")) is None:
            missing.append((node, gate.run[0]))
    if missing:
        node, program = missing[0]
        more = f" (and {len(missing) - 1} more: {', '.join(p for _, p in missing[1:])})"
        raise DagrunnerError(
            "gate-program-missing",
            f"gate {node!r} runs {program!r}, which is not on its PATH"
            + (more if missing[1:] else ""),
            where=str(plan.manifest.path),
            key=f"gates.{node}.run",
            hint=f"install {program} (or add the folder holding it to [env] pass PATH, or a "
            "seed), or comment the gate out; nothing ran",
            exit_code=ExitCode.ENVIRONMENT,
        )


class GateRunner:
    """Turns a node into jobs for the executor, with retries, and judges the attempts.

    Workers run in their own worktree and export an envelope; integrate and land
    nodes are git work done in a thread (``swarm.py``); gates that depend on an
    integrate node run in its worktree.
    """

    def __init__(
        self, plan: Plan, executor: Executor, run_dir: Path, cache: RunCache, nodes: NodeKinds
    ) -> None:
        self.plan = plan
        self.executor = executor
        self.run_dir = run_dir
        self.cache = cache
        self.nodes = nodes
        self.sandbox_root = Path(tempfile.mkdtemp(prefix=SANDBOX))
        self.local: Executor = LocalExecutor()
        # What every gate may write besides its tree and HOME: the manifest's [sandbox]
        # writable and, in a trusted run, the repository's git dir (workers commit there,
        # and a gate's git writes the index); an envelope's gates never write it.
        self.writable = plan.manifest.sandbox.writable
        if not plan.read_only:
            self.writable += _common_dir(plan.repo)
        # Each tree's tracked state before its first gate (``git/guard``); one check at a time
        self.snapshots: dict[Path, guard.TreeSnapshot | None] = {}
        self.guarding = trio.Lock()
        self.active: dict[Path, set[str]] = {}  # the guarded gates running in each tree
        # the trusted tier only for the caller's main checkout; a private layer elsewhere
        self.tools = ToolCaches(plan.repo, own=not plan.read_only)
        self.suspects: dict[str, str] = {}  # gate -> what changed while it ran
        self.listed: str | None = None  # the snapshot's paths, once a gate is given them
        # an envelope's tree: each gate on a layer of its own, where this process can mount
        layered = layers.in_force(plan.layered, local=executor.name == "local")
        self.layers = None
        if layered:  # other runs' left by a kill go first
            runs = self.sandbox_root.parent.glob(f"{SANDBOX}*")
            self.layers = layers.Layers(self.sandbox_root / "layers", runs)

    def drop_layers(self) -> None:
        if self.layers is not None:
            self.layers.drop()

    def job(
        self, gate: GateSpec, attempt: int, root: Path, tools: Path | None, layer: str = ""
    ) -> GateJob:
        """``tools``: the gate's tool cache folder (``ToolCaches``), when it has one;
        ``layer``: the merged folder of its own layer over ``root``, when it has one."""
        argv = ("/bin/sh", "-c", gate.run) if isinstance(gate.run, str) else gate.run
        env = tree_environment(
            self.plan.envs[gate.id], root, [s.path for s in self.plan.manifest.worktrees.seeds]
        )
        if not self.tools.main_checkout(root):  # turbo's cache: the tree's, not the checkout's
            env = with_tree_caches(env)
        caches: tuple[str, ...] = ()
        if tools is not None:
            env, caches = with_tool_caches(env, tools), (str(tools),)
        return GateJob(
            gate=gate.id,
            argv=argv,
            cwd=os.path.normpath(root / gate.cwd),
            env=env,
            sandbox_dir=str(self.sandbox_root / f"{gate.id}.{attempt}"),
            log_path=str(self.run_dir / "logs" / f"{gate.id}.try{attempt}.log"),
            log_limit=gate.log_limit,
            timeout=gate.timeout,
            sample_interval=self.plan.manifest.governor.sample_interval,
            memory_limit=gate.memory
            if self.plan.manifest.governor.enforce and gate.memory
            else None,
            max_pids=self.plan.manifest.governor.max_pids or None,
            hide=str(self.cache.store.root),
            tree=str(root),
            read_only=tuple(map(str, self.plan.read_only)),
            conceal=tuple(map(str, self.plan.conceal)),
            writable=(*self.writable, *gate.writable, *caches),
            cpu=gate.cpu,
            memory=gate.memory,
            junit=gate.junit or "",
            network=gate.network,
            wait_for_workers=self.plan.manifest.executor.wait_for_workers,
            margin=self.plan.manifest.executor.margin,
            # what it reads keys it (inputs = the whole tree) or shows undeclared inputs
            observe=str(root) if self.cache.observes(gate.id) else "",
            paths=self.paths(gate, root),
            layer=layer,
        )

    def clear_junit(self, gate: GateSpec, root: Path, seen: Path) -> None:
        """An observed gate's JUnit file, left by an earlier run (or attempt) and not a
        tracked file, removed before it starts (``inputs.Before.clear``) where the gate sees
        ``root``: the tree, or its own layer over it.  One the project does not ignore is in
        the snapshot but in no key (a declared output): removed too, or the gate rewrote an
        older file in place and its observation was incomplete (found on pallets/werkzeug)."""
        assert gate.junit is not None
        rel = os.path.normpath(os.path.join(gate.cwd, gate.junit))
        shot = self.cache.snapshot
        if root == shot.root and (rel not in shot.ids or rel in shot.untracked):
            self.cache.before.clear(seen, rel)

    def paths(self, gate: GateSpec, root: Path) -> str:
        """The snapshot's paths (the key's name set: tracked files and those not yet added
        that git does not ignore, declared outputs left out) under the gate's folder,
        relative to it, for a gate keyed by the whole tree of the snapshot; else "".  What
        it lists is then in its key, and no ``git ls-files`` reads git's database, which
        the observer cannot see (``process/view``, ``starter/hookgates``)."""
        shot = self.cache.snapshot
        if not WHOLE_TREE_GLOBS & set(gate.inputs) or root != shot.root or not shot.paths:
            return ""
        if self.listed is None:
            outputs = declared_outputs(self.plan.graph)
            self.listed = "\0".join(p for p in shot.paths if p not in outputs)
        under = os.path.normpath(gate.cwd).strip("/")
        if under in ("", "."):
            return self.listed
        return "\0".join(
            p[len(under) + 1 :] for p in self.listed.split("\0") if p.startswith(f"{under}/")
        )

    async def __call__(self, node: str, t0: float) -> Outcome:
        gate = spec(self.plan.graph, node)
        command = gate.run if isinstance(gate.run, str) else shlex.join(gate.run)
        if gate.kind in ("integrate", "land"):
            status, reason = await trio.to_thread.run_sync(self.nodes.run_node, node)
            return Outcome(status=status, reason=reason, command=f"[{gate.kind}]")
        try:
            # Allocating a worker's worktree is slow git work: a thread.  A gate's root is not.
            if gate.kind == "worker":
                root = await trio.to_thread.run_sync(self.nodes.cwd_root, node)
            else:
                root = self.nodes.cwd_root(node)
        except DagrunnerError as exc:
            return Outcome(
                status=Status.FAILED, reason=f"{exc.code}: {exc.message}", command=command
            )
        guarded = gate.kind == "gate" and self.executor_of(gate).name == "local"
        if guarded:
            async with self.guarding:  # before any gate of this tree starts
                if root not in self.snapshots:
                    self.snapshots[root] = await trio.to_thread.run_sync(guard.snapshot, root)
                self.active.setdefault(root, set()).add(node)
        layer, passed = None, False
        try:
            if guarded and self.layers is not None:
                below = list(reversed(list(nx.topological_sort(self.plan.graph.subgraph(
                    nx.ancestors(self.plan.graph, node))))))  # fmt: skip
                layer = await trio.to_thread.run_sync(self.layers.open, root, node, below)
            outcome = await self.attempts(gate, node, command, root, layer)
            if guarded:  # "running" until its own check: a change seen first elsewhere names it
                outcome = await self.unchanged(self.snapshots[root], root, node, outcome, layer)
            passed = outcome.status.ok
        except layers.LayerError as exc:
            self.active.get(root, set()).discard(node)
            reason = f"could not give the gate a layer of its own over {root}: {exc}"
            return Outcome(status=Status.FAILED, reason=reason, command=command)
        except BaseException:
            self.active.get(root, set()).discard(node)
            raise
        finally:
            if layer is not None and self.layers is not None:
                with trio.CancelScope(shield=True):  # a large layer's removal: not on the loop
                    await trio.to_thread.run_sync(self.layers.close, root, node, layer, passed)
        if gate.kind == "worker" and outcome.status.ok:
            try:
                note = await trio.to_thread.run_sync(self.nodes.export_worker, node)
            except DagrunnerError as exc:
                return replace(
                    outcome, status=Status.FAILED, reason=f"export failed: {exc.message}"
                )
            outcome = replace(outcome, reason="; ".join(filter(None, [note, outcome.reason])))
        return outcome

    async def unchanged(
        self,
        shot: guard.TreeSnapshot | None,
        root: Path,
        node: str,
        outcome: Outcome,
        layer: layers.Layer | None = None,
    ) -> Outcome:
        """``outcome``, failed (``tree-modified``) when a tracked file of the gate's tree
        changed while it ran: each is put back, the gate's version kept in the run folder.
        Gates share a tree, so every gate running in it when a change is seen is failed with
        the same proof: the one that wrote never passes (the files tell which it was)."""
        async with self.guarding:
            running = self.active.get(root, set())
            running.discard(node)
            if shot is None:
                return outcome
            if layer is not None:  # its writes are in its own layer: seen there, by it alone
                shot, running = replace(shot, tree=layer.merged), set()
            changed = await trio.to_thread.run_sync(guard.changes, shot)
            if changed:
                keep = self.run_dir / "changed" / node
                left = await trio.to_thread.run_sync(guard.put_back, shot, changed, keep)
                suspects = sorted({node, *running})
                said = _modified(changed, keep, left, suspects, layer is not None)
                for suspect in suspects:
                    self.suspects.setdefault(suspect, said)
            said = self.suspects.pop(node, "")
        return replace(outcome, status=Status.FAILED, reason=said) if said else outcome

    def kept(self, gate: GateSpec, root: Path) -> list[Path]:
        """The folders outside ``root`` the manifest lets ``gate`` write: kept between runs."""
        named = [Path(w) for w in (*self.plan.manifest.sandbox.writable, *gate.writable)]
        return [w for w in named if w.is_absolute() and not is_inside(w, root)]

    def executor_of(self, gate: GateSpec) -> Executor:
        """A worker node edits its worktree on this machine; gates go where the run sends them."""
        return self.local if gate.kind == "worker" else self.executor

    async def attempts(
        self, gate: GateSpec, node: str, command: str, root: Path, layer: layers.Layer | None
    ) -> Outcome:
        attempts: list[Attempt] = []
        result = AttemptResult(exit_code=None)
        number = 0
        began = time.time()  # a JUnit file older than this is not this run's
        tools = None
        if gate.kind == "gate" and self.executor_of(gate).name == "local":
            tools = await trio.to_thread.run_sync(self.tools.folder, gate.id, root)  # a copy
        # a cache it may trust by stat: its tool caches, a folder the manifest lets it write
        places = [*([tools] if tools is not None else []), *self.kept(gate, root)]
        warm = await trio.to_thread.run_sync(lambda: any(map(toolcaches.warm, places)))
        try:
            for number in range(1, gate.retries + 2):
                seen = layer.merged if layer is not None else root  # the gate's writes are there
                if tools is not None and gate.junit and self.cache.observes(gate.id):
                    await trio.to_thread.run_sync(self.clear_junit, gate, root, seen)
                job = self.job(gate, number, root, tools, str(layer.merged) if layer else "")
                if not Path(os.path.normpath(seen / gate.cwd)).is_dir():
                    return Outcome(
                        status=Status.FAILED,
                        reason=f"cwd {gate.cwd!r} does not exist in {root}",
                        command=command,
                    )
                started = trio.current_time()
                result = await self.executor_of(gate).execute(job)
                attempts.append(_attempt(node, number, started, trio.current_time(), result))
                if result.passed:
                    break
        finally:
            _keep_final_log(self.run_dir, node, len(attempts) or 1)
            if self.plan.secrets:  # once per kept log, after the final one got its name
                logs = self.run_dir / "logs"
                for kept in [f"{node}.log"] + [f"{node}.try{n}.log" for n in range(1, number + 1)]:
                    redact_file(logs / kept, self.plan.secrets)
        if not attempts:
            return Outcome(status=Status.FAILED, reason="no attempt ran", command=command)
        attempts[-1] = replace(attempts[-1], log=f"logs/{node}.log")
        self.cache.seen_reading(node, result.observation, warm=warm)  # before its proof
        outcome = judge(gate, tuple(attempts), command)
        failed = outcome.status is Status.FAILED
        outcome = replace(outcome, cache=self.cache.miss_proof(node, failed=failed))
        if gate.junit is None:  # a failure's tests named from its output, where it says them
            if outcome.status is not Status.FAILED:
                return outcome
            log = await trio.to_thread.run_sync(
                lambda: read_log(self.run_dir, f"logs/{node}.log", limit=OUTPUT_READ)
            )
            return replace(outcome, tests=from_output(log))
        if self.executor_of(gate).name != "local":  # read where it ran, and sent back
            tests = result.tests or TestRun(
                problem="no JUnit file came back: the attempt did not run to its end on a worker"
            )
        else:
            seen = layer.merged if layer is not None else root  # the gate's writes are there
            where = Path(os.path.normpath(seen / gate.cwd)) / gate.junit
            tests = await trio.to_thread.run_sync(lambda: read_junit(where, since=began, tree=seen))
        return replace(outcome, tests=tests)


def _modified(
    changed: list[str], keep: Path, left: list[str], running: list[str], layered: bool
) -> str:
    shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if changed[10:] else "")
    said = (
        f"tree-modified: tracked files of the tree under test changed while the gate ran: {shown}"
    )
    if len(running) > 1:  # any of them may have written: the kept files tell which
        said += f" (gates running then: {', '.join(running)})"
    undone = "the tree never saw them (the gate's own layer)" if layered else "put back"
    said += f"; {undone}, the changed versions kept in {keep}"
    if left:
        said += f"; left as changed: {', '.join(left[:10])}"
    return said


def _attempt(
    node: str, number: int, started: float, finished: float, result: AttemptResult
) -> Attempt:
    if result.ran is not None:  # measured where it ran: time queued elsewhere is not its own
        started = max(started, finished - result.ran)
    return Attempt(
        number=number,
        worker=result.worker,
        started=started,
        finished=finished,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        error=result.error,
        peak_rss=result.peak_rss,
        cpu_seconds=result.cpu_seconds,
        log_bytes=result.log_bytes,
        log_elided=result.log_elided,
        leftover_killed=result.leftover_killed,
        survivors=result.survivors,
        log=f"logs/{node}.try{number}.log",
    )


def _keep_final_log(run_dir: Path, node: str, final: int) -> None:
    source = run_dir / "logs" / f"{node}.try{final}.log"
    if source.exists():
        source.replace(run_dir / "logs" / f"{node}.log")


def judge(gate: GateSpec, attempts: tuple[Attempt, ...], command: str) -> Outcome:
    """The gate's status and a one-line reason, from its attempts."""
    last = attempts[-1]
    peak = max(a.peak_rss for a in attempts)
    exceeded = peak > gate.memory * MEMORY_FLAG_RATIO
    notes = []
    if exceeded:
        notes.append(
            f"peak memory {peak >> 20} MiB is well past the declared {gate.memory >> 20} MiB"
        )
    if last.leftover_killed:
        notes.append(f"{last.leftover_killed} leftover process(es) ended after exit")
    passed = last.exit_code == 0 and not last.timed_out and not last.survivors
    if passed:
        status = Status.PASSED if len(attempts) == 1 else Status.FLAKY
        if status is Status.FLAKY:
            first = attempts[0]
            notes.insert(0, f"flaky: passed on attempt {len(attempts)} after {_failure(first)}")
    else:
        status = Status.TIMED_OUT if last.timed_out else Status.FAILED
        notes.insert(0, _failure(last))
    return Outcome(
        status=status,
        reason="; ".join(notes),
        attempts=attempts,
        memory_exceeded=exceeded,
        command=command,
    )


def _failure(attempt: Attempt) -> str:
    if attempt.error:
        return attempt.error
    if attempt.timed_out:
        return f"timed out after {format_duration(attempt.duration)}; process tree ended"
    if attempt.survivors:
        return f"processes {list(attempt.survivors)} survived SIGKILL"
    if attempt.exit_code is not None and attempt.exit_code < 0:
        return f"killed by signal {-attempt.exit_code}"
    return f"exit code {attempt.exit_code}"


def _common_dir(repo: Path) -> tuple[str, ...]:
    """The git dir that ``repo``'s worktrees share (none outside git)."""
    found = git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=repo, check=False)
    return (found.text,) if found.returncode == 0 and found.text else ()
