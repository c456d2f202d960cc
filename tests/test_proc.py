"""The one process door for non-gate commands (worker setup, fingerprints): an explicit
environment without GIT_*, and a timeout that ends the whole tree."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import git, running

from dagrunner.errors import DagrunnerError
from dagrunner.worktrees import allocate as wt


def test_setup_step_does_not_inherit_a_git_dir_pointing_elsewhere(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    git(elsewhere, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(elsewhere / ".git"))
    info = wt.allocate(
        mission="m", worker="w", repo=repo, setup=["sh -c 'git log -1 --format=%H > head.txt'"]
    )
    # The step read the worktree's own history, not the empty repository GIT_DIR names.
    assert (Path(info["path"]) / "head.txt").read_text().strip() == head


def test_setup_timeout_ends_the_whole_tree(repo: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DagrunnerError) as info:
        wt.allocate(
            mission="m",
            worker="slow",
            repo=repo,
            setup=["sh -c 'sleep 300.0351 & sleep 300.0352'"],
            setup_timeout=1.0,
        )
    assert info.value.code == "setup-failed" and "timed out" in info.value.message
    assert time.monotonic() - started < 20
    assert not running("300.0351") and not running("300.0352")
