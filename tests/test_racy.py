"""Bytecode Python would load for a source rewritten within the second it was compiled in.

A timestamp ``.pyc`` (CPython's, and pytest's rewritten test modules) is checked against its
source's size and its mtime in whole seconds.  A same-size edit made in the second the source
was compiled in (an agent flipping ``assert 1`` to ``assert 0`` right after a check) leaves
bytecode that Python loads for the new source: the gate runs the old code and passes a tree
that fails, and that pass would be stored under the new content's key, for any tree holding
it (CI saw it: ``test_last_failures_an_ini_file_runs_by_are_no_cache_of_pytests``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import CLI, PY, SIDE_BY_SIDE, check, git, skip_unless_reads_observed

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


def test_bytecode_written_in_a_later_second_than_its_sources_last_write_is_kept(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    source = commit_good(repo)
    compile_outside(repo)
    pycs = sorted((repo / "__pycache__").glob("test_it.*.pyc"))
    kept = {p: p.stat().st_ino for p in pycs}
    second = int(source.stat().st_mtime)
    os.utime(source, ns=(second * 10**9 + 1 * 10**8,) * 2)  # written before its compile
    for pyc in pycs:  # ... which ended in a later second: any later rewrite is dated later
        os.utime(pyc, ns=((second + 1) * 10**9 + 4 * 10**8,) * 2)
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
    assert f"the last run in this tree (begun {began} UTC)" in said, said
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
    assert racy.settle(state, repo)[0] == []
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
    assert racy.settle(state, repo)[0] == []  # recorded: written at or after this second
    os.utime(repo / "f", ns=(future + 2,) * 2)
    done: list[list[str]] = []
    waiting = threading.Thread(target=lambda: done.append(racy.settle(state, repo)[0]), daemon=True)
    waiting.start()
    waiting.join(timeout=30)
    assert done == [["f"]]
    assert (repo / "f").stat().st_mtime_ns < future


def test_bytecode_written_after_a_rewrite_in_the_second_its_source_was_read_is_removed(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """Python stats and reads the source, compiles, then writes the bytecode: a same-size
    rewrite between the read and the write leaves bytecode *newer* than the source it does
    not hold (pytest compiles a large test module for tens of milliseconds)."""
    source = commit_good(repo)
    compile_outside(repo)
    pycs = racy_rewrite(source, BAD)  # read at .2 (the old bytecode's time), rewritten at .5
    second = source.stat().st_mtime_ns // 10**9
    for pyc in pycs:  # ... and the bytecode of the old source written at .6
        os.utime(pyc, ns=(second * 10**9 + 6 * 10**8,) * 2)
    ran = gate(capsys, repo, DECLARED)
    assert ran["status"] == "failed", "a pass of the old bytecode, stored under the new code"


GENERATED = (
    SIDE_BY_SIDE
    + """
    [gates.gen]
    run = ["{py}", "gen.py"]
    inputs = ["gen.py"]
    [gates.types]
    run = ["{py}", "-m", "mypy", "--strict", "typed.py"]
    inputs = ["typed.py"]
    needs = ["gen"]
