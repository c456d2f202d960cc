"""Hostile review of keys from observed reads (issue 46): trees a cached verdict must not
answer, each reproduced end to end -- a real ``release-check`` whose cached answer is a pass
where ``--no-cache`` fails."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, SIDE_BY_SIDE, check, git, skip_unless_reads_observed

from dagrunner.process import made as madeby


@pytest.fixture
def observed(repo: Path) -> Path:
    skip_unless_reads_observed()
    return repo


def statuses(
    capsys: pytest.CaptureFixture[str], repo: Path, manifest: str, *args: str
) -> dict[str, str]:
    _, body, _ = check(capsys, repo, manifest, *args)
    found: dict[str, Any] = {g["id"]: g["status"] for g in body["gates"]}
    return found


def stale(
    capsys: pytest.CaptureFixture[str],
    repo: Path,
    manifest: str,
    files: dict[str, str],
    made: tuple[str, ...] = ("junk",),
) -> None:
    """Commit ``files`` (``conf`` says good), run ``manifest`` (its ``test`` passes), edit
    ``conf`` to bad: the cached answer must be ``--no-cache``'s (a failure)."""
    files = {**files, ".gitignore": files.get(".gitignore", "") + "go\n"}
    for name, text in {"conf": "good\n", **files}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")

    def run(*args: str, clean: bool = True) -> str:
        for folder in (*made, "go") if clean else ():  # a clean checkout (a file too)
            shutil.rmtree(repo / folder, ignore_errors=True)
            (repo / folder).unlink(missing_ok=True)
        return statuses(capsys, repo, manifest, "--jobs", "2", *args)["test"]

    assert run() == "passed"
    (repo / "conf").write_text("bad\n")
    oracle = run("--no-cache")
    assert oracle == "failed"
    # what the gates made is left: the names of a folder of the tree it listed (its root:
    # Python's imports list it) are as the passing run left them
    cached = run(clean=False)
    assert cached == oracle, "a stale pass: the gate's verdict came from conf, unkeyed"


# A need that opens one file of tests/ (its conftest) made every folder above what it
# opened count as "written by the need": the gate's listing of tests/ was then keyed by
# nothing, and an ignored test file the listing finds is the stale pass 9df88d1 closed.
NEED_LISTS = (
    SIDE_BY_SIDE
    + """
    [gates.prep]
    run = "cat tests/conftest.txt > /dev/null"
    inputs = ["**"]
    observe = true
    [gates.test]
    run = "for f in tests/*; do ! grep -q bad \\"$f\\" || exit 1; done"
    inputs = ["**"]
    observe = true
    needs = ["prep"]
"""
)


