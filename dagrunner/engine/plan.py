"""What a run is given (``RunOptions``), what it plans (``Plan``), and the node-kind protocol.

The runner runs plain gates; worker, integrate and land nodes come in through
``NodeKinds`` (``swarm.py`` implements it, ``release.py`` plugs it in), so the
runner imports neither the swarm nor the integrator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dagrunner.engine.governor import Capacity
from dagrunner.engine.graph import Graph, spec
from dagrunner.engine.scheduler import Flights, Listener
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.manifest.load import Manifest
from dagrunner.process.contain import network_isolation
from dagrunner.records.run import GateResult, Status
from dagrunner.records.summary import RunIntegration


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What ``dagrunner release-check`` takes; every field has the CLI's default."""

    repo: Path | None = None
    manifest: Path | None = None
    report_dir: Path | None = None  # the run directory itself; default reports/<run-id>
    jobs: int | None = None
    only: tuple[str, ...] = ()
    fail_fast: bool = False
    no_cache: bool = False
    executor: str = "local"
    environ: Mapping[str, str] | None = None  # the caller's environment; default os.environ
    listener: Listener | None = None
    history_root: Path | None = None
    cache_root: Path | None = None  # default DAGRUNNER_CACHE_DIR
    node_kinds: NodeKindsFactory | None = None  # workers, integrate, land: release.py adds them
    loaded: Manifest | None = None  # the manifest, when the caller has loaded it already
    # Folders the gates may read but not write, except the repository they run in (the
    # integrator: the user's checkout, the common git dir, the other worktrees).
    read_only: tuple[Path, ...] = ()
    # Folders the gates must not see at all (the integrator: the user's checkout, whose
    # editable installs would otherwise run its code instead of the tree's); what
    # ``read_only`` names inside one stays visible, read-only.
    conceal: tuple[Path, ...] = ()
    # Each gate on a layer of its own over the tree (an envelope's: ``process.layers``):
    # what one writes, only the gates that need it see.
    layered: bool = False
    # The trusted commit (the target's head) when the tree under test is an envelope's:
    # its verdicts are then reused by input key only where the reuse rule allows
    # (``cachestep._tree_scoped``, docs/security.md).
    trusted: str | None = None
    # The pipeline's speculative base of the tree under test: the commits between ``trusted``
    # and it land before this tree can, so their trees' verdicts hold here (``cachestep``).
    ahead: str | None = None
    # Keys computed now by other runs in this trio loop (the pipeline's trees): shared, a
    # gate whose key is in flight waits for it instead of computing it again.
    flights: Flights | None = None
    # Answer gates from a verified landed proof on HEAD (``landed.py``), trusting the allowed
    # signers on this branch's tip (or DAGRUNNER_ALLOWED_SIGNERS).
    reuse_landed: bool = False
    target: str = "main"


@dataclass(frozen=True, kw_only=True)
class Plan:
    repo: Path
    manifest: Manifest
    graph: Graph
    capacity: Capacity
    expected: dict[str, float]
    history: Path
    envs: dict[
        str, dict[str, str]
    ]  # each gate's hermetic environment (HOME/TMPDIR added per attempt)
    git: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # value -> name, redacted from logs
    read_only: tuple[Path, ...] = ()  # RunOptions.read_only
    conceal: tuple[Path, ...] = ()  # RunOptions.conceal
    layered: bool = False  # RunOptions.layered


class NodeKinds(Protocol):
    """How the nodes other than plain gates run (workers, integrate, land: ``swarm.py``).

    The runner knows only this protocol, so it imports neither the swarm nor the
    integrator; ``release.py`` plugs them in.
    """

    def cwd_root(self, node: str) -> Path:
        """The tree ``node`` runs in."""
        ...

    def run_node(self, node: str) -> tuple[Status, str]:
        """Run a node that is git work, not a command (integrate, land)."""
        ...

    def export_worker(self, node: str) -> str:
        """After a worker passed: export its envelope; a note for its record."""
        ...

    def finish(self, results: list[GateResult], *, interrupted: bool) -> RunIntegration | None:
        """After the schedule: settle what is left; the run record's ``integration``."""
        ...


NodeKindsFactory = Callable[[Plan, str, Mapping[str, str]], NodeKinds]


class PlainGates:
    """Node kinds for a run of plain gates: every gate runs in the repository."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo

    @classmethod
    def open(cls, plan: Plan, run_id: str, env: Mapping[str, str]) -> PlainGates:
        return cls(plan.repo)

    def cwd_root(self, node: str) -> Path:
        return self.repo

    def run_node(self, node: str) -> tuple[Status, str]:
        return Status.FAILED, "this run has no handler for worker, integrate or land nodes"

    def export_worker(self, node: str) -> str:
        return ""

    def finish(self, results: list[GateResult], *, interrupted: bool) -> None:
        return None


def check_network(graph: Graph, manifest: Manifest, executor: str) -> None:
    """A gate that asks for a network of its own gets one, or the run does not start (never
    a silent ``host``); on a cluster each worker's sandbox makes it (or the attempt fails)."""
    isolated = [n for n in graph.nodes if spec(graph, n).network == "isolated"]
    if isolated and executor == "local" and not network_isolation():
        raise DagrunnerError(
            "network-isolation-unavailable",
            f'gate {isolated[0]!r} asks for network = "isolated", and this machine gives '
            "gates no network namespace of their own",
            where=str(manifest.path),
            key=f"gates.{isolated[0]}.network",
            hint="run where user namespaces are enabled (dagrunner doctor: network), or set "
            'network = "host"',
            exit_code=ExitCode.ENVIRONMENT,
        )
