"""The public Python API (what orchestrators import) is pinned here."""

from __future__ import annotations

import dagrunner


def test_public_names_resolve() -> None:
    for name in dagrunner.__all__:
        assert getattr(dagrunner, name) is not None, name
    assert callable(dagrunner.release_check) and callable(dagrunner.integrate)
    assert dagrunner.submit.__name__ == "submit_files"


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        _ = dagrunner.no_such_thing
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_the_public_api_is_exactly_these_names() -> None:
    """Orchestrators import these; a change here is a change of contract (CHANGELOG)."""
    assert sorted(dagrunner.__all__) == [
        "DagrunnerError",
        "Event",
        "ExitCode",
        "GateResult",
        "IntegrationResult",
        "Manifest",
        "RunOptions",
        "RunRecord",
        "RunStatus",
        "Status",
        "__version__",
        "allocate",
        "cleanup",
        "export",
        "integrate",
        "load_manifest",
        "overlaps",
        "queue_stats",
        "release_check",
        "submit",
        "sync",
        "wait_for",
        "watch",
    ]
