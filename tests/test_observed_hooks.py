"""The gates ``init`` writes in pre-commit hooks' stead, keyed by what they read (issue 46).

Their selector (``hookgates.SELECT``) listed the tree with ``git ls-files``: the gate read
git's database, its observation was incomplete, and a README edit ran every one of them
again.  dagrunner now hands a gate whose inputs are the whole tree the snapshot's paths
(``$DAGRUNNER_PATHS``, a file in the gate's own HOME): what the shape key's name set holds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import check, git, skip_unless_reads_observed

from dagrunner.starter.hookgates import SELECT

# A checker that fails on the word BAD in any file it is given, and says which it read.
CHECKER = "import sys; bad = [p for p in sys.argv[1:] if 'BAD' in open(p).read()]; print(bad); sys.exit(bool(bad))"


def manifest() -> str:
    argv = [sys.executable, "-c", SELECT, "--types-or=python", "--", sys.executable, "-c", CHECKER]
    return f"""
[env]
pass = ["PATH"]
[gates.lint]
run = [{", ".join(json.dumps(a) for a in argv)}]
inputs = ["**"]
observe = true
"""


@pytest.fixture
def tree(repo: Path) -> Path:
    skip_unless_reads_observed()
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("A = 1\n")
    (repo / "src" / "b.py").write_text("B = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "code")
    return repo


def lint(capsys: pytest.CaptureFixture[str], repo: Path) -> tuple[int, dict[str, Any]]:
    code, body, _ = check(capsys, repo, manifest())
    found: dict[str, Any] = next(g for g in body["gates"] if g["id"] == "lint")
    return code, found


def test_a_readme_edit_answers_the_gate_written_in_a_hooks_stead(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    code, first = lint(capsys, tree)
    assert code == 0, first["reason"]
    observed = first["cache"]["observed"]
    assert observed["complete"] is True and observed["keyed_by"] == "reads", observed
    (tree / "README").write_text("an edit of the docs\n")
    code, again = lint(capsys, tree)
    assert code == 0 and again["status"] == "cached", again["reason"]
    (tree / "src" / "b.py").write_text("B = 'BAD'\n")  # a file it read: it runs, and fails
    code, failed = lint(capsys, tree)
    assert code != 0 and failed["status"] == "failed"


def test_a_file_git_does_not_track_yet_is_checked_and_misses(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """The list is the snapshot's, which the key holds: a file not yet added (and not
    ignored) is in it, so a pass never stands for a tree where it was left out."""
    code, _ = lint(capsys, tree)
    assert code == 0
    (tree / "src" / "new.py").write_text("N = 'BAD'\n")
    code, found = lint(capsys, tree)
    assert code != 0 and found["status"] == "failed"
    git(tree, "add", "src/new.py")
    code, found = lint(capsys, tree)
    assert code != 0 and found["status"] == "failed"


def test_the_selector_reads_the_paths_dagrunner_gives_and_runs_no_git(tmp_path: Path) -> None:
    """Given ``DAGRUNNER_PATHS`` it lists exactly those (no repository needed); without
    it, ``git ls-files`` as before (``test_init_hooks``)."""
    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "b.py").write_text("B = 'BAD'\n")  # not listed: not checked
    (tmp_path / "c.txt").write_text("BAD\n")
    listed = tmp_path.parent / f"{tmp_path.name}.paths"
    listed.write_bytes(b"a.py\0c.txt\0gone.py\0")
    printer = [sys.executable, "-c", "import sys; print('\\n'.join(sys.argv[1:]))"]
    done = subprocess.run(
        [sys.executable, "-c", SELECT, "--types-or=python", "--", *printer],
        cwd=tmp_path,
        env={**os.environ, "DAGRUNNER_PATHS": str(listed), "PATH": "/nonexistent"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "dagrunner: 1 of 3 tracked files, as pre-commit would pass them: " + " ".join(printer),
        "a.py",
    ]


JUNIT = """
[env]
pass = ["PATH"]
[gates.tests]
run = "mkdir -p build/junit && cat src/a.py > /dev/null && echo '<testsuite tests=\\"1\\"><testcase name=\\"t\\"/></testsuite>' > build/junit/tests.xml"
inputs = ["**"]
observe = true
junit = "build/junit/tests.xml"
"""


@pytest.mark.parametrize("ignored", [True, False], ids=["ignored", "not-ignored"])
def test_the_junit_file_an_earlier_run_left_does_not_make_the_next_incomplete(
    capsys: pytest.CaptureFixture[str], tree: Path, ignored: bool
) -> None:
    """``init``'s pytest gate writes its JUnit file where the project ignores it (as init
    tells): the next run found it held before, an ignored cache, and every run after the
    first was keyed by the whole tree.  dagrunner removes it before the gate starts, so
    the gate's file is its own and what the old one held went unread.  Where nobody ignored
    it (found on pallets/werkzeug: untracked, not ignored, no file of the snapshot, which
    leaves declared outputs out) the old file was kept, pytest rewrote it in place, and "it
    opened build/junit/tests.xml, a name the tree did not hold of a file older than its run"
    keyed every later run by the whole tree: a README edit ran the tests again."""
    if ignored:
        (tree / ".gitignore").write_text("reports/\nbuild/junit/\n")
        git(tree, "commit", "-qam", "ignore the JUnit file")
    for edit in ("A = 2\n", "A = 3\n"):  # the first run leaves the file, the second finds it
        (tree / "src" / "a.py").write_text(edit)
        code, body, _ = check(capsys, tree, JUNIT)
        assert code == 0
        found = next(g for g in body["gates"] if g["id"] == "tests")
        assert found["cache"]["observed"]["complete"] is True, found["cache"]["observed"]
    (tree / "README").write_text("an edit of the docs\n")
    code, body, _ = check(capsys, tree, JUNIT)
    assert next(g for g in body["gates"] if g["id"] == "tests")["status"] == "cached"


def test_the_junit_file_is_never_removed_through_a_link_nor_when_it_is_tracked(
    capsys: pytest.CaptureFixture[str], tree: Path, tmp_path: Path
) -> None:
    """The tree may be an envelope's: a ``build`` that links elsewhere is not followed
    (the gate then writes through it, as it would anyway: ``[sandbox]`` decides), and a
    tracked file is the tree's, never removed."""
    outside = tmp_path / "outside"
    (outside / "junit").mkdir(parents=True)
    (outside / "junit" / "tests.xml").write_text("keep me\n")
    (tree / "build").symlink_to(outside)
    git(tree, "add", "build")
    git(tree, "commit", "-qm", "a linked build folder")
    check(capsys, tree, JUNIT)
    assert (outside / "junit" / "tests.xml").exists()


