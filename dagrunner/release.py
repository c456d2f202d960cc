"""``release_check`` with every node kind: plain gates, workers, integrate and land.

The runner runs plain gates and knows other node kinds only through its
``NodeKinds`` protocol; this module plugs in the swarm (``swarm.py``), so the
layers stay one-way: runner <- integration <- swarm <- release <- cli.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dagrunner import runner
from dagrunner.plan import RunOptions
from dagrunner.records import RunRecord
from dagrunner.swarm import Swarm


def release_check(options: RunOptions) -> tuple[RunRecord, Path]:
    """Run the manifest's DAG, workers and integration included; its record and directory.

    Raises DagrunnerError for bad input before anything runs.
    """
    if options.node_kinds is None:
        options = replace(options, node_kinds=Swarm.open)
    return runner.release_check(options)
