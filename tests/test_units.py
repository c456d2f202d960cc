from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagrunner.units import format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), (12, 12.0), ("2.5s", 2.5)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5x", "m5", "5 m", "-3s", True, [1]])
def test_bad_durations_say_what_is_accepted(bad: object) -> None:
    with pytest.raises(ValueError, match=r"duration|negative|boolean"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512M", 512 << 20),
        ("2G", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("4096", 4096),
        (10, 10),
        ("1k", 1024),
    ],
)
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "12Q", "M", True, 1.5])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=10**6))
def test_seconds_round_trip(n: int) -> None:
    assert parse_duration(f"{n}s") == n
    assert format_duration(float(n))  # always some text
