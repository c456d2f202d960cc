"""A red target under either baseline: the queue knows when the target's own head fails a
gate too (one run of the head, shared by every item), says so in one line, and blames no
item for it; nothing is confirmed that a re-run cannot change (a missing program, the
target's own failure).  Real repositories, real gate processes."""

from __future__ import annotations

from pathlib import Path

from conftest import commit_release_manifest, git
from test_integration import breaks_gate, states, worker

from dagrunner import watch
from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate, queue_status
from dagrunner.integration.submit import submit

RED = """{setting}
[gates.docs]
run = "! grep -rq REDMARK --include=*.txt ."

[gates.check]
run = "! grep -rq BROKEN --include=*.txt ."
"""

LINE = "main itself fails docs: nothing can land until they pass (or see baseline = differential)"


def red_target(project: Path, baseline: str = "") -> str:
    """The target's head fails gate ``docs`` (red.txt holds REDMARK); its head."""
    (project / "red.txt").write_text("REDMARK\n")
    setting = f'[integrate]\nbaseline = "{baseline}"\n' if baseline else ""
    git(project, "add", "red.txt")
    commit_release_manifest(project, RED.format(setting=setting))
    return git(project, "rev-parse", "main").strip()


def good(project: Path, name: str) -> Path:
    return worker(project, name, lambda p: (p / f"{name}.txt").write_text(f"{name}\n"))


def fixes(path: Path) -> None:
    (path / "red.txt").write_text("fixed\n")


def test_absolute_a_red_target_blames_no_item_and_says_so_once(project: Path) -> None:
    head = red_target(project)
    submit(repo_info(project), [good(project, f"g{i}") for i in range(1, 4)])
    result = integrate(repo=project, batch=1, window=2)
    assert states(project) == {"g1": "queued", "g2": "queued", "g3": "queued"}
    assert git(project, "rev-parse", "main").strip() == head  # nothing lands red
    assert result.target_red == ("docs",)
    assert result.confirm_runs == 0  # the target's own failure is never confirmed
    assert LINE in result.warnings, result.warnings
    assert sorted(i.split(".")[1] for i in result.held) == ["g1", "g2", "g3"]
    assert result.exit_code == 1  # work is stuck: said by the exit code too
    events = list(watch(repo=project, follow=False))
    red = [e for e in events if e.event == "target-red"]
    assert len(red) == 1 and red[0].details.target_red == ("docs",), red
    assert red[0].details.red_since == head
    held = {e.id.split(".")[1] for e in events if e.event == "held"}
    assert held == {"g1", "g2", "g3"}
    shown = queue_status(repo=project)["target_red"]
    assert shown["main"]["fails"] == ["docs"] and shown["main"]["since"] == head
    head_runs = [r for r in result.pipeline if not r.envelopes]
    assert len(head_runs) == 2, result.pipeline  # its run, and its failure confirmed: shared


def test_absolute_a_fix_in_the_queue_lands_and_what_was_held_lands_behind_it(
    project: Path,
) -> None:
    red_target(project)
    envelopes = [good(project, "g1"), worker(project, "fix", fixes), good(project, "g2")]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, batch=1, window=1)
    assert states(project) == {"g1": "landed", "fix": "landed", "g2": "landed"}
    assert result.held == [] and result.exit_code == 0
    events = [e.event for e in watch(repo=project, follow=False)]
    assert events.count("target-red") == 1 and events.count("target-green") == 1
    assert queue_status(repo=project)["target_red"] == {}


def test_absolute_an_item_held_by_one_run_lands_in_the_next_once_the_target_is_fixed(
    project: Path,
) -> None:
    red_target(project)
    submit(repo_info(project), [good(project, "g1")])
    assert [i.split(".")[1] for i in integrate(repo=project).held] == ["g1"]
    (project / "red.txt").write_text("fixed by hand\n")
    git(project, "commit", "-q", "-am", "fix docs")
    result = integrate(repo=project)
    assert states(project) == {"g1": "landed"}
    assert result.target_red == () and result.exit_code == 0


def test_absolute_an_item_that_adds_its_own_failure_is_blamed_for_it_alone(
    project: Path,
) -> None:
    red_target(project)
    submit(repo_info(project), [worker(project, "bad", breaks_gate), good(project, "g1")])
    result = integrate(repo=project, batch=1, window=1)
    final = states(project)
    # fail-fast may stop its run at the target's failure first: then it is held, not blamed
    assert final["g1"] == "queued" and final["bad"] in ("gates-failed", "queued"), final
    blamed = [e for e in result.envelopes if e.state == "gates-failed"]
    for outcome in blamed:
        assert outcome.details.failed_gates == ("check",), outcome.details


def test_differential_says_the_red_line_too(project: Path) -> None:
    red_target(project, "differential")
    submit(repo_info(project), [good(project, "g1")])
    result = integrate(repo=project)
    assert states(project) == {"g1": "landed"}
    assert result.target_red == ("docs",)
    said = [w for w in result.warnings if w.startswith("main itself fails docs")]
    assert said and "blamed only for what they add" in said[0], result.warnings


def test_a_missing_program_is_not_confirmed(project: Path) -> None:
    """Exit 127 (command not found) is not a flake: no confirmation run is spent on it."""
    commit_release_manifest(
        project,
        '[gates.check]\nrun = "if [ -e tool.txt ]; then no-such-program-dagrunner-x; fi"\n',
    )
    bad = worker(project, "bad", lambda p: (p / "tool.txt").write_text("x\n"))
    submit(repo_info(project), [bad])
    result = integrate(repo=project)
    assert states(project) == {"bad": "gates-failed"}
    assert result.confirm_runs == 0, result.pipeline
    assert result.target_red == ()


def status_text(project: Path) -> str:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "dagrunner", "integrate", "status"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_status_says_the_current_red_line_not_a_stale_one(project: Path) -> None:
    """Found on real projects: after an absolute run held everything and the baseline was
    made differential, items landed on the red target, yet ``integrate status`` still said
    the absolute line ("... or see baseline = differential") of the first red head."""
    red_target(project)
    submit(repo_info(project), [good(project, "g1")])
    integrate(repo=project)
    assert LINE in status_text(project)
    red_target(project, "differential")  # the advice taken: the head moves
    moved = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), [good(project, "g2")])
    result = integrate(repo=project)
    assert states(project) == {"g1": "landed", "g2": "landed"}, result
    shown = status_text(project)
    assert "see baseline = differential" not in shown, shown
    assert "main itself fails docs: items are blamed only for what they add" in shown, shown
    said = queue_status(repo=project)["target_red"]["main"]
    assert said["head"] == moved, said  # and the queue landed every commit since
    # the target moved since (a commit of nobody's queue): its colour there is not known
    (project / "other.txt").write_text("x\n")
    git(project, "add", "other.txt")
    git(project, "commit", "-q", "-m", "by hand")
    assert "is red since" not in status_text(project)
    assert queue_status(repo=project)["target_red"] == {}
