"""The run-wide settings tables of a manifest: ``[sandbox]``, ``[executor]`` and
``[integrate]``'s own keys (``load`` reads the rest)."""

from __future__ import annotations

from dataclasses import dataclass

from dagrunner.manifest.fields import (
    Table,
    auto,
    count,
    duration,
    globs,
    port_count,
    port_range,
    size,
    string,
    window,
    writable_paths,
)


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """``[sandbox]``: what every gate may write besides its tree, HOME and TMPDIR."""

    writable: tuple[str, ...] = ()


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


INTEGRATE_SETTINGS = ("window", "confirm_failures", "protected", "signing_key")


def read_integrate_settings(table: Table) -> IntegrateSpec:
    return IntegrateSpec(
        window=table.take("window", auto(window), None),
        confirm_failures=table.take("confirm_failures", count, 1),
        protected=table.take("protected", globs, ()),
        signing_key=table.take("signing_key", string, None),
    )


@dataclass(frozen=True, kw_only=True)
class WorktreesSpec:
    """``[worktrees]``: what each worker's worktree gets (read from its base commit)."""

    ports: int = 0  # ports leased to each worktree
    port_range: tuple[int, int] = (20000, 29999)
    max_disk: int | None = (
        None  # bytes the cache root's worktrees may hold: allocation refuses past it
    )


def read_worktrees(table: Table) -> WorktreesSpec:
    spec = WorktreesSpec(
        ports=table.take("ports", port_count, 0),
        port_range=table.take("port_range", port_range, (20000, 29999)),
        max_disk=table.take("max_disk", size, None),
    )
    table.finish()
    return spec
