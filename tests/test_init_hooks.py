"""``dagrunner init`` never narrows a pre-commit hook it replaces: the gate written in a hook's
stead runs the hook's tool over exactly the files pre-commit would pass it (its ``files``,
``exclude``, ``types``, the config's top-level ones, the hook repo's defaults) with the hook's
``args``; a hook init cannot replay so stays in the pre-commit gate, and the manifest says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import git, run_json

MYPY_HOOK = """\
repos:
  - repo: https://github.com/pre-commit/pre-commit-hooks
    rev: v4.6.0
    hooks:
      - id: check-yaml
  - repo: https://github.com/pre-commit/mirrors-mypy
    rev: v1.13.0
    hooks:
      - id: mypy
"""


def django_library(repo: Path, hooks: str = MYPY_HOOK) -> None:
    """The shape of the issue's project: a pre-commit mypy hook (every .py file), and a
    ``[tool.mypy]`` that names no files; code in ``src/`` and ``tests/``."""
    (repo / "src" / "lib").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "lib" / "__init__.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n"
    )
    (repo / "tests" / "test_add.py").write_text(
        "from lib import add\n\n\ndef test_add() -> None:\n    assert add(1, 2) == 3\n"
    )
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "lib"\nversion = "0.1"\n\n[tool.mypy]\nmypy_path = "src"\n'
        "warn_unused_configs = true\n"
    )
    (repo / ".pre-commit-config.yaml").write_text(hooks)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "library")


def gates_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["id"]: g for g in body["gates"]}


def skipped_of(body: dict[str, Any]) -> dict[str, str]:
    return {s["id"]: s["why"] for s in body["skipped"]}


def test_a_type_error_in_tests_fails_the_gate_init_writes_in_the_mypy_hooks_stead(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue: init wrote ``mypy src`` and SKIPped the hook, which checks every .py file;
    a worker's type error in tests/ landed.  The gate now checks what the hook checks."""
    assert shutil.which("mypy") is not None  # the gate runs it here
    django_library(repo)
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0, body
    gates = gates_of(body)
    assert gates["pre-commit"]["env"] == {"SKIP": "mypy"}  # replaced, so skipped there
    assert "mypy" in gates["types"]["run"] and "--ignore-missing-imports" in gates["types"]["run"]
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-q", "-m", "manifest")
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--quiet", "--only", "types")
    assert code == 0, run  # the clean project passes
    (repo / "tests" / "test_add.py").write_text(
        "from lib import add\n\n\ndef test_add() -> None:\n    x: str = add(1, 2)\n"
    )
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--quiet", "--only", "types")
    assert code == 1, run
    assert {g["id"]: g["status"] for g in run["gates"]} == {"types": "failed"}


