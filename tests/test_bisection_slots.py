"""Both slots busy while a failure that names nothing is narrowed down (issue 47): what is
left of a batch once its culprit is found is gated with what is behind it, a conflict put
aside takes no place in the window, and the second envelope of a failed pair that fails
alone beside the first passing is blamed without a re-run (the pair's failure corroborates
it).  On real repositories and gate processes; the gate takes a second, so that two runs
side by side overlap by most of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import git
from test_bisection import trace
from test_integration import states, worker
from test_pipeline import recording
from test_queue_volume import assert_every_landing_was_gated, breaking

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.records.integration import Speculation


def slow_anonymous_gate(tmp: Path) -> Path:
    """Fails on BROKEN after a second, naming nothing."""
    return recording(tmp, "! grep -rq BROKEN --include=*.txt .", before="sleep 1; ")


def holding(pipeline: list[Speculation], name: str) -> list[Speculation]:
    return [r for r in pipeline if any(e.split(".")[1] == name for e in r.envelopes)]


def beside(a: Speculation, b: Speculation) -> bool:
    """The two runs were gated side by side for most of a second."""
    return min(a.end, b.end) - max(a.start, b.start) > 0.5


def test_what_is_left_of_a_batch_once_its_culprit_is_found_is_gated_with_what_is_behind(
    project: Path, tmp_path: Path
) -> None:
    """n02 breaks the first batch of 8; once it is blamed, n05..n08 (a half of that batch,
    never gated) and n09..n16 behind it are gated side by side, not one after the other."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 16, {2: "BROKEN\n"}))
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=8, window=2)
    final = states(project)
    assert final.pop("n02") == "gates-failed" and set(final.values()) == {"landed"}, final
    left = [r for r in holding(result.pipeline, "n05") if str(r.verdict) == "passed"]
    behind = [r for r in holding(result.pipeline, "n16") if str(r.verdict) == "passed"]
    assert left and behind and beside(left[-1], behind[-1]), trace(result.pipeline, times=True)
    assert_every_landing_was_gated(project, base, tmp_path)


def test_a_conflict_put_aside_takes_no_place_in_the_window(project: Path, tmp_path: Path) -> None:
    """n02 conflicts with n01 of its own batch: it is put aside, to be retried at the front,
    and the next batch is gated beside the first at once, as if it were not there."""
    base = git(project, "rev-parse", "main").strip()

    def line(who: str) -> Callable[[Path], object]:
        return lambda p: (p / "shared.txt").write_text(f"one\nTWO from {who}\nthree\n")

    envelopes = [worker(project, "n01", line("n01")), worker(project, "n02", line("n02"))]
    envelopes += breaking(project, 8, {}, first=3)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=3, window=2)
    final = states(project)
    assert final.pop("n02") == "conflict" and set(final.values()) == {"landed"}, final
    front = [r for r in holding(result.pipeline, "n01") if str(r.verdict) == "passed"]
    behind = [r for r in holding(result.pipeline, "n05") if str(r.verdict) == "passed"]
    assert front and behind and beside(front[0], behind[0]), trace(result.pipeline, times=True)
    assert_every_landing_was_gated(project, base, tmp_path)


def test_the_second_of_a_pair_failing_alone_beside_the_first_is_blamed_without_a_rerun(
    project: Path, tmp_path: Path
) -> None:
    """n04 breaks the batch; halving comes down to the pair n03, n04, gated side by side on
    the pair's base: n03 passes, n04 fails there.  The pair's failure and n04's own are two
    failing trees whose one common change is n04: it is blamed with no re-run, and nothing
    is gated on a tree holding it once the pair is known."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 8, {4: "BROKEN\n"}))
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=8, window=2)
    final = states(project)
    assert final.pop("n04") == "gates-failed" and set(final.values()) == {"landed"}, final
    said = trace(result.pipeline, times=True)
    assert not [r for r in result.pipeline if r.confirm], said
    alone = holding(result.pipeline, "n04")[-1]
    assert len(alone.envelopes) == 1 and str(alone.verdict) == "failed", said
    assert_every_landing_was_gated(project, base, tmp_path)
