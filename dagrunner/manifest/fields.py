"""Typed fields of a manifest table: converters, and a table reader that records every mistake.

Each converter takes a raw TOML/JSON value and returns a typed one, or raises
``TypeMismatch`` (wrong type) or ``ValueError`` (right type, value not
allowed).  ``Table.take`` turns either into a coded mistake at its key path
(``diagnostics.Problems``) and returns the default, so a file is read to the
end and every mistake is reported together.
"""

from __future__ import annotations

import difflib
import math
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from string import Formatter
from typing import Any, TypeVar

from dagrunner.diagnostics import Problems
from dagrunner.errors import DagrunnerError
from dagrunner.manifest.globs import glob_regex
from dagrunner.units import MAX_WINDOW, parse_duration, parse_size

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
T = TypeVar("T")


class TypeMismatch(Exception):
    pass


class Table:
    """Reads one table's keys, remembering which were used, so leftovers are errors."""

    def __init__(self, data: object, key: str, file: str, problems: Problems) -> None:
        self.key = key
        self.file = file
        self.problems = problems
        self.used: set[str] = set()
        self.unknown: list[str] = []
        # What was read, by key: how (its converter) or as which table; ``schema.py`` reads these.
        self.converters: dict[str, Callable[[Any], Any]] = {}
        self.children: dict[str, Table] = {}
        if not isinstance(data, dict):
            self.fail(
                "manifest-type",
                f"expected a table, got {type_name(data)}",
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
        self.converters[name] = convert
        if name not in self.data:
            return default
        raw = self.data[name]
        try:
            return convert(raw)
        except TypeMismatch as exc:
            self.fail(
                "manifest-type",
                f"expected {exc}, got {type_name(raw)} {show(raw)}",
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

    def table(self, name: str) -> Table:
        self.used.add(name)
        child = Table(self.data.get(name, {}), self.path(name), self.file, self.problems)
        self.children[name] = child
        return child

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
                    f"unknown key {show(name)}",
                    key=self.path(name),
                    hint=f"{hint}known keys here: {', '.join(sorted(self.used))}",
                )
        return suggested


def show(value: object) -> str:
    """A bounded repr for messages (a value can be megabytes, or nested thousands deep)."""
    try:
        text = repr(value)
    except RecursionError:
        text = "(nested too deeply to show)"
    return text if len(text) <= 80 else text[:77] + "..."


def type_name(value: object) -> str:
    return {dict: "table", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def text_ok(text: str) -> str:
    """Text that can reach a process: no NUL, no lone surrogate (JSON can carry both)."""
    if "\0" in text:
        raise ValueError(f"{show(text)} holds a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{show(text)} is not valid Unicode (a lone surrogate)") from None
    return text


def string(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeMismatch("a string")
    return text_ok(raw)


def string_list(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise TypeMismatch("an array of strings")
    return tuple(text_ok(item) for item in raw)


def number(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise TypeMismatch("a number")
    if not math.isfinite(raw):
        raise ValueError(f"{raw} is not a finite number")
    if raw < 0:
        raise ValueError(f"{raw} is negative; use a number >= 0")
    return float(raw)


def count(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeMismatch("a whole number")
    if raw < 0:
        raise ValueError(f"{raw} is negative; use a whole number >= 0")
    return raw


def window(raw: Any) -> int:
    """How many queue items an integration pipeline gates at once."""
    value = count(raw)
    if not 1 <= value <= MAX_WINDOW:
        raise ValueError(f"{value} is out of range; use 1 to {MAX_WINDOW}")
    return value


MAX_BATCH = 64  # envelopes gated together in one tree


def batch(raw: Any) -> int:
    """How many envelopes an integration item gates together (bisected on failure)."""
    value = count(raw)
    if not 1 <= value <= MAX_BATCH:
        raise ValueError(f'{value} is out of range; use 1 to {MAX_BATCH}, or "auto"')
    return value


BASELINES = ("absolute", "differential")


def baseline(raw: Any) -> str:
    """What an item is blamed for: every failure (absolute), or only the failures the
    target's own head does not have (differential)."""
    if not isinstance(raw, str):
        raise TypeMismatch("a string")
    if raw not in BASELINES:
        raise ValueError(f"{raw!r} is not one of {', '.join(BASELINES)}")
    return raw


MESSAGE_FIELDS = ("mission", "worker", "subject")
DEFAULT_MESSAGE = "dagrunner: integrate {mission}/{worker}"
MAX_MESSAGE = 1000


def message_template(raw: Any) -> str:
    """A landed commit's message above its trailers: text with ``{mission}``, ``{worker}``
    and ``{subject}`` (``{{``/``}}`` for braces); nothing else is substituted."""
    if not isinstance(raw, str):
        raise TypeMismatch("a string")
    if not raw.strip() or len(raw) > MAX_MESSAGE:
        raise ValueError(f"must be 1 to {MAX_MESSAGE} characters, not only spaces")
    try:
        parts = list(Formatter().parse(raw))
    except ValueError as exc:  # a lone brace
        raise ValueError(f"{show(raw)} is not a template: {exc} (write {{{{ for a brace)") from None
    for _, name, spec, conversion in parts:
        if name is not None and (name not in MESSAGE_FIELDS or spec or conversion):
            shown = (
                "{"
                + name
                + (f"!{conversion}" if conversion else "")
                + (f":{spec}" if spec else "")
                + "}"
            )
            raise ValueError(
                f"unknown placeholder {shown}; use {', '.join('{' + f + '}' for f in MESSAGE_FIELDS)}"
            )
    return raw


MAX_RETRIES = 10


def retries(raw: Any) -> int:
    """How often a failed gate is tried again: a handful, never a loop without end."""
    value = count(raw)
    if value > MAX_RETRIES:
        raise ValueError(f"{value} is out of range; use 0 to {MAX_RETRIES}")
    return value


def positive(raw: Any) -> float:
    value = number(raw)
    if value == 0:
        raise ValueError("must be greater than 0")
    return value


def auto(convert: Callable[[Any], T]) -> Callable[[Any], T | None]:
    def inner(raw: Any) -> T | None:
        return None if raw == "auto" else convert(raw)

    inner.__wrapped__ = convert  # type: ignore[attr-defined]  # what schema.py describes
    return inner


def duration(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise TypeMismatch("a duration such as 90s or 5m")
    return parse_duration(raw)


def timeout(raw: Any) -> float:
    seconds = duration(raw)
    if seconds == 0:
        raise ValueError("a timeout of 0 would end the gate at once; leave it out for no timeout")
    return seconds


def interval(raw: Any) -> float:
    seconds = duration(raw)
    if seconds < 0.01:
        raise ValueError(f"{seconds:g}s is too short; use at least 10ms")
    return seconds


def size(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise TypeMismatch("a size such as 512M or 2G")
    return parse_size(raw)


def fraction(raw: Any) -> float:
    value = number(raw)
    if not 0 < value <= 1:
        raise ValueError(f"{value} is not a fraction in (0, 1]")
    return value


def command(raw: Any) -> tuple[str, ...] | str:
    """A command: a non-empty argv list, or non-blank shell text (emptiness is checked by the caller)."""
    if isinstance(raw, str):
        return text_ok(raw)
    argv = string_list(raw) if isinstance(raw, list) else None
    if argv is None:
        raise TypeMismatch("an array of strings (argv) or a string (run by sh -c)")
    return argv


def is_empty(run: tuple[str, ...] | str) -> bool:
    return not run.strip() if isinstance(run, str) else not run or not run[0]


def inside_repository(text: str, what: str) -> str:
    """A relative path that stays inside the repository (``a/../b`` is fine, ``../x`` is not)."""
    if PurePosixPath(text).is_absolute():
        raise ValueError(f"{show(text)} is absolute; {what} is relative to the repository root")
    if posixpath.normpath(text).split("/")[0] == "..":
        raise ValueError(f"{show(text)} climbs out of the repository; {what} must stay inside it")
    return text


def relative_path(raw: Any) -> str:
    return inside_repository(string(raw), "cwd")


def writable_paths(raw: Any) -> tuple[str, ...]:
    """Places a gate may write besides its tree, HOME and TMPDIR: absolute paths, or paths
    relative to the repository root (which must stay inside it)."""
    paths = string_list(raw)
    for path in paths:
        if not path or "\n" in path:
            raise ValueError(f"{show(path)} is not a path")
        if not PurePosixPath(path).is_absolute():
            inside_repository(path, "a relative writable path")
        elif posixpath.normpath(path) == "/":
            raise ValueError("'/' would make the whole filesystem writable; name the folders")
    return paths


def globs(raw: Any) -> tuple[str, ...]:
    patterns = tuple(inside_repository(p, "every input glob") for p in string_list(raw))
    for pattern in patterns:
        glob_regex(pattern)  # raises ValueError: checked at load, not when the run starts
    return patterns


def env_names(raw: Any) -> tuple[str, ...]:
    names = string_list(raw)
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    return names


def env_values(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise TypeMismatch('a table of NAME = "value"')
    for name, value in raw.items():
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if not isinstance(value, str):
            raise TypeMismatch(f"a string value for {name}")
        text_ok(value)
    return dict(raw)


def durations(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise TypeMismatch('a table of GATE = "duration"')
    return {str(name): duration(value) for name, value in raw.items()}


def port_range(raw: Any) -> tuple[int, int]:
    """``"20000-29999"``: the ports a worktree may lease (1024 to 65535, low to high)."""
    if not isinstance(raw, str):
        raise TypeMismatch('a string such as "20000-29999"')
    low, dash, high = raw.partition("-")
    if not dash or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f'{show(raw)} is not a port range; write it as "20000-29999"')
    first, last = int(low), int(high)
    if not 1024 <= first <= last <= 65535:
        raise ValueError(f"{show(raw)} must lie within 1024-65535, low to high")
    return first, last


def port_count(raw: Any) -> int:
    value = count(raw)
    if value > 64:
        raise ValueError(f"{value} ports per worktree is too many; at most 64")
    return value


NETWORKS = ("host", "isolated")


def network(raw: Any) -> str:
    """``host`` (the machine's network) or ``isolated`` (a network of its own: loopback only)."""
    if not isinstance(raw, str):
        raise TypeMismatch("a string: host or isolated")
    if raw not in NETWORKS:
        raise ValueError(f"{show(raw)} is not a network; use host or isolated")
    return raw


def boolean(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise TypeMismatch("true or false")
    return raw


MAX_SHARDS = 64


@dataclass(frozen=True)
class SplitSpec:
    """A gate's ``split``: the files its shards share out, and how many shards (None: auto)."""

    files: tuple[str, ...]
    shards: int | None = None


def split_spec(raw: Any) -> SplitSpec:
    if not isinstance(raw, dict):
        raise TypeMismatch('a table such as { files = ["tests/**/test_*.py"], shards = "auto" }')
    unknown = sorted(set(raw) - {"files", "shards"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; split takes files and shards")
    if "files" not in raw:
        raise ValueError("files is missing: the globs of the files the shards share out")
    files = globs(raw["files"])
    if not files:
        raise ValueError("files is empty: name the globs of the files the shards share out")
    shards = raw.get("shards", "auto")
    if shards == "auto":
        return SplitSpec(files)
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f'shards must be "auto" or 1 to {MAX_SHARDS}, not {shards!r}')
    return SplitSpec(files, shards)
