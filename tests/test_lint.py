"""ruff and mypy --strict over the whole tree, as part of the test suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.lint
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "ruff", "check", "--no-cache", "."],
        ["-m", "ruff", "format", "--check", "--no-cache", "."],
        ["-m", "mypy", "--no-incremental"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_tool_is_clean(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
