"""The queue at swarm volume, on real repositories and gate processes: batches that size
themselves (grow on passes, shrink on a culprit, never land an ungated tree) and
differential gating (a red target does not stall the swarm)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from conftest import commit_release_manifest, git
from test_integration import breaks_gate, states, worker
from test_pipeline import numbered, recording, recording_gate

from dagrunner import watch
from dagrunner.envelope import parse_envelope
from dagrunner.git.repo import repo_info
from dagrunner.integration import batching
from dagrunner.integration.run import integrate, queue_status
from dagrunner.integration.submit import submit
from dagrunner.records.run import (
    Attempt,
    GateResult,
    RunRecord,
    RunStatus,
    Status,
    TestCase,
    TestRun,
)


def target_heads(project: Path, base: str) -> list[str]:
    """Every commit the target pointed at since ``base``, from its reflog (oldest first)."""
    moved = git(project, "reflog", "--format=%H", "refs/heads/main").split()[::-1]
    return moved[moved.index(base) + 1 :]


def assert_every_landing_was_gated(project: Path, base: str, tmp: Path) -> None:
    """Never an ungated tree: each tree the target moved to is one a gate run judged."""
    gated = set((tmp / "gated.txt").read_text().split())
    for head in target_heads(project, base):
        assert git(project, "rev-parse", f"{head}^{{tree}}").strip() in gated, head


def workers(ids: tuple[str, ...]) -> tuple[str, ...]:
    """A run's envelopes by their workers' names."""
    return tuple(i.split(".")[1] for i in ids)


def batch_events(project: Path) -> list[str]:
    return [
        e.details.note or "" for e in watch(repo=project, follow=False) if e.event == "batch-size"
    ]


def test_auto_batches_grow_while_they_pass(project: Path, tmp_path: Path) -> None:
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), numbered(project, 20))
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.05), window=1)
    assert set(states(project).values()) == {"landed"}
    assert result.batches[0] == 4 and max(result.batches) >= 8, result.batches
    assert sum(result.batches) == 20
    said = batch_events(project)
    assert said[0].startswith("batch size 4: the first batch")
    assert any(n.startswith("batch size 8: grew: ") for n in said), said
    assert result.gate_runs < 20 / 2  # one run per batch, far fewer than one per envelope
    assert_every_landing_was_gated(project, base, tmp_path)


def test_auto_batches_shrink_on_culprits_and_only_they_fail(project: Path, tmp_path: Path) -> None:
    """Three culprits among the first four: after two, the rate of culprits among the
    envelopes judged (with its prior of one in eight) is over a fifth, and generalized
    binary splitting's batch for it is 2; it grows again as the rest land."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 20, dict.fromkeys((2, 3, 4), "BROKEN\n")))
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.05), window=1)
    final = states(project)
    assert result.batches[0] == 4 and min(result.batches) <= 2, result.batches
    assert final.pop("n02") == final.pop("n03") == final.pop("n04") == "gates-failed", final
    assert set(final.values()) == {"landed"}, final
    said = batch_events(project)
    assert "batch size 2: shrank: 2 culprits among the last 3 envelopes judged" in said, said
    assert any(n.startswith("batch size 4: grew: 3 culprits among the last") for n in said), said
    assert_every_landing_was_gated(project, base, tmp_path)


def test_a_fixed_batch_is_the_manifests_and_no_size_is_decided(project: Path) -> None:
    body = (project / "manifests" / "release.toml").read_text()
    commit_release_manifest(project, "[integrate]\nbatch = 3\n" + body)
    submit(repo_info(project), numbered(project, 6))
    result = integrate(repo=project, window=1)
    assert result.batches == [3, 3]
    assert batch_events(project) == ["batch size 3: fixed by --batch or [integrate] batch"]


CHECK = """import pathlib, sys
if pathlib.Path("nojunit.txt").exists():
    sys.exit(1)  # fails before it writes its JUnit file
red = "RED" in pathlib.Path("known.txt").read_text() or pathlib.Path("rebreak.txt").exists()
new = any("NEWBREAK" in p.read_text() for p in pathlib.Path(".").glob("*.txt"))
cases = [("test_known", red), ("test_new", new), ("test_fine", False)]
body = "".join(
    f'<testcase classname="suite" name="{n}">' + ("<failure/>" if bad else "") + "</testcase>"
    for n, bad in cases
)
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/junit.xml").write_text(
    f'<testsuite name="suite" tests="3" failures="{red + new}">{body}</testsuite>'
)
sys.exit(1 if red or new else 0)
"""


def red_target(project: Path, baseline: str) -> None:
    """A target whose own head already fails JUnit case test_known."""
    (project / "check.py").write_text(CHECK)
    (project / "known.txt").write_text("RED since this commit\n")
    (project / ".gitignore").write_text("out/\n")
    setting = f'[integrate]\nbaseline = "{baseline}"\n\n' if baseline else ""
    git(project, "add", "check.py", "known.txt", ".gitignore")
    commit_release_manifest(
        project,
        f'{setting}[gates.tests]\nrun = ["python3", "check.py"]\njunit = "out/junit.xml"\n',
    )


def five_envelopes(project: Path) -> list[Path]:
    """Four good envelopes and, third, one that adds the failing case test_new."""
    return [
        worker(
            project,
            f"e{i}",
            (lambda p: (p / "third.txt").write_text("NEWBREAK\n"))
            if i == 3
            else (lambda p, i=i: (p / f"e{i}.txt").write_text(f"{i}\n")),
        )
        for i in range(1, 6)
    ]


