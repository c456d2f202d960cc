"""Hostile review of keys from observed reads (issue 46): trees a cached verdict must not
answer, each reproduced end to end -- a real ``release-check`` whose cached answer is a pass
where ``--no-cache`` fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import PY, check, git

from dagrunner.process import observe
from dagrunner.process.contain import detect


@pytest.fixture
def observed(repo: Path) -> Path:
    found = detect()
    if not (found.bwrap and found.views) or observe.refused():
        pytest.skip("this machine does not observe gates' reads (dagrunner doctor: observe)")
    return repo


def statuses(capsys: pytest.CaptureFixture[str], repo: Path, manifest: str, *args: str) -> dict[str, str]:
    _, body, _ = check(capsys, repo, manifest, *args)
    found: dict[str, Any] = {g["id"]: g["status"] for g in body["gates"]}
    return found


# A need that opens one file of tests/ (its conftest) made every folder above what it
# opened count as "written by the need": the gate's listing of tests/ was then keyed by
# nothing, and an ignored test file the listing finds is the stale pass 9df88d1 closed.
NEED_LISTS = """
    [env]
    pass = ["PATH"]
    [gates.prep]
    run = "cat tests/conftest.txt > /dev/null"
    inputs = ["**"]
    [gates.test]
    run = "for f in tests/*; do ! grep -q bad \\"$f\\" || exit 1; done"
    inputs = ["**"]
    needs = ["prep"]
"""


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
