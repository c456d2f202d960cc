"""tox's factor-conditional lines (``coverage: coverage report``) belong to the envs whose
name has those factors, not to every env: what ``init`` says an env runs, and which gate
runs the tests, follow tox."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import run_json
from test_init import THIS, gates_of, python_project

from dagrunner.starter.toxenvs import _ini_commands, factors_match

PY = f"py3{THIS.split('.')[1]}"


def test_a_factor_line_of_another_env_does_not_make_the_env_gate_on_coverage(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on pytest-dev/pluggy: its ``[testenv]`` runs plain pytest, and only its
    ``coverage`` envs add ``coverage: coverage report -m``.  init took that line for every
    env, said ``tox-py311`` "gates on coverage", and preferred it (a tox env, 17 s, made in
    the tree) to the plain ``tests`` gate (pytest, under a second)."""
    python_project(repo)
    (repo / "tox.ini").write_text(
        textwrap.dedent(
            f"""\
            [tox]
            envlist = {PY}
            [testenv]
            commands =
              {{env:_TOX_CMD:pytest}} {{posargs}}
              coverage: coverage combine
              coverage: coverage report -m
            setenv =
              coverage: _TOX_CMD=coverage run -m pytest
            [pytest]
            testpaths = tests
            """
        )
    )
    code, body = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, body
    gates = gates_of(body)
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert "tests" in gates and f"tox-{PY}" not in gates, (gates, why)
    assert why[f"tox-{PY}"] == "tests is run by 'tests'", why
    assert "coverage" not in why[f"tox-{PY}"]


@pytest.mark.parametrize(
    ("condition", "env", "expected"),
    [
        ("coverage", "py311-coverage", True),
        ("coverage", "py311", False),
        ("py310,py311", "py311", True),  # a comma: any of them
        ("py311-coverage", "py311", False),  # a dash: all of them
        ("py311-coverage", "coverage-py311", True),
        ("!coverage", "py311", True),
        ("!coverage", "py311-coverage", False),
        ("py3{10,11}", "py311", True),  # braces expand, as in env names
        ("py3{10,12}", "py311", False),
        ("!py310-!py311", "py312", True),
    ],
)
def test_factor_conditions_follow_tox(condition: str, env: str, expected: bool) -> None:
    assert factors_match(condition, env) is expected


def test_an_envs_commands_keep_only_the_lines_of_its_factors() -> None:
    text = "\n  pytest {posargs}\n  cov: coverage report\n  !cov: echo plain\n"
    assert _ini_commands(text, "py311") == (("pytest",), ("echo", "plain"))
    assert _ini_commands(text, "py311-cov") == (("pytest",), ("coverage", "report"))