def test_differential_lands_what_adds_no_failure_and_names_what_is_new(project: Path) -> None:
    red_target(project, "differential")
    red_since = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), five_envelopes(project))
    result = integrate(repo=project)
    assert states(project) == {
        "e1": "landed",
        "e2": "landed",
        "e3": "gates-failed",
        "e4": "landed",
        "e5": "landed",
    }
    failed = next(e for e in result.envelopes if e.worker == "e3")
    assert failed.details.failed_gates == ("tests",)
    assert failed.details.failed_tests == ("tests::suite::test_new",)
    red = [e for e in watch(repo=project, follow=False) if e.event == "target-red"]
    assert len(red) == 1, red  # said once, however many items met it
    assert red[0].details.target_red == ("tests::suite::test_known",)
    assert red[0].details.red_since == red_since
    assert result.target_red == ("tests::suite::test_known",)
    head_runs = [r for r in result.pipeline if not r.envelopes]  # shared by every item
    assert len(head_runs) == 2, result.pipeline  # its run, and its failures confirmed
    assert all(r.gates == ("tests",) for r in head_runs), result.pipeline
    assert "RED" in git(project, "show", "main:known.txt")  # the target is no worse
    shown = queue_status(repo=project)["target_red"]
    said = (
        "main itself fails tests: items are blamed only for what they add (baseline = differential)"
    )
    assert shown == {"main": {"fails": ["tests::suite::test_known"], "since": red_since,
                              "head": red_since, "at": red[0].at, "said": said}}  # fmt: skip


def test_absolute_a_red_target_holds_every_item_but_one_that_adds_a_failure(
    project: Path,
) -> None:
    """Absolute: nothing lands on a red target; an item is blamed only for what it adds
    (e3's test_new), the rest stay queued (held), and the target's red is said."""
    red_target(project, "")
    before = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), five_envelopes(project))
    result = integrate(repo=project)
    assert states(project) == {
        "e1": "queued",
        "e2": "queued",
        "e3": "gates-failed",
        "e4": "queued",
        "e5": "queued",
    }
    assert git(project, "rev-parse", "main").strip() == before
    red = [e for e in watch(repo=project, follow=False) if e.event == "target-red"]
    assert len(red) == 1 and red[0].details.target_red == ("tests::suite::test_known",)
    named = {e.worker: e.details.failed_tests for e in result.envelopes}
    assert named == {"e3": ("tests::suite::test_new",)}, named  # not the target's own
    assert len(result.held) == 4


def test_a_red_target_that_a_landing_fixes_turns_green(project: Path) -> None:
    red_target(project, "differential")
    first = worker(project, "first", breaks_gate)  # BROKEN: the check does not read it
    fix = worker(project, "fix", lambda p: (p / "known.txt").write_text("fixed\n"))
    submit(repo_info(project), [first, fix])
    integrate(repo=project, batch=1)
    assert states(project) == {"first": "landed", "fix": "landed"}
    events = [e.event for e in watch(repo=project, follow=False)]
    assert events.count("target-red") == 1 and events.count("target-green") == 1
    assert events.index("target-red") < events.index("target-green")
    assert queue_status(repo=project)["target_red"] == {}  # green again: no longer shown


def test_a_conflict_behind_the_front_leaves_its_batch_and_stalls_nothing(
    project: Path, tmp_path: Path
) -> None:
    """c6 edits the line c1 edits: on the speculative head (c1's batch ahead) it does not
    apply, so it is put aside, an item of its own; c5, ahead of it, is gated at once beside
    the first batch, and c7, c8 behind it on c5, without it (never ahead of it: one may
    build on it); at the front c6 is a conflict, never gated."""

    def edit(text: str) -> Any:
        return lambda p: (p / "shared.txt").write_text(f"one\n{text}\nthree\n")

    changes = {
        f"c{i}": (lambda p, i=i: (p / f"c{i}.txt").write_text(f"{i}\n")) for i in range(1, 9)
    }
    changes["c1"], changes["c6"] = edit("TWO from c1"), edit("TWO from c6")
    submit(repo_info(project), [worker(project, name, change) for name, change in changes.items()])
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.5), window=2)
    final = states(project)
    assert final.pop("c6") == "conflict" and set(final.values()) == {"landed"}
    first, second = result.pipeline[0], result.pipeline[1]
    # c5, c7, c8 in one run: the tree the serial loop gates them on once c1 landed
    assert [workers(r.envelopes) for r in result.pipeline][1:] == [("c5", "c7", "c8")]
    assert second.start < first.end  # gated beside the first batch, not after it


def test_a_batch_with_an_envelope_that_conflicts_with_a_sibling_is_gated_in_one_run(
    project: Path, tmp_path: Path
) -> None:
    """n02 edits the line n01 edits, in one batch at the front: n02 is put aside and the
    batch gated without it, in one run (not n01, then n03 and n04 apart); the batch passing,
    n01 lands, so n02 is judged where the serial loop judges it -- on n01: a conflict."""

    def edit(text: str) -> Any:
        return lambda p: (p / "shared.txt").write_text(f"one\n{text}\nthree\n")

    envelopes = [
        worker(project, "n01", edit("two, n01")),
        worker(project, "n02", edit("two, n02")),
        *breaking(project, 4, {}, first=3),
    ]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.05), batch=4, window=1)
    assert states(project) == {"n01": "landed", "n02": "conflict", "n03": "landed", "n04": "landed"}
    assert [workers(r.envelopes) for r in result.pipeline] == [("n01", "n03", "n04")]
    assert git(project, "show", "main:shared.txt") == "one\ntwo, n01\nthree\n"
    (conflict,) = [e for e in result.envelopes if str(e.state) == "conflict"]
    assert conflict.details.conflicts == ("shared.txt",)


