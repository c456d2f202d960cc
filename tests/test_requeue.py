"""``integrate submit --requeue``: the same envelope asked again after a failure of the
machine's, as a new item; the old one keeps its verdict (issue 35)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import git, run_json

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting


def test_requeue_asks_again_for_a_verdict_the_environment_caused(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An envelope failed for a reason of the machine's (here: a variable the gate needs was
    not set); once that is fixed, --requeue queues the same bytes as a new item that lands,
    and the old item keeps its verdict.  Without --requeue it is only 'already queued'."""
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text(
        # the target's head passes it (no new.txt): the failure is the envelope's tree's in
        # this environment, not the target's own (which would hold the item, not fail it)
        '[env]\npass = ["NEEDED"]\n[gates.env]\nrun = "test -n \\"$NEEDED\\" || ! test -f new.txt"\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "gate")
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    (path / "new.txt").write_text("new\n")
    out = path.parent / "w.json"
    exporting.export("m/w", output=out, repo=repo)
    submit(repo_info(repo), [out])
    assert [o.state for o in integrate(repo=repo, window=1).envelopes] == ["gates-failed"]
    code, body = run_json(capsys, "integrate", "submit", str(out), "--repo", str(repo))
    assert code == 0 and body["submitted"][0]["duplicate"] is True
    code, body = run_json(capsys, "integrate", "submit", str(out), "--repo", str(repo), "--requeue")
    (again,) = body["submitted"]
    assert code == 0 and again["duplicate"] is False and again["state"] == "queued", body
    assert again["again_of"] and again["id"] == again["again_of"] + ".r1"
    result = integrate(repo=repo, window=1, env={**os.environ, "NEEDED": "now set"})
    assert [(o.id, o.state) for o in result.envelopes] == [(again["id"], "landed")]
    code, body = run_json(capsys, "integrate", "status", "--repo", str(repo))
    states = {e["id"]: e["state"] for e in body["envelopes"]}
    assert states == {again["again_of"]: "gates-failed", again["id"]: "landed"}, body
