"""The run-wide settings tables of a manifest: ``[sandbox]``, ``[executor]`` and
``[integrate]``'s own keys (``load`` reads the rest)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from dagrunner.manifest.fields import (
    DEFAULT_MESSAGE,
    Table,
    TypeMismatch,
    auto,
    baseline,
    batch,
    command,
    count,
    duration,
    globs,
    inside_repository,
    is_empty,
    message_template,
    port_count,
    port_range,
    show,
    size,
    string,
    string_list,
    timeout,
    window,
    writable_paths,
)


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """``[sandbox]``: what every gate may write besides its tree, HOME and TMPDIR."""

    writable: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReportSpec:
    """``[report]``: where ``release-check`` writes its runs.  "" (the default): outside the
    tree under test, ``<git common dir>/dagrunner/reports`` -- a gate that walks the tree
    never meets a log, ``run.json`` or page of dagrunner's; a folder named here (relative to
    the repository) is the project's choice, made visible to such gates (docs/manifest.md)."""

    dir: str = ""


def read_report(table: Table) -> ReportSpec:
    spec = ReportSpec(dir=table.take("dir", string, ""))
    table.finish()
    return spec


def read_sandbox(table: Table) -> SandboxSpec:
    spec = SandboxSpec(writable=table.take("writable", writable_paths, ()))
    table.finish()
    return spec


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec:
    """``[executor]``: how long a run on a cluster waits for what it lost (docs/distributed.md)."""

    wait_for_workers: float = 180.0  # a gate no worker can take now waits this long, then fails
    margin: float = 30.0  # past timeout + grace + margin with no result: the worker is unreachable


def read_executor(table: Table) -> ExecutorSpec:
    spec = ExecutorSpec(
        wait_for_workers=table.take("wait_for_workers", duration, 180.0),
        margin=table.take("margin", duration, 30.0),
    )
    table.finish()
    return spec


@dataclass(frozen=True, kw_only=True)
class IntegrateSpec:
    """``[integrate]``'s own keys: how ``integrate run`` drains the queue."""

    window: int | None = None  # queue items gated at once; None: adaptive (what fits)
    confirm_failures: int = 1  # re-runs of failed gates before an item is blamed
    # globs of paths an envelope may touch only when submitted with --allow-protected
    protected: tuple[str, ...] = ()
    # the SSH private key that signs landed proofs (DAGRUNNER_SIGNING_KEY outranks it)
    signing_key: str | None = None
    batch: int | None = None  # envelopes gated together; None: sized from the outcomes (auto)
    baseline: str = "absolute"  # or "differential": blame only what the target lacks
    # a landed commit's message above its trailers ({mission}, {worker}, {subject})
    message: str = DEFAULT_MESSAGE


INTEGRATE_SETTINGS = (
    "window",
    "confirm_failures",
    "protected",
    "signing_key",
    "batch",
    "baseline",
    "message",
)


def read_integrate_settings(table: Table) -> IntegrateSpec:
    return IntegrateSpec(
        window=table.take("window", auto(window), None),
        confirm_failures=table.take("confirm_failures", count, 1),
        protected=table.take("protected", globs, ()),
        signing_key=table.take("signing_key", string, None),
        batch=table.take("batch", auto(batch), None),
        baseline=table.take("baseline", baseline, "absolute"),
        message=table.take("message", message_template, DEFAULT_MESSAGE),
    )


SEED_KEYS = ("path", "key", "build", "timeout", "tools", "also", "store")
SEED_TIMEOUT = 600.0
MAX_SEEDS = 16