def test_a_red_target_said_by_one_run_turns_green_in_the_next(project: Path) -> None:
    """The colour lives in the journal: a fix landed by a later run says target-green, and
    status stops showing red; that run's result ends green."""
    red_target(project, "differential")
    submit(repo_info(project), [worker(project, "first", breaks_gate)])
    assert integrate(repo=project).target_red == ("tests::suite::test_known",)
    assert queue_status(repo=project)["target_red"] != {}
    fix = worker(project, "fix", lambda p: (p / "known.txt").write_text("fixed\n"))
    submit(repo_info(project), [fix])
    result = integrate(repo=project)
    assert states(project) == {"first": "landed", "fix": "landed"}
    events = [e.event for e in watch(repo=project, follow=False)]
    assert events.count("target-red") == 1 and events.count("target-green") == 1
    assert queue_status(repo=project)["target_red"] == {}
    assert result.target_red == ()
    head_runs = [r for r in result.pipeline if not r.envelopes]
    assert head_runs == []  # the fix passed: the head's own verdict was never needed


def test_a_front_that_conflicts_after_all_leaves_what_passed_behind_it_to_land(
    project: Path, tmp_path: Path
) -> None:
    """Found by a fuzz run (a hang): culprits, and envelopes editing one shared line put
    aside behind the front; when the last one put aside reached the front and was a
    conflict there, the item behind it had passed already -- and the run waited for a
    verdict that had come.  Batches of 3, window 2."""
    kinds = "bfbffblbllfffl"  # bad, file, line (the same line of shared.txt)

    def change(i: int, kind: str) -> Any:
        if kind == "l":
            return lambda p: (p / "shared.txt").write_text(f"one\nTWO e{i:02d}\nthree\n")
        if kind == "b":
            return breaks_gate
        return lambda p: (p / f"e{i:02d}.txt").write_text(f"{i}\n")

    envelopes = [worker(project, f"e{i:02d}", change(i, k)) for i, k in enumerate(kinds)]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.0), window=2, batch=3)
    final = states(project)
    assert all(final[f"e{i:02d}"] == "gates-failed" for i, k in enumerate(kinds) if k == "b")
    assert all(final[f"e{i:02d}"] == "landed" for i, k in enumerate(kinds) if k == "f"), final
    lines = [final[f"e{i:02d}"] for i, k in enumerate(kinds) if k == "l"]
    assert lines.count("landed") == 1 and lines.count("conflict") == len(lines) - 1, final
    assert result.rebuilds == 0 and not result.target_moving


def test_differential_never_excuses_a_failure_its_junit_does_not_list(project: Path) -> None:
    """The target fails test_known; an item whose check fails before it writes JUnit says
    nothing of which cases failed: it is blamed, not excused as the target's."""
    red_target(project, "differential")
    quiet = worker(project, "quiet", lambda p: (p / "nojunit.txt").write_text("x\n"))
    good = worker(project, "good", lambda p: (p / "good.txt").write_text("x\n"))
    submit(repo_info(project), [quiet, good])
    integrate(repo=project, batch=1)
    assert states(project) == {"quiet": "gates-failed", "good": "landed"}


def test_an_item_excused_on_a_red_head_is_judged_again_on_the_head_it_lands_on(
    project: Path,
) -> None:
    """``fix`` repairs test_known; ``rebreak``, behind it, breaks it again.  Judged against
    the red head its verdict came on, rebreak looked no worse; on the head it would land on
    (fixed by then) it is what breaks test_known, and it is blamed."""
    red_target(project, "differential")
    fix = worker(project, "fix", lambda p: (p / "known.txt").write_text("fixed\n"))
    rebreak = worker(project, "rebreak", lambda p: (p / "rebreak.txt").write_text("x\n"))
    submit(repo_info(project), [fix, rebreak])
    result = integrate(repo=project, batch=1, window=2)
    assert states(project) == {"fix": "landed", "rebreak": "gates-failed"}
    blamed = next(e for e in result.envelopes if e.worker == "rebreak")
    assert blamed.details.failed_tests == ("tests::suite::test_known",)
    assert queue_status(repo=project)["target_red"] == {}  # green, and it stays so


def test_a_flake_of_the_heads_own_run_never_excuses_a_real_break(
    project: Path, tmp_path: Path
) -> None:
    """The head's first run of ``lint`` fails once (a flake: the first run of a tree
    without bad.txt); ``x`` really breaks lint.  The head's failures are confirmed like an
    item's: its second run passes, so the target is green and x is blamed, never excused."""
    marker = tmp_path / "flaked"
    commit_release_manifest(
        project,
        f'[sandbox]\nwritable = ["{tmp_path}"]\n\n[integrate]\nbaseline = "differential"\n\n'
        f"[gates.lint]\nrun = \"if [ ! -e bad.txt ] && mkdir '{marker}'; then exit 1; fi; "
        '! grep -rq BROKEN --include=*.txt ."\n',
    )
    submit(repo_info(project), [worker(project, "x", breaks_gate)])
    result = integrate(repo=project, batch=1)
    assert states(project) == {"x": "gates-failed"}
    assert marker.is_dir()  # the head's first run did flake
    assert [e for e in watch(repo=project, follow=False) if e.event == "target-red"] == []
    assert len([r for r in result.pipeline if not r.envelopes]) == 2  # run, and confirmed


