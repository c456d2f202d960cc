"""Which interpreter a tox env needs, read as tox 4 reads it: a bare version factor
(``3.13-tests``) and ``base_python_file`` name it as ``py313`` and ``base_python`` do; an
env whose interpreter this machine lacks is never written as a gate that must pass."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import git, run_json
from test_init import THIS, gates_of, python_project

from dagrunner.starter.sessions import has_interpreter, interpreter


def tox_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``tox`` on PATH (this Python under that name: init only looks for it)."""
    here = tmp_path / "bin"
    here.mkdir()
    (here / "tox").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{here}{os.pathsep}{os.environ['PATH']}")


def test_a_bare_version_factor_names_the_interpreter_tox_uses() -> None:
    assert interpreter("3.13-tests") == "python3.13"
    assert interpreter("3.14t") == "python3.14t"
    assert interpreter("tests-3.10") == "python3.10"
    assert interpreter("docs-build") == ""
    assert interpreter("lint-2") == ""


def test_an_env_of_a_missing_python_named_by_a_bare_factor_is_not_the_test_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on hynek/structlog: ``env_list = 3.1{0-5}-tests`` and its coverage envs; init
    took the first, ``3.10-tests``, without asking whether this machine has Python 3.10
    (``py310`` would have been asked).  A bare ``3.10`` is tox 4's Python factor too."""
    python_project(repo)
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            f"""\
            [tox]
            env_list = 3.99-tests, {THIS}-tests
            [testenv]
            commands = coverage run -m pytest {{posargs}}
            """
        )
    )
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, body
    gates = gates_of(body)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert f"tox-{THIS}-tests" in gates and "tox-3.99-tests" not in gates, (gates, why)
    assert why["tox-3.99-tests"].startswith("it needs python3.99, which is not installed here")


def test_a_free_threaded_factor_names_its_interpreter(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on python-humanize/humanize: ``env_list = py{310-315}, py{314-315}t``; init
    left the py314/py315 envs out (python3.14 not installed) but wrote ``tox-py314t`` and
    ``tox-py315t`` as gates: ``py314t`` named no interpreter, and both failed every run
    (tox-uv: downloading free-threaded CPython 3.14, offline)."""
    assert interpreter("py314t") == "python3.14t"
    assert interpreter("py3.14t-tests") == "python3.14t"
    assert interpreter("x", base_python="python3.14t") == "python3.14t"
    python_project(repo)
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            f"""\
            [tox]
            env_list = py{THIS.replace(".", "")}, py399t
            [testenv]
            commands = pytest {{posargs}}
            """
        )
    )
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, body
    gates = gates_of(body)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert "tox-py399t" not in gates, (gates, why)
    assert why["tox-py399t"].startswith("it needs python3.99t, which is not installed here"), why


def test_base_python_file_names_the_interpreter_and_an_env_that_lacks_it_is_commented_out(
    repo: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found on hynek/structlog: its ``coverage-*`` and ``typing-*`` envs take their
    Python from ``base_python_file = .python-version-default`` (3.14, not installed
    there); init read no interpreter for them and wrote ``tox-coverage-report`` as a gate,
    which failed in every run (uv: "No interpreter found for CPython 3.14")."""
    python_project(repo)
    (repo / ".python-version-default").write_text("# the CI's Python\n3.99\n")
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            f"""\
            [tox]
            env_list = py{THIS.replace(".", "")}, coverage-report
            [testenv]
            commands = pytest {{posargs}}
            [testenv:coverage-report]
            base_python_file = .python-version-default
            skip_install = true
            commands = coverage report
            """
        )
    )
    tox_on_path(tmp_path, monkeypatch)  # only the interpreter is missing
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    gate = gates_of(body)["tox-coverage-report"]
    assert gate["commented_out"] is True, gate
    text = out.read_text()
    assert "# `python3.99` is not on PATH here: install it" in text, text
    assert "# [gates.tox-coverage-report]" in text
    assert "python3.99" in " ".join(body["missing_tools"]), body["missing_tools"]