def test_a_need_reading_in_a_folder_does_not_unkey_the_gates_listing_of_it(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "tests").mkdir()
    (repo / "tests" / "conftest.txt").write_text("good\n")
    (repo / "tests" / "test_a.txt").write_text("good\n")
    (repo / ".gitignore").write_text("*.local\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    assert statuses(capsys, repo, NEED_LISTS)["test"] == "passed"
    (repo / "tests" / "scratch.local").write_text("bad\n")  # ignored; the loop finds it
    oracle = statuses(capsys, repo, NEED_LISTS, "--no-cache")["test"]
    assert oracle == "failed"
    cached = statuses(capsys, repo, NEED_LISTS)["test"]
    assert cached == oracle, "a stale pass: the gate's listing of tests/ was not in its key"


# A gate process that reads ``conf``, then renames it away and back: the observer names an
# open when it reads the event (``/proc/self/fd``), so with its queue busy (a burst of new
# files first) the read is recorded under the passing name, a file "the gate made new" that
# counts for nothing, and ``conf`` is left out of the read set.
RENAMES = """\
import os, sys, time
os.makedirs("junk", exist_ok=True)
for n in range(12000):
    os.close(os.open(f"junk/{n}", os.O_CREAT | os.O_WRONLY))
time.sleep(1)
for n in range(12000):  # a burst of opens: the observer reads its queue behind them
    os.close(os.open(f"junk/{n}", os.O_RDONLY))
data = open("conf").read()
os.rename("conf", "conf.away")
time.sleep(1.5)
os.rename("conf.away", "conf")
sys.exit(1 if "bad" in data else 0)
"""
RENAMING = (
    SIDE_BY_SIDE
    + """
    [gates.test]
    run = ["{py}", "renames.py"]
    inputs = ["**"]
    observe = true
"""
)


def test_a_file_renamed_away_and_back_while_its_event_waits_is_still_read(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "renames.py").write_text(RENAMES)
    (repo / "conf").write_text("good\n")
    (repo / ".gitignore").write_text("junk/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = RENAMING.format(py=PY)
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "conf").write_text("bad\n")
    oracle = statuses(capsys, repo, manifest, "--no-cache")["test"]
    assert oracle == "failed"
    cached = statuses(capsys, repo, manifest)["test"]
    assert cached == oracle, "a stale pass: conf was read under the name it had for a moment"


# Two gates of one run share the tree: one reads ``conf`` and leaves what it found in an
# ignored file, the other waits for that file (``test -e``: a stat, not seen) and reads it.
# The reader's open is of a file made new while it ran (after it started: the relay waits),
# which counts for nothing; but another gate made it, so the reader's verdict depends on
# ``conf`` unkeyed.
RELAY = (
    SIDE_BY_SIDE
    + """
    [gates.relay]
    run = "sleep 0.5; mkdir -p junk; cat conf > junk/answer.part; mv junk/answer.part junk/answer"
    inputs = ["**"]
    observe = true
    [gates.test]
    run = "n=0; until test -e junk/answer; do sleep 0.05; n=$((n+1)); test $n -lt 200 || exit 2; done; ! grep -q bad junk/answer"
    inputs = ["**"]
    observe = true
"""
)


def test_a_file_another_gate_wrote_in_this_run_is_no_file_the_gate_made(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    stale(capsys, observed, RELAY, {".gitignore": "junk/\n"})


# A need with narrower inputs is observed but not held to ``stands_for``: every file it
# opened, an ignored cache held before the run included, is "the need's" for the gates after
# it.  A gate whose tool trusts that cache by ``stat`` then opens only what changed, and an
# edit of a file it only stat-ed is answered from a read set that never held it.
STATCACHE = """\
import json, os, sys
try:
    seen = json.load(open(".statcache"))
except (OSError, ValueError):
    seen = {}
bad = False
for name in ["f1", "f2"]:
    st = os.stat(name)
    stamp = [st.st_mtime_ns, st.st_size]
    if seen.get(name, [None])[0] != stamp:
        seen[name] = [stamp, "bad" in open(name).read()]
    bad = bad or seen[name][1]
json.dump(seen, open(".statcache", "w"))
sys.exit(1 if bad else 0)
"""
PEEKS = (
    SIDE_BY_SIDE
    + """
    [gates.peek]
    run = "cat f1 .statcache > /dev/null 2>&1; true"
    inputs = ["f1"]
    observe = true
    [gates.test]
    run = ["{py}", "statcache.py"]
    inputs = ["**"]
    observe = true
    needs = ["peek"]
"""
)


def test_a_cache_a_narrow_need_opened_does_not_stand_for_nothing(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "statcache.py").write_text(STATCACHE)
    (repo / "f1").write_text("good\n")
    (repo / "f2").write_text("good\n")
    (repo / ".gitignore").write_text(".statcache\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = PEEKS.format(py=PY)
    assert statuses(capsys, repo, manifest)["test"] == "passed"  # cold: opens f1, f2
    (repo / "f1").write_text("good, once more\n")  # peek runs; test opens only f1 now
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "f2").write_text("bad, and longer\n")  # test only stat-ed f2 last time
    cached = statuses(capsys, repo, manifest)["test"]
    (repo / ".statcache").unlink()
    oracle = statuses(capsys, repo, manifest, "--no-cache")["test"]
    assert oracle == "failed"
    assert cached == oracle, "a stale pass: the need's open of .statcache excused the gate's"


# The same without a race: a gate that reads ``conf`` through a hard link it made (link(2)
# opens nothing), or after renaming it away (and back), opens only a name the tree did not
# hold before it ran, a file "the gate made new", which counts for nothing.
BY_LINK = (
    SIDE_BY_SIDE
    + """
    [gates.linked]
    run = "mkdir -p junk; ln -f conf junk/c; ! grep -q bad junk/c"
    inputs = ["**"]
    observe = true
    [gates.moved]
    run = "mkdir -p junk; mv conf2 junk/m; grep -q bad junk/m; s=$?; mv junk/m conf2; test $s = 1"
    inputs = ["**"]
    observe = true
    [gates.bytecode]
    run = "mkdir -p __pycache__; ln -f conf3 __pycache__/x.cpython-311.pyc; ! grep -q bad __pycache__/x.cpython-311.pyc"
    inputs = ["**"]
    observe = true
"""
)


def test_a_file_read_through_a_link_or_a_rename_the_gate_made_is_still_read(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "conf").write_text("good\n")
    (repo / "conf2").write_text("good\n")
    (repo / "conf3").write_text("good\n")
    (repo / "x.py").write_text("X = 1\n")  # a bytecode name stands for it
    (repo / ".gitignore").write_text("junk/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")

    def run(*args: str) -> dict[str, str]:
        for made in ("junk", "__pycache__"):  # a clean checkout each time
            shutil.rmtree(repo / made, ignore_errors=True)
        return statuses(capsys, repo, BY_LINK, *args)

    assert run() == {"linked": "passed", "moved": "passed", "bytecode": "passed"}
    for name in ("conf", "conf2", "conf3"):
        (repo / name).write_text("bad\n")
    oracle = run("--no-cache")
    assert oracle == {"linked": "failed", "moved": "failed", "bytecode": "failed"}
    assert run() == oracle, "a stale pass: a file was read under a name the gate made"


# What birth times cannot tell: ``conf`` read, then swapped with ``conf2`` (a file of the
# tree too) while its event waits, and swapped back.  The read is named ``conf2``, a name the
# snapshot holds; its content id is conf2's, and conf's edit is answered from the cache.
SWAPS = RENAMES.replace(
    'os.rename("conf", "conf.away")', 'os.rename("conf2", "t"); os.rename("conf", "conf2")'
).replace(
    'os.rename("conf.away", "conf")',
    'os.rename("conf2", "conf"); os.rename("t", "conf2")',
)


def test_a_file_swapped_with_another_while_its_event_waits_is_still_read(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    assert SWAPS != RENAMES
    (repo / "renames.py").write_text(SWAPS)
    (repo / "conf").write_text("good\n")
    (repo / "conf2").write_text("other\n")
    (repo / ".gitignore").write_text("junk/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = RENAMING.format(py=PY)
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "conf").write_text("bad\n")
    oracle = statuses(capsys, repo, manifest, "--no-cache")["test"]
    assert oracle == "failed"
    assert statuses(capsys, repo, manifest)["test"] == oracle, "a stale pass: read as conf2"


# The same through a folder's names: the relay names a file after what ``conf`` says, the
# reader only lists the folder.  A new folder's names were keyed by nothing (not in the tree
# before the run, so "no names" at every lookup).
NAMES = (
    SIDE_BY_SIDE
    + """
    [gates.relay]
    run = "sleep 0.5; mkdir -p junk; touch junk/$(cat conf)"
    inputs = ["**"]
    observe = true
    [gates.test]
    run = "n=0; until test -n \\"$(ls junk 2>/dev/null)\\"; do sleep 0.05; n=$((n+1)); test $n -lt 200 || exit 2; done; ! ls junk | grep -q bad"
    inputs = ["**"]
    observe = true
"""
)


def test_a_folder_another_gate_made_in_this_run_is_no_folder_the_gate_made(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    stale(capsys, observed, NAMES, {".gitignore": "junk/\n"})


# What a gate makes itself stays its own beside another gate: written to a temporary name
# and renamed (as most tools write), then read back, in a folder it made and lists.
OWN = (
    SIDE_BY_SIDE
    + """
    [gates.other]
    run = "mkdir -p junk2; cat conf > junk2/copy; sleep 1"
    inputs = ["**"]
    observe = true
    [gates.build]
    run = "sleep 0.3; mkdir -p out/sub; cat src > out/sub/x.part; mv out/sub/x.part out/sub/x; ls out out/sub > /dev/null; cat out/sub/x > /dev/null"
    inputs = ["**"]
    observe = true
"""
)


def test_what_a_gate_made_itself_beside_another_gate_is_its_own(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "conf").write_text("conf\n")
    (repo / "src").write_text("source\n")
    (repo / "README").write_text("read me\n")
    (repo / ".gitignore").write_text("junk2/\nout/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")

    def run() -> dict[str, str]:
        for made in ("junk2", "out"):
            shutil.rmtree(repo / made, ignore_errors=True)
        return statuses(capsys, repo, OWN, "--jobs", "2")

    assert run() == {"other": "passed", "build": "passed"}
    (repo / "README").write_text("read me again\n")  # read by neither
    assert run() == {"other": "cached", "build": "cached"}
    (repo / "src").write_text("source 2\n")
    assert run() == {"other": "cached", "build": "passed"}


# The names of a folder of the tree: a listing is keyed by the names it held before the
# run, so another gate's name made in it during the run (here from ``conf``, which the
# lister never read) was unkeyed; a fresh tree (as every tree of the queue is) then
# answered the lister without that name.
FLAGS = (
    SIDE_BY_SIDE
    + """
    [gates.flagger]
    run = "touch tests/$(cat conf).flag"
    inputs = ["**"]
    observe = true
    [gates.test]
    run = "n=0; until ls tests | grep -q flag; do sleep 0.05; n=$((n+1)); test $n -lt 200 || exit 2; done; ! ls tests | grep -q bad"
    inputs = ["**"]
    observe = true
"""
)


# pytest's cache counted for nothing (only --lf, --ff, --nf and --sw make a run depend on
# what pytest keeps there); but a test may keep its own values there too (the ``cache``
# fixture, ``config.cache``: plugins do): one read once from ``conf`` is a cache validated by
# nothing, and the run that used it never opened ``conf``.  Once the value is gone (pytest's
# ``--cache-clear``), that run's read set answers a tree whose run reads ``conf`` again.
KEEPS = """\
def test_conf(cache):
    value = cache.get("demo/conf", None)
    if value is None:
        value = open("conf").read()
        cache.set("demo/conf", value)
    assert "bad" not in value
"""
KEEPING = (
    SIDE_BY_SIDE
    + """
    [gates.test]
    run = ["{py}", "-m", "pytest", "-q", "-p", "no:benchmark", "test_keeps.py"]
    inputs = ["**"]
    observe = true
"""
)


def test_a_name_another_gate_made_in_a_folder_of_the_tree_is_no_name_of_its_listing(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    files = {".gitignore": "*.flag\n", "tests/test_a.txt": "a test\n"}
    stale(capsys, observed, FLAGS, files, made=("tests/good.flag", "tests/bad.flag"))


def test_a_value_a_test_keeps_in_pytests_cache_is_no_cache_of_pytests(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "test_keeps.py").write_text(KEEPS)
    (repo / "conf").write_text("good\n")
    (repo / ".gitignore").write_text(".pytest_cache/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = KEEPING.format(py=PY)
    assert statuses(capsys, repo, manifest)["test"] == "passed"  # opens conf, keeps it
    (repo / "conf").write_text("good, once more\n")  # a miss: the kept value answers
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "conf").write_text("bad\n")
    kept = repo / ".pytest_cache" / "v" / "demo"
    shutil.rmtree(kept)  # the value is gone (``--cache-clear``), pytest's cache is not
    cached = statuses(capsys, repo, manifest)["test"]
    shutil.rmtree(kept, ignore_errors=True)
    oracle = statuses(capsys, repo, manifest, "--no-cache")["test"]
    assert oracle == "failed"
    assert cached == oracle, "a stale pass: the value kept in .pytest_cache stood for conf"


def test_pytests_own_cache_still_counts_for_nothing(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    (repo / "test_keeps.py").write_text("def test_a():\n    assert 1\n")
    (repo / "README").write_text("read me\n")
    (repo / ".gitignore").write_text(".pytest_cache/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = KEEPING.format(py=PY)
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "test_keeps.py").write_text("def test_a():\n    assert 2\n")  # run, cache warm
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "README").write_text("read me again\n")  # read by no run
    assert statuses(capsys, repo, manifest)["test"] == "cached"


# The same through pytest's last failures: the gate's command has no --lf, its ini file (a
# file of the tree) has.  A run after a failure runs the failed test alone and never opens
# what the others read; once the failure is fixed, its read set answered a tree where a
# test it did not run fails.  Last failures held before the run count now.
LAST_FAILED = {
    "pytest.ini": "[pytest]\naddopts = --lf\n",
    "test_a.py": "def test_a():\n    assert 'bad' not in open('conf').read()\n",
    "test_b.py": "def test_b():\n    assert 1\n",
}


def test_last_failures_an_ini_file_runs_by_are_no_cache_of_pytests(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    repo = observed
    for name, text in LAST_FAILED.items():
        (repo / name).write_text(text)
    (repo / "conf").write_text("good\n")
    (repo / ".gitignore").write_text(".pytest_cache/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = KEEPING.format(py=PY).replace("test_keeps.py", ".")
    assert statuses(capsys, repo, manifest)["test"] == "passed"
    (repo / "test_b.py").write_text("def test_b():\n    assert 0\n")
    assert statuses(capsys, repo, manifest)["test"] == "failed"  # the last failure: test_b
    (repo / "test_b.py").write_text("def test_b():\n    assert 2\n")
    assert statuses(capsys, repo, manifest)["test"] == "passed"  # test_b alone
    (repo / "conf").write_text("bad\n")
    cached = statuses(capsys, repo, manifest)["test"]
    shutil.rmtree(repo / ".pytest_cache")
    oracle = statuses(capsys, repo, manifest, "--no-cache")["test"]
    assert oracle == "failed"
    assert cached == oracle, "a stale pass: test_a, which reads conf, did not run"


def test_another_gates_empty_folder_nested_in_a_folder_the_gate_filled_is_not_its_own(
    tmp_path: Path,
) -> None:
    """``junk/own/`` holds a file the gate wrote and, beside it, an empty folder another
    gate made (named after what it read): ``junk`` is not all the gate's own, at any depth.
    (Each new folder the gate lists is checked itself; this is ``junk``'s own walk.)"""
    (tmp_path / "junk" / "own" / "other").mkdir(parents=True)
    fd = os.open(tmp_path / "junk" / "own" / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        node = madeby.identity(fd, os.fstat(fd), madeby.born(fd))
    finally:
        os.close(fd)
    listed = new = frozenset({"junk"})
    assert madeby.foreign(str(tmp_path), {}, {node}, listed, new) == {"junk"}
    os.rmdir(tmp_path / "junk" / "own" / "other")  # the gate's own alone: nothing foreign
    assert madeby.foreign(str(tmp_path), {}, {node}, listed, new) == frozenset()
