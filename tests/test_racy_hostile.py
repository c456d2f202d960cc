"""Hostile and racy inputs to ``process/racy.py``: what a worker's tree can hold, and edits
made in the second a tool read a file in, through real runs."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from conftest import SIDE_BY_SIDE, check, git

from dagrunner.process import racy

FUTURE = 4_102_444_800 * 10**9  # 2100-01-01

GATE = (
    SIDE_BY_SIDE
    + """
    [gates.ok]
    run = "true"
"""
)


def test_a_file_name_that_is_not_utf8_written_just_now_is_no_traceback(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """A worker names a file with bytes that are not UTF-8 and writes it in the second its
    run begins: the record of that second must still be written, the run must still run."""
    name = os.fsencode(repo) + b"/\xff\xfe.txt"
    os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
    os.utime(name, ns=(FUTURE, FUTURE))  # recorded whenever the run begins
    code, body, _ = check(capsys, repo, GATE)
    assert code == 0, body


def test_a_tree_dated_ahead_of_the_clock_keeps_its_record_small_and_is_touched_once(
    repo: Path, tmp_path: Path
) -> None:
    """A worker dates every file of a large tree in 2100 (each then looks written in its
    run's first second): the record stays bounded, and a file left out of it is touched at
    the next run if written again, as a recorded one is."""
    for older in git(repo, "ls-files", "-co", "--exclude-standard").splitlines():
        os.utime(repo / older, ns=(10**18, 10**18))  # the fixture's files: 2001, no window's
    names = [f"f{i}" for i in range(racy.RECORDED + 50)]
    for name in names:
        (repo / name).write_text("x\n")
        os.utime(repo / name, ns=(FUTURE, FUTURE))
    state = tmp_path / "state"
    assert racy.settle(state, repo)[0] == []
    (record,) = state.glob("*.json")
    assert len(json.loads(record.read_bytes())["files"]) == racy.RECORDED
    for name in names:  # written again, in that same second of 2100
        os.utime(repo / name, ns=(FUTURE + 1, FUTURE + 1))
    assert sorted(racy.settle(state, repo)[0]) == sorted(names)


def test_a_fifo_named_as_bytecode_of_a_rewritten_source_neither_hangs_nor_goes(
    repo: Path, tmp_path: Path
) -> None:
    """A worker makes ``__pycache__/x.*.pyc`` a FIFO (opening it to read would wait for a
    writer) beside an ``x.py`` dated in its second: the run goes on, the FIFO stays."""
    (repo / "x.py").write_text("x = 1\n")
    (repo / "__pycache__").mkdir()
    fifo = repo / "__pycache__" / "x.cpython-311.pyc"
    os.mkfifo(fifo)
    os.utime(repo / "x.py", ns=(FUTURE, FUTURE))
    done: list[racy.Settled] = []
    waiting = threading.Thread(
        target=lambda: done.append(racy.prepare(tmp_path / "state", repo)), daemon=True
    )
    waiting.start()
    waiting.join(timeout=30)
    assert done and fifo.exists()
