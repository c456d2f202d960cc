"""Gates' own tool caches survive runs, outside the tree, per repository, gate and trust
tier (issue 35): pre-commit installs its hooks once, mypy and ruff start warm, and what an
envelope's gate wrote there is never read by a trusted run."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import can_mount, check, commit_release_manifest, gate_results, git

from dagrunner.git.repo import repo_info, tool_cache_root
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import lifecycle

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


def test_an_envelopes_gate_starts_from_the_trusted_tier_and_never_writes_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_release_manifest(repo, COUNTER)
    code, body, run_dir = check(capsys, repo, COUNTER, "--no-cache")
    assert code == 0 and runs_seen(run_dir) == 1, body
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    (path / "x.txt").write_text("x\n")
    out = path.parent / "w.json"
    exporting.export("m/w", output=out, repo=repo)
    submit(repo_info(repo), [out])
    result = integrate(repo=repo, window=1)
    assert [o.state for o in result.envelopes] == ["landed"]
    # warm: it saw the trusted run's line, and added its own in a layer of its own
    assert [runs_seen(p) for p in Path(result.report_dir).glob("gates-*")] == [2]
    assert private_layers() == []  # that layer went with its run
    code, body, run_dir = check(capsys, repo, COUNTER, "--no-cache")
    assert code == 0, body
    assert runs_seen(run_dir) == 2  # the trusted tier holds the trusted runs' lines only


# A gate that runs what its tool cache holds, as pre-commit runs its installed hooks: a
# hook there answers for the gate, else the tree's own check runs.
HOOKED = """
[gates.check]
run = "if [ -x \\"$PRE_COMMIT_HOME/hook.sh\\" ]; then exec \\"$PRE_COMMIT_HOME/hook.sh\\"; fi; sh ./check.sh"
"""
CHECK = "! grep -rqs BROKEN --include=*.txt .\n"


def planter(answer: str, then: str = "exit 1") -> str:
    """A check.sh that leaves a hook answering ``answer`` in the gate's tool cache."""
    return (
        'mkdir -p "$PRE_COMMIT_HOME"\n'
        f"printf '#!/bin/sh\\n{answer}\\n' > \"$PRE_COMMIT_HOME/hook.sh\"\n"
        'chmod +x "$PRE_COMMIT_HOME/hook.sh"\n'
        f"{then}\n"
    )


def hooked(repo: Path, setting: str = "") -> None:
    (repo / "check.sh").write_text(CHECK)
    git(repo, "add", "check.sh")
    commit_release_manifest(repo, setting + HOOKED)


def envelope(repo: Path, name: str, files: dict[str, str]) -> Path:
    path = Path(wt.allocate(mission="m", worker=name, repo=repo, session=name)["path"])
    for rel, text in files.items():
        (path / rel).write_text(text)
    out = path.parent / f"{name}.json"
    exporting.export(f"m/{name}", output=out, repo=repo)
    return out


def integrate_one(repo: Path, out: Path) -> str:
    submit(repo_info(repo), [out])
    return [o.state for o in integrate(repo=repo, window=1).envelopes][-1]


def private_layers() -> list[Path]:
    return list((tool_cache_root() / "private").glob("run-*"))


