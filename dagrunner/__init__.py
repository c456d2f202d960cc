"""dagrunner: safe, fast parallel work on one git repository.

The public API: ``release_check`` runs a manifest's gate DAG and returns its
record; the CLI (``dagrunner``) is a thin layer over these functions.
"""

from __future__ import annotations

__version__ = "0.1.0"

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.manifest import Manifest, load_manifest
from dagrunner.records import GateResult, RunRecord, RunStatus, Status
from dagrunner.runner import RunOptions, release_check

__all__ = [
    "DagrunnerError",
    "ExitCode",
    "GateResult",
    "Manifest",
    "RunOptions",
    "RunRecord",
    "RunStatus",
    "Status",
    "__version__",
    "load_manifest",
    "release_check",
]
