"""``worktree overlaps``: which live work would collide, merged on the content, on real
worktrees (committed, staged, unstaged and untracked work), queued envelopes and the tip."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
from conftest import CLI, git
from test_integration import worker

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import overlaps
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt


def live(project: Path, name: str, change: Any) -> Path:
    path = Path(wt.allocate(mission="m", worker=name, repo=project)["path"])
    change(path)
    return path


def pairs(project: Path) -> dict[frozenset[str], dict[str, Any]]:
    body = overlaps(repo=project).to_json()
    return {frozenset((p["a"], p["b"])): p for p in body["pairs"]}


def test_a_content_conflict_is_told_from_a_clean_merge_of_the_same_file(project: Path) -> None:
    """w1 (unstaged) and w3 (committed) change line one of shared.txt differently: a
    conflict.  w2 (staged) changes line three: the same file, but it merges cleanly with
    both.  w4 only adds its own untracked file: it overlaps nobody."""
    paths = [live(project, "w1", lambda p: (p / "shared.txt").write_text("ONE\ntwo\nthree\n"))]

    def staged(p: Path) -> None:
        (p / "shared.txt").write_text("one\ntwo\nTHREE\n")
        git(p, "add", "shared.txt")

    def committed(p: Path) -> None:
        (p / "shared.txt").write_text("uno\ntwo\nthree\n")
        git(p, "commit", "-qam", "w3")

    paths += [live(project, "w2", staged), live(project, "w3", committed)]
    paths.append(live(project, "w4", lambda p: (p / "mine.txt").write_text("mine\n")))
    before = [(git(p, "status", "--porcelain"), git(p, "rev-parse", "HEAD")) for p in paths]
    found = pairs(project)
    assert found[frozenset(("m/w1", "m/w3"))]["conflict"] is True
    assert found[frozenset(("m/w1", "m/w3"))]["paths"] == ["shared.txt"]
    assert found[frozenset(("m/w1", "m/w2"))]["conflict"] is False
    assert found[frozenset(("m/w2", "m/w3"))]["conflict"] is False
    assert not any("m/w4" in pair for pair in found)
    assert len(found) == 3  # the tip did not move: nothing overlaps it
    # nothing was staged, written or committed in any worktree
    assert [(git(p, "status", "--porcelain"), git(p, "rev-parse", "HEAD")) for p in paths] == before


def test_queued_envelopes_and_the_moved_tip_are_sides_too_and_the_cli_exits_1(
    project: Path,
) -> None:
    """An envelope queued for main adds new.txt; a live worker adds a different new.txt
    (an add/add conflict).  The tip moved: line one of shared.txt, which another live
    worker changes too.  ``worktree overlaps`` says both, with exit 1."""
    envelope = worker(project, "queued", lambda p: (p / "new.txt").write_text("queued\n"))
    submit(repo_info(project), [envelope])
    live(project, "adder", lambda p: (p / "new.txt").write_text("live\n"))
    live(project, "liner", lambda p: (p / "shared.txt").write_text("LIVE\ntwo\nthree\n"))
    (project / "shared.txt").write_text("TIP\ntwo\nthree\n")
    git(project, "commit", "-qam", "the tip moves")
    done = subprocess.run(
        [*CLI, "worktree", "overlaps", "--json"], cwd=project, capture_output=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    body = orjson.loads(done.stdout)
    found = {frozenset((p["a"], p["b"])): p for p in body["pairs"]}
    queued_id = next(p["b"] for p in body["pairs"] if p["b_kind"] == "envelope")
    assert found[frozenset(("m/adder", queued_id))]["conflict"] is True
    assert found[frozenset(("m/liner", "main"))]["conflict"] is True
    assert found[frozenset(("m/liner", "main"))]["paths"] == ["shared.txt"]
    # the worktree that exported the envelope is not paired with its own envelope
    assert frozenset(("swarm/queued", queued_id)) not in found
    assert body["sides"] == {"worktree": 3, "envelope": 1, "target": 1}
    status = subprocess.run(
        [*CLI, "worktree", "status", "m/liner", "--json"], cwd=project, capture_output=True
    )
    assert orjson.loads(status.stdout)["conflicts_with"] == ["main"]
    text = subprocess.run(
        [*CLI, "worktree", "overlaps"], cwd=project, capture_output=True, text=True
    )
    assert "CONFLICT m/liner <-> main: shared.txt" in text.stdout


def test_the_prefilter_merges_only_pairs_that_touch_a_common_path(project: Path) -> None:
    for i in range(6):
        live(project, f"own{i}", lambda p, i=i: (p / f"own{i}.txt").write_text(f"{i}\n"))
    live(project, "a", lambda p: (p / "shared.txt").write_text("A\ntwo\nthree\n"))
    live(project, "b", lambda p: (p / "shared.txt").write_text("B\ntwo\nthree\n"))
    smart = overlaps(repo=project)
    naive = overlaps(repo=project, prefilter=False)
    assert smart.merges == 1 and naive.merges == 8 * 7 // 2 + 8
    assert [p.to_json() for p in smart.pairs] == [p.to_json() for p in naive.pairs]


def test_a_file_against_a_folder_of_the_same_name_is_not_missed_by_the_prefilter(
    project: Path,
) -> None:
    live(project, "file", lambda p: (p / "docs").write_text("a file\n"))

    def folder(p: Path) -> None:
        (p / "docs").mkdir()
        (p / "docs" / "guide.txt").write_text("a folder\n")

    live(project, "folder", folder)
    (pair,) = overlaps(repo=project).pairs
    assert pair.conflict and {pair.a.name, pair.b.name} == {"m/file", "m/folder"}


def test_submit_journals_an_overlap_with_the_item_queued_ahead_that_it_conflicts_with(
    project: Path,
) -> None:
    """Both envelopes change line one of shared.txt: the second's submit says so (an
    ``overlap`` event naming both and the path, valid against the event schema); a third
    that changes another line of the same file merges cleanly and says nothing."""
    import jsonschema

    from dagrunner import watch

    first = worker(project, "one", lambda p: (p / "shared.txt").write_text("1\ntwo\nthree\n"))
    second = worker(project, "two", lambda p: (p / "shared.txt").write_text("2\ntwo\nthree\n"))
    third = worker(project, "three", lambda p: (p / "shared.txt").write_text("one\ntwo\n3\n"))
    (queued_first,) = submit(repo_info(project), [first])
    (queued_second, queued_third) = submit(repo_info(project), [second, third])
    assert [o.other for o in queued_second.overlaps] == [queued_first.id]
    assert queued_third.overlaps == ()
    events = [e for e in watch(repo=project, follow=False) if e.event == "overlap"]
    assert [(e.id, e.details.overlaps_with, e.details.overlap_paths) for e in events] == [
        (queued_second.id, queued_first.id, ("shared.txt",))
    ]
    schema = orjson.loads(
        (Path(__file__).parents[1] / "docs" / "integration-event.schema.json").read_bytes()
    )
    jsonschema.validate(events[0].to_json(), schema)
    assert events[0].state == "queued"
