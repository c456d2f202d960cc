"""Bytecode Python would load for a source rewritten within the second it was compiled in.

A timestamp ``.pyc`` (CPython's, and pytest's rewritten test modules) is checked against its
source's size and its mtime in whole seconds.  A same-size edit made in the second the source
was compiled in (an agent flipping ``assert 1`` to ``assert 0`` right after a check) leaves
bytecode that Python loads for the new source: the gate runs the old code and passes a tree
that fails, and that pass would be stored under the new content's key, for any tree holding
it (CI saw it: ``test_last_failures_an_ini_file_runs_by_are_no_cache_of_pytests``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, SIDE_BY_SIDE, check, git, skip_unless_reads_observed

from dagrunner.process import racy

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


def compile_outside(repo: Path) -> None:
    """The user's own pytest run, outside dagrunner (no record of its reads is kept)."""
    argv = [PY, "-m", "pytest", "-q", "-p", "no:benchmark", "-p", "no:cacheprovider"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([*argv, "test_it.py"], cwd=repo, check=True, capture_output=True, env=env)


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
    compile_outside(repo)
    pycs = racy_rewrite(source, BAD)
    ran = gate(capsys, repo, manifest)
    assert ran["status"] == "failed", "a pass of the old bytecode, stored under the new code"
    assert any("stale bytecode" in w and pycs[0].name in w for w in ran["warnings"])


def test_bytecode_compiled_after_its_sources_last_write_is_kept(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    source = commit_good(repo)
    compile_outside(repo)
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
    compile_outside(repo)
    elsewhere = tmp_path / "elsewhere"
    (repo / "__pycache__").rename(elsewhere)
    (repo / "__pycache__").symlink_to(elsewhere)
    pycs = [elsewhere / p.name for p in racy_rewrite(source, BAD)]
    gate(capsys, repo, DECLARED)
    assert all(p.exists() for p in pycs)


def at_a_seconds_start() -> None:
    """Sleep until just after the clock's next whole second."""
    time.sleep(1.02 - time.time() % 1)


MYPY = (
    SIDE_BY_SIDE
    + """
    [gates.types]
    run = ["{py}", "-m", "mypy", "--strict", "typed.py"]
    inputs = ["typed.py"]
"""
)


def test_mypys_warm_cache_never_passes_a_same_size_edit_made_in_the_second_it_read(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """mypy trusts its cache while a file's size and whole-second mtime match: an edit made
    in the second a check read the file in would be judged by the old file's result."""
    typed = repo / "typed.py"
    typed.write_text("x: int = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "typed")
    manifest = MYPY.format(py=PY)
    assert check(capsys, repo, manifest)[0] == 0  # mypy's cache is warm from here on
    at_a_seconds_start()
    typed.write_text("x: int = 2\n")  # written in the second the next run begins
    assert check(capsys, repo, manifest)[0] == 0
    second = typed.stat().st_mtime_ns // 10**9
    typed.write_text("x: str = 2\n")  # the same size, a type error, in that same second
    os.utime(typed, ns=(second * 10**9 + 999_999_000,) * 2)
    code, body, _ = check(capsys, repo, manifest)
    assert code == 1
    assert any("touched" in w and "typed.py" in w for w in body["warnings"])
    # the user reads it maybe minutes after that edit: it says which run, and that the
    # file's content is as they left it (found on hynek/structlog, round 7)
    began = time.strftime("%H:%M:%S", time.gmtime(second))
    (said,) = [w for w in body["warnings"] if "touched" in w]
    assert f"the last run in this tree began ({began} UTC)" in said, said
    assert "contents unchanged" in said, said


def test_a_recorded_path_behind_a_link_is_never_touched(repo: Path, tmp_path: Path) -> None:
    """The next run finds ``sub`` (a folder when recorded) made a link elsewhere: nothing
    there is touched."""
    (repo / "sub").mkdir()
    (repo / "sub" / "f").write_text("one\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "sub")
    state = tmp_path / "state"
    at_a_seconds_start()
    (repo / "sub" / "f").write_text("two\n")
    racy.settle(state, repo)  # records sub/f, written in this second
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f").write_text("out\n")
    second = (repo / "sub" / "f").stat().st_mtime_ns // 10**9
    os.utime(elsewhere / "f", ns=(second * 10**9 + 999_999_000,) * 2)
    before = (elsewhere / "f").stat().st_mtime_ns
    shutil.rmtree(repo / "sub")
    (repo / "sub").symlink_to(elsewhere)
    assert racy.settle(state, repo) == []
    assert (elsewhere / "f").stat().st_mtime_ns == before


def test_a_file_dated_years_ahead_is_touched_without_waiting_for_its_second(
    repo: Path, tmp_path: Path
) -> None:
    """A worker dates a file in 2100 and rewrites it in that second: the next run touches it
    (now is another second) and never waits for 2100 to come."""
    future = 4_102_444_800 * 10**9  # 2100-01-01
    (repo / "f").write_text("one\n")
    os.utime(repo / "f", ns=(future + 1,) * 2)
    state = tmp_path / "state"
    assert racy.settle(state, repo) == []  # recorded: written at or after this second
    os.utime(repo / "f", ns=(future + 2,) * 2)
    done: list[list[str]] = []
    waiting = threading.Thread(target=lambda: done.append(racy.settle(state, repo)), daemon=True)
    waiting.start()
    waiting.join(timeout=30)
    assert done == [["f"]]
    assert (repo / "f").stat().st_mtime_ns < future
