"""Hostile and racy inputs to ``process/racy.py``: what a worker's tree can hold, and edits
made in the second a tool read a file in, through real runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import SIDE_BY_SIDE, check

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
