"""Load and validate a release manifest (TOML, or JSON of the same shape).

The result is a tree of frozen records; nothing here runs anything.  Every
mistake is a :class:`DagrunnerError` naming the file, the key path and what
to do.  Cross-gate checks (unknown dependencies, cycles) live in ``graph.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from dagrunner.diagnostics import Problems
from dagrunner.errors import DagrunnerError
from dagrunner.manifest.fields import (
    SplitSpec,
    Table,
    auto,
    boolean,
    command,
    count,
    duration,
    durations,
    env_names,
    env_values,
    fraction,
    globs,
    interval,
    is_empty,
    network,
    positive,
    relative_path,
    retries,
    show,
    size,
    split_spec,
    string,
    string_list,
    timeout,
    writable_paths,
)
from dagrunner.manifest.settings import (
    INTEGRATE_SETTINGS,
    ExecutorSpec,
    IntegrateSpec,
    ReportSpec,
    SandboxSpec,
    WorktreesSpec,
    read_executor,
    read_integrate_settings,
    read_report,
    read_sandbox,
    read_worktrees,
)
from dagrunner.manifest.text import parse_text

SCHEMA_VERSION = 1
DEFAULT_MANIFEST = Path("manifests/release.toml")
STARTER_MANIFEST = Path("dagrunner.toml")  # what `dagrunner init` writes
DEFAULT_LOG_LIMIT = 1024 * 1024
DEFAULT_ESTIMATE = 1.0
DEFAULT_MAX_PIDS = 8192  # [governor] max_pids: processes one gate may have at once
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """Which caller variables pass into a gate, and which are set outright."""

    passed: tuple[str, ...] = ()
    values: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GateSpec:
    id: str
    run: tuple[str, ...] | str  # a tuple is argv; a str runs under ``sh -c``
    needs: tuple[str, ...] = ()
    cpu: float = 1.0
    memory: int = 256 * 1024 * 1024
    timeout: float | None = None
    retries: int = 0
    env: EnvSpec = EnvSpec()
    cwd: str = "."
    inputs: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    estimate: float | None = None  # expected seconds, used until history knows better
    max_duration: float | None = None
    log_limit: int = DEFAULT_LOG_LIMIT
    description: str = ""
    junit: str | None = None  # a JUnit XML file the gate writes, relative to its cwd
    kind: str = "gate"  # gate | worker | integrate | land
    base: str = "HEAD"  # worker: the commit its worktree starts from
    target: str | None = None  # integrate: the branch to land on (default: the checked-out one)
    queue: bool = False  # integrate: also take envelopes already on the queue
    setup: tuple[str, ...] = ()  # worker: commands run in a new worktree before ``run``
    setup_timeout: float = 300.0
    writable: tuple[str, ...] = ()  # besides its tree, HOME and TMPDIR (absolute or repo-relative)
    network: str = "host"  # or "isolated": a network namespace of its own, loopback only
    split: SplitSpec | None = None  # shards share out these files (engine/shards.py)
    shard_of: str = ""  # a shard: the gate it was split from ...
    shard_files: tuple[str, ...] = ()  # ... and the files it runs
    # Key the gate by the files it was seen to read when its inputs are the whole tree, and
    # report its reads outside narrower inputs (docs/cache.md); false: declared inputs only.
    observe: bool = False


KINDS = ("gate", "worker", "integrate", "land")
LAND_PREFIX = "land:"  # graph id of [land.Y]; ':' cannot appear in a manifest id


@dataclass(frozen=True, kw_only=True)
class GovernorSpec:
    cpu: float | None = None  # None: the machine's cores
    memory: int | None = None  # None: memory_fraction of available memory at start
    memory_fraction: float = 0.8
    max_load: float | None = None  # 1-minute load average per core; None: 2.0
    min_available_memory: int | None = None  # None: 5% of total
    sample_interval: float = 0.5
    backfill_limit: float = 60.0  # longest a blocked top gate lets smaller ones pass it
    enforce: bool = False  # declared memory becomes a hard cgroup limit where one is delegated
    max_pids: int = DEFAULT_MAX_PIDS  # processes one gate may have at once (0: no limit)


@dataclass(frozen=True, kw_only=True)
class BudgetSpec:
    max_wall: float | None = None
    min_speedup: float | None = None
    max_duration: Mapping[str, float] = field(default_factory=dict)  # per gate, merged into gates


@dataclass(frozen=True, kw_only=True)
class Manifest:
    path: Path
    digest: str
    name: str
    description: str = ""
    governor: GovernorSpec = GovernorSpec()
    budget: BudgetSpec = BudgetSpec()
    env: EnvSpec = EnvSpec()
    cache_salt: str = ""
    integrate: IntegrateSpec = field(default_factory=IntegrateSpec)
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    report: ReportSpec = field(default_factory=ReportSpec)
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    worktrees: WorktreesSpec = field(default_factory=WorktreesSpec)
    gates: Mapping[str, GateSpec] = field(default_factory=dict)


def _read_env(table: Table) -> EnvSpec:
    env = EnvSpec(
        passed=table.take("pass", env_names, ()), values=table.take("set", env_values, {})
    )
    table.finish()
    return env


def _read_governor(table: Table) -> GovernorSpec:
    default = GovernorSpec()
    spec = GovernorSpec(
        cpu=table.take("cpu", auto(positive), None),
        memory=table.take("memory", auto(size), None),
        memory_fraction=table.take("memory_fraction", fraction, default.memory_fraction),
        max_load=table.take("max_load", auto(positive), None),
        min_available_memory=table.take("min_available_memory", auto(size), None),
        sample_interval=table.take("sample_interval", interval, default.sample_interval),
        backfill_limit=table.take("backfill_limit", duration, default.backfill_limit),
        enforce=table.take("enforce", boolean, default.enforce),
        max_pids=table.take("max_pids", count, default.max_pids),
    )
    table.finish()
    return spec


def _read_budget(table: Table) -> BudgetSpec:
    spec = BudgetSpec(
        max_wall=table.take("max_wall", duration, None),
        min_speedup=table.take("min_speedup", positive, None),
        max_duration=table.take("max_duration", durations, {}),
    )
    table.finish()
    return spec


def _read_gate(gate_id: str, table: Table, defaults: GateSpec, kind: str = "gate") -> GateSpec:
    _check_id(gate_id, table)
    missing: tuple[str, ...] | str = ""  # a missing run reads as an empty one
    run = table.take("run", command, missing)
    env_table = table.table("env")
    spec = GateSpec(
        id=gate_id,
        run=run,
        needs=table.take("needs", string_list, ()),
        cpu=table.take("cpu", positive, defaults.cpu),
        memory=table.take("memory", size, defaults.memory),
        timeout=table.take("timeout", timeout, defaults.timeout),
        retries=table.take("retries", retries, defaults.retries),
        env=_read_env(env_table),
        cwd=table.take("cwd", relative_path, defaults.cwd),
        inputs=table.take("inputs", globs, ()),
        tools=table.take("tools", string_list, ()),
        estimate=table.take("estimate", duration, defaults.estimate),
        max_duration=table.take("max_duration", duration, None),
        log_limit=table.take("log_limit", size, defaults.log_limit),
        description=table.take("description", string, ""),
        junit=table.take("junit", relative_path, None),
        writable=table.take("writable", writable_paths, ()),
        network=table.take("network", network, defaults.network),
        split=table.take("split", split_spec, None) if kind == "gate" else None,
        observe=table.take("observe", boolean, defaults.observe) if kind == "gate" else False,
        kind=kind,
        base=table.take("base", string, "HEAD") if kind == "worker" else "HEAD",
        setup=table.take("setup", string_list, ()) if kind == "worker" else (),
        setup_timeout=table.take("setup_timeout", timeout, 300.0) if kind == "worker" else 300.0,
    )
    suggested = table.finish()
    # A misspelt "run" is reported as the unknown key it is, not as its consequence.
    if is_empty(run) and "run" not in suggested and not table.problems.has(table.path("run")):
        table.fail(
            "manifest-empty-run",
            "the gate has no 'run' command" if "run" not in table.data else "its 'run' is empty",
            key=table.path("run"),
            hint='give a command: run = ["program", "arg"] (argv) or run = "shell text"',
        )
    words = [run] if isinstance(run, str) else list(run)
    if spec.split is not None and not any("{files}" in word for word in words):
        table.fail(
            "manifest-split",
            "a split gate's run must say where its shard's files go",
            key=table.path("run"),
            hint='put "{files}" in run (it becomes the files, one argument each)',
        )
    if len(set(spec.needs)) != len(spec.needs):
        table.fail(
            "manifest-value",
            "a dependency is listed twice",
            key=table.path("needs"),
            hint="list each gate once",
        )
    return spec


def _check_id(node_id: str, table: Table) -> None:
    if not _ID.fullmatch(node_id):
        table.fail(
            "manifest-bad-id",
            f"id {show(node_id)} is not a safe name",
            key=table.key,
            hint="use letters, digits, '_', '-' and '.', starting with a letter or digit",
        )


def _read_worker(worker_id: str, table: Table, defaults: GateSpec) -> GateSpec:
    """``[workers.X]``: a command run in its own worktree, whose result becomes an envelope."""
    return _read_gate(worker_id, table, defaults, kind="worker")


def _read_integrate(node_id: str, table: Table) -> GateSpec:
    """``[integrate.Y]``: apply the envelopes of its workers in an integration worktree."""
    _check_id(node_id, table)
    spec = GateSpec(
        id=node_id,
        run=("integrate",),
        kind="integrate",
        needs=table.take("needs", string_list, ()),
        target=table.take("target", string, None),
        queue=table.take("queue", boolean, False),
        description=table.take("description", string, ""),
        memory=0,
        estimate=1.0,
    )
    table.finish()
    return spec


def _read_land(node_id: str, table: Table) -> GateSpec:
    """``[land.Y]``: after its gates pass, move [integrate.Y]'s target to the integrated commit."""
    _check_id(node_id, table)
    needs: tuple[str, ...] = table.take("needs", string_list, ())
    spec = GateSpec(
        id=LAND_PREFIX + node_id,
        run=("land",),
        kind="land",
        needs=(*needs, node_id),
        description=table.take("description", string, ""),
        memory=0,
        estimate=0.5,
    )
    table.finish()
    return spec


