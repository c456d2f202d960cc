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
        ("512B", 512),
        ("1.5K", 1536),
    ],
)
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "12Q", "M", True, 1.5, "5i", "1.5", "0.5b"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=10**6))
def test_seconds_round_trip(n: int) -> None:
    assert parse_duration(f"{n}s") == n
    assert format_duration(float(n))  # always some text


def test_globs_cross_slashes_only_as_a_whole_segment_and_bad_ones_are_errors() -> None:
    from dagrunner.manifest.globs import glob_regex

    assert glob_regex("a**b").match("axxb") and not glob_regex("a**b").match("a/x/b")
    assert glob_regex("src/**").match("src/a/b.py") and glob_regex("**/x.py").match("a/b/x.py")
    assert glob_regex("src/**/t.py").match("src/t.py")
    for bad in ("src/[]", "src/[!]"):
        with pytest.raises(ValueError):
            glob_regex(bad)


def test_dag_layout_of_a_long_chain_listed_dependents_first() -> None:
    """The report's layout once recursed per gate: a 600-gate chain hit RecursionError."""
    from dagrunner.records.run import GateResult, RunRecord, RunStatus, Status
    from dagrunner.report.svg import dag_layout

    gates = [
        GateResult(id=f"g{i}", status=Status.PASSED, needs=(f"g{i - 1}",) if i else ())
        for i in reversed(range(3000))
    ]
    record = RunRecord(
        run_id="r",
        status=RunStatus.PASSED,
        started_at="",
        wall=0.0,
        manifest={},
        git={},
        machine={},
        governor={},
        gates=gates,
    )
    layout = dag_layout(record)
    x = {box.id: box.x for box in layout["boxes"]}
    assert all(x[f"g{i}"] < x[f"g{i + 1}"] for i in range(2999)), "each gate right of its need"
    assert len(layout["edges"]) == 2999
