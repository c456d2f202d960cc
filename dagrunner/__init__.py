"""dagrunner: safe, fast parallel work on one git repository.

The public API: ``release_check`` runs a manifest's gate DAG and returns its
record; ``allocate`` / ``export`` / ``cleanup`` manage worker worktrees;
``submit`` queues patch envelopes and ``integrate`` drains the queue.  The CLI
(``dagrunner``) is a thin layer over these functions.
"""

from __future__ import annotations

__version__ = "0.1.0"

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.integration import IntegrationResult, integrate
from dagrunner.lifecycle import cleanup
from dagrunner.manifest import Manifest, load_manifest
from dagrunner.queue import submit_files as submit
from dagrunner.records import GateResult, RunRecord, RunStatus, Status
from dagrunner.runner import RunOptions, release_check
from dagrunner.worktrees import allocate, export

__all__ = [
    "DagrunnerError",
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
]
