"""dagrunner: safe, fast parallel work on one git repository.

The public API: ``release_check`` runs a manifest's gate DAG and returns its
record; ``allocate`` / ``export`` / ``cleanup`` manage worker worktrees;
``submit`` queues patch envelopes and ``integrate`` drains the queue; ``watch``
and ``wait_for`` follow its events.  The CLI
(``dagrunner``) is a thin layer over these functions.  Names are imported on
first use, so ``dagrunner release-check`` does not load the integration code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dagrunner.version import VERSION as __version__

_EXPORTS = {
    "DagrunnerError": "dagrunner.errors",
    "Event": "dagrunner.integration.events",
    "ExitCode": "dagrunner.errors",
    "GateResult": "dagrunner.records.run",
    "IntegrationResult": "dagrunner.integration.run",
    "Manifest": "dagrunner.manifest.load",
    "RunOptions": "dagrunner.engine.plan",
    "RunRecord": "dagrunner.records.run",
    "RunStatus": "dagrunner.records.run",
    "Status": "dagrunner.records.run",
    "allocate": "dagrunner.worktrees.allocate",
    "cleanup": "dagrunner.worktrees.lifecycle",
    "export": "dagrunner.worktrees.export",
    "integrate": "dagrunner.integration.run",
    "load_manifest": "dagrunner.manifest.load",
    "release_check": "dagrunner.swarm.release",
    "overlaps": "dagrunner.integration.run",
    "queue_stats": "dagrunner.integration.events",
    "submit": "dagrunner.integration.submit",
    "sync": "dagrunner.worktrees.sync",
    "wait_for": "dagrunner.integration.events",
    "watch": "dagrunner.integration.events",
}
__all__ = [
    "DagrunnerError",
    "Event",
    "ExitCode",
    "GateResult",
    "IntegrationResult",
    "Manifest",
    "RunOptions",
    "RunRecord",
    "RunStatus",
    "Status",
    "__version__",
    "allocate",
    "cleanup",
    "export",
    "integrate",
    "load_manifest",
    "overlaps",
    "queue_stats",
    "release_check",
    "submit",
    "sync",
    "wait_for",
    "watch",
]

if TYPE_CHECKING:
    from dagrunner.engine.plan import RunOptions
    from dagrunner.errors import DagrunnerError, ExitCode
    from dagrunner.integration.events import Event, queue_stats, wait_for, watch
    from dagrunner.integration.run import IntegrationResult, integrate, overlaps
    from dagrunner.integration.submit import submit_files as submit
    from dagrunner.manifest.load import Manifest, load_manifest
    from dagrunner.records.run import GateResult, RunRecord, RunStatus, Status
    from dagrunner.swarm.release import release_check
    from dagrunner.worktrees.allocate import allocate
    from dagrunner.worktrees.export import export
    from dagrunner.worktrees.lifecycle import cleanup
    from dagrunner.worktrees.sync import sync


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagrunner' has no attribute {name!r}")
    attr = "submit_files" if name == "submit" else name
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
