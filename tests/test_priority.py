"""Queue priority on real repositories and processes: higher first and stable within a
priority; an item already gating is never pre-empted, except by ``--priority urgent``,
which resets what runs behind it; and what is submitted while a run goes is taken."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from conftest import CLI
from test_integration import trailers, worker
from test_pipeline import numbered, recording_gate

from dagrunner import watch
from dagrunner.errors import DagrunnerError
from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import URGENT, Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit


def workers_in_landing_order(project: Path) -> list[str]:
    return [t.split(".")[1] for t in trailers(project)][::-1]


def test_higher_priority_first_stable_within_a_priority(project: Path, tmp_path: Path) -> None:
    envelopes = numbered(project, 5)
    info = repo_info(project)
    submit(info, envelopes[:1])  # n01: 0
    submit(info, envelopes[1:3], priority=5)  # n02, n03: 5
    submit(info, envelopes[3:4], priority=-1)  # n04: -1
    submit(info, envelopes[4:], priority=5)  # n05: 5
    assert [i.split(".")[1] for i in Queue.of(info, target="main").pending()] == [
        "n02", "n03", "n05", "n01", "n04"
    ]  # fmt: skip
    assert integrate(repo=project, manifest=recording_gate(tmp_path, 0.05), window=1, batch=1).ok
    assert workers_in_landing_order(project) == ["n02", "n03", "n05", "n01", "n04"]


def test_an_out_of_range_priority_is_a_coded_error_and_queues_nothing(project: Path) -> None:
    (envelope,) = numbered(project, 1)
    with pytest.raises(DagrunnerError) as raised:
        submit(repo_info(project), [envelope], priority=5000)
    assert raised.value.code == "bad-priority"
    assert Queue.of(repo_info(project)).entries() == {}
    done = subprocess.run(
        [*CLI, "integrate", "submit", str(envelope), "--priority", "soon"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "urgent" in done.stderr


def wait_for_gating(project: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gating = [e for e in watch(repo=project, follow=False) if e.event == "gating"]
        if len(gating) >= count:
            return
        time.sleep(0.05)
    raise AssertionError("the integrator never started gating")


def test_urgent_pre_empts_what_gates_and_a_high_priority_never_does(
    project: Path, tmp_path: Path
) -> None:
    """n01 and n02 gate (window 2, 1.5 s each) when ``hi`` (priority 9) and ``urgent``
    are submitted to the running integrator.  ``urgent`` lands first: n01 and n02 are
    reset and gated again on top of it.  ``hi`` waits for the items already gating, and
    lands before n03, queued before it at priority 0."""
    envelopes = numbered(project, 3)
    hi = worker(project, "hi", lambda p: (p / "hi.txt").write_text("hi\n"))
    urgent = worker(project, "urgent", lambda p: (p / "urgent.txt").write_text("urgent\n"))
    submit(repo_info(project), envelopes)
    running = subprocess.Popen(
        [
            *CLI,
            "integrate",
            "run",
            "--window",
            "2",
            "--batch",
            "1",
            "--manifest",
            str(recording_gate(tmp_path, 1.5)),
        ],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_gating(project, 2)
        submit(repo_info(project), [hi], priority=9)
        submit(repo_info(project), [urgent], priority=URGENT)
        _, err = running.communicate(timeout=120)
    finally:
        running.kill()
    assert running.returncode == 0, err
    order = workers_in_landing_order(project)
    assert order[0] == "urgent", order
    assert order.index("hi") < order.index("n03"), order
    resets = [e for e in watch(repo=project, follow=False) if e.event == "speculation-reset"]
    assert any("urgent" in (e.details.note or "") for e in resets)


def test_stats_read_the_journal_of_a_real_run(project: Path, tmp_path: Path) -> None:
    """Five envelopes: n03 breaks the gate, two conflict with each other (one foreseen at
    submit); window 2.  The figures match what the run's own result says."""
    import orjson

    envelopes = numbered(project, 3, bad={3})
    one = worker(project, "one", lambda p: (p / "shared.txt").write_text("1\ntwo\nthree\n"))
    two = worker(project, "two", lambda p: (p / "shared.txt").write_text("2\ntwo\nthree\n"))
    submit(repo_info(project), [*envelopes, one, two])
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.2), window=2, batch=1)
    done = subprocess.run(
        [*CLI, "integrate", "stats", "--json"], cwd=project, capture_output=True, timeout=60
    )
    body = orjson.loads(done.stdout)
    assert body["outcomes"] == {"conflict": 1, "gates-failed": 1, "landed": 3}
    assert body["pending"] == 0 and body["overlaps"] == 1
    assert body["time_in_queue"]["count"] == 5
    assert 0 < body["time_in_queue"]["p50"] <= body["time_in_queue"]["p95"] < 120
    # wasted: the runs cancelled before their verdict (a reset of an item not gating yet
    # wastes none)
    cancelled = [r for r in result.pipeline if r.verdict == "cancelled"]
    assert body["wasted_gate_runs"] == len(cancelled) <= result.resets
    # one gate-run event per run: the very runs the result counts, and what they cost
    assert body["gate_runs"] == result.gate_runs
    assert body["gate_runs_per_landed"] == round(result.gate_runs / 3, 3)
    assert (
        body["gate_cpu_seconds"] == round(result.gate_cpu, 3)
        or abs(body["gate_cpu_seconds"] - result.gate_cpu) < 0.01
    )
    # (a trivial gate's CPU can read 0 where it has no cgroup of its own: sampled)
    assert body["gate_cpu_per_landed"] == round(body["gate_cpu_seconds"] / 3, 3)
    recent = subprocess.run(
        [*CLI, "integrate", "stats", "--since", "1s", "--json"], cwd=project, capture_output=True
    )
    time.sleep(1.1)
    later = subprocess.run(
        [*CLI, "integrate", "stats", "--since", "1s", "--json"], cwd=project, capture_output=True
    )
    assert orjson.loads(later.stdout)["outcomes"] == {}, recent.stdout
    text = subprocess.run(
        [*CLI, "integrate", "stats", "--format", "prometheus"],
        cwd=project,
        capture_output=True,
        text=True,
    ).stdout
    assert 'dagrunner_queue_outcomes_total{state="landed"} 3' in text
    assert "# TYPE dagrunner_queue_time_in_queue_seconds summary" in text
    assert "dagrunner_queue_time_in_queue_seconds_count 5" in text
    assert "# TYPE dagrunner_queue_gate_cpu_seconds_total counter" in text


def test_status_gives_each_pending_item_its_position_and_an_eta_from_the_history(
    project: Path, tmp_path: Path
) -> None:
    from dagrunner.integration.run import queue_status

    first = numbered(project, 2)
    submit(repo_info(project), first)
    assert queue_status(repo=project)["eta"]["gate_run_seconds"] is None  # no history yet
    assert integrate(repo=project, manifest=recording_gate(tmp_path, 0.3), window=1, batch=1).ok
    later = [
        worker(project, f"later{i}", lambda p, i=i: (p / f"l{i}.txt").write_text("l\n"))
        for i in range(3)
    ]
    submit(repo_info(project), later[:2])
    submit(repo_info(project), later[2:], priority=3)
    status = queue_status(repo=project)
    run = status["eta"]["gate_run_seconds"]
    assert run is not None and run >= 0.3
    pending = {e["worker"]: e for e in status["envelopes"] if e["state"] == "queued"}
    assert [pending[w]["position"] for w in ("later2", "later0", "later1")] == [1, 2, 3]
    etas = [pending[w]["eta_seconds"] for w in ("later2", "later0", "later1")]
    assert etas == sorted(etas) and etas[0] == round(run, 1)  # window 1: one run each
    assert pending["later2"]["priority"] == 3