def naming_gate(tmp: Path, show: str, quiet: str = "none") -> Path:
    """A gate that records the tree it judged and fails on BROKEN, saying where as a runner
    does: ``show`` is grep's option (``-n``: ``path:line:text``; ``-h``: the text only); of
    file ``quiet`` it says nothing."""
    say = f"grep -r {show} BROKEN --include=*.txt --exclude={quiet} ."
    return recording(tmp, f"{say}; ! grep -rq BROKEN --include=*.txt .", before="sleep 0.2; ")


def breaking(project: Path, count: int, bad: dict[int, str], first: int = 1) -> list[Path]:
    """Envelopes n{first}..n{count}, each changing its own file; ``bad[i]``: what n{i}'s file
    says."""
    return [
        worker(
            project,
            f"n{i:02d}",
            lambda p, i=i: (p / f"n{i:02d}.txt").write_text(bad.get(i, f"{i}\n")),
        )
        for i in range(first, count + 1)
    ]


def test_the_envelope_a_failure_names_is_gated_first_apart_from_the_rest(
    project: Path, tmp_path: Path
) -> None:
    """The gate says ./n05.txt:1 broke it: n05 is gated alone on what is queued ahead of it
    (n01..n04, as the serial loop gates it) and the rest (n06..n08) on those, built without
    it, at the same time; n05 fails the gate its batch failed and the rest passes without
    it: that is its confirmation (no re-run).  n01..n04 (carried: not gated while n05 may
    pass and land them) are then gated alone, as the serial loop judges n05 on them (a tree
    holding the rest says nothing of them alone); they land, n05 is blamed, the rest lands.
    Four runs of envelopes in all, where halving 8 takes five, one after another (and one
    of the target's head, once: does it fail the gate too?)."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 8, {5: "BROKEN\n"}))
    result = integrate(repo=project, manifest=naming_gate(tmp_path, "-n"), batch=8, window=2)
    final = states(project)
    assert final.pop("n05") == "gates-failed" and set(final.values()) == {"landed"}
    runs = {(len(r.envelopes), str(r.verdict)): r for r in result.pipeline if r.envelopes}
    assert sorted(runs) == [(1, "failed"), (3, "passed"), (4, "passed"), (8, "failed")]
    assert [str(r.verdict) for r in result.pipeline if not r.envelopes] == ["passed"]
    assert result.confirm_runs == 0
    alone, rest = runs[1, "failed"], runs[3, "passed"]
    assert alone.envelopes[0].split(".")[1] == "n05"
    assert base != alone.head == rest.head  # on n01..n04, as the serial loop
    assert rest.start < alone.end  # gated beside it
    ahead = runs[4, "passed"]
    assert target_heads(project, base) == [ahead.commit, rest.commit]  # n01..n04 first
    named = [e for e in watch(repo=project, follow=False) if e.event == "named"]
    assert [e.id.split(".")[1] for e in named] == ["n05"], named
    assert (named[0].details.note or "").startswith("named by the failure of gates-01")
    assert_every_landing_was_gated(project, base, tmp_path)


def test_a_carried_envelope_withdrawn_while_the_named_gate_never_gets_them_blamed(
    project: Path, tmp_path: Path
) -> None:
    """n05 fails only beside n02 (the check names n05); n01..n04 are carried, and n02 is
    withdrawn while n05 and the rest gate.  n05 was judged on a tree holding n02: it must
    not be blamed off the rest's pass (which would land n02); the carried piece is gated on
    its own, found withdrawn, and n05, judged again without n02, lands."""
    import threading
    import time

    from dagrunner.integration.submit import withdraw

    submit(repo_info(project), breaking(project, 8, {}))
    check = (
        "sleep 1; if [ -e n02.txt ] && [ -e n05.txt ]; then echo './n05.txt:1: clash'; exit 1; fi"
    )
    gate = recording(tmp_path, check)

    def withdraw_once_named() -> None:
        for _ in range(600):
            named = [e.id for e in watch(repo=project, follow=False) if e.event == "named"]
            if named:
                ids = [e.id for e in watch(repo=project, follow=False) if ".n02." in e.id]
                withdraw(repo_info(project), ids[0])
                return
            time.sleep(0.05)

    thread = threading.Thread(target=withdraw_once_named)
    thread.start()
    integrate(repo=project, manifest=gate, batch=8, window=2)
    thread.join()
    final = states(project)
    assert final.pop("n02") == "withdrawn" and set(final.values()) == {"landed"}, final
    assert "n02.txt" not in git(project, "ls-tree", "-r", "--name-only", "main")


def tree_gate(tmp: Path) -> Path:
    """A gate that runs the tree's own checks (``checks/*.sh``), as a test suite does: an
    envelope says what its checks print and when they fail."""
    checks = "for f in checks/*.sh; do [ -e $f ] || continue; sh $f || exit 1; done"
    return recording(tmp, checks, before="sleep 0.2; ", name="tree")


def checking(project: Path, name: str, script: str) -> Path:
    """An envelope that adds ``checks/<name>.sh``."""

    def write(path: Path) -> None:
        (path / "checks").mkdir()
        (path / "checks" / f"{name}.sh").write_text(script)

    return worker(project, name, write)


def test_a_failure_that_names_innocents_queued_ahead_never_gets_them_blamed(
    project: Path, tmp_path: Path
) -> None:
    """A hostile n08, last in its batch, fails whenever n01..n04 are in its tree and names
    them (4 of 8: at most half).  They are gated first, without n08: they pass and land; n08
    on them fails and is blamed.  (Gated behind the rest, they would be judged on trees
    holding n08, and blamed for it.)"""
    base = git(project, "rev-parse", "main").strip()
    bomb = (
        "for f in n01.txt n02.txt n03.txt n04.txt; do "
        '[ -e $f ] && echo "error: ./$f:1" && bad=1; done; [ -z "$bad" ]\n'
    )
    submit(repo_info(project), [*breaking(project, 7, {}), checking(project, "n08", bomb)])
    integrate(repo=project, manifest=tree_gate(tmp_path), batch=8, window=2)
    final = states(project)
    assert final.pop("n08") == "gates-failed" and set(final.values()) == {"landed"}, final
    named = [e.id.split(".")[1] for e in watch(repo=project, follow=False) if e.event == "named"]
    assert sorted(named) == ["n01", "n02", "n03", "n04"]
    assert_every_landing_was_gated(project, base, tmp_path)


def test_a_batch_is_split_by_names_once_then_halved(project: Path, tmp_path: Path) -> None:
    """A hostile n01 always fails and names one other envelope of its tree: a batch of 16 is
    split by that name once, then halved -- about as many runs as halving, not a run per
    envelope."""
    base = git(project, "rev-parse", "main").strip()
    bomb = (
        "for f in n*.txt; do [ $f = n01.txt ] && continue; "
        'echo "error: ./$f:1"; break; done; exit 1\n'
    )
    others = breaking(project, 16, {}, first=2)
    submit(repo_info(project), [checking(project, "n01", bomb), *others])
    result = integrate(repo=project, manifest=tree_gate(tmp_path), batch=16, window=2)
    final = states(project)
    assert final.pop("n01") == "gates-failed" and set(final.values()) == {"landed"}, final
    named = [e.id.split(".")[1] for e in watch(repo=project, follow=False) if e.event == "named"]
    assert named == ["n02"], named
    assert result.gate_runs <= 12, [r.to_json() for r in result.pipeline]
    assert_every_landing_was_gated(project, base, tmp_path)


def test_what_a_failure_names(project: Path, tmp_path: Path) -> None:
    """A path a batch's envelope changes, as a word of a failing gate's log tail (colours and
    all) or a failed test case's (a dotted module too); a longer path's end counts, a longer
    name does not; more than half of the batch named names none."""
    changes = {
        "alpha": ("tests/test_alpha.py", "def test_x(): pass\n"),
        "beta": ("src/pkg/beta.py", "B = 1\n"),
        "gamma": ("gamma.txt", "g\n"),
        "delta": ("delta.txt", "d\n"),
        "eps": ("eps.txt", "e\n"),
    }

    def change(path: str, text: str) -> Any:
        def write(p: Path) -> None:
            (p / path).parent.mkdir(parents=True, exist_ok=True)
            (p / path).write_text(text)

        return write

    envelopes = [
        parse_envelope(worker(project, name, change(*c)).read_bytes())
        for name, c in changes.items()
    ]

    def named_by(log: str, cases: tuple[TestCase, ...] = ()) -> set[str]:
        (tmp_path / "check.log").write_text(log)
        attempt = Attempt(number=1, started=0.0, finished=1.0, exit_code=1, log="check.log")
        tests = TestRun(tests=len(cases), failures=len(cases), cases=cases)
        gate = GateResult(id="check", status=Status.FAILED, attempts=(attempt,), tests=tests)
        passed = GateResult(id="lint", status=Status.PASSED, attempts=(attempt,))
        record = RunRecord(
            run_id="r",
            status=RunStatus.FAILED,
            started_at="",
            wall=1.0,
            manifest={},
            git={},
            machine={},
            governor={},
            gates=[gate, passed],
        )
        return {i.split(".")[1] for i in batching.named(envelopes, record, tmp_path)}

    assert named_by("FAILED tests/test_alpha.py::test_x - assert 1 == 2\n") == {"alpha"}
    assert named_by("\x1b[1m/tmp/slot/src/pkg/beta.py\x1b[0m:3:1: F401 unused\n") == {"beta"}
    said = "error: src/pkg/beta.pyc tests/test_alpha.py.orig xgamma.txt beta.py\n"
    assert named_by(said) == set()
    case = TestCase(suite="tests.test_alpha.TestX", name="test_y", outcome="failed")
    assert named_by("1 failed\n", (case,)) == {"alpha"}
    assert named_by("error: gamma.txt delta.txt\n") == {"gamma", "delta"}
    assert named_by("error: gamma.txt delta.txt eps.txt\n") == set()  # 3 of 5: nothing
    # what a failing test is named after: test_gamma, delta_test, DeltaTest, gamma.spec.ts
    assert named_by("FAILED tests/test_gamma.py::test_x - assert 1 == 2\n") == {"gamma"}
    assert named_by("--- FAIL: TestX (0.00s)\n    delta_test.go:12: want 1\n") == {"delta"}
    assert named_by("FAIL src/gamma.spec.ts\n") == {"gamma"}
    # a runner's progress lines name every file, failing or not: they name nothing
    assert named_by("tests/test_alpha.py ....\ngamma.txt ok\n3 passed\n") == set()


def test_a_named_envelope_is_confirmed_by_a_rerun_when_the_rest_fails_too(
    project: Path, tmp_path: Path
) -> None:
    """Two culprits in a batch of 8, the failure names only n03: the rest (n06 in it) fails
    too, so n03's failure alone is not its batch's explanation -- it is re-run before it is
    blamed; n06 is found by halving the rest, down to the pair n05, n06: n05 passing, n06 is
    confirmed on the pair's tree (the one that holds n05) before it is blamed."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 8, {3: "BROKEN\n", 6: "BROKEN\n"}))
    manifest = naming_gate(tmp_path, "-n", quiet="n06.txt")
    result = integrate(repo=project, manifest=manifest, batch=8, window=2)
    final = states(project)
    assert final.pop("n03") == "gates-failed" and final.pop("n06") == "gates-failed"
    assert set(final.values()) == {"landed"}, final
    named = [e.id.split(".")[1] for e in watch(repo=project, follow=False) if e.event == "named"]
    assert named == ["n03"], named
    confirmed = [r.envelopes[0].split(".")[1] for r in result.pipeline if r.confirm]
    # n03 re-run before it is blamed, n06 after; another confirmation is a run that failed
    # for the machine's sake (seen once under a loaded CI: n05), re-run and landed
    assert [e for e in confirmed if e in ("n03", "n06")] == ["n03", "n06"], confirmed
    assert all(final[e] == "landed" for e in confirmed if e not in ("n03", "n06")), confirmed
    assert_every_landing_was_gated(project, base, tmp_path)


