"""``dagrunner init`` wires a JS test runner's own JUnit reporter where a ``package.json``
script calls it (issue 44): vitest, jest and mocha behind ``npm``/``yarn``/``pnpm run``, each
only with the reporter the project installs; the failing tests it names reach the run's
JSON, the terminal, ``integrate status`` and ``dagrunner_why``.

vitest cannot be installed offline on the test machine: the end-to-end test runs a small
stand-in at ``node_modules/.bin/vitest`` that takes vitest's reporter flags and writes the
JUnit file vitest writes (a real vitest 3.1 took the same flags on a real yarn workspace:
docs/real-projects.md); the package manager, the gate's sandbox and the queue are real."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import git, run_json
from test_init import dry, gates_of
from test_integration import states, worker

from dagrunner.agents.follow import why
from dagrunner.agents.tools import Binding
from dagrunner.cli.main import run_cli
from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit

JUNIT = "build/junit/js-test.xml"
VITEST = ["--reporter=default", "--reporter=junit", f"--outputFile.junit={JUNIT}"]
MOCHA = ["--reporter", "mocha-junit-reporter", "--reporter-options"]
MOCHA += [f"mochaFile={JUNIT},jenkinsMode=true,testCaseSwitchClassnameAndName=true"
          ",suiteTitleSeparatedBy= > "]  # fmt: skip


def js_project(repo: Path, test: str, lock: str, **deps: str) -> None:
    body: dict[str, Any] = {"name": "p", "private": True, "scripts": {"test": test}}
    if deps:
        body["devDependencies"] = deps
    (repo / "package.json").write_text(json.dumps(body))
    (repo / lock).write_text("")
    (repo / ".gitignore").write_text("reports/\nbuild/\n")


@pytest.mark.parametrize(
    ("lock", "test", "deps", "run", "env"),
    [
        ("yarn.lock", "vitest", {}, ["yarn", "run", "test", *VITEST], {}),
        ("package-lock.json", "vitest run", {}, ["npm", "run", "test", "--", *VITEST], {}),
        (
            "pnpm-lock.yaml",
            "NODE_ENV=test jest --ci",
            {"jest": "29", "jest-junit": "16"},
            ["pnpm", "run", "test", "--reporters=default", "--reporters=jest-junit"],
            {"JEST_JUNIT_OUTPUT_FILE": JUNIT, "JEST_JUNIT_CLASSNAME": "{classname}"}
            | {"JEST_JUNIT_TITLE": "{title}", "JEST_JUNIT_ANCESTOR_SEPARATOR": " \u203a "},
        ),
        (
            "yarn.lock",
            "mocha 'test/**/*.js'",
            {"mocha-junit-reporter": "2"},
            ["yarn", "run", "test", *MOCHA],
            {},
        ),
    ],
)
def test_a_script_that_calls_a_test_runner_gets_its_junit_reporter(
    repo: Path,
    capsys: pytest.CaptureFixture[str],
    lock: str,
    test: str,
    deps: dict[str, str],
    run: list[str],
    env: dict[str, str],
) -> None:
    """Found on real workspaces (vitest in a yarn monorepo, jest, mocha): the test gate's
    failures were counted, never named.  The runner's reporter flags are passed through the
    package manager (npm only after ``--``), its JUnit file is the gate's ``junit``."""
    js_project(repo, test, lock, **deps)
    gate = gates_of(dry(capsys, repo))["js-test"]
    assert gate["run"] == run and gate["junit"] == JUNIT and gate["env"] == env, gate
    assert "JUnit reporter added" in gate["source"], gate["source"]


