"""Never gate the same thing twice: verdicts reused across the pipeline's speculative trees
and rebuilds (identical keys in flight run once), on real repositories and processes."""

from __future__ import annotations

from pathlib import Path

import orjson
from conftest import commit_release_manifest, git
from test_integration import worker

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import submit
from dagrunner.integration.run import integrate


def heavy_manifest(tmp: Path) -> str:
    """``heavy`` (1 s, inputs src/**) counts its runs in runs.txt; ``other`` fails on reject.txt."""
    return f"""
[sandbox]
writable = ["{tmp}"]

[gates.heavy]
run = "sleep 1; echo ran >> '{tmp / "runs.txt"}'; ! grep -q BAD src/a.txt"
inputs = ["src/**"]

[gates.other]
run = "test ! -e reject.txt"
"""


def four_with_a_culprit(project: Path, tmp: Path) -> list[Path]:
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(project, heavy_manifest(tmp))
    return [
        worker(project, "w1", lambda p: (p / "src" / "a.txt").write_text("GOOD too\n")),
        worker(project, "w2", lambda p: (p / "reject.txt").write_text("culprit\n")),
        worker(project, "w3", lambda p: (p / "three.txt").write_text("3\n")),
        worker(project, "w4", lambda p: (p / "four.txt").write_text("4\n")),
    ]


def test_a_key_in_flight_runs_once_across_speculative_trees_and_rebuilds(
    project: Path, tmp_path: Path
) -> None:
    """The issue's case: 4 envelopes, window 4, the second a culprit; ``heavy``'s inputs are
    the same in every tree after the first.  It runs once: the other trees wait for the key
    in flight, and the rebuilds behind the culprit are answered from it."""
    envelopes = four_with_a_culprit(project, tmp_path)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, window=4)
    final = {o.worker: str(o.state) for o in result.envelopes}
    assert final == {"w1": "landed", "w2": "gates-failed", "w3": "landed", "w4": "landed"}
    assert (tmp_path / "runs.txt").read_text().count("ran") == 1
    assert result.gates_reused >= 3, result.to_json()
    assert git(project, "show", "main:three.txt") == "3\n"


def test_a_failed_flight_answers_nobody_and_its_waiters_run_themselves(
    project: Path, tmp_path: Path
) -> None:
    """w1 makes heavy fail; w2's tree (the same inputs) waited for w1's heavy, then runs its
    own -- a failure is never lent -- and after the reset onto a head without w1, w2 lands."""
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(project, heavy_manifest(tmp_path))
    first = worker(project, "w1", lambda p: (p / "src" / "a.txt").write_text("BAD\n"))
    second = worker(project, "w2", lambda p: (p / "two.txt").write_text("2\n"))
    submit(repo_info(project), [first, second])
    result = integrate(repo=project, window=2)
    final = {o.worker: str(o.state) for o in result.envelopes}
    assert final == {"w1": "gates-failed", "w2": "landed"}, result.to_json()
    assert git(project, "show", "main:src/a.txt") == "GOOD\n"
    heavy = [
        orjson.loads((Path(run.report) / "gates" / "heavy.json").read_bytes())["status"]
        for run in result.pipeline
        if (Path(run.report) / "gates" / "heavy.json").exists()
    ]
    assert "cached" not in heavy[: heavy.count("failed")], heavy
    assert heavy.count("failed") >= 2 and heavy[-1] == "passed", heavy