def test_with_a_window_of_one_a_named_envelope_is_confirmed_by_a_rerun(
    project: Path, tmp_path: Path
) -> None:
    """One run at a time: nothing is gated beside the named n05, so its batch's failure
    cannot be corroborated by the rest passing; it is re-run and blamed.  What is ahead of
    it (carried while n05 might pass and land it) is gated on its own once n05 failed, then
    the rest (it used to wait for the rest, which waited for the window: a hang)."""
    submit(repo_info(project), breaking(project, 8, {5: "BROKEN\n"}))
    result = integrate(repo=project, manifest=naming_gate(tmp_path, "-n"), batch=8, window=1)
    final = states(project)
    assert final.pop("n05") == "gates-failed" and set(final.values()) == {"landed"}
    runs = [(len(r.envelopes), str(r.verdict)) for r in result.pipeline]
    # the target's head, once, after the first failure: it passes, the failure is theirs;
    # then n05 on what is queued ahead of it, what is ahead alone (n05 failed), n05's
    # re-run, the rest
    assert sorted(runs) == sorted(
        [
            (8, "failed"),
            (0, "passed"),
            (1, "failed"),
            (4, "passed"),
            (1, "confirmed"),
            (3, "passed"),
        ]
    ), runs
    assert all(a.end <= b.start for a, b in itertools.pairwise(result.pipeline))


