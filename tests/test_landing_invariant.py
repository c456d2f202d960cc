"""The landing invariant (docs/security.md, "The landing invariant"): an item lands only when
every gate of the target's manifest has a pass for exactly the tree that lands.  A flake's
confirmation re-runs every gate that did not pass -- failed, skipped behind a failed need,
cancelled by the tree's first failure -- never only the one that failed."""

from __future__ import annotations

from pathlib import Path

import orjson
from conftest import git
from test_integration import breaks_gate, states, worker

from dagrunner.engine.plan import RunOptions
from dagrunner.engine.steps import release_check
from dagrunner.git.repo import repo_info
from dagrunner.integration import proofs
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit


def manifest(tmp: Path, body: str) -> Path:
    path = tmp / "gates.toml"
    path.write_text(f'[sandbox]\nwritable = ["{tmp}"]\n{body}')
    return path


def flaky_once(tmp: Path) -> str:
    """A shell line that fails the first time it runs anywhere (mkdir is atomic)."""
    return f"if mkdir '{tmp / 'failed-once'}' 2>/dev/null; then exit 1; fi"


BROKEN = "! grep -rq BROKEN --include=*.txt ."


def gated_once_each(project: Path, tmp: Path, body: str) -> tuple[str, str, str]:
    """One envelope that breaks the BROKEN check, integrated alone: its final state, and the
    target before and after."""
    envelope = worker(project, "w1", breaks_gate)
    submit(repo_info(project), [envelope])
    before = git(project, "rev-parse", "main").strip()
    integrate(repo=project, manifest=manifest(tmp, body), window=1, batch=1)
    return states(project)["w1"], before, git(project, "rev-parse", "main").strip()


def test_a_flaky_need_never_lands_the_gates_it_skipped(project: Path, tmp_path: Path) -> None:
    """[lint failed, tests skipped] then a confirmation of lint alone used to land: the
    tests, which fail on this tree, never ran."""
    body = f"""
[gates.lint]
run = "{flaky_once(tmp_path)}"

[gates.tests]
run = "{BROKEN}"
needs = ["lint"]
"""
    state, before, after = gated_once_each(project, tmp_path, body)
    assert state == "gates-failed"
    assert after == before


def test_a_flaky_gate_never_lands_the_gates_its_failure_cancelled(
    project: Path, tmp_path: Path
) -> None:
    """[a failed, b cancelled] (the tree's first failure stops the rest) then a confirmation
    of a alone used to land: b, which fails on this tree, never finished."""
    body = f"""
[gates.a]
run = "{flaky_once(tmp_path)}"

[gates.b]
run = "sleep 2; {BROKEN}"
"""
    state, before, after = gated_once_each(project, tmp_path, body)
    assert state == "gates-failed"
    assert after == before


def test_an_honest_flake_lands_after_every_gate_passed_on_its_tree(
    project: Path, tmp_path: Path
) -> None:
    """The confirmation ran the skipped gate too: the landed item's flaky gate is lint, and
    its proof holds a pass of every gate of the manifest."""
    ran = tmp_path / "tests-ran"
    body = f"""
[gates.lint]
run = "{flaky_once(tmp_path)}"

[gates.tests]
run = "echo x >> '{ran}'; {BROKEN}"
needs = ["lint"]
"""
    assert fine_lands_flaky(project, tmp_path, body) == {"lint"}
    assert ran.read_text() == "x\n"  # once: on the confirmation, after lint passed there


def fine_lands_flaky(project: Path, tmp: Path, body: str) -> set[str]:
    """A good envelope, integrated alone: it lands with a proof of every gate (lint and
    tests); its flaky gates."""
    envelope = worker(project, "w1", lambda p: (p / "fine.txt").write_text("fine\n"))
    submit(repo_info(project), [envelope])
    result = integrate(repo=project, manifest=manifest(tmp, body), window=1, batch=1)
    assert states(project) == {"w1": "landed"}
    note = git(project, "notes", "--ref", "refs/notes/dagrunner", "show", "main")
    assert set(orjson.loads(note)["proof"]["gates"]) == {"lint", "tests"}
    (landed,) = result.envelopes
    return set(landed.details.flaky_gates or ())


def test_a_gate_failing_first_in_a_confirmation_gets_a_confirmation_of_its_own(
    project: Path, tmp_path: Path
) -> None:
    """[lint failed, tests skipped], then the confirmation: lint passes, tests runs for the
    first time and fails.  That is no confirmation of anything -- no gate failed twice -- so
    tests is re-run before anyone is blamed (fuzzer seeds 447 and 467: two flakes, one per
    gate, blamed a worker that passes alone)."""
    once = tmp_path / "tests-once"
    body = f"""
[gates.lint]
run = "{flaky_once(tmp_path)}"

[gates.tests]
run = "if mkdir '{once}' 2>/dev/null; then exit 1; fi"
needs = ["lint"]
"""
    assert fine_lands_flaky(project, tmp_path, body) == {"lint", "tests"}


def test_a_gate_failing_again_in_a_confirmation_is_confirmed_whatever_else_flaked(
    project: Path, tmp_path: Path
) -> None:
    """[lint failed, tests skipped], lint passes in the confirmation and tests (broken on
    this tree) fails there, then again in its own: blamed for tests alone, never landed."""
    state, before, after = gated_once_each(
        project,
        tmp_path,
        f"""
[gates.lint]
run = "{flaky_once(tmp_path)}"

[gates.tests]
run = "{BROKEN}"
needs = ["lint"]
""",
    )
    assert (state, after) == ("gates-failed", before)
    (entry,) = Queue.of(repo_info(project)).entries().values()
    assert entry.details.failed_gates == ("tests",)


