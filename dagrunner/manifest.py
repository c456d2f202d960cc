"""Load and validate a release manifest (TOML, or JSON of the same shape).

The result is a tree of frozen records; nothing here runs anything.  Every
mistake is a :class:`DagrunnerError` naming the file, the key path and what
to do.  Cross-gate checks (unknown dependencies, cycles) live in ``graph.py``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import posixpath
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from dagrunner.contain import DEFAULT_MAX_PIDS
from dagrunner.diagnostics import Problems
from dagrunner.errors import DagrunnerError
from dagrunner.units import parse_duration, parse_size

SCHEMA_VERSION = 1
DEFAULT_MANIFEST = Path("manifests/release.toml")
DEFAULT_LOG_LIMIT = 1024 * 1024
DEFAULT_ESTIMATE = 1.0
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

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
    kind: str = "gate"  # gate | worker | integrate | land
    base: str = "HEAD"  # worker: the commit its worktree starts from
    target: str | None = None  # integrate: the branch to land on (default: the checked-out one)
    queue: bool = False  # integrate: also take envelopes already on the queue
    setup: tuple[str, ...] = ()  # worker: commands run in a new worktree before ``run``
    setup_timeout: float = 300.0


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
    gates: Mapping[str, GateSpec] = field(default_factory=dict)


class _TypeMismatch(Exception):
    pass


class _Table:
    """Reads one table's keys, remembering which were used, so leftovers are errors."""

    def __init__(self, data: object, key: str, file: str, problems: Problems) -> None:
        self.key = key
        self.file = file
        self.problems = problems
        self.used: set[str] = set()
        self.unknown: list[str] = []
        if not isinstance(data, dict):
            self.fail(
                "manifest-type",
                f"expected a table, got {_type_name(data)}",
                key=key or "(top level)",
                hint="write it as a [section] in TOML or an object in JSON",
            )
            data = {}
        self.data: dict[str, Any] = data

    def fail(self, code: str, message: str, *, key: str, hint: str) -> None:
        """Record a mistake at ``key`` and go on reading: every mistake is reported at once."""
        self.problems.add(DagrunnerError(code, message, where=self.file, key=key, hint=hint))

    def path(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def take(self, name: str, convert: Callable[[Any], T], default: T) -> T:
        """The converted value of ``name``; its default when missing or wrong (recorded)."""
        self.used.add(name)
        if name not in self.data:
            return default
        raw = self.data[name]
        try:
            return convert(raw)
        except _TypeMismatch as exc:
            self.fail(
                "manifest-type",
                f"expected {exc}, got {_type_name(raw)} {_show(raw)}",
                key=self.path(name),
                hint="see dagrunner's manifest reference (docs/manifest.md) for each key's type",
            )
        except ValueError as exc:
            self.fail(
                "manifest-value",
                str(exc),
                key=self.path(name),
                hint="see dagrunner's manifest reference (docs/manifest.md) for accepted values",
            )
        return default

    def table(self, name: str) -> _Table:
        self.used.add(name)
        return _Table(self.data.get(name, {}), self.path(name), self.file, self.problems)

    def finish(self) -> list[str]:
        """Record every key nobody read; the did-you-mean suggestions, to suppress consequences."""
        suggested = []
        for name in self.data:
            if name not in self.used:
                close = difflib.get_close_matches(name, sorted(self.used), n=1)
                suggested += close
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.fail(
                    "manifest-unknown-key",
                    f"unknown key {_show(name)}",
                    key=self.path(name),
                    hint=f"{hint}known keys here: {', '.join(sorted(self.used))}",
                )
        return suggested


def _show(value: object) -> str:
    """A bounded repr for messages (a value can be megabytes, or nested thousands deep)."""
    try:
        text = repr(value)
    except RecursionError:
        text = "(nested too deeply to show)"
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(value: object) -> str:
    return {dict: "table", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _text_ok(text: str) -> str:
    """Text that can reach a process: no NUL, no lone surrogate (JSON can carry both)."""
    if "\0" in text:
        raise ValueError(f"{_show(text)} holds a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{_show(text)} is not valid Unicode (a lone surrogate)") from None
    return text


def _string(raw: Any) -> str:
    if not isinstance(raw, str):
        raise _TypeMismatch("a string")
    return _text_ok(raw)


def _string_list(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise _TypeMismatch("an array of strings")
    return tuple(_text_ok(item) for item in raw)


def _number(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise _TypeMismatch("a number")
    if not math.isfinite(raw):
        raise ValueError(f"{raw} is not a finite number")
    if raw < 0:
        raise ValueError(f"{raw} is negative; use a number >= 0")
    return float(raw)


def _count(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _TypeMismatch("a whole number")
    if raw < 0:
        raise ValueError(f"{raw} is negative; use a whole number >= 0")
    return raw


def _positive(raw: Any) -> float:
    value = _number(raw)
    if value == 0:
        raise ValueError("must be greater than 0")
    return value


def _auto(convert: Callable[[Any], T]) -> Callable[[Any], T | None]:
    def inner(raw: Any) -> T | None:
        return None if raw == "auto" else convert(raw)

    return inner


def _duration(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise _TypeMismatch("a duration such as 90s or 5m")
    return parse_duration(raw)


def _timeout(raw: Any) -> float:
    seconds = _duration(raw)
    if seconds == 0:
        raise ValueError("a timeout of 0 would end the gate at once; leave it out for no timeout")
    return seconds


def _interval(raw: Any) -> float:
    seconds = _duration(raw)
    if seconds < 0.01:
        raise ValueError(f"{seconds:g}s is too short; use at least 10ms")
    return seconds


def _size(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise _TypeMismatch("a size such as 512M or 2G")
    return parse_size(raw)


def _fraction(raw: Any) -> float:
    value = _number(raw)
    if not 0 < value <= 1:
        raise ValueError(f"{value} is not a fraction in (0, 1]")
    return value


def _run(raw: Any) -> tuple[str, ...] | str:
    """A command: a non-empty argv list, or non-blank shell text (emptiness is checked by the caller)."""
    if isinstance(raw, str):
        return _text_ok(raw)
    argv = _string_list(raw) if isinstance(raw, list) else None
    if argv is None:
        raise _TypeMismatch("an array of strings (argv) or a string (run by sh -c)")
    return argv


def _is_empty(run: tuple[str, ...] | str) -> bool:
    return not run.strip() if isinstance(run, str) else not run or not run[0]


def _inside_repository(text: str, what: str) -> str:
    """A relative path that stays inside the repository (``a/../b`` is fine, ``../x`` is not)."""
    if PurePosixPath(text).is_absolute():
        raise ValueError(f"{_show(text)} is absolute; {what} is relative to the repository root")
    if posixpath.normpath(text).split("/")[0] == "..":
        raise ValueError(f"{_show(text)} climbs out of the repository; {what} must stay inside it")
    return text


def _relative_path(raw: Any) -> str:
    return _inside_repository(_string(raw), "cwd")


def _globs(raw: Any) -> tuple[str, ...]:
    return tuple(_inside_repository(p, "every input glob") for p in _string_list(raw))


def _env_names(raw: Any) -> tuple[str, ...]:
    names = _string_list(raw)
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    return names


def _env_values(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise _TypeMismatch('a table of NAME = "value"')
    for name, value in raw.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if not isinstance(value, str):
            raise _TypeMismatch(f"a string value for {name}")
        _text_ok(value)
    return dict(raw)


def _read_env(table: _Table) -> EnvSpec:
    env = EnvSpec(
        passed=table.take("pass", _env_names, ()), values=table.take("set", _env_values, {})
    )
    table.finish()
    return env


def _read_governor(table: _Table) -> GovernorSpec:
    default = GovernorSpec()
    spec = GovernorSpec(
        cpu=table.take("cpu", _auto(_positive), None),
        memory=table.take("memory", _auto(_size), None),
        memory_fraction=table.take("memory_fraction", _fraction, default.memory_fraction),
        max_load=table.take("max_load", _auto(_positive), None),
        min_available_memory=table.take("min_available_memory", _auto(_size), None),
        sample_interval=table.take("sample_interval", _interval, default.sample_interval),
        backfill_limit=table.take("backfill_limit", _duration, default.backfill_limit),
        enforce=table.take("enforce", _boolean, default.enforce),
        max_pids=table.take("max_pids", _count, default.max_pids),
    )
    table.finish()
    return spec


def _durations(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise _TypeMismatch('a table of GATE = "duration"')
    return {str(name): _duration(value) for name, value in raw.items()}


def _read_budget(table: _Table) -> BudgetSpec:
    spec = BudgetSpec(
        max_wall=table.take("max_wall", _duration, None),
        min_speedup=table.take("min_speedup", _positive, None),
        max_duration=table.take("max_duration", _durations, {}),
    )
    table.finish()
    return spec


def _read_gate(gate_id: str, table: _Table, defaults: GateSpec, kind: str = "gate") -> GateSpec:
    _check_id(gate_id, table)
    missing: tuple[str, ...] | str = ""  # a missing run reads as an empty one
    run = table.take("run", _run, missing)
    env_table = table.table("env")
    spec = GateSpec(
        id=gate_id,
        run=run,
        needs=table.take("needs", _string_list, ()),
        cpu=table.take("cpu", _positive, defaults.cpu),
        memory=table.take("memory", _size, defaults.memory),
        timeout=table.take("timeout", _timeout, defaults.timeout),
        retries=table.take("retries", _count, defaults.retries),
        env=_read_env(env_table),
        cwd=table.take("cwd", _relative_path, defaults.cwd),
        inputs=table.take("inputs", _globs, ()),
        tools=table.take("tools", _string_list, ()),
        estimate=table.take("estimate", _duration, defaults.estimate),
        max_duration=table.take("max_duration", _duration, None),
        log_limit=table.take("log_limit", _size, defaults.log_limit),
        description=table.take("description", _string, ""),
        kind=kind,
        base=table.take("base", _string, "HEAD") if kind == "worker" else "HEAD",
        setup=table.take("setup", _string_list, ()) if kind == "worker" else (),
        setup_timeout=table.take("setup_timeout", _timeout, 300.0) if kind == "worker" else 300.0,
    )
    suggested = table.finish()
    # A misspelt "run" is reported as the unknown key it is, not as its consequence.
    if _is_empty(run) and "run" not in suggested and not table.problems.has(table.path("run")):
        table.fail(
            "manifest-empty-run",
            "the gate has no 'run' command" if "run" not in table.data else "its 'run' is empty",
            key=table.path("run"),
            hint='give a command: run = ["program", "arg"] (argv) or run = "shell text"',
        )
    if len(set(spec.needs)) != len(spec.needs):
        table.fail(
            "manifest-value",
            "a dependency is listed twice",
            key=table.path("needs"),
            hint="list each gate once",
        )
    return spec


def _boolean(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise _TypeMismatch("true or false")
    return raw


def _check_id(node_id: str, table: _Table) -> None:
    if not _ID.fullmatch(node_id):
        table.fail(
            "manifest-bad-id",
            f"id {_show(node_id)} is not a safe name",
            key=table.key,
            hint="use letters, digits, '_', '-' and '.', starting with a letter or digit",
        )


def _read_worker(worker_id: str, table: _Table, defaults: GateSpec) -> GateSpec:
    """``[workers.X]``: a command run in its own worktree, whose result becomes an envelope."""
    return _read_gate(worker_id, table, defaults, kind="worker")


def _read_integrate(node_id: str, table: _Table) -> GateSpec:
    """``[integrate.Y]``: apply the envelopes of its workers in an integration worktree."""
    _check_id(node_id, table)
    spec = GateSpec(
        id=node_id,
        run=("integrate",),
        kind="integrate",
        needs=table.take("needs", _string_list, ()),
        target=table.take("target", _string, None),
        queue=table.take("queue", _boolean, False),
        description=table.take("description", _string, ""),
        memory=0,
        estimate=1.0,
    )
    table.finish()
    return spec


def _read_land(node_id: str, table: _Table) -> GateSpec:
    """``[land.Y]``: after its gates pass, move [integrate.Y]'s target to the integrated commit."""
    _check_id(node_id, table)
    needs: tuple[str, ...] = table.take("needs", _string_list, ())
    spec = GateSpec(
        id=LAND_PREFIX + node_id,
        run=("land",),
        kind="land",
        needs=(*needs, node_id),
        description=table.take("description", _string, ""),
        memory=0,
        estimate=0.5,
    )
    table.finish()
    return spec


def _read_defaults(table: _Table) -> GateSpec:
    base = GateSpec(id="defaults", run=("true",))
    spec = GateSpec(
        id="defaults",
        run=("true",),
        cpu=table.take("cpu", _positive, base.cpu),
        memory=table.take("memory", _size, base.memory),
        timeout=table.take("timeout", _timeout, base.timeout),
        retries=table.take("retries", _count, base.retries),
        cwd=table.take("cwd", _relative_path, base.cwd),
        estimate=table.take("estimate", _duration, base.estimate),
        log_limit=table.take("log_limit", _size, base.log_limit),
    )
    table.finish()
    return spec


def _no_duplicate_keys(file: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise DagrunnerError(
                    "manifest-duplicate-id",
                    f"{key!r} is defined twice",
                    where=file,
                    key=key,
                    hint="give each gate (and each key) one definition",
                )
            result[key] = value
        return result

    return hook


def _parse(path: Path, data: bytes) -> dict[str, Any]:
    try:
        return _parse_text(path, data)
    except RecursionError:
        raise DagrunnerError(
            "manifest-parse",
            "the file is nested too deeply to read",
            where=str(path),
            hint="a manifest needs a few levels of tables; flatten it",
        ) from None


def _parse_text(path: Path, data: bytes) -> dict[str, Any]:
    file = str(path)
    if path.suffix == ".json":
        try:
            parsed = json.loads(data, object_pairs_hook=_no_duplicate_keys(file))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DagrunnerError(
                "manifest-parse", f"not valid JSON: {exc}", where=file, hint="fix the syntax"
            ) from None
        if not isinstance(parsed, dict):
            raise DagrunnerError(
                "manifest-type", "the top level must be an object", where=file, hint="wrap it in {}"
            )
        return parsed
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DagrunnerError(
            "manifest-parse", f"not UTF-8: {exc}", where=file, hint="save the file as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        if "twice" in text or "overwrite" in text.lower():
            raise DagrunnerError(
                "manifest-duplicate-id",
                f"a table or key is defined twice ({text})",
                where=file,
                hint="give each gate (and each key) one definition",
            ) from None
        raise DagrunnerError(
            "manifest-parse", f"not valid TOML: {text}", where=file, hint="fix the syntax"
        ) from None


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
            hint="pass a manifest path, or run from a repository with manifests/release.toml",
        ) from None
    except OSError as exc:
        raise DagrunnerError(
            "manifest-unreadable", exc.strerror or str(exc), where=file, hint="check the path"
        ) from None
    problems = Problems(data.decode("utf-8", "replace"), json=path.suffix == ".json")
    top = _Table(_parse(path, data), "", file, problems)
    schema = top.take("schema", _count, SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        top.fail(
            "manifest-schema",
            f"schema {schema} is not supported (this dagrunner reads schema {SCHEMA_VERSION})",
            key="schema",
            hint=f"set schema = {SCHEMA_VERSION}",
        )
    name = top.take("name", _string, path.stem)
    description = top.take("description", _string, "")
    cache_salt = top.take("cache_salt", _string, "")
    governor = _read_governor(top.table("governor"))
    budget = _read_budget(top.table("budget"))
    env = _read_env(top.table("env"))
    defaults = _read_defaults(top.table("defaults"))
    gates: dict[str, GateSpec] = {}
    readers: dict[str, Callable[[str, _Table], GateSpec]] = {
        "gates": lambda i, t: _read_gate(i, t, defaults),
        "workers": lambda i, t: _read_worker(i, t, defaults),
        "integrate": _read_integrate,
        "land": _read_land,
    }
    for section, read in readers.items():
        table = top.table(section)
        for node_id in table.data:
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
                f"[budget] max_duration names {_show(gate_id)}, which is not defined",
                key=f"budget.max_duration.{gate_id}",
                hint=f"defined: {', '.join(sorted(gates))}",
            )
        else:
            gates[gate_id] = replace(gates[gate_id], max_duration=seconds)
    if not gates and not problems:
        top.fail(
            "manifest-no-gates",
            "the manifest defines no gates",
            key="gates",
            hint="add at least one [gates.NAME] table with a run = [...] command",
        )
    problems.raise_if_any()
    return Manifest(
        path=path,
        digest=hashlib.sha256(data).hexdigest(),
        name=name,
        description=description,
        governor=governor,
        budget=budget,
        env=env,
        cache_salt=cache_salt,
        gates=gates,
    )