def test_a_carried_piece_lands_with_a_named_one_that_passes_after_all(
    project: Path, tmp_path: Path
) -> None:
    """The batch's failure (a flake) names n05, which passes on its own tree: n01..n04,
    carried, land with it on its tree, never gated apart -- and each landed entry says
    which gate run passed the tree it landed on (integrate status --json's landed shape,
    tests/test_json_shapes.py; round 11 found the carried ones without it)."""
    base = git(project, "rev-parse", "main").strip()
    once = tmp_path / "flaked"
    say = f"if mkdir '{once}' 2>/dev/null; then echo './n05.txt:1: flaked'; exit 1; fi"
    submit(repo_info(project), breaking(project, 8, {}))
    result = integrate(repo=project, manifest=recording(tmp_path, say), batch=8, window=2)
    assert set(states(project).values()) == {"landed"}
    runs = [(len(r.envelopes), str(r.verdict)) for r in result.pipeline if r.envelopes]
    assert (4, "passed") not in runs and (1, "passed") in runs, runs
    assert_every_landing_was_gated(project, base, tmp_path)
    landed = [e for e in queue_status(repo=project)["envelopes"] if e["state"] == "landed"]
    odd = [e["worker"] for e in landed if not {"gate_run", "head", "position"} <= set(e)]
    assert odd == [], odd
    carried = {e["worker"]: e.get("gate_run") for e in landed if e["worker"] <= "n05"}
    assert len(set(carried.values())) == 1, carried  # n01..n05: n05's run


def test_a_flake_landing_on_a_red_target_leaves_it_red_and_blames_nobody(
    project: Path, tmp_path: Path
) -> None:
    """Differential, red target: n01's tree fails test_new once (a flake) and test_known (the
    target's).  Its re-run passes but for test_known: it lands, and the target it leaves is
    as red as before -- no target-green, and n02 behind it is not blamed for test_known
    (found by fuzzing: the flake's gate was dropped whole from the head's failures)."""
    red_target(project, "differential")
    marker = tmp_path / "flaked"
    flaky = (
        f'\nimport os\nif pathlib.Path("flaky.txt").exists() and not os.path.exists("{marker}"):\n'
    )
    flaky += f'    os.mkdir("{marker}"); new = True; red = True\n'
    check = CHECK.replace("cases = [", flaky + "cases = [", 1)
    assert check != CHECK
    (project / "check.py").write_text(check)
    body = (project / "manifests" / "release.toml").read_text()
    commit_release_manifest(project, f'[sandbox]\nwritable = ["{tmp_path}"]\n\n{body}')
    envelopes = [
        worker(project, "n01", lambda p: (p / "flaky.txt").write_text("once\n")),
        worker(project, "n02", lambda p: (p / "n02.txt").write_text("2\n")),
    ]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, batch=1, window=1)
    assert states(project) == {"n01": "landed", "n02": "landed"}, result.to_json()
    assert marker.is_dir()  # it did flake
    events = [e.event for e in watch(repo=project, follow=False)]
    assert "flaky" in events and "target-green" not in events, events


