"""Workers, integrate and land as DAG nodes: the swarm demo, a failing gate, and manifest rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import check, commit_release_manifest, gate_results, git, run_json, write_manifest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def demo(repo: Path) -> Path:
    """A scratch repository holding the demo's manifest, worker program and settings."""
    for rel in (
        "manifests/swarm-demo.toml",
        "gates/demo_worker.py",
        "manifests/swarm-demo/settings.txt",
    ):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, repo / rel)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "demo")
    return repo


def test_swarm_demo_runs_workers_integrates_gates_and_lands(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = git(demo, "rev-parse", "main").strip()
    code, body = run_json(
        capsys, "release-check", "manifests/swarm-demo.toml", "--repo", str(demo), "--quiet"
    )
    assert code == 0, body
    statuses = {g["id"]: g["status"] for g in body["gates"]}
    assert statuses == dict.fromkeys(
        ["docs", "feature", "tune-a", "tune-b", "main", "settings", "land:main"], "passed"
    )
    outcome = {e["worker"]: e["state"] for e in body["integration"]["envelopes"]}
    assert sorted(outcome.values()) == ["conflict", "landed", "landed", "landed"]
    assert outcome["docs"] == outcome["feature"] == "landed"
    assert {outcome["tune-a"], outcome["tune-b"]} == {"landed", "conflict"}
    # the target moved, the main checkout followed and is clean, the gate's view is what landed
    assert git(demo, "rev-parse", "main~3").strip() == start
    assert git(demo, "status", "--porcelain") == ""
    assert (demo / "manifests/swarm-demo/NOTES.md").exists()
    assert (demo / "manifests/swarm-demo/feature.py").exists()
    assert (demo / "manifests/swarm-demo/settings.txt").read_text().split("\n")[0] in (
        "threads = 8",
        "threads = 16",
    )
    html = (Path(body["run_dir"]) / "index.html").read_text()
    assert 'id="integration"' in html


def test_failing_gate_skips_the_landing(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "value.txt").write_text("ok\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "value")
    start = git(repo, "rev-parse", "main").strip()
    code, body, run_dir = check(
        capsys,
        repo,
        """
        [workers.good]
        run = "echo fine > good.txt"
        [workers.bad]
        run = "echo BROKEN > value.txt"
        [integrate.main]
        needs = ["good", "bad"]
        [gates.verify]
        run = "! grep -q BROKEN value.txt"
        needs = ["main"]
        [land.main]
        needs = ["verify"]
    """,
    )
    assert code == 1
    results = gate_results(run_dir)
    assert results["verify"]["status"] == "failed"
    assert results["land:main"]["status"] == "skipped"
    assert git(repo, "rev-parse", "main").strip() == start
    states = {e["worker"]: e["state"] for e in body["integration"]["envelopes"]}
    assert states == {"good": "gates-failed", "bad": "gates-failed"}
    assert not (repo / "good.txt").exists()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            '[gates.g]\nrun = ["true"]\n[integrate.main]\nneeds = ["g"]\n',
            "an integrate node needs only workers",
        ),
        (
            '[gates.g]\nrun = ["true"]\n[land.main]\nneeds = ["g"]\n',
            "needs 'main', which is not defined",
        ),
        (
            '[workers.w]\nrun = ["true"]\n[gates.w]\nrun = ["true"]\n',
            "defined in [workers] and as a gate",
        ),
    ],
)
def test_swarm_manifest_rules(
    repo: Path, capsys: pytest.CaptureFixture[str], text: str, fragment: str
) -> None:
    path = write_manifest(repo, text)
    code, body = run_json(capsys, "graph", str(path))
    assert code == 2 and fragment in body["error"]["message"]


def test_worker_setup_runs_first_and_a_failing_one_fails_the_worker(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _body, run_dir = check(
        capsys,
        repo,
        """
        [workers.prepared]
        setup = ["touch prepared.flag"]
        run = "test -f prepared.flag && echo ready > ready.txt"
        [workers.broken]
        setup = ["false"]
        run = ["true"]
        [integrate.main]
        needs = ["prepared"]
    """,
    )
    results = gate_results(run_dir)
    assert results["prepared"]["status"] == "passed"
    assert results["broken"]["status"] == "failed"
    assert "setup-failed" in results["broken"]["reason"]
    assert code == 1


def test_swarm_demo_runs_again_in_the_same_copy(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["release-check", "manifests/swarm-demo.toml", "--repo", str(demo), "--quiet"]
    first, _ = run_json(capsys, *argv)
    second, body = run_json(capsys, *argv)
    assert first == 0 and second == 0, body
    outcome = {e["worker"]: e["state"] for e in body["integration"]["envelopes"]}
    assert outcome["docs"] == outcome["feature"] == "rejected"  # nothing new to land
    assert "conflict" in outcome.values()  # tune-b's retained worktree, reused, conflicts again
    assert git(demo, "status", "--porcelain") == ""


def test_verdict_names_envelopes_that_did_not_land(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dagrunner.cli.main import run_cli

    argv = ["release-check", "manifests/swarm-demo.toml", "--repo", str(demo), "--quiet"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "PASSED: 7 passed in " in out and "; envelopes: 3 landed, 1 conflict" in out


def test_an_integrated_tree_whose_own_seed_does_not_build_does_not_land(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round 16b, in the swarm's own integrate node: a worker's change of the seed's key file
    that its build refuses (``uv sync --locked`` on a stale lock) fails the integrate node,
    and its envelopes end ``gates-failed`` -- its gates ran without the seed, on the
    caller's tools, and passed."""
    (repo / ".gitignore").write_text("reports/\n.venv/\n")
    (repo / "lock").write_text("good\n")
    commit_release_manifest(
        repo,
        '[env]\npass = ["PATH"]\n[[worktrees.seed]]\npath = ".venv"\nkey = ["lock"]\n'
        'build = "grep -qx good lock && mkdir .venv"\n[gates.check]\nrun = ["true"]\n',
    )
    start = git(repo, "rev-parse", "main").strip()
    code, body, run_dir = check(
        capsys,
        repo,
        """
        [workers.bump]
        run = "echo bad > lock"
        [integrate.main]
        needs = ["bump"]
        [gates.verify]
        run = "true"
        needs = ["main"]
        [land.main]
        needs = ["verify"]
    """,
    )
    assert code == 1, body
    results = gate_results(run_dir)
    assert results["main"]["status"] == "failed", results["main"]
    assert "seed-build-failed" in results["main"]["reason"], results["main"]
    assert results["land:main"]["status"] == "skipped"
    assert git(repo, "rev-parse", "main").strip() == start
    states = {e["worker"]: e["state"] for e in body["integration"]["envelopes"]}
    assert states == {"bump": "gates-failed"}, states
