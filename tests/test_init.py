"""``dagrunner init`` on real fixture projects: what each kind of project configures becomes
gates; the manifest written for a Python project passes ``release-check`` as it is (and is
cached the second time); nothing is ever overwritten; ``--dry-run`` writes nothing."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import envelope, git, run_json

from dagrunner.cli.main import run_cli

THIS = f"{sys.version_info.major}.{sys.version_info.minor}"

PYPROJECT = """
[project]
name = "pkg"
version = "0.1"

[tool.ruff]
line-length = 100

[tool.ruff.format]

[tool.mypy]
strict = true
files = ["src", "tests"]
mypy_path = "src"

[tool.pytest.ini_options]
pythonpath = ["src"]
"""


def python_project(repo: Path) -> None:
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "pkg" / "__init__.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n"
    )
    (repo / "tests" / "test_add.py").write_text(
        "from pkg import add\n\n\ndef test_add() -> None:\n    assert add(1, 2) == 3\n"
    )
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "Makefile").write_text("test:\n\tpython -m pytest\n\nclean:\n\trm -rf build\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project")


def gates_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["id"]: g for g in body["gates"]}


def test_a_python_projects_manifest_passes_release_check_and_is_cached_next_time(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    python_project(repo)
    # the certificate and proxy variables pass by default, and redaction does not mind them
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0 and body["written"] is True
    assert Path(body["path"]) == repo / "dagrunner.toml"
    gates = gates_of(body)
    assert list(gates) == ["lint", "format", "types", "tests"]
    assert gates["types"]["source"] == "pyproject.toml [tool.mypy]"
    assert gates["tests"]["inputs"] == ["**"]  # it may read anything: keyed by every file
    assert "**/*.py" in gates["lint"]["inputs"] and "pyproject.toml" in gates["lint"]["inputs"]
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT"):
        assert name in body["env_pass"]
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "no_proxy"):
        assert name in body["env_pass"]
    assert gates["tests"]["tools"] == ["python -m pytest --version"]
    assert [s["id"] for s in body["skipped"]] == ["make-test"]  # pytest already runs the tests
    text = (repo / "dagrunner.toml").read_text()
    assert "# from pyproject.toml [tool.ruff]" in text and "# Also found" in text
    # release-check with no manifest: manifests/release.toml is absent, so dagrunner.toml
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--quiet")
    assert code == 0, run
    assert {g["id"]: g["status"] for g in run["gates"]} == dict.fromkeys(gates, "passed")
    code, again = run_json(capsys, "release-check", "--repo", str(repo), "--quiet")
    assert code == 0
    assert {g["status"] for g in again["gates"]} == {"cached"}  # its own writes left no trace


def test_the_tests_gate_names_the_pytest_table_the_project_wrote(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pytest 9 reads a native ``[tool.pytest]`` table: init named it
    ``[tool.pytest.ini_options]``, a table the project does not have."""
    python_project(repo)
    for table, said in (
        ('[tool.pytest]\nminversion = "9.0"\n', "[tool.pytest]"),
        ('[tool.pytest.ini_options]\npythonpath = ["src"]\n', "[tool.pytest.ini_options]"),
    ):
        head = PYPROJECT.split("[tool.pytest.ini_options]")[0]
        (repo / "pyproject.toml").write_text(head + table)
        code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
        assert code == 0, body
        assert gates_of(body)["tests"]["source"] == f"pyproject.toml {said}"


