"""Both slots busy while a failure that names nothing is narrowed down (issue 47): what is
left of a batch once its culprit is found is gated with what is behind it, a conflict put
aside takes no place in the window, and the second envelope of a failed pair is judged on
a tree of its own (the pair's, once the first passed), never on the pair's base without the
first.  On real repositories and gate processes; the gate takes a second, so that two runs
side by side overlap by most of it."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from conftest import git
from test_bisection import spent_behind, trace
from test_integration import states, worker
from test_pipeline import recording
from test_queue_volume import assert_every_landing_was_gated, breaking

from dagrunner import watch
from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.records.integration import Speculation


def slow_anonymous_gate(tmp: Path) -> Path:
    """Fails on BROKEN after a second, naming nothing."""
    return recording(tmp, "! grep -rq BROKEN --include=*.txt .", before="sleep 1; ")


def two_lines(who: str, path: Path) -> None:
    (path / "shared.txt").write_text(f"one\nTWO from {who}\nthree\n")


def holding(pipeline: list[Speculation], name: str) -> list[Speculation]:
    return [r for r in pipeline if any(e.split(".")[1] == name for e in r.envelopes)]


def beside(a: Speculation, b: Speculation) -> bool:
    """The two runs were gated side by side for most of a second."""
    return min(a.end, b.end) - max(a.start, b.start) > 0.5


def test_what_is_left_of_a_batch_once_its_culprit_is_found_is_gated_with_what_is_behind(
    project: Path, tmp_path: Path
) -> None:
    """n02 breaks the first batch of 8; once it is found, n05..n08 (a half of that batch,
    never gated) and n09..n16 behind it are gated side by side, not one after the other
    (beside n02's confirmation: a window of 3)."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 16, {2: "BROKEN\n"}))
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=8, window=3)
    final = states(project)
    assert final.pop("n02") == "gates-failed" and set(final.values()) == {"landed"}, final
    left = [r for r in holding(result.pipeline, "n05") if str(r.verdict) == "passed"]
    behind = [r for r in holding(result.pipeline, "n16") if str(r.verdict) == "passed"]
    assert left and behind and beside(left[-1], behind[-1]), trace(result.pipeline, times=True)
    assert_every_landing_was_gated(project, base, tmp_path)


def test_a_conflict_put_aside_takes_no_place_in_the_window(project: Path, tmp_path: Path) -> None:
    """n02 conflicts with n01 of its own batch: it is put aside and n01, n03 are gated in
    one run, on the tree the serial loop gates n03 on once n01 landed (n02 a conflict
    there), and the next batch beside them at once, as if n02 took no place."""
    base = git(project, "rev-parse", "main").strip()
    envelopes = [worker(project, who, partial(two_lines, who)) for who in ("n01", "n02")]
    envelopes += breaking(project, 8, {}, first=3)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=3, window=2)
    final = states(project)
    assert final.pop("n02") == "conflict" and set(final.values()) == {"landed"}, final
    front = [r for r in holding(result.pipeline, "n01") if str(r.verdict) == "passed"]
    behind = [r for r in holding(result.pipeline, "n04") if str(r.verdict) == "passed"]
    assert front and behind and beside(front[0], behind[0]), trace(result.pipeline, times=True)
    assert [e.split(".")[1] for e in front[0].envelopes] == ["n01", "n03"]
    assert behind[0].head == front[0].commit, trace(result.pipeline)
    assert_every_landing_was_gated(project, base, tmp_path)


def test_the_second_of_a_pair_is_blamed_for_the_pairs_tree_confirmed(
    project: Path, tmp_path: Path
) -> None:
    """n04 breaks the batch; halving comes down to the pair n03, n04, gated side by side on
    the pair's base: n03 passes, so n04's tree is the pair's (known failed, no run), and it
    is confirmed there -- a re-run of the tree that holds n03 -- before it is blamed."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 8, {4: "BROKEN\n"}))
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=8, window=2)
    final = states(project)
    assert final.pop("n04") == "gates-failed" and set(final.values()) == {"landed"}, final
    said = trace(result.pipeline, times=True)
    confirm = [r for r in holding(result.pipeline, "n04") if r.confirm]
    assert len(confirm) == 1 and len(confirm[0].envelopes) == 1, said
    assert holding(result.pipeline, "n03")[-1].commit == confirm[0].head, said
    assert_every_landing_was_gated(project, base, tmp_path)


def test_the_second_of_a_pair_is_not_blamed_for_a_tree_without_the_first_that_passed(
    project: Path, tmp_path: Path
) -> None:
    """n02 needs n01 (its gate fails where n02's file is without n01's), and the pair's run
    fails once by a flake.  n01 passes on the pair's base; n02's run there, beside it, fails
    for want of n01 -- a tree that is not n02's own once n01 passed (n02 lands on n01).  Its
    own tree, the pair's, failed once, by the flake: n02 is confirmed there, passes, lands."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 2, {}))
    flake = f"if mkdir '{tmp_path}/flaked' 2>/dev/null; then echo flaked; exit 1; fi; "
    check = flake + "! { [ -e n02.txt ] && [ ! -e n01.txt ]; }"
    manifest = recording(tmp_path, check, before="sleep 1; ")
    result = integrate(repo=project, manifest=manifest, batch=2, window=2)
    final = states(project)
    assert final == {"n01": "landed", "n02": "landed"}, (final, trace(result.pipeline, times=True))
    assert_every_landing_was_gated(project, base, tmp_path)