def test_a_gate_in_a_hooks_stead_is_not_marked_as_needing_the_network(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real project: the mypy gate init writes in the hook's stead runs mypy
    alone, offline, yet was marked ``network = "host"`` ("it runs pre-commit"), because its
    inline selector script says "as pre-commit would pass them"; the pre-commit gate, which
    clones its hooks, stays marked."""
    django_library(repo)
    out = repo / "dagrunner.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    gates = gates_of(body)
    assert "mypy" in gates["types"]["run"]
    assert gates["types"]["network"] is None
    assert "clones its hooks' repositories" in gates["pre-commit"]["network"]
    table = out.read_text().split("[gates.types]")[1].split("\n\n")[0]
    assert "network" not in table


def select(repo: Path, *options: str) -> list[str]:
    """The files the gate's selector passes to its tool (a program that prints them)."""
    from dagrunner.starter.hookgates import SELECT

    printer = [sys.executable, "-c", "import sys; print('\\n'.join(sys.argv[1:]))"]
    done = subprocess.run(
        [sys.executable, "-c", SELECT, *options, "--", *printer],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said, *files = done.stdout.splitlines()
    assert said.startswith(f"dagrunner: {len(files)} of "), said  # the log says how many
    return sorted(files)


def test_the_selector_passes_what_pre_commit_would(repo: Path) -> None:
    """Tracked files only, by pre-commit's rules: ``re.search`` of ``files`` and ``exclude``
    (the config's top-level ones too), every ``types`` tag, one of ``types_or``, none of
    ``exclude_types``; a script without an extension is Python by its shebang."""
    for name in ("src/a.py", "src/b.pyi", "tests/t.py", "tests/fixtures/f.py", "docs/conf.py"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x = 1\n")
    (repo / "bin").mkdir()
    (repo / "bin" / "tool").write_text("#!/usr/bin/env python3\nx = 1\n")
    (repo / "bin" / "tool").chmod(0o755)
    (repo / "bin" / "sh").write_text("#!/bin/sh\ntrue\n")
    (repo / "bin" / "sh").chmod(0o755)
    (repo / "src" / "gone.py").write_text("")
    git(repo, "add", "src", "tests", "docs", "bin")
    git(repo, "commit", "-q", "-m", "files")
    (repo / "src" / "gone.py").unlink()  # tracked, not there: not passed
    (repo / "untracked.py").write_text("x = 1\n")
    everything = ["bin/tool", "docs/conf.py", "src/a.py", "tests/fixtures/f.py", "tests/t.py"]
    assert select(repo, "--types-or=python") == everything
    assert select(repo, "--types-or=python,pyi") == sorted([*everything, "src/b.pyi"])
    assert select(repo, "--types=python", "--files=^(src|tests)/") == [
        "src/a.py",
        "tests/fixtures/f.py",
        "tests/t.py",
    ]
    assert select(repo, "--types=python", "--exclude=^tests/fixtures/", "--top-exclude=^docs/") == [
        "bin/tool",
        "src/a.py",
        "tests/t.py",
    ]
    assert select(repo, "--types=python", "--exclude-types=executable") == everything[1:]
    assert select(repo, "--types=file", "--files=\\.pyi$") == ["src/b.pyi"]
    assert select(repo, "--types=python", "--files=nothing-matches") == []  # the tool never runs


def test_the_gate_carries_the_hooks_files_exclude_and_args(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hook's own ``files``/``exclude`` (a verbose regex in a block scalar) and the
    config's top-level ``exclude`` reach the selector; the hook's ``args`` replace its
    repo's default args, as in pre-commit."""
    hooks = MYPY_HOOK.replace("      - id: mypy\n", "") + textwrap.indent(
        textwrap.dedent(
            """\
            - id: mypy
              files: ^(src|tests)/
              exclude: |
                (?x)^(
                  tests/fixtures/.*
                )$
              args: [--strict, "--python-version=3.11"]
              additional_dependencies: [attrs]
            """
        ),
        "      ",
    )
    django_library(repo, "exclude: ^docs/\n" + hooks)
    code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0, body
    run = gates_of(body)["types"]["run"]
    tail = run[run.index("--") + 1 :]
    assert tail == ["mypy", "--strict", "--python-version=3.11"]  # not the repo's defaults
    options = run[3 : run.index("--")]
    assert "--files=^(src|tests)/" in options and "--top-exclude=^docs/" in options
    assert "--exclude=(?x)^(\n  tests/fixtures/.*\n)$\n" in options
    assert "--types-or=python,pyi" in options  # mirrors-mypy's own types_or
    # the gate runs it: an untyped def in src fails under the hook's --strict, a type error
    # in tests/fixtures (excluded) or in docs (outside files) is not looked at
    (repo / "tests" / "fixtures").mkdir()
    (repo / "tests" / "fixtures" / "bad.py").write_text("x: int = 'no'\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "bad.py").write_text("x: int = 'no'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "out of the hook's sight")
    assert run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))[0] == 0
    code, result = run_json(
        capsys, "release-check", "--repo", str(repo), "--quiet", "--only", "types"
    )
    assert code == 0, result
    (repo / "src" / "lib" / "more.py").write_text("def f(x):\n    return x\n")
    git(repo, "add", "-A")
    code, result = run_json(
        capsys, "release-check", "--repo", str(repo), "--quiet", "--only", "types"
    )
    assert code == 1, result


@pytest.mark.parametrize(
    ("hooks", "why"),
    [
        (  # a repo whose hook definitions init does not know
            "repos:\n- repo: https://example.com/mypy-fork\n  rev: v1\n  hooks:\n  - id: mypy\n",
            "its repository's hook definition is not one init knows",
        ),
        (  # a key init does not replay
            MYPY_HOOK + "        files: !!python/name:x\n",
            "cannot read",
        ),
        (  # two hooks of one id: SKIP would skip both
            MYPY_HOOK + "      - id: mypy\n        files: ^docs/\n",
            "more than one hook has id mypy",
        ),
        (  # an alias: a value init would have to trace
            MYPY_HOOK + "        args: *strict\n",
            "cannot read",
        ),
    ],
    ids=["unknown-repo", "unknown-tag", "two-hooks", "alias"],
)
def test_a_hook_init_cannot_replay_stays_in_the_pre_commit_gate(
    repo: Path, capsys: pytest.CaptureFixture[str], hooks: str, why: str
) -> None:
    django_library(repo, hooks)
    code, body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0, body
    gates, skipped = gates_of(body), skipped_of(body)
    assert gates["pre-commit"]["env"] == {}  # nothing SKIPped: pre-commit still runs mypy
    assert gates["types"]["run"][0] == "mypy"  # the tool table's gate, beside the hook
    assert why in skipped["pre-commit:mypy"], skipped
    assert "keeps it" in skipped["pre-commit:mypy"]


def test_formatters_are_replayed_as_checks_and_a_text_hook_stays(
    repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A formatter hook fails in pre-commit when it would change a file: its gate asks the
    tool to check (a gate never rewrites a tracked file); ``--fix`` becomes ``--no-fix``.
    codespell's hook selects ``types: [text]`` (file contents): it stays in pre-commit."""
    (repo / "pyproject.toml").write_text("[tool.ruff]\n\n[tool.codespell]\n")
    (repo / ".pre-commit-config.yaml").write_text(
        textwrap.dedent(
            """\
            repos:
            - repo: https://github.com/astral-sh/ruff-pre-commit
              rev: v0.8.0
              hooks:
              - id: ruff
                args: [--fix, --exit-non-zero-on-fix]
              - id: ruff-format
            - repo: https://github.com/codespell-project/codespell
              rev: v2.3.0
              hooks:
              - id: codespell
            """
        )
    )
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in ("git", "ruff", "codespell", "pre-commit", "python3"):
        target = shutil.which(name) or sys.executable
        (bare / name).symlink_to(target)
    monkeypatch.setenv("PATH", f"{bare}{os.pathsep}{os.environ['PATH']}")
    body = run_json(capsys, "init", "--repo", str(repo), "--dry-run")[1]
    gates, skipped = gates_of(body), skipped_of(body)
    lint, fmt = gates["lint"]["run"], gates["format"]["run"]
    fixed = ["ruff", "check", "--force-exclude", "--no-fix", "--exit-non-zero-on-fix"]
    assert lint[lint.index("--") + 1 :] == fixed
    assert fmt[fmt.index("--") + 1 :] == ["ruff", "format", "--force-exclude", "--check"]
    assert "--types-or=python,pyi,jupyter" in lint
    assert gates["pre-commit"]["env"] == {"SKIP": "ruff,ruff-format"}
    assert gates["spelling"]["run"] == ["codespell"]
    assert "types text" in skipped["pre-commit:codespell"], skipped


def test_a_tracked_file_named_like_an_option_reaches_the_tool_as_a_path(repo: Path) -> None:
    """A worker's file named ``--exit-zero`` (a Python script by its shebang) is passed to
    ruff as ``./--exit-zero``: as the option it would be, the lint gate would pass any
    error."""
    (repo / "bad.py").write_text("import os\n")  # F401: os imported, never used
    (repo / "--exit-zero").write_text("#!/usr/bin/env python3\nx = 1\n")
    (repo / "--exit-zero").chmod(0o755)
    git(repo, "add", "--", "bad.py", "--exit-zero")
    git(repo, "commit", "-q", "-m", "files")
    assert "./--exit-zero" in select(repo, "--types=python")
    from dagrunner.starter.hookgates import SELECT

    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated"]
    done = subprocess.run(
        [sys.executable, "-c", SELECT, "--types=python", "--", *ruff],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F401" in done.stdout


def test_a_file_named_like_a_response_file_reaches_mypy_as_a_path(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mypy reads ``@FILE`` as more arguments: a worker's script ``@v`` (Python by its
    shebang, so selected) beside a file ``v`` saying ``--version`` made the types gate init
    writes run ``mypy --version`` and pass a type error.  It is passed as ``./@v``."""
    django_library(repo)
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0, body
    assert "mypy" in gates_of(body)["types"]["run"]
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-q", "-m", "manifest")
    (repo / "tests" / "test_add.py").write_text(
        "from lib import add\n\n\ndef test_add() -> None:\n    x: str = add(1, 2)\n"
    )
    (repo / "@v").write_text("#!/usr/bin/env python3\nx = 1\n")
    (repo / "@v").chmod(0o755)
    (repo / "v").write_text("--version\n")
    code, run = run_json(capsys, "release-check", "--repo", str(repo), "--quiet", "--only", "types")
    assert code == 1, run
    assert {g["id"]: g["status"] for g in run["gates"]} == {"types": "failed"}


PREK_HOOKS = MYPY_HOOK + (
    "  - repo: https://github.com/astral-sh/ruff-pre-commit\n    rev: v0.6.0\n"
    "    hooks:\n      - id: ruff-format\n"
)


def test_a_session_that_runs_every_hook_through_prek_runs_them_once_and_needs_the_network(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on pypa/packaging: its lint session runs every hook with ``prek run
    --all-files`` (prek: a pre-commit runner, the same config).  init did not know prek: it
    kept the mypy and ruff-format gates and the pre-commit gate beside the session (each
    hook ran twice), and did not mark the session as needing the network, which failed
    offline cloning the hooks' repositories from github.com."""
    django_library(repo, PREK_HOOKS)
    (repo / "Makefile").write_text("lint:\n\tprek run --all-files\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text("steps:\n- run: make lint\n")
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, body
    gates = gates_of(body)
    assert "make-lint" in gates and not {"pre-commit", "types", "format"} & set(gates), gates
    why = skipped_of(body)
    said = "its hooks are run by 'make-lint' (prek run, every hook): not twice"
    assert why["pre-commit"] == why["types"] == said, why
    assert "prek clones its hooks' repositories" in gates["make-lint"]["network"]