def test_package_json_scripts_use_the_lockfiles_manager_and_dry_run_writes_nothing(
    repo: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripts = {"build": "tsc", "test": "jest", "lint": "eslint .", "start": "node x.js"}
    (repo / "package.json").write_text(json.dumps({"name": "x", "scripts": scripts}))
    (repo / "pnpm-lock.yaml").write_text("lockfileVersion: '9.0'\n")
    code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0 and body["written"] is False
    assert not (repo / "dagrunner.toml").exists()
    gates = gates_of(body)
    assert list(gates) == ["js-build", "js-test", "js-lint"]  # `start` is no check
    assert gates["js-test"]["run"] == ["pnpm", "run", "test"]
    assert gates["js-test"]["needs"] == ["js-build"]
    assert "pnpm --version" in gates["js-lint"]["tools"]
    assert gates["js-lint"]["inputs"] == ["**"]  # its tools read their own configs
    # the text form prints the manifest itself, and says which programs this machine lacks
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    monkeypatch.setenv("PATH", str(bare))
    assert run_cli(["init", "--repo", str(repo), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# Written by `dagrunner init`") and "[gates.js-test]" in printed
    # every gate needs pnpm: none is commented out (a manifest needs one), each says so
    assert "# `pnpm` is not on PATH here: install it (corepack enable pnpm" in printed
    assert "# [gates." not in printed
    assert not (repo / "dagrunner.toml").exists()
    (bare / "pnpm").write_text("#!/bin/sh\n")
    (bare / "pnpm").chmod(0o755)
    code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert body["missing_tools"] == []


def test_makefile_targets_that_look_like_checks_run_in_order(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "Makefile").write_text(
        textwrap.dedent(
            """\
            VAR := 1
            build:
            \ttouch built
            test: build
            \ttest -f built
            lint:
            \ttrue
            clean:
            \trm -f built
            """
        )
    )
    (repo / ".gitignore").write_text("reports/\nbuilt\n")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0
    gates = gates_of(body)
    assert list(gates) == ["make-build", "make-test", "make-lint"]
    assert gates["make-test"]["needs"] == ["make-build"]
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--quiet")
    assert code == 0, run
    started = {g["id"]: g["started"] for g in run["gates"]}
    finished = {g["id"]: g["finished"] for g in run["gates"]}
    assert started["make-test"] >= finished["make-build"]


def test_tox_nox_pre_commit_go_and_rust_are_read_without_running_anything(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python_project(repo)
    (repo / "tox.ini").write_text("[tox]\nenvlist = py{311,312}, docs\n")
    (repo / "noxfile.py").write_text(
        "import nox\nraise SystemExit('never imported')\n\n"
        "@nox.session\ndef typing(session):\n    pass\n\n"
        "@nox.session(python=['3.12'])\ndef bench(session):\n    pass\n"
    )
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: local\n  hooks:\n  - id: trailing-whitespace\n  - id: check-yaml\n"
    )
    (repo / "go.mod").write_text("module example.com/x\n\ngo 1.22\n")
    (repo / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0
    gates = gates_of(body)
    assert gates["tox-docs"]["run"] == ["tox", "-e", "docs"]
    assert gates["nox-bench"]["run"] == ["nox", "-s", "bench", "--force-python", THIS]
    assert "trailing-whitespace" in gates["pre-commit"]["source"]
    assert gates["go-test"]["run"] == ["go", "test", "./..."] and "go-vet" in gates
    assert gates["clippy"]["run"][:2] == ["cargo", "clippy"] and "cargo-test" in gates
    skipped = {s["id"]: s["why"] for s in body["skipped"]}
    assert "tox-py311" in skipped and "tox-py312" in skipped  # pytest runs the tests
    assert "nox-typing" in skipped  # mypy covers types
    assert skipped["make-test"].startswith("tests is run by")
    assert run_cli(["init", "--repo", str(repo), "--dry-run"]) == 0
    env_pass = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("pass")
    )
    for name in ("PATH", "VIRTUAL_ENV", "GOPATH", "CARGO_HOME", "RUSTUP_HOME"):
        assert f'"{name}"' in env_pass, env_pass  # their toolchains live outside the gate


def test_init_never_overwrites_and_says_when_it_finds_nothing(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 2 and body["error"]["code"] == "init-nothing-found"
    assert not (repo / "dagrunner.toml").exists()
    python_project(repo)
    (repo / "dagrunner.toml").write_text("# mine\n")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 2 and body["error"]["code"] == "init-exists"
    assert str(repo / "dagrunner.toml") in json.dumps(body["error"])
    assert (repo / "dagrunner.toml").read_text() == "# mine\n"
    other = repo / "ci" / "gates.toml"
    other.parent.mkdir()
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(other))
    assert code == 0 and other.is_file() and Path(body["path"]) == other


def test_release_check_prefers_manifests_release_toml_over_dagrunner_toml(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "dagrunner.toml").write_text('[gates.starter]\nrun = ["true"]\n')
    code, body = run_json(capsys, "release-check", "--repo", str(repo), "--quiet")
    assert code == 0 and [g["id"] for g in body["gates"]] == ["starter"]
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text('[gates.release]\nrun = ["true"]\n')
    code, body = run_json(capsys, "release-check", "--repo", str(repo), "--quiet")
    assert code == 0 and [g["id"] for g in body["gates"]] == ["release"]


def test_integrate_reads_dagrunner_toml_from_the_target_when_there_is_no_release_toml(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "dagrunner.toml").write_text(
        '[gates.check]\nrun = "! grep -rq BROKEN --include=*.txt ."\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "manifest")
    base = ["--repo", str(repo)]
    for name, text in (("good", "fine\n"), ("bad", "BROKEN\n")):
        _, made = run_json(
            capsys, "worktree", "allocate", "--mission", "m", "--worker", name, *base
        )
        (Path(made["path"]) / f"{name}.txt").write_text(text)
        out = str(repo.parent / f"{name}.json")
        run_json(capsys, "worktree", "export", f"m/{name}", "-o", out, *base)
        run_json(capsys, "integrate", "submit", out, *base)
    code, body = run_json(capsys, "integrate", "run", *base)
    outcome = {e["worker"]: e["state"] for e in body["envelopes"]}
    assert code == 1 and outcome == {"good": "landed", "bad": "gates-failed"}, body


# -- real projects: what users saw ------------------------------------------------------------


def dry(capsys: pytest.CaptureFixture[str], repo: Path) -> dict[str, Any]:
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, body
    assert body["written"] is False and not (repo / "dagrunner.toml").exists()
    return body


def test_tox4_native_toml_envs_are_read_from_pyproject_and_tox_toml(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [tool.mypy]
            strict = true
            [tool.tox]
            env_list = ["typing", "docs", "release"]
            [tool.tox.env.typing]
            commands = [["mypy", "src"], ["pyright", "src"]]
            [tool.tox.env.docs]
            commands = [["sphinx-build", "-W", "docs", "build/docs"]]
            [tool.tox.env.release]
            commands = [["twine", "upload", "dist/*"]]
            """
        )
    )
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert gates["tox-typing"]["run"] == ["tox", "-e", "typing"]
    assert gates["tox-typing"]["memory"] == "1G" and gates["tox-typing"]["estimate"] == "2m"
    assert gates["tox-docs"]["run"] == ["tox", "-e", "docs"]
    assert "tox-typing" in skipped["types"] and "2 commands" in skipped["types"]
    assert "uploads" in skipped["tox-release"]
    (repo / "pyproject.toml").unlink()
    (repo / "tox.toml").write_text(
        'env_list = ["docs"]\n[env.docs]\ncommands = [["sphinx-build", "-W", "docs", "out"]]\n'
    )
    assert gates_of(dry(capsys, repo))["tox-docs"]["source"] == "tox.toml env docs"


def test_every_brace_group_of_a_tox_envlist_is_expanded(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "tox.ini").write_text(
        "[tox]\nenvlist = py{38,39}-django{32,40}, lint\n\n"
        "[testenv]\ncommands = pytest {posargs}\n\n"
        "[testenv:lint]\ncommands =\n    ruff check .\n    ruff format --check .\n"
    )
    body = dry(capsys, repo)
    ids = [g["id"] for g in body["gates"]] + [s["id"] for s in body["skipped"]]
    for env in ("py38-django32", "py38-django40", "py39-django32", "py39-django40", "lint"):
        assert f"tox-{env}" in ids
    assert not any("{" in i for i in ids)
    assert gates_of(body)["tox-lint"]["run"] == ["tox", "-e", "lint"]
    # of a matrix, the env of the Python running here is the one kept
    here = f"py3{sys.version_info.minor}"
    (repo / "tox.ini").write_text(f"[tox]\nenvlist = py3{{9,{sys.version_info.minor}}}-x\n")
    assert [g["id"] for g in dry(capsys, repo)["gates"]] == [f"tox-{here}-x"]


NOXFILE = """
import nox

nox.options.sessions = ["lint", "tests", "typing", "release", "old"]


@nox.session
def lint(session):
    session.install("pre-commit", "build", "twine")
    session.run("pre-commit", "run", "--all-files")
    session.run("python", "-m", "build")
    session.run("twine", "check", "dist/*")


@nox.session(python=["3.12"])
def tests(session):
    session.run("pytest", "--cov=pkg", "--cov-fail-under=90")


@nox.session(default=False)
def typing(session):
    session.run("mypy")


@nox.session
def old(session):
    session.run("pytest")


@nox.session
def unlisted(session):
    session.run("pytest")


@nox.session
def release(session):
    session.run("git", "tag", "v1")


@session(name="update-deps")
def update(session):
    session.run("git", "clone", "https://example.invalid/x")


@nox.session
def docs_build(session):
    session.run("git", "commit", "-am", "docs")
"""


def test_nox_sessions_that_are_tasks_or_not_default_are_skipped_and_real_ones_win(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python_project(repo)
    (repo / "noxfile.py").write_text(NOXFILE)
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    # the project's own lint (hooks, build, twine check) and coverage-gated tests win
    assert gates["nox-lint"]["run"] == ["nox", "-s", "lint", "--force-python", THIS]
    assert "lint" not in gates
    assert "nox-lint" in skipped["lint"] and "3 commands" in skipped["lint"]
    if shutil.which("nox"):
        assert "nox-tests" in gates and "tests" not in gates
        assert "nox-tests" in skipped["tests"] and "coverage" in skipped["tests"]
    else:  # the project's tests gate cannot run here: pytest runs the tests meanwhile
        assert gates["nox-tests"]["commented_out"] and not gates["tests"]["commented_out"]
    assert "default=False" in skipped["nox-typing"]
    assert "nox.options.sessions" in skipped["nox-unlisted"]
    assert "git tag" in skipped["nox-release"]
    assert "task" in skipped["nox-update-deps"]
    assert "git commit" in skipped["nox-docs_build"]
    if shutil.which("nox"):
        assert skipped["nox-old"].startswith("tests is run by 'nox-tests'")
    else:  # the stand-in runs them (round 16)
        assert skipped["nox-old"].startswith("tests is run by 'tests' ('nox-tests' is written")


def test_what_ci_runs_by_name_wins(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python_project(repo)
    (repo / "tox.ini").write_text(
        "[tox]\nenvlist = py312\n\n[testenv:typing]\ncommands = mypy src\n"
        "[testenv:lint]\ncommands = ruff check .\n"
    )
    (repo / "package.json").write_text(json.dumps({"scripts": {"test": "jest", "lint": "x"}}))
    (repo / ".pre-commit-config.yaml").write_text("repos: []\n")
    workflows = repo / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "ci.yml").write_text(
        textwrap.dedent(
            """\
            jobs:
              check:
                runs-on: ubuntu-latest
                steps:
                  - uses: actions/checkout@v4
                  - run: python -m tox -e typing
                  - name: js
                    run: |
                      npm ci
                      npm test
                  - run: pre-commit run --all-files
                  - run: nox -s ${{ matrix.session }}
            """
        )
    )
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert "tox-typing" in gates and "types" not in gates  # not in envlist, but CI runs it
    assert "CI runs it" in skipped["types"]
    assert "not in env_list" in skipped["tox-lint"]
    assert {"js-test", "pre-commit"} <= set(gates)


def test_a_script_ci_runs_is_a_gate_whatever_its_name_and_npm_scripts_key_on_the_tree(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """jshttp/mime-types: CI runs ``npm run test-ci`` (not a name init knew) and ``npm run
    lint`` (eslint with a markdown plugin and its own .eslintrc.yml: a lint key of only
    *.js files let a lint-breaking README land from the cache)."""
    scripts = {"lint": "eslint .", "test": "mocha", "test-ci": "nyc npm test"}
    (repo / "package.json").write_text(json.dumps({"scripts": scripts}))
    workflows = repo / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "ci.yml").write_text("jobs:\n  t:\n    steps:\n      - run: npm run test-ci\n")
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert "js-test-ci" in gates and "js-test" not in gates and "CI runs it" in skipped["js-test"]
    assert gates["js-lint"]["inputs"] == ["**"]


def test_ruff_fix_true_is_checked_with_no_fix_and_ruff_format_where_used(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "pyproject.toml").write_text("[tool.ruff]\nfix = true\n")
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  hooks:\n"
        "  - id: ruff-format\n  - id: check-yaml\n"
    )
    gates = gates_of(dry(capsys, repo))
    assert gates["lint"]["run"][:3] == ["ruff", "check", "--no-fix"]
    run = gates["format"]["run"]  # the hook's, replayed as a check (tests/test_init_hooks.py)
    assert run[run.index("--") + 1 :] == ["ruff", "format", "--force-exclude", "--check"]
    (repo / "pyproject.toml").write_text("[tool.black]\n")
    (repo / "ruff.toml").write_text("fix = true\n")
    gates = gates_of(dry(capsys, repo))
    assert "--no-fix" in gates["lint"]["run"]
    assert gates["format"]["run"][:2] == ["black", "--check"]  # black formats: no ruff format


def test_junit_files_are_wired_and_never_tracked(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python_project(repo)
    (repo / "package.json").write_text(json.dumps({"scripts": {"test": "node --test"}}))
    (repo / "add.test.mjs").write_text("import test from 'node:test';\ntest('adds', () => {});\n")
    out = repo / "dagrunner.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0
    gates = gates_of(body)
    tests, node = gates["tests"], gates["js-test"]
    assert f"--junitxml={tests['junit']}" in tests["run"]
    assert node["run"][:2] == ["sh", "-c"] and "exec node --test" in node["run"][2]
    assert f"--test-reporter=junit --test-reporter-destination={node['junit']}" in node["run"][2]
    for path in (tests["junit"], node["junit"]):
        assert git(repo, "check-ignore", path).strip() == path  # never committed
        assert f'junit = "{path}"' in out.read_text()
    if shutil.which("node") is None:
        return
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--quiet")
    assert code == 0, run
    counted = {g["id"]: (g.get("tests") or {}).get("tests") for g in run["gates"]}
    assert counted["tests"] == 1 and counted["js-test"] == 1, counted


def test_memory_estimate_and_inputs_follow_the_tool_and_its_config(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python_project(repo)
    gates = gates_of(dry(capsys, repo))
    assert gates["lint"]["memory"] == "256M"
    assert gates["types"]["memory"] == "2G" and gates["tests"]["memory"] == "1G"
    assert gates["types"]["inputs"][:2] == ["src/**/*.py", "tests/**/*.py"]  # mypy's files
    assert not any(i.endswith(".pyi") for g in gates.values() for i in g["inputs"])
    (repo / "src" / "pkg" / "_c.pyi").write_text("def f() -> int: ...\n")
    gates = gates_of(dry(capsys, repo))
    assert "**/*.pyi" in gates["lint"]["inputs"] and "src/**/*.pyi" in gates["types"]["inputs"]


def test_missing_programs_are_commented_out_and_pre_commit_overlaps_merged(
    repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python_project(repo)
    (repo / "pyproject.toml").write_text(PYPROJECT + "\n[tool.codespell]\n")
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: x\n  hooks:\n  - id: ruff\n  - id: codespell\n  - id: check-yaml\n"
    )
    bare = tmp_path / "bin"
    bare.mkdir()
    for name, target in (("git", "git"), ("mypy", "mypy"), ("pre-commit", "true")):
        (bare / name).symlink_to(shutil.which(target) or f"/usr/bin/{target}")
    monkeypatch.setenv("PATH", str(bare))
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    # ruff and codespell come only through pre-commit here: no gates of their own
    assert "lint" not in gates and "hook ruff" in skipped["lint"]
    assert "spelling" not in gates and "hook codespell" in skipped["spelling"]
    assert gates["pre-commit"]["env"] == {}
    # with them on PATH, their gates stay; pre-commit keeps hooks of a repository init does
    # not know (it cannot tell what they check), and skips those its gates replay
    for name in ("ruff", "codespell"):
        (bare / name).write_text("#!/bin/sh\n")
        (bare / name).chmod(0o755)
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert gates["pre-commit"]["env"] == {}
    assert "the pre-commit gate keeps it" in skipped["pre-commit:ruff"]
    url = "https://github.com/astral-sh/ruff-pre-commit"
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {url}\n  hooks:\n  - id: ruff\n- repo: x\n  hooks:\n"
        "  - id: codespell\n  - id: check-yaml\n"
    )
    body = dry(capsys, repo)
    gates, skipped = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert gates["pre-commit"]["env"] == {"SKIP": "ruff"}
    assert "SKIP=ruff" in skipped["pre-commit:ruff"] and "'lint'" in skipped["pre-commit:ruff"]
    # a program missing from PATH: its gate is written commented out, with how to install it
    (bare / "ruff").unlink()
    (bare / "mypy").unlink()
    (bare / "pre-commit").unlink()
    out = tmp_path / "m.toml"
    assert run_cli(["init", "--repo", str(repo), "-o", str(out)]) == 0
    text = out.read_text()
    assert "# `mypy` is not on PATH here: install it (python -m pip install mypy)" in text
    assert "# [gates.types]\n# run = " in text and "\n[gates.tests]\n" in text


@pytest.mark.parametrize(
    ("name", "text", "code"),
    [
        ("pyproject.toml", "a = " + "[" * 50_000 + "]" * 50_000 + "\n", "init-config-too-deep"),
        ("package.json", "[" * 100_000 + "]" * 100_000, "init-config-too-deep"),
        ("noxfile.py", "x = 1" + " + 1" * 200_000, "init-config-too-deep"),
        (
            "package.json",
            '{"scripts": {}, "x": "' + "a" * (5 << 20) + '"}',
            "init-config-too-large",
        ),
    ],
    ids=["deep-toml", "deep-json", "deep-python", "large-json"],
)
def test_hostile_files_get_coded_errors(
    repo: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, code: str
) -> None:
    (repo / name).write_text(text)
    exit_code, body = run_json(capsys, "init", "--repo", str(repo))
    assert exit_code == 2 and body["error"]["code"] == code, body


def test_a_fifo_is_refused_without_blocking_and_symlinks_out_are_not_followed(
    repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.mkfifo(repo / "package.json")  # an open() without O_NONBLOCK would wait forever
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 2 and body["error"]["code"] == "init-not-a-file", body
    (repo / "package.json").unlink()
    outside = tmp_path / "elsewhere.toml"
    outside.write_text("[tool.ruff]\n[tool.mypy]\n")
    (repo / "pyproject.toml").symlink_to(outside)
    (repo / "Makefile").write_text("lint:\n\ttrue\n")
    body = dry(capsys, repo)
    assert [g["id"] for g in body["gates"]] == ["make-lint"]  # nothing read from outside
    why = {s["id"]: s["why"] for s in body["skipped"]}["pyproject.toml"]
    assert "outside the repository" in why and "not followed" in why


def test_json_without_output_writes_nothing(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python_project(repo)
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0 and body["written"] is False
    assert not (repo / "dagrunner.toml").exists()
    assert run_cli(["init", "--repo", str(repo), "-q"]) == 0  # without --json it writes
    assert (repo / "dagrunner.toml").is_file()


def fake_venv(repo: Path, name: str = ".venv") -> Path:
    """A venv as ``python -m venv`` and ``pip install -e .`` leave it: pyvenv.cfg, the
    project's dist-info with an editable direct_url.json, and two pinned distributions."""
    site = repo / name / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (repo / name / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    url = {"url": f"file://{repo.resolve()}", "dir_info": {"editable": True}}
    (site / "pkg-0.1.dist-info").mkdir()
    (site / "pkg-0.1.dist-info" / "direct_url.json").write_text(json.dumps(url))
    for dist in ("pytest-8.3.5", "freezegun-1.5.5", "pip-24.0"):
        (site / f"{dist}.dist-info").mkdir()
    return site


def test_a_venv_that_imports_the_project_in_place_becomes_its_seed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Integration gates never see the checkout: without a seed they cannot import the
    project (found on itsdangerous).  Ignored, the venv is written as an active seed that
    builds the same venv; not ignored, commented out with what to do."""
    python_project(repo)
    fake_venv(repo)
    (seed,) = dry(capsys, repo)["seeds"]
    assert seed["active"] is False  # not ignored: written commented out
    (repo / ".gitignore").write_text(".venv/\n")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "m.toml"))
    assert code == 0 and body["seeds"][0]["active"] is True
    text = (repo / "m.toml").read_text()
    assert '\n[[worktrees.seed]]\npath = ".venv"\nkey = ["pyproject.toml"]\n' in text
    build = body["seeds"][0]["build"]
    assert build.endswith("pip install -q -e . freezegun==1.5.5 pytest==8.3.5"), build
    assert "pip==" not in build and "pkg==" not in build  # the venv's own, and the project


LOCK_BUILDS = {
    "poetry": (
        "poetry.lock",
        "Poetry (version 2.1.3)",
        'python3 -m venv .venv && VIRTUAL_ENV="$PWD/.venv" poetry install --no-interaction',
    ),
    "uv": (
        "uv.lock",
        "uv 0.13.9",
        'python3 -m venv .venv && UV_PROJECT_ENVIRONMENT="$PWD/.venv" uv sync --locked'
        " --python .venv/bin/python",
    ),
}


@pytest.mark.parametrize("tool", sorted(LOCK_BUILDS))
def test_a_locked_projects_venv_seed_is_built_from_its_lock(
    repo: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
) -> None:
    """Found on Textualize/rich (round 16): the seed's build pinned what the checkout's venv
    held, keyed by ``poetry.lock``.  A worker's lock bump (black 22.12 to 24.8) rebuilt the
    seed with the same pins: its gates ran the old black, passed, and it landed, where the
    project's CI (``poetry install``, then ``black --check .``) fails 14 files.  With the
    lock's tool on PATH the build is the project's own install from its lock (poetry's;
    uv's ``uv sync --locked``, as pallets/werkzeug has it); without, the pins stay and the
    manifest says the lock is not followed -- as for a ``pdm.lock``, not followed yet."""
    lock, version, build = LOCK_BUILDS[tool]
    python_project(repo)
    (repo / lock).write_text("# a lock\n")
    (repo / ".gitignore").write_text(".venv/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", tool)
    fake_venv(repo)
    paths = os.environ["PATH"].split(os.pathsep)
    bare = os.pathsep.join(p for p in paths if p and not (Path(p) / tool).exists())
    monkeypatch.setenv("PATH", bare)
    (seed,) = dry(capsys, repo)["seeds"]
    assert "pytest==8.3.5" in seed["build"] and f"{tool} " not in seed["build"], seed
    out = tmp_path / "pinned.toml"
    assert run_cli(["init", "--repo", str(repo), "-q", "-o", str(out)]) == 0
    assert f"{lock} is not followed" in out.read_text()
    (repo / lock).rename(repo / "pdm.lock")
    out = tmp_path / "pdm.toml"
    assert run_cli(["init", "--repo", str(repo), "-q", "-o", str(out)]) == 0
    assert "pdm.lock is not followed" in out.read_text()
    (repo / "pdm.lock").rename(repo / lock)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / tool).write_text(f"#!/bin/sh\necho '{version}'\n")
    (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{bare}")
    (seed,) = dry(capsys, repo)["seeds"]
    assert seed["key"] == ["pyproject.toml", lock], seed
    assert seed["build"] == build, seed
    out = tmp_path / "locked.toml"
    assert run_cli(["init", "--repo", str(repo), "-q", "-o", str(out)]) == 0
    assert f'tools = ["python3 --version", "{tool} --version"]' in out.read_text()


def test_a_venv_that_does_not_import_the_project_is_no_seed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python_project(repo)
    site = fake_venv(repo)
    (site / "pkg-0.1.dist-info" / "direct_url.json").unlink()
    assert dry(capsys, repo)["seeds"] == []


def tests_by_nox_missing_here(repo: Path) -> None:
    """A project whose CI runs its tests by ``nox -s tests``; nox is not on this machine."""
    python_project(repo)
    (repo / "noxfile.py").write_text(
        "import nox\n\n@nox.session\ndef tests(session):\n    session.run('pytest')\n"
    )
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  t:\n    steps:\n    - run: nox -s tests\n"
    )
    assert shutil.which("nox") is None  # what this test is about


def test_the_tests_are_run_here_while_cis_runner_for_them_is_missing(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CI runs the tests through nox, which this machine lacks: the nox gate is written
    commented out, and the pytest gate runs the tests here meanwhile (on pypa/packaging no
    active gate ran them, and a test-breaking change would have landed)."""
    tests_by_nox_missing_here(repo)
    gates = gates_of(dry(capsys, repo))
    assert gates["nox-tests"]["commented_out"] is True
    here = [g for g in gates.values() if g["run"][:3] == ["python", "-m", "pytest"]]
    assert len(here) == 1 and not here[0]["commented_out"], gates


def test_what_the_stand_in_for_a_missing_runner_runs_is_said_to_be_run_by_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on Textualize/rich (round 16): tox is missing, so ``make-test`` runs the tests
    here and ``tox-py311`` is written commented out; yet the tool table's tests and the
    envs of missing Pythons were listed as run by ``tox-py311``, a gate that runs nothing.
    They are run by the stand-in, and the left-out line says the runner's gate is off."""
    tests_by_nox_missing_here(repo)
    body = dry(capsys, repo)
    (stand_in,) = [g["id"] for g in body["gates"] if g["id"] in ("tests", "make-test")]
    whys = {s["id"]: s["why"] for s in body["skipped"]}
    left = [i for i in ("tests", "make-test") if i != stand_in]
    assert left and all(i in whys for i in left), whys
    for i in left:
        assert f"run by {stand_in!r}" in whys[i], whys
        assert "'nox-tests' is written commented out" in whys[i], whys


def test_what_pre_commits_mypy_hook_installs_for_it_goes_into_the_seed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The types gate runs mypy in the pre-commit hook's stead, so it needs what the hook
    installs for mypy: the venv seed's build installs it too, and the gate says so (on
    pypa/packaging the first release check failed 15 imports without it)."""
    assert shutil.which("mypy") is not None  # the types gate runs it here
    python_project(repo)
    fake_venv(repo)
    (repo / ".gitignore").write_text(".venv/\n")
    (repo / ".pre-commit-config.yaml").write_text(
        textwrap.dedent(
            """\
            repos:
              - repo: https://github.com/pre-commit/mirrors-mypy
                rev: 41e691678310dfd3833f7ab4e180ddb014310356  # frozen: v1.13.0
                hooks:
                  - id: mypy
                    args: []
                    additional_dependencies: &deps
                      - 'nox>=2024.1'
                      - pytest  # the venv has it: its version stays
                      - types-requests
              - repo: local
                hooks:
                  - id: check-x
                    name: x
            """
        )
    )
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    (seed,) = body["seeds"]
    pins = "freezegun==1.5.5 pytest==8.3.5"
    assert seed["build"].endswith(f"{pins} mypy==1.13.0 'nox>=2024.1' types-requests"), seed
    text = out.read_text()
    said = "# pre-commit's mypy hook gives mypy nox>=2024.1, pytest, types-requests"
    assert said in text and text.index(said) < text.index("[gates.types]")
    # a flow list, and a hook repo's rev that is no version: the tool is not pinned
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: x\n  rev: main\n  hooks:\n  - id: mypy\n"
        "    additional_dependencies: [attrs, 'pydantic>=2']\n"
    )
    (seed,) = dry(capsys, repo)["seeds"]
    assert seed["build"].endswith(f"{pins} mypy attrs 'pydantic>=2'"), seed


def test_a_hooks_pinned_tool_is_said_and_goes_into_the_seed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real project (pypa/installer): the ruff gate written in the ruff-check
    hook's stead ran the ruff on PATH (0.17), the hook pins v0.15.22, and the target's own
    lint was red (3 rules new in the later ruff) with nothing said.  The gate says which
    version to install, and a venv seed's build installs it."""
    python_project(repo)
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  rev: v0.15.22\n"
        "  hooks:\n  - id: ruff-check\n"
    )
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    text = out.read_text()
    said = "# the hook runs ruff==0.15.22: install it (pip install 'ruff==0.15.22', in your"
    assert said in text and text.index(said) < text.index("[gates.lint]"), text
    fake_venv(repo)
    (repo / ".gitignore").write_text(".venv/\n")
    (seed,) = dry(capsys, repo)["seeds"]
    assert seed["build"].endswith("pytest==8.3.5 ruff==0.15.22"), seed


def test_a_commented_gate_in_a_hooks_stead_says_to_install_what_the_hook_installs(
    repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on a real project: the types gate, written commented out (mypy missing here),
    said "install it (python -m pip install mypy), then uncomment"; the hook's mypy type-
    checks against its ``additional_dependencies`` (the next line named them): so installed,
    the gate was red locally and green in the queue, whose seed installs them."""
    python_project(repo)
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: https://github.com/pre-commit/mirrors-mypy\n  rev: v1.13.0\n"
        "  hooks:\n  - id: mypy\n    additional_dependencies: [types-requests, 'attrs>=23']\n"
    )
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in ("git", "ruff", "python3"):
        (bare / name).symlink_to(shutil.which(name) or sys.executable)
    monkeypatch.setenv("PATH", str(bare))
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0 and gates_of(body)["types"]["commented_out"] is True, body
    text = out.read_text()
    wanted = "python -m pip install 'mypy==1.13.0' 'types-requests' 'attrs>=23'"
    assert f"# `mypy` is not on PATH here: install it ({wanted}), then uncomment" in text, text
    assert "(pip install 'mypy==1.13.0' 'types-requests' 'attrs>=23', in your" in text, text


def test_cis_coverage_gates_are_never_dropped_unsaid(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real nox library: CI's ``coverage report --fail-under=100`` was neither a
    gate nor listed among what init left out.  A coverage threshold a gate already runs
    (a tox env's ``--cov-fail-under``) is not listed."""
    python_project(repo)
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  t:\n    steps:\n    - run: python -m pytest --cov --cov-fail-under=95\n"
        "  c:\n    steps:\n    - run: |\n        coverage combine\n"
        "        coverage report --fail-under=100 --show-missing\n"
    )
    why = {s["id"]: s for s in dry(capsys, repo)["skipped"]}
    report = why["ci: coverage report --fail-under=100"]
    assert report["source"] == ".github/workflows/ci.yml", report
    assert "the coverage data earlier CI steps collected" in report["why"], report
    threshold = why["ci: --cov-fail-under=95"]
    assert "gate 'tests' runs pytest without it" in threshold["why"], threshold
    (repo / "tox.ini").write_text(
        "[tox]\nenvlist = py\n[testenv]\ncommands = pytest --cov --cov-fail-under=95\n"
    )
    why = {s["id"]: s for s in dry(capsys, repo)["skipped"]}
    assert "ci: --cov-fail-under=95" not in why and "ci: coverage report --fail-under=100" in why


def test_tests_a_session_deselects_are_never_said_to_be_run_by_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real nox library: 427 property tests were left out as "run by
    nox-tests", a session that deselects them (``-m "not property"``).  The session that
    runs them is a gate of its own; a matrix twin of the chosen one is still left out."""
    python_project(repo)
    (repo / "noxfile.py").write_text(
        "import nox\n\n@nox.session\ndef tests(session):\n"
        "    session.run('pytest', '-m', 'not property', '--cov', '--cov-fail-under=90')\n\n"
        "@nox.session\ndef property(session):\n    session.run('pytest', '-m', 'property')\n\n"
        "@nox.session\ndef unit(session):\n"
        "    session.run('pytest', '-m', 'not property', '--cov', '--cov-fail-under=90')\n"
    )
    body = dry(capsys, repo)
    gates, why = gates_of(body), {s["id"]: s["why"] for s in body["skipped"]}
    assert "nox-tests" in gates and "nox-property" in gates, (gates, why)
    assert "nox-property" not in why and "nox-unit" in why, why


def test_a_venv_ignored_only_by_its_own_gitignore_is_no_active_seed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``uv venv`` writes ``.venv/.gitignore`` (``*``); the seed's build (``python -m venv``)
    may not, so only a committed rule makes the seed usable: else the line to add is said
    (found on a real project: the first allocation refused the seed init wrote active)."""
    python_project(repo)
    fake_venv(repo)
    (repo / ".venv" / ".gitignore").write_text("*\n")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "m.toml"))
    assert code == 0 and body["seeds"][0]["active"] is False
    text = (repo / "m.toml").read_text()
    assert "# add .venv/ to .gitignore" in text and "\n# [[worktrees.seed]]\n" in text


def test_gates_that_need_the_network_are_marked_and_say_why(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Docs built with intersphinx and a nox session that runs pre-commit (which clones its
    hooks) fail offline with pages of log: init marks them ``network = "host"``, with why."""
    python_project(repo)
    (repo / "docs").mkdir()
    (repo / "docs" / "conf.py").write_text('extensions = ["sphinx.ext.intersphinx"]\n')
    (repo / "noxfile.py").write_text(
        "import nox\n\n@nox.session\ndef lint(session):\n"
        "    session.run('pre-commit', 'run', '--all-files')\n\n"
        "@nox.session\ndef docs(session):\n"
        "    session.run('sphinx-build', '-W', 'docs', 'build/docs')\n"
    )
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text("steps:\n- run: nox -s lint docs\n")
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    gates = gates_of(body)
    assert "clones its hooks' repositories" in gates["nox-lint"]["network"]
    assert "intersphinx (docs/conf.py)" in gates["nox-docs"]["network"]
    assert gates["tests"]["network"] is None
    text = out.read_text()
    table = text[text.index("[gates.nox-docs]") :].split("\n\n")[0]
    assert 'network = "host"' in table
    assert "# needs the network: sphinx's intersphinx" in text


def test_a_session_that_runs_every_hook_is_not_doubled_by_the_hook_gates(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make lint`` runs ``pre-commit run --all-files``: the pre-commit gate and the ruff
    and mypy gates (hooks of that config) would run the same hooks again; they are left out
    with why.  With the session's runner missing (nox), they stay and it says what to drop."""
    python_project(repo)
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  rev: v0.6.0\n"
        "  hooks:\n  - id: ruff\n- repo: https://github.com/pre-commit/mirrors-mypy\n"
        "  rev: v1.13.0\n  hooks:\n  - id: mypy\n"
    )
    (repo / "Makefile").write_text("lint:\n\tpre-commit run --all-files\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text("steps:\n- run: make lint\n")
    body = dry(capsys, repo)
    gates = gates_of(body)
    assert "make-lint" in gates and not {"pre-commit", "lint", "types"} & set(gates), gates
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert (
        why["pre-commit"]
        == why["types"]
        == ("its hooks are run by 'make-lint' (pre-commit run, every hook): not twice")
    )
    (repo / "Makefile").unlink()
    (repo / "noxfile.py").write_text(
        "import nox\n\n@nox.session\ndef lint(session):\n"
        "    session.run('pre-commit', 'run', '--all-files')\n"
    )
    (repo / ".github" / "workflows" / "ci.yml").write_text("steps:\n- run: nox -s lint\n")
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0 and gates_of(body)["nox-lint"]["commented_out"] is True
    assert "# it runs every pre-commit hook: once uncommented, remove gates" in out.read_text()


def test_a_variant_or_an_env_whose_python_is_missing_is_never_the_test_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a tox 4 project init made ``tests-min`` (CPython 3.99, minimum pins: a variant)
    the test gate and dropped ``py3.11`` as "run by tox-tests-min": the project's tests never
    ran.  The default env of an installed Python is the gate; the others say the truth."""
    python_project(repo)
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            """\
            [tox]
            envlist = py3.{99,11}, tests-min, tests-nightly
            [testenv]
            commands = pytest --cov --cov-fail-under=90 {posargs}
            [testenv:tests-min]
            base_python = python3.99
            [testenv:tests-nightly]
            """
        )
    )
    body = dry(capsys, repo)
    gates = gates_of(body)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert "tox-py3.11" in gates and "tox-tests-min" not in gates, gates
    assert why["tox-tests-min"].startswith("it needs python3.99, which is not installed here")
    assert why["tox-py3.99"].startswith("it needs python3.99, which is not installed here")
    assert why["tox-tests-nightly"].startswith("a variant ('nightly'"), why
    assert "'tox-py3.11'" in why["tox-tests-nightly"]


def test_a_scripts_memory_is_its_heaviest_tools(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check` runs tsc (through another script): it peaked at 1 GiB where 256M was declared."""
    scripts = {"check": "npm run types && biome ci .", "types": "tsc --noEmit", "lint": "x"}
    (repo / "package.json").write_text(json.dumps({"name": "p", "scripts": scripts}))
    gates = gates_of(dry(capsys, repo))
    assert gates["js-check"]["memory"] == "2G" and gates["js-lint"]["memory"] == "256M"


def test_a_scripts_memory_follows_its_scripts_and_its_workspaces_scripts(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real pnpm monorepo: js-check ran ``pnpm -r check``, each package's
    ``check`` is tsc: it peaked at 1 GiB every run where 256M was declared.  A chain of
    scripts is followed to its end too."""
    scripts = {
        "check": "pnpm -r --parallel run check",
        "lint": "pnpm run lint:all",
        "lint:all": "pnpm run lint:ts",
        "lint:ts": "tsc -p tsconfig.lint.json",
    }
    (repo / "package.json").write_text(json.dumps({"name": "m", "scripts": scripts}))
    (repo / "pnpm-workspace.yaml").write_text("packages:\n  - packages/*\n")
    (repo / "pnpm-lock.yaml").write_text("lockfileVersion: '9.0'\n")
    (repo / "packages" / "a").mkdir(parents=True)
    (repo / "packages" / "a" / "package.json").write_text(
        json.dumps({"name": "a", "scripts": {"check": "tsc --noEmit", "build": "webpack"}})
    )
    gates = gates_of(dry(capsys, repo))
    assert gates["js-check"]["memory"] == "2G", gates["js-check"]
    assert gates["js-lint"]["memory"] == "2G", gates["js-lint"]


def test_a_project_that_runs_its_tests_with_unittest_gets_a_unittest_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real library (tomli): CI and tox run ``python -m unittest``, pytest is named
    nowhere, yet init wrote ``python -m pytest``, which the project's venv seed (the project
    editable, nothing else) cannot run: the tests gate failed ``No module named pytest`` on
    the target itself.  The gate runs what the project runs; a failure is named from its
    output.  A project that names pytest anywhere keeps the pytest gate."""
    (repo / "pkg").mkdir()
    (repo / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_add.py").write_text(
        "import unittest\n\nfrom pkg import add\n\n\nclass TestAdd(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(1, 2), 3)\n"
    )
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "pkg"\nversion = "0.1"\n\n[tool.tox]\nenv_list = ["3.11"]\n\n'
        '[tool.tox.env_run_base]\ncommands = [["python", "-m", "unittest"]]\n'
    )
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  t:\n    steps:\n    - run: pip install .\n    - run: python -m unittest\n"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a unittest project")
    out = repo / "dagrunner.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    tests = gates_of(body)["tests"]
    assert tests["run"] == ["python", "-m", "unittest"] and tests["junit"] is None, tests
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-q", "-m", "manifest")
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--only", "tests")
    assert code == 0, run
    (repo / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--only", "tests")
    assert code == 1, run
    (gate,) = run["gates"]
    assert [c["name"] for c in gate["tests"]["cases"]] == ["test_add"], gate["tests"]
    (repo / "requirements-dev.txt").write_text("pytest\n")
    out.unlink()
    code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert "pytest" in gates_of(body)["tests"]["run"]


def test_a_program_ci_runs_through_yarn_gets_its_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real yarn workspace (manypkg): CI runs ``yarn tsc``, a program of
    node_modules/.bin, not a script; init made no gate of it and did not list it, so type
    errors landed unchecked.  It is a gate now; a name that is no program there is not."""
    body = {"name": "root", "private": True, "scripts": {"test": "vitest"}}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "yarn.lock").write_text("# yarn lockfile v1\n")
    (repo / ".gitignore").write_text("node_modules/\n")
    (repo / "node_modules" / ".bin").mkdir(parents=True)
    (repo / "node_modules" / ".bin" / "tsc").write_text("#!/bin/sh\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  t:\n    steps:\n    - run: yarn test\n    - run: yarn tsc\n    - run: yarn knip\n"
        "    - run: yarn changeset publish --tag latest\n"
    )
    (repo / "node_modules" / ".bin" / "changeset").write_text("#!/bin/sh\n")
    gates = gates_of(dry(capsys, repo))
    assert gates["js-tsc"]["run"] == ["yarn", "tsc"], gates
    assert "js-knip" not in gates  # no such program in node_modules/.bin
    assert "js-changeset" not in gates  # a task (publish), not a check


@pytest.mark.parametrize(
    "convention",
    [
        (
            "commitlint.config.js",
            "export default { extends: ['@commitlint/config-conventional'] }\n",
        ),
        (
            "package.json",
            '{"name": "p", "commitlint": {"extends": ["@commitlint/config-conventional"]}}\n',
        ),
        (
            ".pre-commit-config.yaml",
            "repos:\n- repo: https://github.com/compilerla/conventional-pre-commit\n  rev: v3.0.0\n  hooks:\n  - id: conventional-pre-commit\n    stages: [commit-msg]\n",
        ),
    ],
    ids=["commitlint-config", "package-json", "pre-commit-hook"],
)
def test_a_project_that_checks_commit_messages_gets_landed_commits_in_its_convention(
    repo: Path, capsys: pytest.CaptureFixture[str], convention: tuple[str, str]
) -> None:
    """tinyhttp's commitlint would refuse ``dagrunner: integrate m/w1``: init proposes an
    ``[integrate] message`` a Conventional Commits check passes, and the queue lands with it."""
    name, text = convention
    (repo / name).write_text(text)
    (repo / "Makefile").write_text("check:\n\t! grep -rq BROKEN --include=*.txt .\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "chore: a project")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0, body
    manifest = (repo / "dagrunner.toml").read_text()
    assert (
        "[integrate]" in manifest and 'message = "chore: integrate {mission}/{worker}"' in manifest
    )
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-q", "-m", "chore: dagrunner manifest")
    base = ["--repo", str(repo)]
    run_json(capsys, "integrate", "submit", str(envelope(repo, "w1")), *base)
    code, body = run_json(capsys, "integrate", "run", *base)
    assert code == 0, body
    assert git(repo, "log", "-1", "--format=%s", "main").strip() == "chore: integrate m/w1"


def test_a_project_that_checks_no_commit_message_gets_no_integrate_table(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "Makefile").write_text("check:\n\ttrue\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a project")
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0, body
    assert "[integrate]" not in (repo / "dagrunner.toml").read_text()


def test_a_nox_session_ci_runs_for_a_matrix_value_is_not_said_to_be_unrun_by_ci(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pypa/packaging's CI runs ``nox -s "downstream(project='$MATRIX_PROJECT')"``: which
    values is CI's matrix, unknowable here, so the session is still left out -- but with a
    true reason, not "CI does not" (round 6 of docs/real-projects.md)."""
    python_project(repo)
    (repo / "noxfile.py").write_text(
        "import nox\n\n@nox.session\ndef tests(session):\n    session.run('pytest')\n\n"
        "@nox.session(default=False)\n@nox.parametrize('project', ['a', 'b'])\n"
        "def downstream(session, project):\n    session.run('pytest', project)\n\n"
        "@nox.session(default=False)\ndef typing(session):\n    session.run('mypy', 'src')\n"
    )
    workflows = repo / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "ci.yml").write_text(
        "jobs:\n  downstream:\n    steps:\n      - env:\n"
        "          MATRIX_PROJECT: ${{ matrix.project }}\n"
        "        run: pipx run nox -s \"downstream(project='$MATRIX_PROJECT')\"\n"
    )
    skipped = {s["id"]: s["why"] for s in dry(capsys, repo)["skipped"]}
    assert "CI runs it for a matrix value" in skipped["nox-downstream"], skipped
    assert "CI does not" not in skipped["nox-downstream"]
    assert "and CI does not" in skipped["nox-typing"]  # named by nothing CI runs


def test_the_summary_says_which_gates_need_the_network_and_what_to_do_offline(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on real projects (rounds 6-8, 11, 12): a gate init marked as needing the
    network fails every tree where gates run offline, so nothing lands; the user commented
    it out, an edit init never told (its comment says why it needs the network, not what to
    do without it).  The summary names the gates and the edit."""
    python_project(repo)
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: https://github.com/pre-commit/pre-commit-hooks\n  hooks:\n"
        "  - id: check-yaml\n"
    )
    tools = repo.parent / "bin"  # pre-commit on PATH, so that its gate is written active
    tools.mkdir()
    (tools / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (tools / "pre-commit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert run_cli(["init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml")]) == 0
    said = capsys.readouterr().out
    line = next((x for x in said.splitlines() if x.startswith("needs the network")), said)
    assert "pre-commit" in line and "comment" in line and "offline" in line, line