def test_a_tox_env_that_type_checks_other_files_is_a_gate_of_its_own(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on hynek/structlog: its ``3.1x-mypy`` envs run ``mypy tests/typing`` (the
    API's typing tests, a CI job of their own) and ``typing-pyright`` runs pyright; init
    kept only the ``[tool.mypy]`` gate and said of each "types is run by 'types'", so
    nothing checked ``tests/typing`` and no reason said so."""
    python_project(repo)
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            f"""\
            [tox]
            env_list = 3.99-mypy, {THIS}-mypy, typing-mypy, typing-pyright
            [testenv]
            commands = mypy tests/typing
            [testenv:typing-{{mypy,pyright}}]
            commands =
                mypy: mypy
                pyright: pyright tests/typing
            """
        )
    )
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, body
    gates = gates_of(body)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert gates["types"]["run"][0] == "mypy", gates["types"]
    assert f"tox-{THIS}-mypy" in gates and "tox-typing-pyright" in gates, (gates, why)
    assert why["tox-typing-mypy"] == "types is run by 'types'", why
    assert why["tox-3.99-mypy"] == (
        f"it needs python3.99, which is not installed here; 'tox-{THIS}-mypy' runs the types"
    )


def test_a_type_check_of_part_of_what_a_tox_env_checks_is_run_by_that_env(
    repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on python-humanize/humanize: its ``mypy`` env runs ``mypy .`` (with its pinned
    mypy) and init wrote both that and ``types`` (``mypy src``, from ``[tool.mypy]``).
    ``mypy src`` checks nothing ``mypy .`` does not, and alone, in a fresh tree, it could
    not import ``src/humanize/_version.py`` (hatch-vcs writes it at a build): it passed or
    failed by which gate of the tree ran first, and blamed five good envelopes."""
    python_project(repo)  # humanize's [tool.mypy] names no files: `types` runs mypy src
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('files = ["src", "tests"]\n', ""))
    git(repo, "commit", "-qam", "no mypy files")
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            f"""\
            [tox]
            env_list = py{THIS.replace(".", "")}, mypy, typing
            [testenv]
            commands = pytest {{posargs}}
            [testenv:mypy]
            commands = mypy . {{posargs}}
            [testenv:typing]
            commands = mypy src/pkg
            """
        )
    )
    tox_on_path(tmp_path, monkeypatch)  # so its env can stand for `types`
    out = repo / "m.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    gates = gates_of(body)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert "types" not in gates and not gates["tox-mypy"]["commented_out"], (gates, why)
    assert "which types does not" not in out.read_text()  # its own words, no more
    assert why["types"] == "types is run by 'tox-mypy' (it checks ., which holds src)", why
    assert why["tox-typing"] == "types is run by 'tox-mypy'", why


def test_a_pyenv_shim_is_an_interpreter_only_for_a_version_pyenv_selects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on hynek/structlog: pyenv puts a ``python3.10`` shim on PATH for every version
    it has, selected or not; init took the shim for Python 3.10, and the gate's tox-uv,
    finding no usable 3.10, tried to download one (offline: failed)."""
    root = tmp_path / "pyenv"
    (root / "shims").mkdir(parents=True)
    shim = root / "shims" / "python3.97"
    shim.write_text('#!/bin/sh\necho "pyenv: python3.97: command not found" >&2; exit 127\n')
    shim.chmod(0o755)
    (root / "version").write_text(f"{THIS}.0\n")  # the global selection: another version
    installed = root / "versions" / "3.97.1" / "bin" / "python3.97"
    installed.parent.mkdir(parents=True)
    installed.symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{root / 'shims'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PYENV_VERSION", raising=False)
    monkeypatch.chdir(tmp_path)
    assert not has_interpreter("python3.97")  # installed under pyenv, but not selected
    monkeypatch.setenv("PYENV_VERSION", f"{THIS}.0:3.97.1")
    assert has_interpreter("python3.97")
    monkeypatch.delenv("PYENV_VERSION")
    (tmp_path / ".python-version").write_text("3.97.1\n")  # pyenv local
    assert has_interpreter("python3.97")