def test_the_target_heads_failures_are_confirmed_only_by_gates_that_failed_twice(
    project: Path, tmp_path: Path
) -> None:
    """Fuzzer seed 5216 (differential baseline): w1 breaks tests, and its failure gates the
    target's head.  There lint flakes once (tests skipped behind it); in the head's
    confirmation lint passes and tests runs for the first time and flakes.  No gate of the
    head failed twice, yet tests was taken for the target's own failure: w1's real one was
    excused, and w1 landed a tree that fails tests.  A gate failing first in the head's
    confirmation gets one of its own, as an item's does."""
    tree = git(project, "rev-parse", "main^{tree}").strip()
    on_head = f'[ "$(git rev-parse "HEAD^{{tree}}")" = {tree} ]'
    body = f"""
[integrate]
baseline = "differential"

[gates.lint]
run = '''if {on_head} && mkdir '{tmp_path / "lint-once"}' 2>/dev/null; then exit 1; fi'''

[gates.tests]
run = '''if {on_head} && mkdir '{tmp_path / "tests-once"}' 2>/dev/null; then exit 1; fi; {BROKEN}'''
needs = ["lint"]
"""
    state, before, after = gated_once_each(project, tmp_path, body)
    assert (tmp_path / "lint-once").is_dir() and (tmp_path / "tests-once").is_dir()
    assert (state, after) == ("gates-failed", before)


def test_what_a_run_passed_and_what_a_confirmation_runs(repo: Path, tmp_path: Path) -> None:
    """From a real run's record: a gate skipped behind a failed need, or cancelled, has no
    pass; a split gate passes only when every shard did; what a confirmation runs is every
    gate of the manifest without a pass, in the manifest's order."""
    path = manifest(
        tmp_path,
        """
[gates.lint]
run = "exit 1"

[gates.tests]
run = "true"
needs = ["lint"]

[gates.docs]
run = "true"

[gates.split]
run = "cat {files}"
split = { files = ["*.txt"], shards = 2 }
""",
    )
    (repo / "a.txt").write_text("a\n")
    (repo / "b.txt").write_text("b\n")
    record, _ = release_check(RunOptions(repo=repo, manifest=path, report_dir=tmp_path / "r"))
    assert {g.id for g in record.gates} == {"lint", "tests", "docs", "split-1", "split-2"}
    assert proofs.passes(record) == {"docs", "split"}
    assert proofs.failures(record) == {"lint", "tests"}
    assert proofs.rerun(path, proofs.passes(record)) == ("lint", "tests")
    assert proofs.gaps(proofs.required(path), {"lint", "tests", "docs"}) == ("split",)
    assert proofs.gaps(proofs.required(path), {"lint", "docs", "split"}, {"tests"}) == ()
    assert proofs.required(None) == ("(no manifest)",)  # never built: can never land


def test_a_cached_build_never_leaves_an_integration_trees_tests_without_its_output(
    project: Path, tmp_path: Path
) -> None:
    """``build`` writes ``out/built.txt`` (untracked), which ``test`` (needing it) reads.
    The second envelope changes only what ``test`` reads: ``build``'s pass of the first tree
    has the very same key, but a cached pass restores nothing it left, and the integration
    tree is clean -- so ``build`` runs again there, and the good envelope lands.  (On a real
    yarn workspace a cached build left the tests without ``dist/``, and a broken test was
    judged on that failure instead of its own.)"""
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("built\n")
    git(project, "add", "src")
    git(project, "commit", "-q", "-m", "src")
    body = """
[gates.build]
run = "mkdir -p out && cp src/a.txt out/built.txt"
inputs = ["src/**"]

[gates.test]
run = "grep -q built out/built.txt"
needs = ["build"]
"""
    path = manifest(tmp_path, body)
    first = worker(project, "w1", lambda p: (p / "one.txt").write_text("one\n"))
    submit(repo_info(project), [first])
    assert integrate(repo=project, manifest=path, window=1, batch=1).ok
    second = worker(project, "w2", lambda p: (p / "two.txt").write_text("two\n"))
    submit(repo_info(project), [second])
    result = integrate(repo=project, manifest=path, window=1, batch=1)
    assert states(project) == {"w1": "landed", "w2": "landed"}
    runs = sorted(Path(result.report_dir).glob("gates-*/gates/build.json"))
    assert runs and all(orjson.loads(r.read_bytes())["status"] == "passed" for r in runs)


def test_a_run_failing_with_no_failed_gate_is_confirmed_not_rerun_forever(
    project: Path, tmp_path: Path
) -> None:
    """A run that fails with every gate passed (a ``[budget]`` miss: the gate took longer than
    its ``max_duration``) names no failing gate, so its confirmation's failure shares none with
    it either: that used to count as "no gate failed twice" and ask for yet another
    confirmation, forever.  Two failing runs of the tree are its confirmation."""
    body = """
[budget]
max_duration = { slow = 0.05 }

[gates.slow]
run = "if [ -f fine.txt ]; then sleep 0.5; fi"
"""
    envelope = worker(project, "w1", lambda p: (p / "fine.txt").write_text("fine\n"))
    submit(repo_info(project), [envelope])
    before = git(project, "rev-parse", "main").strip()
    result = integrate(repo=project, manifest=manifest(tmp_path, body), window=1, batch=1)
    assert states(project)["w1"] == "gates-failed"
    assert git(project, "rev-parse", "main").strip() == before
    assert len(list(Path(result.report_dir).glob("gates-*"))) <= 3
