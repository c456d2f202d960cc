"""Landing and cleanup crash-safe together (issue 48): a SIGKILL near a landing never leaves a
landed worker's worktree (or its branch) for a human; a worktree half removed (files, no
``.git``) is reported by ``doctor``, skipped by ``worktree list``/``status``/``prune`` and
removed by ``worktree cleanup --force``; a landed worktree whose uncommitted work is on the
target is cleaned, not retained as "untracked"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import CLI, git

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting


def worker(repo: Path, name: str) -> tuple[Path, Path]:
    """A worktree with one new file, not committed (a worker's usual state), exported:
    the worktree and its envelope (kept outside it)."""
    path = Path(wt.allocate(mission="m", worker=name, repo=repo, session=name)["path"])
    (path / f"{name}.txt").write_text(f"{name}\n")
    out = path.parent / f"{name}.envelope.json"
    exporting.export(f"m/{name}", output=out, repo=repo)
    wt.release(f"m/{name}", session=name, repo=repo)
    return path, out


def cli(repo: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    done = subprocess.run(
        [*CLI, *args, "--repo", str(repo), "--json"],
        capture_output=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    try:
        return done.returncode, orjson.loads(done.stdout)
    except orjson.JSONDecodeError:
        return done.returncode, done.stderr.decode()


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()


def states(repo: Path) -> dict[str, str]:
    return {e.worker or e.id: str(e.state) for e in Queue.of(repo_info(repo)).entries().values()}


def folders(path: Path) -> list[str]:
    """The folders beside the worktree at ``path`` (a removal's trash included)."""
    return [p.name for p in path.parent.iterdir() if p.is_dir()]


@pytest.mark.parametrize("point", ["landed-ref", "landed", "removing"])
def test_a_kill_around_a_landing_leaves_no_worktree_once_an_integrator_runs_again(
    project: Path, point: str
) -> None:
    path, envelope = worker(project, "w1")
    submit(repo_info(project), [envelope])
    code, _ = cli(project, "integrate", "run", env={"DAGRUNNER_CRASH_AT": point})
    assert code == -9
    # the kill came before the cleanup, or in its middle (the folder in its trash)
    assert folders(path), "the kill came after the cleanup"
    code, said = cli(project, "integrate", "run")
    assert code == 0, said
    assert states(project) == {"w1": "landed"}
    assert git(project, "cat-file", "-e", "main:w1.txt") == ""
    assert folders(path) == []  # neither the worktree nor a trash of it is left
    assert "dagrunner/m/w1" not in " ".join(branches(project)), branches(project)
    code, listed = cli(project, "worktree", "list")
    assert code == 0 and listed["worktrees"] == [], listed


def test_a_half_removed_worktree_is_reported_skipped_and_removed_by_force(
    project: Path,
) -> None:
    broken, _ = worker(project, "half")
    intact, _ = worker(project, "whole")
    (broken / ".git").unlink()  # what a kill in the middle of a removal leaves
    (broken / "README").unlink()
    code, listed = cli(project, "worktree", "list")
    assert code == 0, listed
    by_id = {w["id"]: w for w in listed["worktrees"]}
    assert by_id["m/half"]["half_removed"] is True and by_id["m/whole"]["missing"] is False
    code, one = cli(project, "worktree", "status", "m/half")
    assert code == 0 and one["half_removed"] is True, one
    code, pruned = cli(project, "worktree", "prune", "--dry-run")
    assert code == 0, pruned
    assert any(r["id"] == "m/half" for r in pruned["retained"]), pruned
    code, pruned = cli(project, "worktree", "prune")
    assert code == 0 and broken.exists() and not (broken / ".git").exists(), pruned
    code, doctor = cli(project, "doctor")
    found = [f for f in doctor["findings"] if f["check"] == "half-removed"]
    assert found and found[0]["level"] == "WARN" and str(broken) in found[0]["detail"], doctor
    code, refused = cli(project, "worktree", "cleanup", "m/half")
    assert code == 4 and refused["error"]["code"] == "worktree-half-removed", refused
    code, forced = cli(project, "worktree", "cleanup", "m/half", "--force")
    assert code == 0, forced
    assert not broken.exists() and intact.exists()
    code, listed = cli(project, "worktree", "list")
    assert code == 0 and [w["id"] for w in listed["worktrees"]] == ["m/whole"], listed


def test_a_landed_worktree_whose_uncommitted_work_is_on_the_target_is_cleaned(
    project: Path,
) -> None:
    path, envelope = worker(project, "w2")
    submit(repo_info(project), [envelope])
    # the target holds its work; the integrator was killed before it cleaned up
    code, _ = cli(project, "integrate", "run", env={"DAGRUNNER_CRASH_AT": "landed"})
    assert code == -9 and git(project, "cat-file", "-e", "main:w2.txt") == ""
    code, said = cli(project, "worktree", "cleanup", "m/w2")
    assert code == 0, said  # its one untracked file is the landed w2.txt
    assert said["branch_deleted"] is True and not path.exists()


def test_a_cleanup_killed_in_the_middle_is_finished_by_prune(project: Path) -> None:
    path, envelope = worker(project, "w3")
    submit(repo_info(project), [envelope])
    code, _ = cli(project, "integrate", "run", env={"DAGRUNNER_CRASH_AT": "landed"})
    assert code == -9
    code, _ = cli(project, "worktree", "cleanup", "m/w3", env={"DAGRUNNER_CRASH_AT": "removing"})
    assert code == -9
    code, listed = cli(project, "worktree", "list")
    assert code == 0, listed
    code, pruned = cli(project, "worktree", "prune")
    assert code == 0, pruned
    assert folders(path) == []
    assert "dagrunner/m/w3" not in " ".join(branches(project))
    code, listed = cli(project, "worktree", "list")
    assert code == 0 and listed["worktrees"] == [], listed


def test_a_kill_after_an_item_ended_unlanded_still_leaves_its_worktree_retained_with_why(
    project: Path,
) -> None:
    """Found on pypa/packaging: an integrator that died after w4's conflict was journaled,
    before the run's end, never marked w4's worktree retained; the next run did not either,
    so ``worktree list`` said "committed-not-landed" and no reason, where a run that ends
    says "conflict" and names the envelope."""
    path, conflicting = worker(project, "c")
    (project / "c.txt").write_text("the target's own c\n")  # the same new file, other text
    git(project, "add", "c.txt")
    git(project, "commit", "-q", "-m", "target adds c.txt")
    _, fine = worker(project, "ok")
    submit(repo_info(project), [conflicting, fine])
    code, _ = cli(project, "integrate", "run", env={"DAGRUNNER_CRASH_AT": "gating"})
    assert code == -9 and states(project)["c"] == "conflict", states(project)
    code, said = cli(project, "integrate", "run")
    assert code == 0 and states(project) == {"c": "conflict", "ok": "landed"}, said
    code, listed = cli(project, "worktree", "list")
    assert code == 0, listed
    (kept,) = listed["worktrees"]
    assert kept["id"] == "m/c", kept
    assert kept["retained"].startswith("envelope m.c.") and kept["retained"].endswith("conflict")
    assert path.is_dir()