def _read_defaults(table: Table) -> GateSpec:
    base = GateSpec(id="defaults", run=("true",))
    spec = GateSpec(
        id="defaults",
        run=("true",),
        cpu=table.take("cpu", positive, base.cpu),
        memory=table.take("memory", size, base.memory),
        timeout=table.take("timeout", timeout, base.timeout),
        retries=table.take("retries", retries, base.retries),
        cwd=table.take("cwd", relative_path, base.cwd),
        estimate=table.take("estimate", duration, base.estimate),
        log_limit=table.take("log_limit", size, base.log_limit),
        network=table.take("network", network, base.network),
        # opt-in until a file another gate beside it made is told from its own (docs/cache.md)
        observe=table.take("observe", boolean, False),
    )
    table.finish()
    return spec


def load_manifest(path: Path) -> Manifest:
    """Read and validate the manifest at ``path``.

    Raises DagrunnerError (exit 2) for a missing file, bad syntax, an unknown
    key, a wrong type or value, a bad or duplicate id, or an empty ``run``.
    """
    file = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DagrunnerError(
            "manifest-not-found",
            "no such manifest",
            where=file,
            hint="pass a manifest path, or run from a repository with manifests/release.toml "
            "(or dagrunner.toml: `dagrunner init` writes one)",
        ) from None
    except OSError as exc:
        raise DagrunnerError(
            "manifest-unreadable", exc.strerror or str(exc), where=file, hint="check the path"
        ) from None
    problems = Problems(data.decode("utf-8", "replace"), json=path.suffix == ".json")
    top = Table(parse_text(path, data), "", file, problems)
    manifest = read_tables(top, path)
    problems.raise_if_any()
    return replace(manifest, digest=hashlib.sha256(data).hexdigest())


