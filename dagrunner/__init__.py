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
    "Event": "dagrunner.events",
    "ExitCode": "dagrunner.errors",
    "GateResult": "dagrunner.records",
    "IntegrationResult": "dagrunner.integration",
    "Manifest": "dagrunner.manifest",
    "RunOptions": "dagrunner.plan",
    "RunRecord": "dagrunner.records",
    "RunStatus": "dagrunner.records",
    "Status": "dagrunner.records",
    "allocate": "dagrunner.worktrees",
    "cleanup": "dagrunner.lifecycle",
    "export": "dagrunner.exporting",
    "integrate": "dagrunner.integration",
    "load_manifest": "dagrunner.manifest",
    "release_check": "dagrunner.release",
    "submit": "dagrunner.queue",
    "wait_for": "dagrunner.events",
    "watch": "dagrunner.events",
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
    "release_check",
    "submit",
    "wait_for",
    "watch",
]

if TYPE_CHECKING:
    from dagrunner.errors import DagrunnerError, ExitCode
    from dagrunner.events import Event, wait_for, watch
    from dagrunner.exporting import export
    from dagrunner.integration import IntegrationResult, integrate
    from dagrunner.lifecycle import cleanup
    from dagrunner.manifest import Manifest, load_manifest
    from dagrunner.plan import RunOptions
    from dagrunner.queue import submit_files as submit
    from dagrunner.records import GateResult, RunRecord, RunStatus, Status
    from dagrunner.release import release_check
    from dagrunner.worktrees import allocate


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagrunner' has no attribute {name!r}")
    attr = "submit_files" if name == "submit" else name
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
