"""Failing tests named from a gate's output for every common runner (a gate without a JUnit
file), and named where people look: the outcome's ``failed_tests``, ``integrate status``
and the terminal.

pytest, unittest and ``node --test`` (both its TAP and spec reporters) are run for real
here.  vitest, jest, mocha, go test and cargo test cannot be installed offline on the test
machine: their samples in ``tests/fixtures/runner-output/`` were written by hand in each
runner's documented output format (vitest 1.x; vitest 4 under turbo after a line of a real
run in round 9 of docs/real-projects.md; jest 30 under turbo from a real run in round 12; jest 29, mocha 10 spec reporter, go test
-v, cargo test), not captured from a run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import commit_release_manifest, git
from test_integration import states, worker
from test_target_red import status_text

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.report.testnames import from_output

FIXTURES = Path(__file__).parent / "fixtures" / "runner-output"

SUITE = """import unittest


class Calc(unittest.TestCase):
    def test_add(self):
        self.assertEqual(1 + 1, 2)

    def test_sub(self):
        self.assertEqual(2 - 1, int(open("answer.txt").read()))

    def test_err(self):
        if open("answer.txt").read().strip() != "1":
            raise RuntimeError("boom")


def test_plain():
    assert 1 == 2
"""


def names(text: str) -> list[str]:
    found = from_output(text)
    assert found is None or found.source == "output"
    return [f"{c.suite}::{c.name}" if c.suite else c.name for c in found.cases] if found else []


def ran(cwd: Path, *argv: str) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode != 0, done.stdout
    return done.stdout + done.stderr


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "test_m.py").write_text(SUITE)
    (tmp_path / "answer.txt").write_text("3\n")
    return tmp_path


def test_pytest_short_summary(suite: Path) -> None:
    out = ran(suite, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_m.py")
    assert names(out) == ["test_m.py::Calc::test_err", "test_m.py::Calc::test_sub",
                          "test_m.py::test_plain"]  # fmt: skip


PARAMETRIZED = """import pytest


@pytest.mark.parametrize("words", ["1, 2 and 3", "a - b", "x"])
class TestJoin:
    def test_join(self, words):
        assert words == "x"
"""


def test_pytest_parametrized_ids_with_spaces_are_named_whole(tmp_path: Path) -> None:
    # humanize's ids are the expected strings ("1, 2, and 3"): pytest's summary line then has
    # spaces, and " - " inside the brackets, before the " - " of its message; its addopts
    # say --color=yes
    (tmp_path / "test_p.py").write_text(PARAMETRIZED)
    argv = ("-m", "pytest", "-q", "--color=yes", "-p", "no:cacheprovider", "test_p.py")
    out = ran(tmp_path, sys.executable, *argv)
    assert names(out) == ["test_p.py::TestJoin::test_join[1, 2 and 3]",
                          "test_p.py::TestJoin::test_join[a - b]"]  # fmt: skip


def test_unittest_fail_and_error_lines(suite: Path) -> None:
    out = ran(suite, sys.executable, "-m", "unittest", "test_m")
    assert sorted(names(out)) == ["test_m.Calc::test_err", "test_m.Calc::test_sub"]


NODE_SUITE = """const test = require('node:test');
const assert = require('node:assert');
test('adds numbers', () => { assert.strictEqual(1 + 1, 2); });
test('subtracts numbers', () => { assert.strictEqual(2 - 1, 3); });
test('a suite', async (t) => {
  await t.test('inner passes', () => {});
  await t.test('inner fails', () => { throw new Error('boom'); });
});
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("reporter", ["tap", "spec"])
def test_node_test_runner(tmp_path: Path, reporter: str) -> None:
    (tmp_path / "a.test.js").write_text(NODE_SUITE)
    out = ran(tmp_path, "node", "--test", f"--test-reporter={reporter}", "a.test.js")
    # the parent "a suite" failed only for its subtest: not a test of its own; the spec
    # reporter's "test at FILE:LINE:COL" above each names its file (round 15, commander.js:
    # "js-test::when arguments includes -- ...", in which of 112 test files not said)
    expected = {"tap": ["subtracts numbers", "a suite::inner fails"],
                "spec": ["a.test.js::subtracts numbers", "a.test.js::inner fails"]}  # fmt: skip
    assert names(out) == expected[reporter], out


@pytest.mark.parametrize(
    ("runner", "expected"),
    [
        ("vitest", ["src/sum.test.ts::sum > adds 1 + 2 to equal 4",
                    "src/sum.test.ts::divide by zero throws"]),
        # vitest 4 under turbo (`pkg:task: `) and `pnpm -r` (`dir script: `), with a
        # project's badge (`|server|`, coloured ` client `): round 9's solid
        ("vitest-workspace", ["test/array.spec.ts::Map operator > simple mapArray",
                              "test/server/lazy.spec.ts::lazy > renders on the server",
                              "test/signals.spec.ts::Create signals > Create and read a Signal"]),
        ("jest", ["sum \u203a adds 1 + 2 to equal 4", "divide by zero throws"]),
        # jest 30 under turbo (`pkg:task: `; a real run's lines, callstack/reassure) and
        # `pnpm -r` (`dir script: `)
        ("jest-workspace", ["formatCountDiff", "logger \u203a prints in colour"]),
        ("mocha", ["Array > #indexOf()::should return -1 when the value is not present",
                   "sum::adds 1 + 2 to equal 4"]),
        ("go", ["TestDivide", "TestTable/negative"]),
        ("cargo", ["tests::divides_by_zero", "tests::table::negative"]),
    ],
)  # fmt: skip
def test_runner_output_samples(runner: str, expected: list[str]) -> None:
    assert names((FIXTURES / f"{runner}.txt").read_text()) == expected