@pytest.mark.parametrize("how", ["copy", "overlay"])
def test_an_innocent_envelope_is_not_failed_by_a_hook_an_earlier_envelope_planted(
    repo: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "overlay" and not can_mount():
        pytest.skip("this process cannot mount")
    monkeypatch.setenv("DAGRUNNER_TOOL_SHARE", how)
    hooked(repo)
    assert integrate_one(repo, envelope(repo, "hostile", {"check.sh": planter("exit 1")})) == (
        "gates-failed"
    )
    assert integrate_one(repo, envelope(repo, "innocent", {"x.txt": "x\n"})) == "landed"
    assert private_layers() == []  # each run's layer went with it


def test_a_broken_envelope_is_not_passed_by_a_hook_an_earlier_envelope_planted(
    repo: Path,
) -> None:
    hooked(repo)
    assert integrate_one(repo, envelope(repo, "hostile", {"check.sh": planter("exit 0")})) == (
        "gates-failed"
    )
    assert integrate_one(repo, envelope(repo, "broken", {"bad.txt": "BROKEN\n"})) == (
        "gates-failed"
    )


def test_the_differential_baselines_head_run_does_not_see_what_an_envelopes_gate_wrote(
    repo: Path,
) -> None:
    hooked(repo, '[integrate]\nbaseline = "differential"\nbatch = 1\n')  # one run, one by one
    hostile = envelope(repo, "hostile", {"check.sh": planter("exit 1")})
    broken = envelope(repo, "broken", {"bad.txt": "BROKEN\n"})
    submit(repo_info(repo), [hostile])
    submit(repo_info(repo), [broken])
    result = integrate(repo=repo, window=1)
    # the broken one fails on its own; the target's head, gated for the baseline, must not
    # run the hook the hostile one planted (red, it would excuse the failure as the target's)
    assert [o.state for o in result.envelopes] == ["gates-failed", "gates-failed"]
    assert git(repo, "ls-tree", "--name-only", "main", "bad.txt").strip() == ""


@pytest.mark.parametrize("how", ["copy", "overlay"])
def test_a_worker_worktrees_release_check_cannot_plant_what_the_main_checkouts_runs(
    repo: Path, capsys: pytest.CaptureFixture[str], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "overlay" and not can_mount():
        pytest.skip("this process cannot mount")
    monkeypatch.setenv("DAGRUNNER_TOOL_SHARE", how)
    hooked(repo)
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    # in a main checkout (.git a folder) the hook writes the shared git dir: a branch
    plant = planter("if [ -d .git ]; then git branch planted; fi; exit 1", then="exit 0")
    (path / "check.sh").write_text(plant)
    code, body, _ = check(capsys, path, HOOKED, "--no-cache")
    assert code == 0, body
    code, body, _ = check(capsys, repo, HOOKED, "--no-cache")
    assert code == 0, body
    assert git(repo, "branch", "--list", "planted").strip() == ""
    (path / "check.sh").write_text(CHECK)  # its next check reads its own layer: the hook
    code, body, _ = check(capsys, path, HOOKED, "--no-cache")
    assert code == 1, body
    assert list((tool_cache_root() / "private").glob("tree-*"))
    lifecycle.cleanup("m/w", force=True, repo=repo)
    assert list((tool_cache_root() / "private").glob("tree-*")) == []  # dropped with it


def test_a_worktree_whose_git_file_names_the_main_git_dir_is_still_not_the_main_checkout(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooked(repo)
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    (path / "check.sh").write_text(planter("git branch planted; exit 1", then="exit 0"))
    (path / ".git").write_text(f"gitdir: {repo / '.git'}\n")  # git now says: the main one
    code, body, _ = check(capsys, path, HOOKED, "--no-cache")
    assert code == 0, body
    code, body, _ = check(capsys, repo, HOOKED, "--no-cache")
    assert code == 0, body
    assert git(repo, "branch", "--list", "planted").strip() == ""


def turbo(gate: str, miss: str, extra: str = "") -> str:
    """A stand-in for turbo (2.8 and later), as documented: with no cache folder set, in a
    linked worktree it keeps its task cache in the main worktree's ``.turbo/cache``, not the
    tree's (a relative ``TURBO_CACHE_DIR`` is the tree's own); a task found there is
    replayed, not run; one run is cached.  ``miss``: what the task runs."""
    return f"""
[gates.{gate}]
{extra}run = '''top=$(git rev-parse --show-toplevel); \\
common=$(git rev-parse --path-format=absolute --git-common-dir); \\
cache=${{TURBO_CACHE_DIR:-$(dirname "$common")/.turbo/cache}}; \\
case $cache in /*) ;; *) cache=$top/$cache;; esac; \\
if [ -f "$cache/build" ]; then exec sh "$cache/build"; fi; \\
{miss} && mkdir -p "$cache" && echo 'exit 0' > "$cache/build"'''
"""


def test_a_workers_check_is_never_answered_by_the_main_checkouts_turbo_cache(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Round 9 of docs/real-projects.md: turbo in a linked worktree replays the main
    checkout's task cache, which every worker's own turbo run writes too; a worker's
    release-check must run its tree's own tasks, as a fresh clone would.  (A checkout
    under /tmp or a home is out of a gate's sight anyway: this one is not.)"""
    place = next(
        (Path(p) for p in ("/var/cache", "/var/lib", "/srv", "/opt") if _writable(p)), None
    )
    if place is None:
        pytest.skip("needs a writable folder outside the view's covers (CI runs as root)")
    repo = Path(tempfile.mkdtemp(prefix="dagrunner-test-turbo-", dir=place))
    try:
        git(repo, "init", "-q", "-b", "main")
        (repo / ".gitignore").write_text("reports/\n.turbo/\n")
        hooked(repo)
        manifest = turbo("build", "sh ./check.sh")
        commit_release_manifest(repo, manifest)
        code, body, _ = check(capsys, repo, manifest, "--no-cache")
        assert code == 0, body
        assert (repo / ".turbo" / "cache" / "build").is_file()  # the main checkout's own
        path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
        (path / "bad.txt").write_text("BROKEN\n")
        code, body, _ = check(capsys, path, manifest, "--no-cache")
        assert code == 1, body  # replayed from the main checkout's cache, it passed
    finally:
        lifecycle.cleanup("m/w", force=True, repo=repo)
        shutil.rmtree(repo, ignore_errors=True)


def _writable(folder: str) -> bool:
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


def test_what_a_gates_turbo_cached_in_an_envelopes_tree_reaches_the_gates_that_need_it(
    repo: Path,
) -> None:
    """In an envelope's tree turbo's cache is the tree's own, on the gate's layer: the tests
    replay the build their gate needs, as in one CI job, not build it again (or, with the
    checkout concealed, cache into the gate's private /tmp and lose it)."""
    (repo / ".gitignore").write_text("reports/\n.turbo/\n")
    git(repo, "add", ".gitignore")
    hooked(repo)
    manifest = turbo("build", "sh ./check.sh") + turbo(
        "test",
        "echo 'built again: the build gate left no cache here'; false",
        'needs = ["build"]\n',
    )
    commit_release_manifest(repo, manifest)
    submit(repo_info(repo), [envelope(repo, "w", {"x.txt": "x\n"})])
    result = integrate(repo=repo, window=1)
    assert [o.state for o in result.envelopes] == ["landed"], result.target_red