@dataclass(frozen=True, kw_only=True)
class SeedSpec:
    """One ``[[worktrees.seed]]``: a git-ignored folder built once per key, in every worktree."""

    path: str  # relative to the worktree, normalised ("." and ".." refused)
    key: tuple[str, ...]  # globs of the files whose bytes at the base key the seed
    build: tuple[str, ...] | str  # argv, or text run by sh -c, in a clean checkout of the base
    timeout: float = SEED_TIMEOUT
    tools: tuple[str, ...] = ()  # commands whose output keys the seed too (python --version)
    # globs of more folders the same build makes (each workspace's node_modules), stored and
    # placed with ``path``
    also: tuple[str, ...] = ()
    # a package manager's store that outlives the builds ("pnpm"): $DAGRUNNER_SEED_STORE
    store: str = ""


def seed_path(raw: Any) -> str:
    text = inside_repository(string(raw), "a seed's path")
    path = posixpath.normpath(text)
    parts = path.split("/")
    if path in (".", "") or "\n" in path:
        raise ValueError(f"{show(text)} is not a folder inside the worktree")
    if parts[0] in (".git", ".dagrunner") or ".git" in parts:
        raise ValueError(f"{show(text)} is dagrunner's or git's own; a seed cannot live there")
    return path


def seed_store(raw: Any) -> str:
    text = string(raw)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,39}", text):
        raise ValueError(f"{show(text)} is not a store's name (lowercase letters, digits, . _ -)")
    return text


def seed_also(raw: Any) -> tuple[str, ...]:
    patterns = globs(raw)
    for pattern in patterns:
        seed_path(pattern)  # neither the tree itself nor git's own
    return patterns


def seeds(raw: Any) -> tuple[SeedSpec, ...]:
    """``[[worktrees.seed]]`` tables: each a path, the key globs and a build command."""
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise TypeMismatch('an array of tables: [[worktrees.seed]] path = ".venv" ...')
    if len(raw) > MAX_SEEDS:
        raise ValueError(f"{len(raw)} seeds is too many; at most {MAX_SEEDS}")
    found: list[SeedSpec] = []
    for n, item in enumerate(raw, 1):
        unknown = sorted(set(item) - set(SEED_KEYS))
        if unknown:
            raise ValueError(f"seed {n}: unknown key {unknown[0]!r}; a seed takes {SEED_KEYS}")
        missing = [name for name in ("path", "key", "build") if name not in item]
        if missing:
            raise ValueError(f"seed {n}: {missing[0]} is missing (a seed needs path, key, build)")
        build = command(item["build"])
        if is_empty(build):
            raise ValueError(f"seed {n}: build is empty")
        spec = SeedSpec(
            path=seed_path(item["path"]),
            key=globs(item["key"]),
            build=build,
            timeout=timeout(item["timeout"]) if "timeout" in item else SEED_TIMEOUT,
            tools=string_list(item.get("tools", [])),
            also=seed_also(item.get("also", [])),
            store=seed_store(item["store"]) if "store" in item else "",
        )
        if not spec.key:
            raise ValueError(f"seed {n}: key is empty; name the lockfiles that key the seed")
        for other in found:
            if (
                other.path == spec.path
                or f"{spec.path}/".startswith(f"{other.path}/")
                or (f"{other.path}/".startswith(f"{spec.path}/"))
            ):
                raise ValueError(f"seed {n}: {show(spec.path)} overlaps seed {show(other.path)}")
        found.append(spec)
    return tuple(found)


@dataclass(frozen=True, kw_only=True)
class WorktreesSpec:
    """``[worktrees]``: what each worker's worktree gets (read from its base commit)."""

    ports: int = 0  # ports leased to each worktree
    port_range: tuple[int, int] = (20000, 29999)
    max_disk: int | None = (
        None  # bytes the cache root's worktrees may hold: allocation refuses past it
    )
    seeds: tuple[SeedSpec, ...] = ()  # [[worktrees.seed]]: dependency folders built once per key


def read_worktrees(table: Table) -> WorktreesSpec:
    spec = WorktreesSpec(
        ports=table.take("ports", port_count, 0),
        port_range=table.take("port_range", port_range, (20000, 29999)),
        max_disk=table.take("max_disk", size, None),
        seeds=table.take("seed", seeds, ()),
    )
    table.finish()
    return spec
