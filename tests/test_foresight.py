"""Submit's foresight kept per target (``worktrees/foresight``): the overlaps a submit
reports are exactly those of the old pairwise way (``submit(pairwise=True)``, run on a clone
of the same repository), at a cost that does not grow with the queue -- on real envelopes,
real repositories and real merges."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import git

from dagrunner.envelope import load_envelope
from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import Submitted, submit
from dagrunner.records.integration import FINAL, EnvelopeState
from dagrunner.worktrees.export import export_worktree, write_envelope
from dagrunner.worktrees.foresight import REFS, Foresight

LINES = 60  # the changelog's lines; edits three lines apart merge cleanly
Found = set[tuple[str, str, tuple[str, ...]]]


@pytest.fixture
def changelog(project: Path) -> Path:
    """``project`` with a changelog of distinct lines committed, and a clone of it that
    foresees the old way (``clone``, beside it)."""
    text = "".join(f"- entry {k}: nothing yet\n" for k in range(LINES))
    (project / "CHANGES.md").write_text(text)
    git(project, "add", "CHANGES.md")
    git(project, "commit", "-qm", "a changelog")
    git(project.parent, "clone", "-q", str(project), "clone")
    return project


def edit(repo: Path, name: str, line: int, text: str = "") -> Path:
    """An envelope (exported from ``repo``'s checkout, on its HEAD) whose only change is
    line ``line`` of the changelog; ``repo``'s checkout is left as it was."""
    path = repo / "CHANGES.md"
    before = path.read_text()
    lines = before.splitlines(keepends=True)
    lines[line] = f"- entry {line}: {text or f'changed by {name}'}\n"
    path.write_text("".join(lines))
    head = git(repo, "rev-parse", "HEAD").strip()
    envelope = export_worktree(repo, mission="m", worker=name, base=head)
    path.write_text(before)
    git(repo, "update-index", "-q", "--refresh")  # the same content, as git sees it too
    out = repo.parent / "envelopes" / f"{name}.json"
    write_envelope(envelope, out)
    return out


def found(submitted: list[Submitted]) -> Found:
    return {(s.id, o.other, o.paths) for s in submitted for o in s.overlaps}


def one_by_one(repo: Path, files: list[Path], *, pairwise: bool = False) -> list[Submitted]:
    info = repo_info(repo)
    return [s for f in files for s in submit(info, [f], pairwise=pairwise)]


def both_ways(project: Path, files: list[Path]) -> tuple[Found, Found]:
    ours = found(one_by_one(project, files))
    theirs = found(one_by_one(project.parent / "clone", files, pairwise=True))
    return ours, theirs


def ids(files: list[Path]) -> list[str]:
    return [orjson.loads(f.read_bytes())["id"] for f in files]


def state(project: Path) -> Any:
    """The foresight state file of ``project``'s target ``main``."""
    folder = repo_info(project).state_dir / "queue" / "foresight"
    return orjson.loads((folder / "main.json").read_bytes())


def test_a_conflicting_pair_deep_in_a_queue_of_clean_edits_is_reported_as_pairwise_would(
    changelog: Path,
) -> None:
    """Sixteen envelopes edit their own line of one file; #11 edits #4's line, and #13 that
    line too: it conflicts with #4 (in the first combined commit) and #11 (not in it)."""
    line = {i: 3 * i for i in range(16)} | {11: 12, 13: 12}
    files = [edit(changelog, f"w{i:02d}", line[i]) for i in range(16)]
    ours, theirs = both_ways(changelog, files)
    item = ids(files)
    path = ("CHANGES.md",)
    assert (
        ours
        == theirs
        == {
            (item[11], item[4], path),
            (item[13], item[4], path),
            (item[13], item[11], path),
        }
    )
    members = [c["members"] for c in state(changelog)["combined"]]
    clean = [i for n, i in enumerate(item) if n not in (11, 13)]
    assert members == [clean, [item[11]], [item[13]]]


def test_a_submit_merges_with_the_combined_commits_not_with_every_item_ahead(
    changelog: Path,
) -> None:
    """With 14 same-file edits queued, the 15th is merged once, and no side is computed
    again: only its own."""
    files = [edit(changelog, f"w{i:02d}", 3 * i) for i in range(15)]
    one_by_one(changelog, files[:-1])
    info = repo_info(changelog)
    queue = Queue.of(info, target="main")
    ahead = [i for i, e in queue.entries().items() if e.state not in FINAL]
    seer = Foresight.open(
        repo=info.root, common=info.common_dir, queue_dir=queue.dir, target="main", load=queue.load
    )
    envelope = load_envelope(files[-1])  # as submit reads it
    assert seer.foresee(envelope.id, envelope, ahead) == []
    assert (seer.merges, seer.sides) == (1, 1)


def test_an_item_that_left_the_queue_is_never_reported(changelog: Path) -> None:
    """#a lands and #b, which conflicts with it, ends ``conflict``; #c0, on their line, is
    told of neither.  Then #c0 is rejected while it is merged into the combined commit with
    three queued edits of other lines: #e, on its line again, conflicts with that combined
    commit, but with none of the items still queued -- and is told of nothing."""
    a, b, c0, e = (edit(changelog, f"w{i}", 6, f"version {i}") for i in range(4))
    others = [edit(changelog, f"x{i}", 15 + 3 * i) for i in range(3)]
    first, second = one_by_one(changelog, [a, b])
    assert [o.other for o in second.overlaps] == [first.id]
    integrate(repo=changelog, window=1)
    entries = Queue.of(repo_info(changelog)).entries()
    assert entries[first.id].state == EnvelopeState.LANDED
    assert entries[second.id].state == EnvelopeState.CONFLICT
    queued = one_by_one(changelog, [c0, *others])
    assert [s.overlaps for s in queued] == [(), (), (), ()]
    ids = [s.id for s in queued]
    assert [c["members"] for c in state(changelog)["combined"]] == [ids]  # a and b left
    Queue.of(repo_info(changelog), target="main").record(ids[0], EnvelopeState.REJECTED)
    (last,) = one_by_one(changelog, [e])
    assert last.overlaps == ()
    assert [c["members"] for c in state(changelog)["combined"]] == [ids, [last.id]]
    assert found(one_by_one(changelog.parent / "clone", [c0, *others, e], pairwise=True))


@pytest.mark.parametrize("damage", ["garbage", "missing", "refs-and-objects-gone"])
def test_a_damaged_or_lost_state_is_rebuilt_and_finds_the_same_overlaps(
    changelog: Path, damage: str
) -> None:
    """#5 edits #1's line, #8 that line too, #9 #7's line; the state is damaged after #6."""
    line = {i: 3 * i for i in range(10)} | {5: 3, 8: 3, 9: 21}
    files = [edit(changelog, f"w{i}", line[i]) for i in range(10)]
    info = repo_info(changelog)
    before = found(one_by_one(changelog, files[:7]))
    path = info.state_dir / "queue" / "foresight" / "main.json"
    assert path.is_file()
    if damage == "garbage":
        path.write_bytes(b'{"version": 1, "items": {"../x": 1}')
    elif damage == "missing":
        path.unlink()
    else:  # no ref holds the combined commits any more, and git prunes every loose object
        refs = git(changelog, "for-each-ref", "--format=%(refname)", REFS).split()
        assert refs
        for ref in refs:
            git(changelog, "update-ref", "-d", ref)
        git(changelog, "gc", "-q", "--prune=now")
        for commit in [c["commit"] for c in state(changelog)["combined"]]:
            assert subprocess.run(["git", "cat-file", "-e", commit], cwd=changelog).returncode
    after = found(one_by_one(changelog, files[7:]))
    theirs = found(one_by_one(changelog.parent / "clone", files, pairwise=True))
    item = ids(files)
    assert before | after == theirs
    assert after == {(item[a], item[b], ("CHANGES.md",)) for a, b in ((8, 1), (8, 5), (9, 7))}
    for commit in [c["commit"] for c in state(changelog)["combined"]]:
        assert git(changelog, "cat-file", "-t", commit).strip() == "commit"
    assert git(changelog, "for-each-ref", "--format=%(refname)", REFS).split()


def test_a_conflict_with_an_item_outside_the_first_combined_commit_is_found(
    changelog: Path,
) -> None:
    """#1 conflicts with #0, so it is no member of the first combined commit; #2 makes
    #1's very change (no conflict with #1, one with #0); #3 conflicts with all three."""
    files = [
        edit(changelog, "w0", 9, "from w0"),
        edit(changelog, "w1", 9, "from w1"),
        edit(changelog, "w2", 9, "from w1"),
        edit(changelog, "w3", 9, "from w3"),
        edit(changelog, "w4", 30),
    ]
    ours, theirs = both_ways(changelog, files)
    item, path = ids(files), ("CHANGES.md",)
    assert (
        ours
        == theirs
        == {
            (item[1], item[0], path),
            (item[2], item[0], path),
            (item[3], item[0], path),
            (item[3], item[1], path),
            (item[3], item[2], path),
        }
    )
