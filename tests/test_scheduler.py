"""Scheduling on real processes: order, capacity, priorities, backfill, pressure, failures."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import check, gate_results

from dagrunner.engine.graph import build_graph, critical_path, expected_durations
from dagrunner.manifest.load import load_manifest


def intervals(gates: dict[str, dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    return sorted((g["started"], g["finished"], g) for g in gates.values() if g["attempts"])


def peak_use(gates: dict[str, dict[str, Any]], key: str) -> float:
    """The largest sum of ``key`` over gates running at once, from recorded start/end times."""
    events: list[tuple[float, int, float]] = []
    for start, end, gate in intervals(gates):
        events.append((start, 1, gate[key]))
        events.append((end, 0, -gate[key]))  # ends sort before starts at the same instant
    use = peak = 0.0
    for _, _, delta in sorted(events):
        use += delta
        peak = max(peak, use)
    return peak


def test_dependency_order_and_capacity_on_a_random_dag(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(7)
    lines = ["[governor]", "cpu = 3", 'memory = "1G"', 'sample_interval = "50ms"']
    for i in range(14):
        needs = sorted({f"g{j}" for j in range(i) if rng.random() < 0.2})
        cpu = rng.choice([1, 1, 2, 3])
        mem = rng.choice(["100M", "300M", "600M"])
        lines += [
            f"[gates.g{i}]",
            f'run = "sleep {rng.choice([0.05, 0.1, 0.2])}"',
            f"needs = {needs!r}".replace("'", '"'),
            f"cpu = {cpu}",
            f'memory = "{mem}"',
        ]
    code, body, run_dir = check(capsys, repo, "\n".join(lines) + "\n")
    assert code == 0, body
    gates = gate_results(run_dir)
    assert len(gates) == 14 and all(g["status"] == "passed" for g in gates.values())
    for gate in gates.values():
        for need in gate["needs"]:
            assert gate["started"] >= gates[need]["finished"], (gate["id"], need)
    assert peak_use(gates, "cpu") <= 3
    assert peak_use(gates, "memory") <= 1 << 30
    run = body
    assert run["speed"]["serial_sum"] > 0
    assert run["speed"]["lower_bound"] <= run["speed"]["wall"] * 1.05


def test_longest_remaining_path_starts_first(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.x1]
        run = "sleep 0.05"
        estimate = "0.2s"
        [gates.x2]
        run = "sleep 0.05"
        estimate = "0.2s"
        [gates.chain1]
        run = "sleep 0.05"
        estimate = "1s"
        [gates.chain2]
        run = "sleep 0.05"
        estimate = "1s"
        needs = ["chain1"]
        [gates.chain3]
        run = "sleep 0.05"
        estimate = "1s"
        needs = ["chain2"]
    """,
        "--jobs",
        "1",
    )
    assert code == 0
    gates = gate_results(run_dir)
    order = [g["id"] for _, _, g in intervals(gates)]
    assert order[0] == "chain1"
    assert order.index("chain2") < order.index("x1")  # the chain keeps priority while it lasts


# Tests that need gates to run side by side switch live pressure off, so a busy
# machine (load past the default threshold) cannot serialise them.
NO_PRESSURE = "max_load = 1000\nmin_available_memory = 0\n"

BACKFILL = """
    [governor]
    cpu = 2
    max_load = 1000
    min_available_memory = 0
    backfill_limit = "{limit}"
    [gates.long]
    run = "sleep 1"
    estimate = "1s"
    [gates.big]
    run = "sleep 0.1"
    cpu = 2
    estimate = "0.9s"
    [gates.s1]
    run = "sleep 0.05"
    estimate = "0.08s"
    [gates.s2]
    run = "sleep 0.05"
    estimate = "0.08s"
"""  # s1, s2: above the cheap-first share (5% of the critical path), so backfill decides


