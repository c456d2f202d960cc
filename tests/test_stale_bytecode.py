"""Bytecode Python would load for a source rewritten within the second it was compiled in.

A timestamp ``.pyc`` (CPython's, and pytest's rewritten test modules) is checked against its
source's size and its mtime in whole seconds.  A same-size edit made in the second the source
was compiled in (an agent flipping ``assert 1`` to ``assert 0`` right after a check) leaves
bytecode that Python loads for the new source: the gate runs the old code and passes a tree
that fails, and that pass would be stored under the new content's key, for any tree holding
it (CI saw it: ``test_last_failures_an_ini_file_runs_by_are_no_cache_of_pytests``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, SIDE_BY_SIDE, check, git, skip_unless_reads_observed

GOOD = "def test_it():\n    assert 1\n"
BAD = "def test_it():\n    assert 0\n"  # the same size: only the mtime could tell

DECLARED = (
    SIDE_BY_SIDE
    + """
    [gates.test]
    run = ["{py}", "-m", "pytest", "-q", "-p", "no:benchmark", "-p", "no:cacheprovider", "test_it.py"]
    inputs = ["test_it.py"]
"""
)
OBSERVED = DECLARED.replace('inputs = ["test_it.py"]', 'inputs = ["**"]\n    observe = true')


def gate(
    capsys: pytest.CaptureFixture[str], repo: Path, manifest: str, *args: str
) -> dict[str, Any]:
    _, body, _ = check(capsys, repo, manifest.format(py=PY), *args)
    found: dict[str, Any] = next(g for g in body["gates"] if g["id"] == "test")
    return {**found, "warnings": body.get("warnings", [])}


def commit_good(repo: Path) -> Path:
    source = repo / "test_it.py"
    source.write_text(GOOD)
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "good")
    return source


def racy_rewrite(source: Path, text: str) -> list[Path]:
    """Rewrite ``source`` as if within the second its bytecode was compiled in: the bytecode
    written at .2 of the second its header names, the source rewritten at .5 (same size)."""
    pycs = sorted((source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"))
    assert pycs, "the first run compiled the test module"
    second = int(source.stat().st_mtime)  # what every header holds
    assert len(text) == source.stat().st_size
    source.write_text(text)
    for pyc in pycs:
        os.utime(pyc, ns=(second * 10**9 + 2 * 10**8,) * 2)
    os.utime(source, ns=(second * 10**9 + 5 * 10**8,) * 2)
    return pycs


@pytest.mark.parametrize("manifest", [DECLARED, OBSERVED], ids=["declared", "observed"])
def test_a_same_second_rewrite_is_judged_on_its_own_code(
    capsys: pytest.CaptureFixture[str], repo: Path, manifest: str
) -> None:
    if manifest is OBSERVED:
        skip_unless_reads_observed()
    source = commit_good(repo)
    assert gate(capsys, repo, manifest)["status"] == "passed"
    pycs = racy_rewrite(source, BAD)
    ran = gate(capsys, repo, manifest)
    assert ran["status"] == "failed", "a pass of the old bytecode, stored under the new code"
    assert any("stale bytecode" in w and pycs[0].name in w for w in ran["warnings"])
    source.write_text(GOOD)  # back to the code that passes: its stored pass answers it
    # (an observed gate listed the tree before ``__pycache__`` was in it: a new listing)
    assert gate(capsys, repo, manifest)["status"] == (
        "cached" if manifest is DECLARED else "passed"
    )


def test_bytecode_compiled_after_its_sources_last_write_is_kept(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    source = commit_good(repo)
    assert gate(capsys, repo, DECLARED)["status"] == "passed"
    pycs = sorted((repo / "__pycache__").glob("test_it.*.pyc"))
    kept = {p: p.stat().st_ino for p in pycs}
    second = int(source.stat().st_mtime)
    os.utime(source, ns=(second * 10**9 + 1 * 10**8,) * 2)  # written before its compile
    for pyc in pycs:
        os.utime(pyc, ns=(second * 10**9 + 4 * 10**8,) * 2)
    ran = gate(capsys, repo, DECLARED, "--no-cache")  # it runs: Python loads that bytecode
    assert ran["status"] == "passed"
    assert {p: p.stat().st_ino for p in pycs} == kept
    assert not any("stale bytecode" in w for w in ran["warnings"])


def test_a_linked_bytecode_folder_is_never_followed(
    capsys: pytest.CaptureFixture[str], repo: Path, tmp_path: Path
) -> None:
    """A worker's ``__pycache__`` that links elsewhere: nothing there is removed."""
    source = commit_good(repo)
    assert gate(capsys, repo, DECLARED)["status"] == "passed"
    elsewhere = tmp_path / "elsewhere"
    (repo / "__pycache__").rename(elsewhere)
    (repo / "__pycache__").symlink_to(elsewhere)
    pycs = [elsewhere / p.name for p in racy_rewrite(source, BAD)]
    gate(capsys, repo, DECLARED)
    assert all(p.exists() for p in pycs)