def test_the_second_of_a_pair_excused_on_the_pairs_base_is_not_landed_from_there(
    project: Path, tmp_path: Path
) -> None:
    """Differential: the target fails ``red``; n01 and n02 each fail only that, and together
    fail ``both`` too.  n02's run on the pair's base ends after n01 passed there; its tree
    holds no n01, so it is no verdict of the tree n02 would land as: nothing is landed from
    it (no compare-and-swap from the pair's base once n01 moved the target), n02 is judged
    on n01 and blamed."""
    submit(repo_info(project), breaking(project, 2, {}))
    (tmp_path / "gated.txt").touch()
    manifest = tmp_path / "differential.toml"
    manifest.write_text(
        '[integrate]\nbaseline = "differential"\n\n'
        '[gates.red]\nrun = "exit 1"\n\n'
        '[gates.both]\nrun = "sleep 1; if [ -e n02.txt ]; then sleep 1; fi; '
        '! { [ -e n01.txt ] && [ -e n02.txt ]; }"\n'
    )
    result = integrate(repo=project, manifest=manifest, batch=2, window=2)
    final = states(project)
    assert final == {"n01": "landed", "n02": "gates-failed"}, (
        final,
        trace(result.pipeline, times=True),
    )
    landing = [e for e in watch(repo=project, follow=False) if str(e.state) == "landing"]
    assert [e.id.split(".")[1] for e in landing] == ["n01"], landing
    assert result.rebuilds == 0, trace(result.pipeline, times=True)


def test_a_second_culprit_in_what_is_left_holds_back_what_is_behind_it_again(
    project: Path, tmp_path: Path
) -> None:
    """n02 and n07 break the first batch of 8.  Once n02 is blamed, what is left of the batch
    is gated with what is behind it; when that fails too (n07), its own halves hold back
    what is behind them again: once the first batch failed, nothing is gated on a tree that
    holds a culprit not found yet (n09..n16 speculated behind the first batch is the bet
    the pipeline makes on every batch)."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 16, {2: "BROKEN\n", 7: "BROKEN\n"}))
    result = integrate(repo=project, manifest=slow_anonymous_gate(tmp_path), batch=8, window=2)
    final = states(project)
    culprits = {"n02", "n07"}
    assert {k for k, v in final.items() if v == "gates-failed"} == culprits, final
    first = min(r.end for r in result.pipeline if str(r.verdict) == "failed")
    wasted = [r for r in spent_behind(result.pipeline, culprits) if r.start > first]
    assert wasted == [], trace(result.pipeline, times=True)
    assert_every_landing_was_gated(project, base, tmp_path)


def test_a_pairs_rest_takes_what_is_left_past_an_envelope_its_batch_put_aside(
    project: Path, tmp_path: Path
) -> None:
    """n11 breaks a batch of 16 that names nothing; n15 does not apply behind n14 (the
    batch's tree was gated without it).  Narrowed down to the pair n11, n12, the rest beside
    n11 took what was left only up to n15 (not in the batch's tree): n16 was gated apart,
    and the rest, lacking it, corroborated nothing (n11 re-run).  It takes all of it, n15
    put aside in its place again: n11 is blamed off the batch's failure, no re-run."""
    from test_bisection import anonymous_gate

    envelopes = breaking(project, 13, {11: "BROKEN\n"})
    envelopes += [worker(project, who, partial(two_lines, who)) for who in ("n14", "n15")]
    envelopes += breaking(project, 16, {}, first=16)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=anonymous_gate(tmp_path), batch=16, window=2)
    final = states(project)
    assert (final.pop("n11"), final.pop("n15")) == ("gates-failed", "conflict"), final
    assert set(final.values()) == {"landed"}, final
    rest = [r for r in holding(result.pipeline, "n12") if str(r.verdict) == "passed"]
    assert rest and holding([rest[-1]], "n16"), trace(result.pipeline)
    assert result.confirm_runs == 0, trace(result.pipeline)