def lister(waits_for: str) -> str:
    """A manifest's head: ``lists``, a gate listing the root, and any gate after it run side
    by side whatever the machine's load (the governor would start one at a time); ``lists``
    waits (10 s at most, by a ``stat``: not seen) for ``waits_for`` before it lists."""
    wait = f"for i in $(seq 200); do test -e {waits_for} && break; sleep 0.05; done"
    return f"""
[governor]
max_load = 1000
[env]
pass = ["PATH"]
[gates.lists]
run = "{wait}; ls -a > /dev/null; cat src/a.py > /dev/null"
inputs = ["**"]
observe = true
"""


LISTS = (
    lister("build/out.txt")
    + """[gates.makes]
run = "mkdir -p build && echo made > build/out.txt; rm -rf stale"
inputs = ["**"]
"""
)


def ran(capsys: pytest.CaptureFixture[str], repo: Path) -> set[str]:
    code, body, _ = check(capsys, repo, LISTS)
    assert code == 0, [(g["id"], g["reason"]) for g in body["gates"]]
    return {g["id"] for g in body["gates"] if g["status"] != "cached"}


def test_a_folder_another_gate_makes_during_the_run_is_not_in_a_listing_key(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """Every tree of the queue starts without the folders its gates make (``build/``,
    ``.tox``, ``.mypy_cache``): a gate that lists the tree's root was stored with the
    names it held once the gate ended, another gate's ``build`` among them, and a fresh
    tree (a docs-only envelope's) never matched it.  Names made in this run are left out
    of a listing's key -- when they are the gate's own or a need's: made beside it by
    another gate, a name may stand for what the lister never read (the stale pass in
    test_observed_hostile), so that run is keyed by the whole tree and says why."""
    (tree / ".gitignore").write_text("reports/\nbuild/\nstale/\n")
    git(tree, "commit", "-qam", "ignore build")
    assert "lists" in ran(capsys, tree)
    shutil.rmtree(tree / "build")  # a fresh tree: what the last run made is not there
    (tree / "README").write_text("an edit of the docs\n")
    _, body, _ = check(capsys, tree, LISTS)
    lists = next(g for g in body["gates"] if g["id"] == "lists")
    assert lists["status"] == "passed", lists
    assert "build was made in this run by another gate" in lists["cache"]["observed"]["why"]
    # made by a need, the name is the need's (its key is the lister's): a fresh tree matches
    after = LISTS.replace("observe = true\n", 'observe = true\nneeds = ["makes"]\n', 1)
    after += "observe = true\n"  # what it wrote is seen: its names are its own
    for edit in ("", "another edit of the docs\n"):
        shutil.rmtree(tree / "build")
        (tree / "README").write_text(edit or "a third edit\n")
        _, body, _ = check(capsys, tree, after)
    assert {g["id"]: g["status"] for g in body["gates"]}["lists"] == "cached", body["gates"]


def test_a_name_another_gate_removed_during_the_run_is_not_answered_without(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """The other way round: a name the tree held before the run and a gate removed while
    it ran was not seen; a tree that holds it is not answered by that run."""
    (tree / ".gitignore").write_text("reports/\nbuild/\nstale/\n")
    git(tree, "commit", "-qam", "ignore build")
    (tree / "stale").mkdir()
    assert "lists" in ran(capsys, tree)  # makes removed stale/ while lists slept
    (tree / "stale").mkdir()
    (tree / "README").write_text("an edit of the docs\n")
    assert "lists" in ran(capsys, tree)


RELAY = """
[governor]
max_load = 1000  # side by side, whatever the load
[env]
pass = ["PATH"]
[gates.check]
run = '''files=$(ls tests); for i in $(seq 100); do [ -e tests/gen_test.txt ] && break; sleep 0.1; done
[ -e tests/gen_test.txt ] || exit 3  # gen ran beside it (a stat: not seen)
for f in $files; do ! grep -q FAIL tests/$f || exit 1; done'''
inputs = ["**"]
observe = true
[gates.gen]
run = "sleep 0.5; echo FAIL > tests/gen_test.txt; sleep 1"
"""


def test_a_file_another_gate_made_after_the_listing_is_not_answered_for_once_it_is_there(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """``check`` lists ``tests/`` before ``gen`` writes a failing file there (ignored), and
    waits for it by ``stat`` (not seen): it never saw the file in its listing, and passed.
    Keyed by the names once it ended, that pass answered the next run, where the file was
    there from the start and ``check`` would read it: a stale pass.  The names made in the
    run are not in the key, so the next run misses, and fails."""
    (tree / "tests").mkdir()
    (tree / "tests" / "ok.txt").write_text("fine\n")
    (tree / ".gitignore").write_text("reports/\ntests/gen_test.txt\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "tests")
    code, body, _ = check(capsys, tree, RELAY)
    assert code == 0, [(g["id"], g["reason"]) for g in body["gates"]]
    (tree / "README").write_text("an edit of the docs\n")
    code, body, _ = check(capsys, tree, RELAY)
    found = next(g for g in body["gates"] if g["id"] == "check")
    assert code != 0 and found["status"] == "failed", found["reason"]


def test_a_gate_in_a_folder_is_given_the_paths_under_it_relative_to_it(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """As ``git ls-files`` run there lists them: ``src/a.py`` is ``a.py`` to a gate whose
    ``cwd`` is ``src``, and nothing outside ``src`` is given."""
    counts = "import sys; sys.exit(sorted(sys.argv[1:]) != ['a.py', 'b.py'])"
    argv = [sys.executable, "-c", SELECT, "--always-run", "--", sys.executable, "-c", counts]
    manifest = f"""
[env]
pass = ["PATH"]
[gates.lint]
run = [{", ".join(json.dumps(a) for a in argv)}]
cwd = "src"
inputs = ["**"]
observe = true
"""
    code, body, _ = check(capsys, tree, manifest)
    assert code == 0, [(g["id"], g["reason"]) for g in body["gates"]]
    assert body["gates"][0]["cache"]["observed"]["keyed_by"] == "reads"


# init's pytest gate and a gate that lists the root (ruff, mypy), side by side
BESIDE = lister("build/junit/tests.xml") + JUNIT.replace('[env]\npass = ["PATH"]\n', "")


def test_the_junit_folder_the_tests_gate_makes_does_not_unkey_a_gate_listing_the_root(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """Found on pytest-dev/pluggy: each fresh tree of the queue starts without ``build``;
    init's pytest gate made it (``--junitxml=build/junit/tests.xml``) while ruff and mypy,
    beside it, listed the root: "it listed the tree, where build was made in this run by
    another gate", and a docs-only envelope's tree answered none of them.  dagrunner makes
    the folders of an observed gate's JUnit file before the run begins, as a checkout that
    ran the gate once holds them: the root's names are the same throughout."""
    (tree / ".gitignore").write_text("reports/\nbuild/\n")
    git(tree, "commit", "-qam", "ignore build")
    for edit in ("a docs edit\n", "another docs edit\n"):
        shutil.rmtree(tree / "build", ignore_errors=True)  # a fresh tree of the queue
        (tree / "README").write_text(edit)
        code, body, _ = check(capsys, tree, BESIDE)
        assert code == 0, [(g["id"], g["reason"]) for g in body["gates"]]
        lists = next(g for g in body["gates"] if g["id"] == "lists")
        if lists["status"] != "cached":
            assert lists["cache"]["observed"]["complete"] is True, lists["cache"]["observed"]
    assert lists["status"] == "cached", lists


def test_the_junit_folders_are_never_made_through_a_link(
    capsys: pytest.CaptureFixture[str], tree: Path, tmp_path: Path
) -> None:
    """The tree may be an envelope's, its ``build`` a link to any folder: dagrunner makes
    nothing through it (what the gate itself writes there is ``[sandbox]``'s to decide)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "build").symlink_to(outside)
    git(tree, "add", "build")
    git(tree, "commit", "-qm", "a linked build folder")
    check(capsys, tree, JUNIT.replace("mkdir -p build/junit && ", "exit 0; "))
    assert list(outside.iterdir()) == []