def test_a_conflict_with_a_culprit_of_its_own_batch_is_retried_not_final(
    project: Path, tmp_path: Path
) -> None:
    """n01 (a culprit) and n02 edit the same line, in one batch at the front: n02 does not
    apply on n01, which never lands -- so n02 is put aside and retried on the target, where
    it lands (found by fuzzing: it ended conflict against an envelope that never landed)."""

    def edit(text: str) -> Any:
        return lambda p: (p / "shared.txt").write_text(f"one\n{text}\nthree\n")

    submit(
        repo_info(project),
        [worker(project, "n01", edit("BROKEN by n01")), worker(project, "n02", edit("two, n02"))],
    )
    integrate(repo=project, manifest=recording_gate(tmp_path, 0.05), batch=2, window=1)
    assert states(project) == {"n01": "gates-failed", "n02": "landed"}
    assert git(project, "show", "main:shared.txt") == "one\ntwo, n02\nthree\n"


@pytest.mark.parametrize("certain", [False, True], ids=["confirmed", "certain"])
def test_an_envelope_behind_one_put_aside_is_never_judged_without_it(
    project: Path, tmp_path: Path, certain: bool
) -> None:
    """n01 (a culprit) and n02 edit the same line; n03 builds on n02 (its check fails
    without n02's line).  At the front n02 does not apply on n01 and is put aside -- behind
    n03, which was gated without it, on the target alone once n01 failed, and blamed: the
    serial loop lands n02 (n01 never landed), then n03 on it.  ``certain``: n01's failure
    is not re-run (exit 127), and n02, put aside ahead of n03, went back into the queue
    *behind* it: n03 was gated on the target without n02 ahead of it, and blamed."""

    def edit(text: str) -> Any:
        return lambda p: (p / "shared.txt").write_text(f"one\n{text}\nthree\n")

    needs = "if [ -e n03.txt ] && ! grep -q 'two, n02' shared.txt; then exit 1; fi; "
    check = needs + "! grep -rq BROKEN --include=*.txt ."
    if certain:
        check = "if grep -rq BROKEN --include=*.txt .; then exit 127; fi; " + needs + "true"
    gate = recording(tmp_path, check, before="sleep 0.05; ")
    submit(
        repo_info(project),
        [
            worker(project, "n01", edit("BROKEN by n01")),
            worker(project, "n02", edit("two, n02")),
            worker(project, "n03", lambda p: (p / "n03.txt").write_text("NEEDS n02\n")),
        ],
    )
    base = git(project, "rev-parse", "main").strip()
    integrate(repo=project, manifest=gate, batch=3, window=2)
    assert states(project) == {"n01": "gates-failed", "n02": "landed", "n03": "landed"}
    assert_every_landing_was_gated(project, base, tmp_path)
    said = "--format=%(trailers:key=Dagrunner-Worker,valueonly)"
    landed = git(project, "log", "--reverse", said, f"{base}..main").split()
    assert landed == ["n02", "n03"], landed  # in the queue's order


def test_an_envelope_put_aside_ahead_of_a_failing_one_is_judged_before_it(
    project: Path, tmp_path: Path
) -> None:
    """Fuzzer seed 43: n01 (a culprit) and n03 edit the same line, n04 needs n03's line,
    n02 breaks too.  The batch fails naming none; its second half [n03, n04], built on the
    first [n01, n02], put n03 aside (it does not apply on n01): its tree is the batch's,
    known failed, so n04 failed without a run -- and n03 went back behind it.  n01 failing,
    n03 lands, and n04, judged without it, was blamed: the serial loop lands both."""

    def edit(text: str) -> Any:
        return lambda p: (p / "shared.txt").write_text(f"one\n{text}\nthree\n")

    needs = "if [ -e n04.txt ] && ! grep -q 'two, n03' shared.txt; then exit 1; fi; "
    gate = recording(tmp_path, needs + "! grep -rq BROKEN --include=*.txt .", before="sleep 0.1; ")
    submit(
        repo_info(project),
        [
            worker(project, "n01", edit("BROKEN by n01")),
            worker(project, "n02", lambda p: (p / "n02.txt").write_text("BROKEN\n")),
            worker(project, "n03", edit("two, n03")),
            worker(project, "n04", lambda p: (p / "n04.txt").write_text("NEEDS n03\n")),
        ],
    )
    base = git(project, "rev-parse", "main").strip()
    result = integrate(repo=project, manifest=gate, batch=4, window=4)
    final = states(project)
    assert final == {"n01": "gates-failed", "n02": "gates-failed", "n03": "landed", "n04": "landed"}
    assert_every_landing_was_gated(project, base, tmp_path)
    landed = git(project, "log", "--reverse", "--format=%s", f"{base}..main").splitlines()
    assert [s.split("/")[-1] for s in landed] == ["n03", "n04"], landed  # in the queue's order
    assert [len(r.envelopes) for r in result.pipeline][:3] == [3, 0, 2]  # its first half, run