"""
)


def test_a_file_written_while_the_run_went_on_and_rewritten_in_that_second_is_touched(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """A file written after the run's first second (by a gate, or by the user while the
    gates run) is read by mypy in the second it was written in and rewritten in that second:
    the next run must not judge it by mypy's cache of the first version."""
    (repo / "gen.py").write_text("open('typed.py', 'w').write('x: int = 2\\n')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "gen")
    manifest = GENERATED.format(py=PY)
    assert check(capsys, repo, manifest)[0] == 0  # typed.py written by gen, read by mypy
    typed = repo / "typed.py"
    second = typed.stat().st_mtime_ns // 10**9
    typed.write_text("x: str = 2\n")  # the same size, a type error, in that same second
    os.utime(typed, ns=(second * 10**9 + 999_999_000,) * 2)
    code, body, _ = check(capsys, repo, manifest)  # gen is answered from the cache
    assert code == 1, [(g["id"], g["status"], g.get("cached")) for g in body["gates"]]
    assert any("touched" in w and "typed.py" in w for w in body["warnings"])


def test_a_file_written_after_the_last_run_ended_is_left_alone_unless_that_run_was_killed(
    repo: Path, tmp_path: Path
) -> None:
    """The window the last run's gates read in ends with them: an edit in a later second is
    after every read (never touched: an editor holding the file would see it change); a run
    killed before its end leaves the window open."""
    state = tmp_path / "state"
    _, since = racy.settle(state, repo)  # a run begins ...
    assert since is not None
    racy.ended(state, repo, since)  # ... and its gates end
    at_a_seconds_start()
    (repo / "README").write_text("edited\n")  # a second after the gates ended
    assert racy.settle(state, repo)[0] == []
    _, since = racy.settle(state, repo)  # a run begins, and is killed: no end
    at_a_seconds_start()
    (repo / "README").write_text("edited again\n")
    assert racy.settle(state, repo)[0] == ["README"]


def test_a_run_interrupted_with_ctrl_c_records_the_end_of_its_gates(repo: Path) -> None:
    """Ctrl-C ends the gates: the window closes then, or every later edit would be touched."""
    manifest = repo / "m.toml"
    manifest.write_text('[gates.slow]\nrun = "echo > started.mark; sleep 300.0417"\n')
    proc = subprocess.Popen(
        [PY, "-m", "dagrunner", "release-check", "m.toml", "--quiet"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not (repo / "started.mark").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    state = Path(os.environ["DAGRUNNER_CACHE_DIR"]) / "racy"
    record = json.loads(next(state.glob("*.json")).read_text())
    assert record["until"] >= record["since"]


def test_a_run_ending_while_a_later_run_in_its_tree_goes_on_leaves_that_runs_window_open(
    repo: Path, tmp_path: Path
) -> None:
    """Two runs at once in one tree: the later one's record is the tree's; the earlier one's
    end must not close it while the later one's gates still read."""
    state = tmp_path / "state"
    _, first = racy.settle(state, repo)
    at_a_seconds_start()
    _, later = racy.settle(state, repo)
    assert first is not None and later is not None and later > first
    racy.ended(state, repo, first)  # the first run ends; the later one still reads
    at_a_seconds_start()
    (repo / "README").write_text("read by the later run's gates in this second\n")
    assert racy.settle(state, repo)[0] == ["README"]


def test_a_rewrite_of_this_very_second_is_dated_the_next_seconds_start_and_still_seen(
    repo: Path, tmp_path: Path
) -> None:
    """The next run starts in the second of the rewrite: the file is dated the next second's
    start (never waited for: an edit-and-check loop paid up to a second a check), and a
    rewrite in that next second is still seen by the run after."""
    state = tmp_path / "state"
    at_a_seconds_start()
    (repo / "f").write_text("one\n")
    second = (repo / "f").stat().st_mtime_ns // 10**9
    _, since = racy.settle(state, repo)  # a run begins: its gates may read f in this second
    assert since is not None
    (repo / "f").write_text("two\n")  # the same second, after they may have read it
    racy.ended(state, repo, since)
    touched, since = racy.settle(state, repo)
    assert touched == ["f"]
    assert (repo / "f").stat().st_mtime_ns == (second + 1) * 10**9
    assert since is not None
    racy.ended(state, repo, since)  # its window reaches the second f is dated in
    at_a_seconds_start()
    (repo / "f").write_text("six\n")  # in that second: what a tool read there says the same
    assert racy.settle(state, repo)[0] == ["f"]


def test_cache_prune_removes_the_records_of_trees_that_are_gone(repo: Path, tmp_path: Path) -> None:
    """A removed worktree's record answers nothing: ``cache prune`` removes it (``--dry-run``
    only counts it); a live tree's record is kept."""
    state = tmp_path / "cache" / "racy"
    gone = tmp_path / "gone"
    shutil.copytree(repo, gone)
    for tree in (repo, gone):
        racy.settle(state, tree)
    shutil.rmtree(gone)
    (state / "stray.json").mkdir()  # not a record (made by hand, say): left, never a crash
    env = {**os.environ, "DAGRUNNER_CACHE_DIR": str(tmp_path / "cache")}
    said = []
    for extra in (["--dry-run"], [], []):
        done = subprocess.run(
            [*CLI, "cache", "prune", "--max-size", "1G", "--json", *extra],
            cwd=repo,
            env=env,
            capture_output=True,
            check=True,
        )
        said.append(json.loads(done.stdout)["racy_records"])
    assert said == [1, 1, 0]
    records = [p for p in state.glob("*.json") if p.is_file()]
    assert [json.loads(p.read_text())["tree"] for p in records] == [str(repo)]
    assert (state / "stray.json").is_dir()


def test_a_junit_file_a_gate_declares_is_never_touched_as_a_rewritten_input(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """Found on pallets/werkzeug: where nobody ignored ``build/junit/`` (init tells to), the
    JUnit file the last run wrote was named at every run, "touched 1 file(s) ... written
    again since the last run": a declared output is in no gate's key and is rewritten by
    every run (and removed before an observed gate starts), so no tool trusts its time."""
    manifest = """
[env]
pass = ["PATH"]
[gates.tests]
run = "mkdir -p build/junit && echo '<testsuite tests=\\"1\\"><testcase name=\\"t\\"/></testsuite>' > build/junit/tests.xml"
inputs = ["**"]
junit = "build/junit/tests.xml"
"""
    for _ in range(3):
        code, body, _ = check(capsys, repo, manifest, "--no-cache")
        assert code == 0
        assert not any("build/junit" in w for w in body["warnings"]), body["warnings"]