def test_nothing_named_where_no_runner_speaks() -> None:
    assert from_output("error: lint failed\nsrc/a.py:3: E501 line too long\n") is None


def test_hostile_output_is_bounded_and_printable() -> None:
    out = "".join(f"FAILED t.py::test_{i}\x1b[31m{'x' * 500} - no\n" for i in range(1000))
    found = from_output(out)
    assert found is not None and len(found.cases) == 200
    assert all(len(c.name) <= 300 and "\x1b" not in c.name for c in found.cases)


def test_an_item_failing_unittest_without_junit_is_blamed_by_test_name(project: Path) -> None:
    """The gate writes no JUnit file: its failing tests are read from its output, named in
    the outcome (``failed_tests``), and ``integrate status`` says them."""
    (project / "test_m.py").write_text(SUITE)
    (project / "answer.txt").write_text("1\n")
    git(project, "add", "test_m.py", "answer.txt")
    commit_release_manifest(
        project, '[gates.tests]\nrun = ["python3", "-m", "unittest", "test_m.Calc"]\n'
    )
    bad = worker(project, "bad", lambda p: (p / "answer.txt").write_text("3\n"))
    submit(repo_info(project), [bad])
    result = integrate(repo=project)
    assert states(project) == {"bad": "gates-failed"}
    (outcome,) = result.envelopes
    assert outcome.details.failed_tests == (
        "tests::test_m.Calc::test_err",
        "tests::test_m.Calc::test_sub",
    )
    shown = status_text(project)
    assert "gates-failed  tests (tests: tests::test_m.Calc::test_err" in shown, shown


RED_SUITE = """import unittest


class Calc(unittest.TestCase):
    def test_known(self):
        self.assertEqual(open("known.txt").read(), "fixed\\n")

    def test_new(self):
        self.assertEqual(open("answer.txt").read(), "1\\n")
"""


def test_a_new_failing_test_in_a_gate_the_red_target_fails_whole_is_blamed(
    project: Path,
) -> None:
    """Differential baseline, a gate without JUnit that the target itself fails (test_known):
    an envelope that breaks another test of it (test_new) is blamed, not excused as the
    target's own failure -- its output names a failing test the target's does not.  (On a
    real yarn workspace, a test-breaking worker landed so.)  One that breaks nothing new
    lands."""
    (project / "test_red.py").write_text(RED_SUITE)
    (project / "known.txt").write_text("broken\n")
    (project / "answer.txt").write_text("1\n")
    git(project, "add", "test_red.py", "known.txt", "answer.txt")
    commit_release_manifest(
        project,
        '[integrate]\nbaseline = "differential"\n\n'
        '[gates.tests]\nrun = ["python3", "-m", "unittest", "test_red.Calc"]\n',
    )
    bad = worker(project, "bad", lambda p: (p / "answer.txt").write_text("2\n"))
    fine = worker(project, "fine", lambda p: (p / "other.txt").write_text("x\n"))
    submit(repo_info(project), [bad, fine])
    result = integrate(repo=project, batch=1)
    assert states(project) == {"bad": "gates-failed", "fine": "landed"}
    (blamed,) = [o for o in result.envelopes if o.state == "gates-failed"]
    assert "tests::test_red.Calc::test_new" in (blamed.details.failed_tests or ())


NODE_TOP = """const test = require("node:test");
const assert = require("node:assert");
const fs = require("node:fs");

test("should process a file", () => {
  assert.strictEqual(fs.readFileSync("answer.txt", "utf8"), "1\\n");
});

test("keeps the rest", () => {});
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("baseline", ["absolute", "differential"])
def test_a_failing_test_is_named_once_without_an_empty_suite_or_its_gate_beside_it(
    project: Path, baseline: str
) -> None:
    """Found on a real npm workspace (remark): a ``node --test`` case outside any suite was
    named ``js-test::::should process a file``, and ``failed_tests`` listed the gate itself
    beside its cases (``tests, tests::...``)."""
    (project / "a.test.js").write_text(NODE_TOP)
    (project / "answer.txt").write_text("1\n")
    git(project, "add", "a.test.js", "answer.txt")
    commit_release_manifest(
        project,
        f'[integrate]\nbaseline = "{baseline}"\n\n'
        '[gates.tests]\nrun = ["node", "--test", "--test-reporter=spec", "a.test.js"]\n',
    )
    bad = worker(project, "bad", lambda p: (p / "answer.txt").write_text("2\n"))
    submit(repo_info(project), [bad])
    result = integrate(repo=project)
    assert states(project) == {"bad": "gates-failed"}
    (outcome,) = result.envelopes
    # its file, from the spec reporter's "test at a.test.js:3:1" (round 15)
    assert outcome.details.failed_tests == ("tests::a.test.js::should process a file",), (
        outcome.details
    )