@pytest.mark.parametrize("batch", [1, 2], ids=["behind", "in-its-batch"])
def test_an_item_built_on_a_manifest_change_is_judged_by_it_once_it_landed(
    project: Path, batch: int
) -> None:
    """``strict`` adds a gate to the target's manifest (no file lax.txt); ``lax``, behind
    it, adds lax.txt.  Built on strict while the target's head still had the old manifest
    (an item behind it, or in its batch), lax passed the old gates -- and landed, on a
    target whose manifest it never passed.  The serial loop judges lax by strict's
    manifest, and blames it."""
    strict = '\n[gates.strict]\nrun = "test ! -e lax.txt"\n'

    def add_gate(path: Path) -> None:
        manifest = path / "manifests" / "release.toml"
        manifest.write_text(manifest.read_text() + strict)

    submit(
        repo_info(project),
        [
            worker(project, "strict", add_gate),
            worker(project, "lax", lambda p: (p / "lax.txt").write_text("x\n")),
        ],
    )
    integrate(repo=project, batch=batch, window=2)
    assert states(project) == {"strict": "landed", "lax": "gates-failed"}
    assert git(project, "show", "main:manifests/release.toml").endswith(strict)


def test_a_rest_holding_an_envelope_its_batch_put_aside_corroborates_nothing(
    project: Path, tmp_path: Path
) -> None:
    """Batch [a, e, b]: e edits the line a edits (put aside, the batch gated as a+b), b is
    broken unless e's fix is in the tree.  a+b fails and names a; a alone flakes once; the
    rest, built without a, is e+b -- e applies there and fixes b, so it passes.  That is no
    corroboration of a: the rest's tree holds e, which the batch's did not, so its pass
    says nothing about what failed the batch.  The serial loop confirms a's flake (a lands),
    then e conflicts on a and b is blamed."""
    check = tmp_path / "check.sh"
    check.write_text(
        "if [ -f b.txt ] && ! [ -f fix.txt ]; then echo 'error: ./shared.txt:2: broken'; exit 1; fi\n"
        f"if grep -q 'two, a' shared.txt && ! [ -f b.txt ] && mkdir '{tmp_path / 'a-flaked'}' "
        "2>/dev/null; then echo 'error: ./shared.txt:2: flaked'; exit 1; fi\n"
    )

    def edit(text: str, fix: bool = False) -> Any:
        def write(p: Path) -> None:
            (p / "shared.txt").write_text(f"one\n{text}\nthree\n")
            if fix:
                (p / "fix.txt").write_text("fixed\n")

        return write

    envelopes = [
        worker(project, "a", edit("two, a")),
        worker(project, "e", edit("two, e", fix=True)),
        worker(project, "b", lambda p: (p / "b.txt").write_text("b\n")),
    ]
    submit(repo_info(project), envelopes)
    gate = recording(tmp_path, f"sh '{check}'", before="sleep 0.2; ")
    integrate(repo=project, manifest=gate, batch=3, window=2)
    assert states(project) == {"a": "landed", "e": "conflict", "b": "gates-failed"}


@pytest.mark.timeout(90)
def test_a_carried_front_waiting_on_runs_being_cancelled_does_not_hang(
    project: Path, tmp_path: Path
) -> None:
    """Batch [n01, n02, n03, n04, n05], its failure naming n02 and n04: n01 is carried; n02
    fails twice (confirmed), n03 fails for a missing program (certain: no re-run) while
    n04 and n05, built on it, gate -- they are reset, their runs cancelled (a gate that
    takes its grace to end), and the window, halved, has no room for them.  The carried
    front then waits on nothing live: the cancelled runs end without a verdict, and the
    controller waited for one forever (on 0ba9c6d; now the carried piece is also gated alone
    as soon as n02 failed, and a cancelled run wakes the controller all the same)."""
    gated = tmp_path / "gated.txt"
    check = (
        "trap '' TERM; "
        "if [ -e n02.txt ]; then echo './n02.txt:1: broken'; "
        "[ -e n04.txt ] && echo './n04.txt:1: broken'; exit 1; fi; "
        "if [ -e n04.txt ]; then sleep 6; echo './n04.txt:1: broken'; exit 1; fi; "
        "if [ -e n05.txt ]; then sleep 6; exit 0; fi; "
        "if [ -e n03.txt ]; then sleep 3; exit 127; fi"
    )
    manifest = tmp_path / "slow.toml"
    manifest.write_text(
        f'[sandbox]\nwritable = ["{tmp_path}"]\n\n[gates.check]\ncpu = 0.1\n'
        f"run = \"git rev-parse 'HEAD^{{tree}}' >> '{gated}'; {check}\"\n"
    )
    submit(repo_info(project), breaking(project, 5, {}))
    integrate(repo=project, manifest=manifest, batch=5, window=8)
    assert states(project) == {
        "n01": "landed",
        "n02": "gates-failed",
        "n03": "gates-failed",
        "n04": "gates-failed",
        "n05": "landed",
    }


def test_a_carried_envelope_failing_alone_cannot_frame_the_one_it_names(
    project: Path, tmp_path: Path
) -> None:
    """A hostile n01 fails whenever n02 is in its tree (naming n02), and whenever n03 is
    not: alone it fails.  The serial loop blames n01 and lands n02 and n03.  Carried (never
    gated alone), n01 landed with the rest (n01+n03 passes) and n02, failing beside n01,
    was blamed for n01's failure."""
    bomb = (
        "if [ -e n02.txt ]; then echo 'error: ./n02.txt:1'; exit 1; fi; [ -e n03.txt ] || exit 1\n"
    )
    submit(repo_info(project), [checking(project, "n01", bomb), *breaking(project, 3, {}, 2)])
    integrate(repo=project, manifest=tree_gate(tmp_path), batch=3, window=2)
    assert states(project) == {"n01": "gates-failed", "n02": "landed", "n03": "landed"}
