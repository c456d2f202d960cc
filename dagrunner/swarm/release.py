"""``release_check`` with every node kind: plain gates, workers, integrate and land.

The runner runs plain gates and knows other node kinds only through its
``NodeKinds`` protocol; this module plugs in the swarm (``swarm.py``), so the
layers stay one-way: runner <- integration <- swarm <- release <- cli.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from dagrunner.engine import steps as runner
from dagrunner.engine.graph import spec
from dagrunner.engine.plan import NodeKinds, PlainGates, Plan, RunOptions
from dagrunner.records.run import RunRecord


def node_kinds(plan: Plan, run_id: str, env: Mapping[str, str]) -> NodeKinds:
    """The swarm when the plan has workers, integrate or land nodes; else plain gates (and
    the swarm's modules -- worktrees, export, the integrator -- are never imported)."""
    if all(spec(plan.graph, node).kind == "gate" for node in plan.graph.nodes):
        return PlainGates.open(plan, run_id, env)
    from dagrunner.swarm.nodes import Swarm

    return Swarm.open(plan, run_id, env)


def release_check(options: RunOptions) -> tuple[RunRecord, Path]:
    """Run the manifest's DAG, workers and integration included; its record and directory.

    Raises DagrunnerError for bad input before anything runs.
    """
    if options.node_kinds is None:
        options = replace(options, node_kinds=node_kinds)
    return runner.release_check(options)
