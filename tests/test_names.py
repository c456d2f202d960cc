"""The one rule for names that cross the trust line (``dagrunner/names.py``)."""

from __future__ import annotations

import pytest

from dagrunner.names import is_object_id


@pytest.mark.parametrize("value", ["a" * 40, "0123456789abcdef" * 4])
def test_a_full_object_id_is_one(value: str) -> None:
    assert is_object_id(value)


@pytest.mark.parametrize(
    "value", ["A" * 40, "a" * 39, "a" * 41, "--all", "a" * 40 + "\n", "HEAD", "^" + "a" * 40, None]
)
def test_anything_else_a_worker_could_report_is_not(value: object) -> None:
    """A commit a worker says it holds becomes an argument of git: never an option, a
    range, a ref name or two lines."""
    assert not is_object_id(value)
