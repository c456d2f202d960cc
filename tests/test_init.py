"""``dagrunner init`` on real fixture projects: what each kind of project configures becomes
gates; the manifest written for a Python project passes ``release-check`` as it is (and is
cached the second time); nothing is ever overwritten; ``--dry-run`` writes nothing."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import git, run_json

from dagrunner.cli.main import run_cli

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
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python_project(repo)
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0 and body["written"] is True
    assert Path(body["path"]) == repo / "dagrunner.toml"
    gates = gates_of(body)
    assert list(gates) == ["lint", "format", "types", "tests"]
    assert gates["types"]["source"] == "pyproject.toml [tool.mypy]"
    assert gates["tests"]["inputs"] == ["**"]  # it may read anything: keyed by every file
    assert "**/*.py" in gates["lint"]["inputs"] and "pyproject.toml" in gates["lint"]["inputs"]
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
    assert "package.json" in gates["js-lint"]["inputs"]
    # the text form prints the manifest itself, and says which programs this machine lacks
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    monkeypatch.setenv("PATH", str(bare))
    assert run_cli(["init", "--repo", str(repo), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# Written by `dagrunner init`") and "[gates.js-test]" in printed
    assert "# `pnpm` is not on PATH here: install it, or drop this gate" in printed
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
    code, body = run_json(capsys, "init", "--repo", str(repo))
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
    assert gates["nox-bench"]["run"] == ["nox", "-s", "bench"]
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
    code, body = run_json(capsys, "init", "--repo", str(repo))
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
