"""Gates' own tool caches survive runs, outside the tree, per repository, gate and trust
tier (issue 35): pre-commit installs its hooks once, mypy and ruff start warm, and what an
envelope's gate wrote there is never read by a trusted run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check, commit_release_manifest, gate_results

from dagrunner.git.repo import repo_info, tool_cache_root
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting

COUNTER = """
[gates.warm]
run = "echo run >> \\"$XDG_CACHE_HOME/runs\\" && wc -l < \\"$XDG_CACHE_HOME/runs\\" && test -n \\"$PRE_COMMIT_HOME\\" && test -n \\"$MYPY_CACHE_DIR\\""
"""


def runs_seen(run_dir: Path) -> int:
    return int((run_dir / "logs" / "warm.log").read_text().split()[0])


def test_a_gates_tool_cache_is_kept_between_runs_outside_the_tree(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = []
    for _ in range(2):
        code, body, run_dir = check(capsys, repo, COUNTER, "--no-cache")
        assert code == 0, body
        assert gate_results(run_dir)["warm"]["status"] == "passed"
        seen.append(runs_seen(run_dir))
    assert seen == [1, 2]
    kept = list(tool_cache_root().glob("*/trusted/warm/runs"))
    assert len(kept) == 1 and repo not in kept[0].parents


def test_what_an_envelopes_gate_wrote_is_never_read_by_a_trusted_run(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_release_manifest(repo, COUNTER)
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    (path / "x.txt").write_text("x\n")
    out = path.parent / "w.json"
    exporting.export("m/w", output=out, repo=repo)
    submit(repo_info(repo), [out])
    assert [o.state for o in integrate(repo=repo, window=1).envelopes] == ["landed"]
    assert len(list(tool_cache_root().glob("*/untrusted/warm/runs"))) == 1
    code, body, run_dir = check(capsys, repo, COUNTER, "--no-cache")
    assert code == 0, body
    assert runs_seen(run_dir) == 1  # the trusted tier starts empty