@pytest.mark.parametrize(
    ("test", "deps", "said"),
    [
        ("jest", {"jest": "29"}, "add jest-junit to devDependencies"),
        ("mocha", {}, "add mocha-junit-reporter to devDependencies"),
        ("vitest run && sh check.sh", {}, ""),  # flags appended would go to `sh check.sh`
        ("vitest watch", {}, ""),
    ],
)
def test_no_reporter_is_wired_where_none_is_installed_or_the_script_does_more(
    repo: Path,
    capsys: pytest.CaptureFixture[str],
    test: str,
    deps: dict[str, str],
    said: str,
) -> None:
    js_project(repo, test, "yarn.lock", **deps)
    body = dry(capsys, repo)
    gate = gates_of(body)["js-test"]
    assert gate["run"] == ["yarn", "run", "test"] and gate["junit"] is None, gate
    (repo / "dagrunner.toml").unlink(missing_ok=True)
    assert run_cli(["init", "--repo", str(repo), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert (said in printed) if said else "devDependencies" not in printed, printed


def test_a_script_without_a_lockfile_says_so_in_its_source(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """remark (npm, ``package-lock=false``): the gate's comment said ``(npm:
    package-lock.json)``, a file the project does not have."""
    (repo / "package.json").write_text(json.dumps({"scripts": {"lint": "eslint ."}}))
    assert gates_of(dry(capsys, repo))["js-lint"]["source"] == (
        "package.json scripts.lint (npm: no lockfile)"
    )


STAND_IN = r"""#!/usr/bin/env node
// vitest's reporter flags, and the JUnit file its junit reporter writes: one case per
// tests/*.check file, failing unless the file says "ok".
const fs = require("fs");
const path = require("path");
const args = process.argv.slice(2);
const out = (args.find((a) => a.startsWith("--outputFile.junit=")) || "").split("=")[1];
const cases = fs.readdirSync("tests").filter((f) => f.endsWith(".check")).sort();
const failed = cases.filter((f) => fs.readFileSync(path.join("tests", f), "utf8").trim() !== "ok");
const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
for (const f of cases) console.log(`${failed.includes(f) ? "x" : "v"} tests/${f}`);
console.log(` Tests  ${failed.length} failed | ${cases.length - failed.length} passed`);
if (args.includes("--reporter=junit") && out) {
  fs.mkdirSync(path.dirname(out), { recursive: true });
  const body = cases.map((f) => {
    const name = esc(`checks > ${f}`);
    const fail = failed.includes(f) ? `<failure message="expected ok">AssertionError</failure>` : "";
    return `<testcase classname="tests/suite.test.ts" name="${name}">${fail}</testcase>`;
  });
  fs.writeFileSync(out, `<?xml version="1.0" encoding="UTF-8" ?>\n<testsuites tests="${cases.length}" failures="${failed.length}"><testsuite name="tests/suite.test.ts" tests="${cases.length}" failures="${failed.length}" errors="0" skipped="0">${body.join("")}</testsuite></testsuites>\n`);
}
process.exit(failed.length ? 1 : 0);
"""

NAME = "js-test::tests/suite.test.ts::checks > b.check"


def test_the_failing_tests_a_wired_runner_names_reach_every_place_people_read(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The names come from the JUnit file (``"source": "junit"``), and a worker that breaks
    one test is blamed for that test by name: run JSON, terminal, ``integrate status``,
    ``dagrunner_why``."""
    js_project(repo, "vitest", "yarn.lock")
    bin_dir = repo / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vitest").write_text(STAND_IN)
    os.chmod(bin_dir / "vitest", 0o755)
    (repo / "tests").mkdir()
    for name in ("a", "b"):
        (repo / "tests" / f"{name}.check").write_text("ok\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a yarn project whose node_modules is committed")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0 and gates_of(body)["js-test"]["junit"] == JUNIT, body
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-q", "-m", "manifest")

    (repo / "tests" / "b.check").write_text("broken\n")
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--only", "js-test")
    assert code == 1, run
    (gate,) = run["gates"]
    assert gate["tests"]["source"] == "junit", gate["tests"]
    assert [c["name"] for c in gate["tests"]["cases"]] == ["checks > b.check"], gate["tests"]
    assert run_cli(["release-check", "--repo", str(repo), "--only", "js-test"]) == 1
    printed = capsys.readouterr()
    assert "failed tests (1 of 2):" in printed.out + printed.err
    assert "tests/suite.test.ts::checks > b.check: expected ok" in printed.out + printed.err
    git(repo, "checkout", "-q", "--", "tests")

    bad = worker(repo, "bad", lambda p: (p / "tests" / "b.check").write_text("broken\n"))
    submit(repo_info(repo), [bad])
    result = integrate(repo=repo)
    assert states(repo) == {"bad": "gates-failed"}, result
    (outcome,) = result.envelopes
    assert outcome.details.failed_tests == (NAME,), outcome.details
    assert run_cli(["integrate", "status", "--repo", str(repo)]) == 0
    assert f"js-test (tests: {NAME})" in capsys.readouterr().out
    said = why(Binding(repo=repo), outcome.id)
    (failed,) = said["failed_gates"]
    assert [t["test"] for t in failed["failed_tests"]] == ["tests/suite.test.ts::checks > b.check"]


def test_scripts_and_ci_programs_that_look_like_checks_are_gates_or_listed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real pnpm monorepo: ``biome ci`` in CI, the ``format`` and
    ``test:coverage`` scripts were neither gates nor listed as left out."""
    scripts = {
        "test": "vitest run",
        "test:coverage": "vitest run --coverage",
        "format": "prettier --write .",
        "lint:fix": "eslint --fix .",
        "start": "node server.js",
    }
    (repo / "package.json").write_text(json.dumps({"name": "m", "scripts": scripts}))
    (repo / "pnpm-lock.yaml").write_text("lockfileVersion: '9.0'\n")
    (repo / ".gitignore").write_text("node_modules/\n")
    (repo / "node_modules" / ".bin").mkdir(parents=True)
    (repo / "node_modules" / ".bin" / "biome").write_text("#!/bin/sh\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  t:\n    steps:\n    - run: pnpm install\n    - run: pnpm biome ci .\n"
        "    - run: pnpm tsc --noEmit\n    - run: pnpm test\n"
    )
    body = dry(capsys, repo)
    gates, why = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert gates["js-biome"]["run"] == ["pnpm", "biome", "ci", "."], gates
    assert "a fixer" in why["js-format"] and "a fixer" in why["js-lint-fix"], why
    assert "the tests gate runs the tests" in why["js-test-coverage"], why
    assert "node_modules/.bin/tsc is not here" in why["js-tsc"], why
    assert "js-start" not in why and "js-install" not in why, why


def test_init_says_the_ignore_rule_the_junit_file_needs(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round 11 (pallets/click): the tests gate's comment said "add build/junit/ to
    .gitignore", and init's summary, which lists every other edit it leaves to the user,
    did not; a project that ignores the folder is told nothing."""
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    git(repo, "rm", "-q", ".gitignore")  # the fixture's ignores reports/, a JUnit folder too
    git(repo, "commit", "-qm", "no ignore rules")
    assert run_cli(["init", "--repo", str(repo)]) == 0
    printed = capsys.readouterr().out
    assert "add build/junit/ to .gitignore" in printed and "(gate tests)" in printed, printed
    (repo / "dagrunner.toml").unlink()
    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore build")
    assert run_cli(["init", "--repo", str(repo)]) == 0
    assert ".gitignore" not in capsys.readouterr().out


def test_a_script_a_gated_script_runs_is_listed_as_run_by_that_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round 15 (tj/commander.js): ``check`` runs ``check:type``, ``check:lint`` and
    ``check:format`` (CI runs ``npm run check``), yet each was listed as "its name is no check
    of its own and CI does not run it; the check gate runs the check" -- as if no gate ran it.
    The script that calls it is named, and the gate of that script."""
    scripts = {
        "check": "npm run check:type && npm run check:lint && npm run check:format",
        "check:format": "prettier --check .",
        "check:lint": "eslint .",
        "check:type": "npm run check:type:js && npm run check:type:ts",
        "check:type:ts": "tsd && tsc -p tsconfig.ts.json",
        "check:type:js": "tsc -p tsconfig.js.json",
        "test": "node --test && npm run check:type:ts",
        "test:coverage": "node --test --experimental-test-coverage",
    }
    (repo / "package.json").write_text(json.dumps({"name": "m", "scripts": scripts}))
    (repo / "package-lock.json").write_text("{}\n")
    body = dry(capsys, repo)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert sorted(gates_of(body)) == ["js-check", "js-test"], gates_of(body)
    assert why["js-check-format"] == "scripts.check runs it: the js-check gate runs it", why
    assert why["js-check-lint"] == "scripts.check runs it: the js-check gate runs it", why
    # called through check:type; test calls it too: the first gated script that runs it
    assert why["js-check-type-ts"] == "scripts.check runs it: the js-check gate runs it", why
    assert why["js-check-type-js"] == "scripts.check runs it: the js-check gate runs it", why
    # run by no gated script: as before
    assert "the tests gate runs the tests" in why["js-test-coverage"], why
