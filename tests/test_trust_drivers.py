"""Programs a planted repository config names for git to run on file contents -- merge
drivers and clean/smudge filters, picked by a tree's .gitattributes -- never run in
dagrunner's own git (the integrator's ``git apply --3way`` and checkouts, ``overlaps``)."""

from __future__ import annotations

from pathlib import Path

from conftest import git
from test_integration import worker

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate, overlaps
from dagrunner.integration.submit import submit


def plant(project: Path, attributes: str, **config: str) -> None:
    """What a hostile worker does beside the repository: config in the shared git dir, and
    attributes that reached the target (an earlier envelope landed them)."""
    (project / ".gitattributes").write_text(attributes)
    git(project, "add", ".gitattributes")
    git(project, "commit", "-q", "-m", "attributes")
    for key, value in config.items():
        git(project, "config", key.replace("__", "."), value)


def test_a_planted_merge_driver_never_runs_in_the_integrators_three_way_apply(
    project: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "merge-driver-ran"
    plant(project, "shared.txt merge=evil\n", merge__evil__driver=f"touch '{marker}'; false")
    first = worker(project, "w1", lambda p: (p / "shared.txt").write_text("ONE\ntwo\nthree\n"))
    second = worker(project, "w2", lambda p: (p / "shared.txt").write_text("one\ntwo\nTHREE\n"))
    submit(repo_info(project), [first, second])
    result = integrate(repo=project, window=1)
    final = {o.worker: str(o.state) for o in result.envelopes}
    # w2's patch needs a three-way merge on a file whose attributes name the driver: the
    # driver is off (false), so the file conflicts instead of running the planted command
    assert final == {"w1": "landed", "w2": "conflict"}, result.to_json()
    assert not marker.exists()
    assert overlaps(repo=project).skipped == ()
    assert not marker.exists()


def test_planted_clean_and_smudge_filters_never_run_in_integration_checkouts(
    project: Path, tmp_path: Path
) -> None:
    smudged, cleaned = tmp_path / "smudge-ran", tmp_path / "clean-ran"
    plant(
        project,
        "*.txt filter=evil\n",
        filter__evil__smudge=f"touch '{smudged}'; cat",
        filter__evil__clean=f"touch '{cleaned}'; cat",
        filter__evil__process=f"touch '{smudged}'",
    )
    # allocation and export (checkout, add -A) are dagrunner's git too
    envelope = worker(project, "w1", lambda p: (p / "new.txt").write_text("new\n"))
    assert not smudged.exists() and not cleaned.exists()
    submit(repo_info(project), [envelope])
    result = integrate(repo=project, window=1)
    assert [str(o.state) for o in result.envelopes] == ["landed"], result.to_json()
    assert not smudged.exists() and not cleaned.exists()
    assert git(project, "show", "main:new.txt") == "new\n"