def test_small_gates_backfill_without_delaying_the_big_one(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(capsys, repo, BACKFILL.format(limit="60s"))
    assert code == 0
    g = gate_results(run_dir)
    assert g["long"]["started"] < g["s1"]["started"] < g["big"]["started"]
    assert g["s2"]["finished"] <= g["big"]["started"]
    assert g["big"]["started"] - g["long"]["finished"] < 0.5  # not starved by backfill
    assert peak_use(g, "cpu") <= 2


def test_backfill_limit_stops_backfilling(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, run_dir = check(capsys, repo, BACKFILL.format(limit="0s"))
    assert code == 0
    g = gate_results(run_dir)
    assert g["s1"]["started"] >= g["big"]["finished"]
    assert g["s2"]["started"] >= g["big"]["finished"]


def test_live_pressure_holds_new_starts(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _body, run_dir = check(
        capsys,
        repo,
        """
        [governor]
        cpu = 4
        min_available_memory = "100000G"
        sample_interval = "50ms"
        [gates.a]
        run = "sleep 0.2"
        [gates.b]
        run = "sleep 0.2"
        [gates.c]
        run = "sleep 0.2"
    """,
    )
    assert code == 0
    g = gate_results(run_dir)
    assert peak_use(g, "cpu") == 1, "under pressure only one gate may run at a time"
    run = __import__("orjson").loads((run_dir / "run.json").read_bytes())
    assert run["governor"]["samples"] and all(s["pressured"] for s in run["governor"]["samples"])


def test_failure_skips_dependents_but_independent_branches_go_on(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body, run_dir = check(
        capsys,
        repo,
        """
        [gates.bad]
        run = "exit 2"
        [gates.child]
        run = ["true"]
        needs = ["bad"]
        [gates.grandchild]
        run = ["true"]
        needs = ["child"]
        [gates.other]
        run = "sleep 0.2"
        [gates.other2]
        run = ["true"]
        needs = ["other"]
    """,
    )
    assert code == 1
    g = gate_results(run_dir)
    assert g["bad"]["status"] == "failed" and g["bad"]["exit_code"] == 2
    assert g["child"]["status"] == "skipped" and g["child"]["skipped_because"] == "bad"
    assert g["grandchild"]["status"] == "skipped" and g["grandchild"]["skipped_because"] == "bad"
    assert g["other2"]["status"] == "passed"
    assert body["status"] == "failed"


def test_fail_fast_stops_at_the_first_failure(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [governor]
        max_load = 1000
        min_available_memory = 0
        [gates.bad]
        run = "sleep 0.1; exit 1"
        [gates.slow]
        run = "sleep 30"
        [gates.later]
        run = ["true"]
        needs = ["slow"]
    """,
        "--fail-fast",
    )
    assert code == 1
    g = gate_results(run_dir)
    assert g["slow"]["status"] == "cancelled"
    assert g["slow"]["finished"] < 10
    assert g["later"]["status"] == "skipped"


def test_only_runs_a_gate_with_what_it_needs(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.a]
        run = ["true"]
        [gates.b]
        run = ["true"]
        needs = ["a"]
        [gates.c]
        run = ["true"]
    """,
        "--only",
        "b",
    )
    assert code == 0
    assert set(gate_results(run_dir)) == {"a", "b"}


def test_only_unknown_gate(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body, _ = check(capsys, repo, '[gates.a]\nrun = ["true"]\n', "--only", "zzz")
    assert code == 2
    assert body["error"]["code"] == "unknown-gate"


def test_critical_path_and_priorities_weighted_by_duration(repo: Path) -> None:
    path = repo / "m.toml"
    path.write_text("""
[gates.a]
run = ["true"]
estimate = "1s"
[gates.b]
run = ["true"]
estimate = "5s"
needs = ["a"]
[gates.c]
run = ["true"]
estimate = "2s"
needs = ["a"]
[gates.d]
run = ["true"]
needs = ["b", "c"]
estimate = "1s"
""")
    graph = build_graph(load_manifest(path))
    assert critical_path(graph, expected_durations(graph, {})) == (["a", "b", "d"], 7.0)
    # A measured history outranks the estimate.
    assert critical_path(graph, expected_durations(graph, {"c": 9.0}))[0] == ["a", "c", "d"]


def test_jobs_caps_concurrency(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gates = "\n".join(f'[gates.g{i}]\nrun = "sleep 0.1"\ncpu = 0.5\n' for i in range(6))
    manifest = "[governor]\ncpu = 4\n" + NO_PRESSURE + gates
    code, _, run_dir = check(capsys, repo, manifest, "--jobs", "2")
    assert code == 0
    recorded = gate_results(run_dir)
    for gate in recorded.values():
        gate["one"] = 1
    assert peak_use(recorded, "one") == 2


def test_measured_durations_feed_the_next_plan(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dagrunner.engine.steps import RunOptions, load_step, plan_step

    manifest = '[gates.slow]\nrun = "sleep 0.3"\nestimate = "10s"\n[gates.quick]\nrun = ["true"]\n'
    path = repo / "m.toml"
    options = RunOptions(repo=repo, manifest=path)
    path.write_text(manifest)
    assert (
        plan_step(*load_step(options), options).expected["slow"] == 10.0
    )  # the estimate, at first
    code, _, run_dir = check(capsys, repo, manifest)
    assert code == 0
    measured = gate_results(run_dir)["slow"]["duration"]
    expected = plan_step(*load_step(options), options).expected
    assert expected["slow"] == pytest.approx(measured, abs=1e-3)
    assert 0.25 < expected["slow"] < 5
