"""Worker worktrees on real repositories: allocation, records, status, claims, cleanup, prune, pool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import CLI, git, run_json

from dagrunner.errors import DagrunnerError
from dagrunner.git.repo import repo_info
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import lifecycle


@pytest.fixture
def project(repo: Path) -> Path:
    """A repository with spaces, non-ASCII names, a binary file, nested folders and an ignored .env."""
    (repo / "dir with space" / "nested" / "deeper").mkdir(parents=True)
    (repo / "dir with space" / "nested" / "deeper" / "é-file.txt").write_text("accented\n")
    (repo / "image.bin").write_bytes(bytes(range(256)) * 8)
    (repo / ".gitignore").write_text("reports/\n.env\nbuild/\n")
    (repo / ".worktreeinclude").write_text(".env\n")
    (repo / ".env").write_text("TOKEN=local\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "layout")
    return repo


def alloc(repo: Path, worker: str = "w1", **kw: Any) -> dict[str, Any]:
    return wt.allocate(mission="m", worker=worker, repo=repo, **kw)


def commit_all(path: Path, message: str = "work") -> None:
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", message)


def error_of(call: Any) -> DagrunnerError:
    with pytest.raises(DagrunnerError) as info:
        call()
    return info.value


def slow_joins() -> bool:
    """The cgroup2 mount lacks favordynmods (read from /proc/mounts, not doctor's source)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return "favordynmods" not in fields[3].split(",")
    return False


def test_doctor_reports_each_check(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body = run_json(capsys, "doctor", "--repo", str(project))
    assert code == 0 and body["ok"]
    checks = {f["check"]: f["level"] for f in body["findings"]}
    contained = body["containment"]["pid_namespace"] or body["containment"]["cgroup_kill"]
    assert checks == {
        "git": "PASS",
        "repository": "PASS",
        "bare": "PASS",
        "worktrees": "PASS",
        "git-config": "PASS",
        "containment": "PASS" if contained else "WARN",
        "network": "PASS" if body["network_isolation"] else "NOTE",
        "observe": "PASS" if body["reads_observed"] else "NOTE",
        "root": "PASS",
        "disk": "PASS",
        "seeds": "NOTE" if body["seed_share"] == "copy" else "PASS",
        "gate layers": "PASS" if body["gate_layers"] else "NOTE",
    } | ({"cgroup-join": "NOTE"} if body["containment"]["cgroup_kill"] and slow_joins() else {}) | (
        {"bubblewrap": "NOTE"} if body["containment"]["views_by"] == "mount" else {}
    )
    assert body["worktree_root"].startswith(os.environ["DAGRUNNER_WORKTREE_ROOT"])
    assert body["seed_share"] in ("reflink", "overlay", "copy")


def test_root_inside_repo_is_refused_and_nothing_written(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGRUNNER_WORKTREE_ROOT", str(project / "trees"))
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    code, body = run_json(
        capsys, "worktree", "allocate", "--mission", "m", "--worker", "w", "--repo", str(project)
    )
    assert code == 3 and body["error"]["code"] == "unsafe-root"
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before
    code, body = run_json(capsys, "doctor", "--repo", str(project))
    assert code == 3 and any(
        f["level"] == "FAIL" and f["check"] == "root" for f in body["findings"]
    )
    monkeypatch.setenv("DAGRUNNER_ALLOW_IN_REPO_WORKTREES", "1")
    assert alloc(project)["path"].startswith(str(project / "trees"))


def test_allocate_creates_a_locked_claimed_worktree(project: Path) -> None:
    info = alloc(project, session="s1")
    path = Path(info["path"])
    assert info["branch"] == "dagrunner/m/w1" and info["session"] == "s1"
    assert info["base"] == git(project, "rev-parse", "HEAD").strip()
    assert (
        path / "dir with space" / "nested" / "deeper" / "é-file.txt"
    ).read_text() == "accented\n"
    assert (path / "image.bin").read_bytes() == (project / "image.bin").read_bytes()
    assert (path / ".env").read_text() == "TOKEN=local\n" and info["copied"] == [".env"]
    listing = git(project, "worktree", "list", "--porcelain")
    block = listing.split(f"worktree {path}\n")[1].split("\n\n")[0]
    assert "locked dagrunner: m/w1" in block
    assert git(project, "status", "--porcelain") == ""  # the main checkout is untouched
    # idempotent for the same session (and for no session)
    again = alloc(project, session="s1")
    assert again["path"] == info["path"] and again["reused"] is True
    events = [e["event"] for e in wt.open_context(project).ledger.events()]
    assert events.count("allocated") == 1


def test_other_session_stray_dir_foreign_branch_and_bad_names(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alloc(project, session="s1")
    code, body = run_json(
        capsys,
        "worktree",
        "allocate",
        "--mission",
        "m",
        "--worker",
        "w1",
        "--session",
        "s2",
        "--repo",
        str(project),
    )
    assert code == 4 and body["error"]["code"] == "claimed" and "s1" in body["error"]["message"]
    stray = wt.open_context(project).root / "m" / "stray"
    stray.mkdir(parents=True)
    (stray / "mine.txt").write_text("do not touch")
    assert error_of(lambda: alloc(project, "stray")).code == "path-occupied"
    assert (stray / "mine.txt").read_text() == "do not touch"
    git(project, "branch", "dagrunner/m/taken")
    assert error_of(lambda: alloc(project, "taken")).code == "branch-exists"
    assert error_of(lambda: alloc(project, "-x")).code == "bad-name"
    for bad in ("../x", "a b", "x.lock", "", "a/b"):
        code, body = run_json(
            capsys,
            "worktree",
            "allocate",
            "--mission",
            "m",
            "--worker",
            bad,
            "--repo",
            str(project),
        )
        assert code == 2 and body["error"]["code"] == "bad-name"
    assert error_of(lambda: alloc(project, "w9", base="no-such-ref")).code == "bad-base"


def test_dirty_main_checkout_is_reported_and_kept(project: Path) -> None:
    (project / "README").write_text("local edit\n")
    info = alloc(project)
    assert info["main_checkout_dirty"] is True and "not in this worktree" in info["note"]
    assert (project / "README").read_text() == "local edit\n"
    assert (Path(info["path"]) / "README").read_text() == "hello\n"


def test_allocate_reads_the_users_checkout_without_taking_its_index_lock(project: Path) -> None:
    """git status refreshes a stale index under .git/index.lock unless optional locks are
    off: an allocate killed there left the lock, and the user's next git add failed."""
    index = project / ".git" / "index"
    stamp = index.stat().st_mtime_ns - 5_000_000_000
    os.utime(project / "README", ns=(stamp + 10_000_000_000,) * 2)  # stat-dirty, same bytes
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    info = alloc(project)
    assert info["main_checkout_dirty"] is False
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before


def test_worktreeinclude_never_overwrites_a_tracked_file(project: Path) -> None:
    (project / ".worktreeinclude").write_text(".env\nREADME\nlocal.cfg\n")
    (project / "local.cfg").write_text("untracked config\n")
    info = alloc(project)
    assert sorted(info["copied"]) == [".env", "local.cfg"]
    assert (Path(info["path"]) / "README").read_text() == "hello\n"


def test_failing_setup_removes_the_worktree(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body = run_json(
        capsys,
        "worktree",
        "allocate",
        "--mission",
        "m",
        "--worker",
        "w1",
        "--repo",
        str(project),
        "--setup",
        "true",
        "--setup",
        f"{sys.executable} -c \"print('boom happened'); raise SystemExit(3)\"",
    )
    assert code == 1 and body["error"]["code"] == "setup-failed"
    assert "boom happened" in body["error"]["details"]["output_tail"]
    assert not (wt.open_context(project).root / "m" / "w1").exists()
    assert "dagrunner/m/w1" not in git(project, "branch", "--list")
    assert lifecycle.list_worktrees(repo=project) == []


def test_twenty_concurrent_allocations(project: Path) -> None:
    procs = [
        subprocess.Popen(
            [
                *CLI,
                "worktree",
                "allocate",
                "--mission",
                "swarm",
                "--worker",
                f"w{i:02d}",
                "--session",
                f"s{i}",
                "--json",
            ],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(20)
    ]
    paths = set()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        paths.add(orjson.loads(out)["path"])
    assert len(paths) == 20
    ledger = wt.open_context(project).ledger
    lines = ledger.path.read_bytes().splitlines()
    assert all(orjson.loads(line) for line in lines)  # no torn line
    assert sum(1 for e in ledger.events() if e["event"] == "allocated") == 20
    assert len(lifecycle.list_worktrees(repo=project)) == 20
    assert git(project, "worktree", "list").count("locked") == 20


def test_status_counts_and_state(project: Path) -> None:
    path = Path(alloc(project)["path"])
    (path / "README").write_text("changed\n")
    (path / "image.bin").write_bytes(b"\x00new")
    git(path, "add", "image.bin")
    (path / "untracked é.txt").write_text("u\n")
    info = lifecycle.status("m/w1", repo=project)
    assert (info["staged"], info["unstaged"], info["untracked"]) == (1, 1, 1)
    assert info["clean"] is False and info["ahead"] == 0 and info["behind"] == 0
    assert "2 files changed" in info["diffstat"]
    # nothing committed yet: the reason says so (its work is `clean: false`, not landed)
    assert info["integrated"] is True
    assert info["integrated_reason"] == "nothing committed: its head is its base"
    git(path, "reset", "-q", "--hard")
    (path / "untracked é.txt").unlink()
    (path / "a.txt").write_text("a\n")
    commit_all(path)
    (project / "main.txt").write_text("m\n")
    commit_all(project, "main moves")
    info = lifecycle.status("m/w1", repo=project)
    assert (info["ahead"], info["behind"]) == (1, 1)
    assert (
        info["integrated"] is False and "1 commit(s) not on the target" in info["integrated_reason"]
    )


def test_merge_in_progress_is_seen(project: Path) -> None:
    path = Path(alloc(project)["path"])
    (path / "README").write_text("worker\n")
    commit_all(path)
    (project / "README").write_text("main\n")
    commit_all(project, "main edit")
    with pytest.raises(subprocess.CalledProcessError):  # a conflict: the merge stops half-way
        git(path, "merge", "-q", "main")
    info = lifecycle.status("m/w1", repo=project)
    assert info["merge_in_progress"] is True and info["clean"] is False and info["unmerged"] == 1


@pytest.mark.parametrize("landing", ["merge", "rebase", "squash"])
def test_landed_branch_reads_as_landed(project: Path, landing: str) -> None:
    path = Path(alloc(project)["path"])
    (path / "one.txt").write_text("1\n")
    commit_all(path, "one")
    (path / "two.txt").write_text("2\n")
    commit_all(path, "two")
    (project / "other.txt").write_text("main\n")
    commit_all(project, "main moves")
    if landing == "merge":
        git(project, "merge", "-q", "--no-edit", "dagrunner/m/w1")
    elif landing == "rebase":
        git(project, "cherry-pick", "main..dagrunner/m/w1")
    else:
        git(project, "merge", "-q", "--squash", "dagrunner/m/w1")
        commit_all(project, "squashed")
    info = lifecycle.status("m/w1", repo=project)
    assert info["integrated"] is True, info["integrated_reason"]
    expected = {"merge": "ancestor", "rebase": "same patches", "squash": "squashed onto"}[landing]
    assert expected in info["integrated_reason"]
    assert lifecycle.cleanup("m/w1", repo=project)["branch_deleted"] is True


def test_a_textconv_rendering_never_passes_unlanded_work_off_as_landed(
    project: Path, tmp_path: Path
) -> None:
    """With a user's textconv driver, which the worker's ``.gitattributes`` selects, two
    different contents can render alike: the patches compared must be the bytes, or cleanup
    would take the worker's own text for the target's and delete it."""
    upper = tmp_path / "upper"
    upper.write_text('#!/bin/sh\ntr a-z A-Z < "$1"\n')
    upper.chmod(0o755)
    Path(os.environ["HOME"], ".gitconfig").write_text(f'[diff "upper"]\n\ttextconv = {upper}\n')
    path = Path(alloc(project)["path"])
    for tree, text in (
        (path, "only the worker wrote this\n"),
        (project, "ONLY THE WORKER WROTE THIS\n"),
    ):
        (tree / ".gitattributes").write_text("*.txt diff=upper\n")
        (tree / "notes.txt").write_text(text)
        commit_all(tree, "notes")
    info = lifecycle.status("m/w1", repo=project)
    assert info["integrated"] is False, info["integrated_reason"]
    with pytest.raises(DagrunnerError):
        lifecycle.cleanup("m/w1", repo=project)
    assert (path / "notes.txt").read_text() == "only the worker wrote this\n"


def test_missing_directory_is_reconciled(project: Path) -> None:
    import shutil

    path = Path(alloc(project)["path"])
    shutil.rmtree(path)
    info = lifecycle.status("m/w1", repo=project)
    assert info["missing"] is True
    assert any(e["event"] == "missing" for e in wt.open_context(project).ledger.events())


def test_claim_and_release_rules(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alloc(project, session="s1")
    code, body = run_json(
        capsys, "worktree", "claim", "m/w1", "--session", "s2", "--repo", str(project)
    )
    assert code == 4 and body["error"]["details"]["owner"] == "s1"
    code, body = run_json(
        capsys, "worktree", "release", "m/w1", "--session", "s2", "--repo", str(project)
    )
    assert code == 4 and body["error"]["code"] == "not-owner"
    assert wt.release("m/w1", session="s1", repo=project)["previous"] == "s1"
    assert wt.claim("m/w1", session="s2", repo=project)["previous"] is None
    assert wt.claim("m/w1", session="s3", force=True, repo=project)["previous"] == "s2"
    assert lifecycle.status("m/w1", repo=project)["session"] == "s3"


def test_cleanup_retains_work_and_force_backs_it_up(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Path(alloc(project)["path"])
    (path / "precious.txt").write_text("only copy\n")
    code, body = run_json(capsys, "worktree", "cleanup", "m/w1", "--repo", str(project))
    assert code == 4 and body["error"]["code"] == "retained"
    lock = Path(body["error"]["file"])
    assert "untracked" in orjson.loads(lock.read_bytes())["why"]
    assert (path / "precious.txt").exists()
    commit_all(path)
    code, body = run_json(capsys, "worktree", "cleanup", "m/w1", "--repo", str(project))
    assert code == 4 and "not landed" in body["error"]["message"]
    (path / "more.txt").write_text("uncommitted\n")
    result = lifecycle.cleanup("m/w1", force=True, repo=project)
    assert not path.exists() and not lock.exists()
    backup = result["backup"]["commit"]
    names = git(project, "ls-tree", "-r", "--name-only", backup).split("\n")
    assert "precious.txt" in names and "more.txt" in names
    assert git(project, "rev-parse", result["backup"]["ref"]).strip() == backup


def test_cleanup_refuses_a_worktree_in_use(project: Path) -> None:
    path = Path(alloc(project)["path"])
    proc = subprocess.Popen(["sleep", "60"], cwd=path)
    try:
        err = error_of(lambda: lifecycle.cleanup("m/w1", force=True, repo=project))
        assert err.code == "in-use" and proc.pid in err.details["pids"]
        assert path.exists()
    finally:
        proc.kill()
        proc.wait()


def test_prune(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    monkeypatch.setenv("DAGRUNNER_POOL_SIZE", "0")
    gone = Path(alloc(project, "gone")["path"])
    landed = Path(alloc(project, "landed")["path"])
    dirty = Path(alloc(project, "dirty")["path"])
    idle = Path(alloc(project, "idle")["path"])
    claimed = Path(alloc(project, "claimed", session="busy")["path"])
    (claimed / "x.txt").write_text("x\n")
    commit_all(claimed)
    shutil.rmtree(gone)
    (dirty / "wip.txt").write_text("wip\n")
    (idle / "feature.txt").write_text("f\n")
    commit_all(idle)
    del landed
    code, plan = run_json(capsys, "worktree", "prune", "--dry-run", "--repo", str(project))
    assert code == 0 and plan["dry_run"] is True
    assert gone.parent.joinpath("landed").exists()
    code, body = run_json(capsys, "worktree", "prune", "--idle", "0", "--repo", str(project))
    removed = {item["id"]: item for item in body["removed"]}
    retained = {item["id"]: item["reason"] for item in body["retained"]}
    assert set(removed) == {"m/gone", "m/landed", "m/idle"}
    assert retained == {"m/dirty": "uncommitted work", "m/claimed": "claimed by session 'busy'"}
    assert removed["m/idle"]["branch_kept"] == "dagrunner/m/idle"
    assert "dagrunner/m/idle" in git(project, "branch", "--list")  # its commit is not lost
    assert "dagrunner/m/landed" not in git(project, "branch", "--list")
    assert {w["id"] for w in lifecycle.list_worktrees(repo=project)} == {"m/dirty", "m/claimed"}


def test_pooled_allocation_is_like_a_fresh_one(project: Path) -> None:
    first = Path(alloc(project)["path"])
    (first / "build").mkdir()
    (first / "build" / "artifact.o").write_text("ignored output\n")
    assert lifecycle.cleanup("m/w1", repo=project)["action"] == "pooled"
    (project / "later.txt").write_text("later\n")
    commit_all(project, "later")
    info = alloc(project, "w2")
    path = Path(info["path"])
    assert info["pooled"] is True
    assert git(path, "rev-parse", "HEAD").strip() == git(project, "rev-parse", "HEAD").strip()
    assert git(path, "symbolic-ref", "--short", "HEAD").strip() == "dagrunner/m/w2"
    ignored = git(path, "status", "--porcelain", "--ignored", "--untracked-files=all")
    assert ignored == "!! .env\n"  # only what .worktreeinclude names
    assert (path / "later.txt").read_text() == "later\n"
    assert "locked dagrunner: m/w2" in git(project, "worktree", "list", "--porcelain")
    assert repo_info(project).common_dir == repo_info(path).common_dir


@pytest.mark.parametrize("pooled", [True, False])
def test_an_allocation_killed_midway_never_wedges_its_worker(project: Path, pooled: bool) -> None:
    """SIGKILL after the pooled worktree moved into place (or after `worktree add`), before
    the ledger says allocated: the next allocate finishes the job, where every later one
    once said path-occupied for good."""
    if pooled:
        alloc(project, "w0")
        assert lifecycle.cleanup("m/w0", repo=project)["action"] == "pooled"
    argv = [*CLI, "worktree", "allocate", "--mission", "m", "--worker", "w1", "--json"]
    env = {**os.environ, "DAGRUNNER_CRASH_AT": "allocating"}
    killed = subprocess.run(argv, cwd=project, env=env, capture_output=True, check=False)
    assert killed.returncode == -9
    path = wt.open_context(project).root / "m" / "w1"
    assert path.is_dir()  # what the killed allocation left
    again = subprocess.run(argv, cwd=project, capture_output=True, check=False)
    assert again.returncode == 0, again.stdout
    made = orjson.loads(again.stdout)
    assert made["path"] == str(path) and made["branch"] == "dagrunner/m/w1"
    assert git(path, "status", "--porcelain") == ""
    assert lifecycle.cleanup("m/w1", repo=project)["action"] in ("pooled", "removed")
    assert not (project / ".git" / "index.lock").exists()


def test_prune_reclaims_an_allocation_killed_midway(project: Path) -> None:
    argv = [*CLI, "worktree", "allocate", "--mission", "m", "--worker", "w1", "--json"]
    env = {**os.environ, "DAGRUNNER_CRASH_AT": "allocating"}
    subprocess.run(argv, cwd=project, env=env, capture_output=True, check=False)
    path = wt.open_context(project).root / "m" / "w1"
    assert path.is_dir()
    pruned = lifecycle.prune(repo=project)
    assert {"id": "m/w1", "action": "remove", "reason": "allocation killed"} in pruned["removed"]
    assert not path.exists() and "dagrunner/m/w1" not in git(project, "branch", "--list")
    assert lifecycle.prune(repo=project)["removed"] == []  # reclaimed once


def test_a_killed_allocation_with_changes_in_its_folder_keeps_them(project: Path) -> None:
    argv = [*CLI, "worktree", "allocate", "--mission", "m", "--worker", "w1", "--json"]
    env = {**os.environ, "DAGRUNNER_CRASH_AT": "allocating"}
    subprocess.run(argv, cwd=project, env=env, capture_output=True, check=False)
    path = wt.open_context(project).root / "m" / "w1"
    (path / "somebody's.txt").write_text("written there after all\n")
    again = subprocess.run(argv, cwd=project, capture_output=True, check=False)
    assert again.returncode == 4 and orjson.loads(again.stdout)["error"]["code"] == "path-occupied"
    assert (path / "somebody's.txt").read_text() == "written there after all\n"


def test_vanished_worktree_is_restored_from_its_branch(project: Path) -> None:
    import shutil

    path = Path(alloc(project, session="s1")["path"])
    (path / "kept.txt").write_text("committed work\n")
    commit_all(path)
    shutil.rmtree(path)
    assert lifecycle.status("m/w1", repo=project)["missing"] is True
    again = alloc(project, session="s1")
    assert again["restored"] is True and again["path"] == str(path)
    assert (path / "kept.txt").read_text() == "committed work\n"
    assert lifecycle.status("m/w1", repo=project)["missing"] is False


def test_list_says_landed_only_when_all_the_work_landed(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dagrunner.cli.main import run_cli
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.run import integrate
    from dagrunner.integration.submit import submit

    assert run_cli(["worktree", "list", "--repo", str(project)]) == 0
    assert "no worktrees are recorded" in capsys.readouterr().out
    edited = Path(alloc(project, "edited")["path"])
    (edited / "draft.txt").write_text("uncommitted\n")
    committed = Path(alloc(project, "committed")["path"])
    (committed / "work.txt").write_text("committed\n")
    commit_all(committed)
    alloc(project, "idle")  # nothing done in it (round 15: it read "landed")
    for name, text in (("first", "one\n"), ("second", "two\n")):
        path = Path(alloc(project, name, session=name)["path"])
        (path / "README").write_text(text)
        exporting.export(f"m/{name}", output=tmp_path / f"{name}.json", repo=project)
    submit(repo_info(project), [tmp_path / "first.json", tmp_path / "second.json"])
    (tmp_path / "gates.toml").write_text('[gates.ok]\nrun = ["true"]\n')
    integrate(repo=project, manifest=tmp_path / "gates.toml")
    assert run_cli(["worktree", "list", "--repo", str(project)]) == 0
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()}
    assert rows["m/edited"] == "uncommitted"
    assert rows["m/committed"] == "committed-not-landed"
    assert rows["m/idle"] == "nothing-committed"
    assert rows["m/second"] == "conflict"
    assert "m/first" not in rows  # landed and cleaned


def test_a_worker_that_points_its_git_file_at_the_repository_touches_nothing_there(
    project: Path,
) -> None:
    """A worker rewrites its ``.git`` to name the user's repository; cleanup's checkout and
    reset would then move the user's HEAD.  Its link is restored from git's registry first."""
    path = Path(alloc(project)["path"])
    head_before = git(project, "symbolic-ref", "HEAD").strip()
    (path / ".git").write_text(f"gitdir: {project / '.git'}\n")
    cleaned = lifecycle.cleanup("m/w1", repo=project)
    assert cleaned["action"] in ("pooled", "removed")
    assert git(project, "symbolic-ref", "HEAD").strip() == head_before == "refs/heads/main"
    assert git(project, "status", "--porcelain") == ""
