"""Ports leased to a worker's worktree: ``[worktrees] ports = N`` and ``port_range`` in the
manifest at the allocation's base commit (never a worker's).

An allocation leases N ports of the range that no live worktree of this repository holds
(the ledger's ``allocated`` events, under its lock: concurrent allocations never share one)
and that are free on this machine now (nothing listens on them).  They are in the ledger,
in ``allocate`` and ``status``, in the environment of ``--setup`` commands, and in
``<worktree>/.dagrunner/env`` (``DAGRUNNER_PORT``, ``DAGRUNNER_PORTS``; ignored by git).  A
worktree's ports are free again once it is cleaned, pooled or pruned.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import atomic_write
from dagrunner.manifest.settings import WorktreesSpec


def _free(port: int) -> bool:
    """Whether nothing on this machine holds ``port`` (on loopback and every address)."""
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                return False
    return True


def lease(spec: WorktreesSpec, held: Iterable[int]) -> tuple[int, ...]:
    """``spec.ports`` ports of its range that no live worktree holds and nothing listens on;
    ``ports-exhausted`` when the range has not that many.  Call it under the ledger's lock."""
    if not spec.ports:
        return ()
    taken = set(held)
    first, last = spec.port_range
    found: list[int] = []
    for port in range(first, last + 1):
        if port not in taken and _free(port):
            found.append(port)
            if len(found) == spec.ports:
                return tuple(found)
    raise DagrunnerError(
        "ports-exhausted",
        f"the port range {first}-{last} has {len(found)} free port(s) for a worktree that "
        f"leases {spec.ports}",
        key="worktrees.port_range",
        exit_code=ExitCode.REFUSED,
        hint="clean up landed or idle worktrees (worktree prune), or widen port_range",
    )


def port_env(ports: tuple[int, ...]) -> dict[str, str]:
    if not ports:
        return {}
    return {"DAGRUNNER_PORT": str(ports[0]), "DAGRUNNER_PORTS": " ".join(map(str, ports))}


def write_env(path: Path, ports: tuple[int, ...]) -> None:
    """``<worktree>/.dagrunner/env`` (KEY=value lines) and a ``.gitignore`` that keeps the
    folder out of git."""
    if not ports:
        return
    folder = path / ".dagrunner"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise DagrunnerError(
            "path-occupied",
            f"{folder} is not a folder dagrunner can write its env file in",
            where=str(folder),
            exit_code=ExitCode.REFUSED,
            hint="remove .dagrunner from the base commit (dagrunner writes it in each worktree)",
        )
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
    atomic_write(folder / ".gitignore", b"*\n")
    lines = "".join(f"{key}={value}\n" for key, value in port_env(ports).items())
    atomic_write(folder / "env", lines.encode())


def held_ports(records: Mapping[str, object]) -> list[int]:
    """Every port the live worktrees of the ledger hold."""
    return [port for record in records.values() for port in getattr(record, "ports", ())]