def default_manifest(repo: Path) -> Path:
    """``manifests/release.toml`` when the repository has it, else ``dagrunner.toml``."""
    if not (repo / DEFAULT_MANIFEST).exists() and (repo / STARTER_MANIFEST).is_file():
        return repo / STARTER_MANIFEST
    return repo / DEFAULT_MANIFEST


def read_tables(top: Table, path: Path) -> Manifest:
    """The manifest that ``top`` holds; every mistake is recorded in ``top.problems`` (the
    caller raises them).  ``schema.py`` runs it on a sample to learn every key it reads."""
    top.take("$schema", string, "")  # an editor's pointer to docs/manifest.schema.json
    schema = top.take("schema", count, SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        top.fail(
            "manifest-schema",
            f"schema {schema} is not supported (this dagrunner reads schema {SCHEMA_VERSION})",
            key="schema",
            hint=f"set schema = {SCHEMA_VERSION}",
        )
    name = top.take("name", string, path.stem)
    description = top.take("description", string, "")
    cache_salt = top.take("cache_salt", string, "")
    governor = _read_governor(top.table("governor"))
    budget = _read_budget(top.table("budget"))
    env = _read_env(top.table("env"))
    sandbox = read_sandbox(top.table("sandbox"))
    report = read_report(top.table("report"))
    executor = read_executor(top.table("executor"))
    worktrees = read_worktrees(top.table("worktrees"))
    defaults = _read_defaults(top.table("defaults"))
    gates: dict[str, GateSpec] = {}
    readers: dict[str, Callable[[str, Table], GateSpec]] = {
        "gates": lambda i, t: _read_gate(i, t, defaults),
        "workers": lambda i, t: _read_worker(i, t, defaults),
        "integrate": _read_integrate,
        "land": _read_land,
    }
    integrate = IntegrateSpec()
    for section, read in readers.items():
        table = top.table(section)
        if section == "integrate":
            integrate = read_integrate_settings(table)
        for node_id in table.data:
            if section == "integrate" and node_id in INTEGRATE_SETTINGS:
                continue
            table.used.add(node_id)
            spec = read(node_id, table.table(node_id))
            if spec.id in gates:
                top.fail(
                    "manifest-duplicate-id",
                    f"{node_id!r} is defined in [{section}] and as a {gates[spec.id].kind}",
                    key=f"{section}.{node_id}",
                    hint="ids are shared by gates, workers and integrate nodes; rename one",
                )
            gates[spec.id] = spec
    top.finish()
    for gate_id, seconds in budget.max_duration.items():
        if gate_id not in gates:
            top.fail(
                "manifest-unknown-dependency",
                f"[budget] max_duration names {show(gate_id)}, which is not defined",
                key=f"budget.max_duration.{gate_id}",
                hint=f"defined: {', '.join(sorted(gates))}",
            )
        else:
            gates[gate_id] = replace(gates[gate_id], max_duration=seconds)
    if not gates and not top.problems:
        top.fail(
            "manifest-no-gates",
            "the manifest defines no gates",
            key="gates",
            hint="add at least one [gates.NAME] table with a run = [...] command",
        )
    return Manifest(
        path=path,
        digest="",
        name=name,
        description=description,
        governor=governor,
        budget=budget,
        env=env,
        cache_salt=cache_salt,
        integrate=integrate,
        sandbox=sandbox,
        report=report,
        executor=executor,
        worktrees=worktrees,
        gates=gates,
    )
