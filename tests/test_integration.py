"""The integration queue end to end on real repositories: apply, gate, land, bisect, recover."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import CLI, commit_release_manifest, git, run_json

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import TRAILER, integrate, integrator_lock
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import lifecycle


def worker(repo: Path, name: str, change: Any) -> Path:
    """Allocate, change, export; the envelope's path."""
    path = Path(wt.allocate(mission="swarm", worker=name, repo=repo, session=name)["path"])
    change(path)
    out = path.parent / f"{name}.envelope.json"
    exporting.export(f"swarm/{name}", output=out, repo=repo)
    return out


def independent_1(path: Path) -> None:
    (path / "feature-one.txt").write_text("one\n")


def independent_2(path: Path) -> None:
    (path / "shared.txt").write_text("one\nTWO from w2\nthree\n")
    git(path, "add", "shared.txt")
    git(path, "commit", "-q", "-m", "w2 edits line two")


def same_lines(path: Path) -> None:
    (path / "shared.txt").write_text("one\nTWO from w3\nthree\n")


def everything(path: Path) -> None:
    (path / "logo.bin").write_bytes(bytes(reversed(range(256))) * 4)
    git(path, "mv", "old name.txt", "new näme.txt")
    os.chmod(path / "run.sh", 0o755)
    (path / "obsolete.txt").unlink()
    (path / "docs").mkdir()
    (path / "docs" / "added one.txt").write_text("untracked 1\n")
    (path / "docs" / "added two.txt").write_text("untracked 2\n")


def breaks_gate(path: Path) -> None:
    (path / "bad.txt").write_text("BROKEN\n")


def states(repo: Path) -> dict[str, str]:
    return {e.id.split(".")[1]: e.state for e in Queue.of(repo_info(repo)).entries().values()}


def trailers(repo: Path) -> list[str]:
    log = git(repo, "log", f"--format=%(trailers:key={TRAILER},valueonly)", "main")
    return [line for line in log.split("\n") if line.strip()]


def expected_tree(repo: Path, base: str, envelopes: list[Path], tmp: Path) -> str:
    check = tmp / "expected"
    git(repo, "worktree", "add", "-q", "--detach", str(check), base)
    for path in envelopes:
        diff = orjson.loads(path.read_bytes())["diff"].encode()
        (tmp / "p.diff").write_bytes(diff)
        git(check, "apply", "--index", str(tmp / "p.diff"))
    return git(check, "write-tree").strip()


def test_five_workers_scenario(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = git(project, "rev-parse", "HEAD").strip()
    changes = {
        "w1": independent_1,
        "w2": independent_2,
        "w3": same_lines,
        "w4": everything,
        "w5": breaks_gate,
    }
    envelopes: dict[str, Path] = {}

    def run_worker(name: str) -> None:
        envelopes[name] = worker(project, name, changes[name])

    threads = [threading.Thread(target=run_worker, args=(name,)) for name in changes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(envelopes) == set(changes)
    submit(repo_info(project), [envelopes[n] for n in sorted(envelopes)])
    code, body = run_json(capsys, "integrate", "run", "--batch", "1", "--repo", str(project))
    assert code == 1, body  # w5's gates failed: the contract's exit 1
    assert states(project) == {
        "w1": "landed",
        "w2": "landed",
        "w3": "conflict",
        "w4": "landed",
        "w5": "gates-failed",
    }
    outcome = {e["worker"]: e for e in body["envelopes"]}
    assert outcome["w3"]["conflicts"] == ["shared.txt"] and "TWO from w3" in outcome["w3"]["hunks"]
    assert outcome["w5"]["failed_gates"] == ["check"] and Path(outcome["w5"]["report"]).is_dir()
    # 4 gate runs, and one more confirming w5's failure on the same tree
    assert outcome["w1"]["commit"] and body["gate_runs"] == 5 and body["confirm_runs"] == 1
    # the target holds exactly the landed work, and its gates pass there
    landed = [envelopes[n] for n in ("w1", "w2", "w4")]
    assert git(project, "rev-parse", "main^{tree}").strip() == expected_tree(
        project, base, landed, tmp_path
    )
    assert sorted(t.split(".")[1] for t in trailers(project)) == ["w1", "w2", "w4"]
    assert not (project / "bad.txt").exists()
    assert os.access(project / "run.sh", os.X_OK) and (project / "new näme.txt").exists()
    # the main checkout (target checked out, clean) ends clean at the new head
    assert git(project, "status", "--porcelain") == ""
    assert git(project, "rev-parse", "HEAD").strip() == body["end"]
    # landed workers are cleaned up; the others keep their work
    left = {w["id"] for w in lifecycle.list_worktrees(repo=project)}
    assert left == {"swarm/w3", "swarm/w5"}
    html = (Path(body["report_dir"]) / "gates-05" / "index.html").read_text()
    assert 'id="integration"' in html and "conflicting: shared.txt" in html


def test_dirty_target_checkout_refuses_landing(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = worker(project, "w1", independent_1)
    submit(repo_info(project), [envelope])
    (project / "shared.txt").write_text("my uncommitted edit\n")
    head = git(project, "rev-parse", "main").strip()
    code, body = run_json(capsys, "integrate", "run", "--repo", str(project))
    assert code == 1
    assert body["land_blocked"]["code"] == "target-checkout-dirty"
    assert (project / "shared.txt").read_text() == "my uncommitted edit\n"
    assert git(project, "rev-parse", "main").strip() == head
    assert states(project) == {"w1": "queued"}
    (project / "shared.txt").write_text("one\ntwo\nthree\n")
    assert integrate(repo=project).ok and states(project) == {"w1": "landed"}


def test_duplicate_submission_queues_once(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = worker(project, "w1", independent_1)
    code, body = run_json(
        capsys, "integrate", "submit", str(envelope), str(envelope), "--repo", str(project)
    )
    assert code == 0
    assert [s["duplicate"] for s in body["submitted"]] == [False, True]
    code, body = run_json(capsys, "integrate", "submit", str(envelope), "--repo", str(project))
    assert body["submitted"][0]["duplicate"] is True and body["submitted"][0]["position"] == 1
    assert len(Queue.of(repo_info(project)).entries()) == 1


def test_a_submissions_position_counts_only_what_is_pending_ahead_of_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round 16 (rich): the only pending item was "queued at position 11": the count of every
    item the journal knows, the ten finished ones too.  It is its place among the target's
    pending items, as ``integrate status`` gives it."""
    first = worker(project, "w1", independent_1)
    submit(repo_info(project), [first])
    assert integrate(repo=project).ok and states(project) == {"w1": "landed"}
    envelopes = [
        worker(project, f"n{i}", lambda p, i=i: (p / f"n{i}.txt").write_text(f"{i}\n"))
        for i in (2, 3)
    ]
    code, body = run_json(
        capsys, "integrate", "submit", *map(str, envelopes), "--repo", str(project)
    )
    assert code == 0 and [s["position"] for s in body["submitted"]] == [1, 2], body
    code, body = run_json(capsys, "integrate", "submit", str(envelopes[1]), "--repo", str(project))
    assert body["submitted"][0]["duplicate"] is True and body["submitted"][0]["position"] == 2


def test_concurrent_submitters(project: Path) -> None:
    envelopes = [
        worker(project, f"w{i}", lambda p, i=i: (p / f"f{i}.txt").write_text(f"{i}\n"))
        for i in range(6)
    ]
    procs = [
        subprocess.Popen(
            [*CLI, "integrate", "submit", str(e), "--json"],
            cwd=project,
            stdout=subprocess.PIPE,
        )
        for e in envelopes + envelopes
    ]
    for proc in procs:
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    assert len(Queue.of(repo_info(project)).entries()) == 6


def test_batch_bisects_to_the_culprit(project: Path) -> None:
    names = ["b1", "b2", "b3", "b4"]
    changes = {
        "b1": independent_1,
        "b2": lambda p: (p / "two.txt").write_text("2\n"),
        "b3": lambda p: (p / "three.txt").write_text("3\n"),
        "b4": breaks_gate,
    }
    submit(repo_info(project), [worker(project, n, changes[n]) for n in names])
    result = integrate(repo=project, batch=4, window=1)
    assert states(project) == {"b1": "landed", "b2": "landed", "b3": "landed", "b4": "gates-failed"}
    # [b1..b4] fails and is split at once; [b1 b2] passes; [b3 b4] on it is the very tree
    # that failed (not gated), so it is split too: [b3] passes, and [b4] on it is that tree
    # again -- blamed after its one confirmation, the only one of the run; and the target's
    # head is gated once, after the first failure: it passes, so the failure is not its own
    assert result.gate_runs == 5 and result.confirm_runs == 1
    assert [str(r.verdict) for r in result.pipeline if not r.envelopes] == ["passed"]
    assert sorted(t.split(".")[1] for t in trailers(project)) == ["b1", "b2", "b3"]
    # the culprit's worktree is kept, and its outcome says so
    (b4,) = (e for e in result.envelopes if e.worker == "b4")
    assert b4.worktree == "retained: its envelope ended gates-failed", b4


def mover_gate(folder: Path, once: bool) -> str:
    """A gate that asks the test to move the target (a gate itself may not write the
    repository) and waits until it did; ``once``: only the first time."""
    guard = f"[ -e '{folder}/once' ] && exit 0; touch '{folder}/once'; " if once else ""
    wait = f"while [ ! -e '{folder}/moved' ]; do sleep 0.05; done; rm -f '{folder}/moved'"
    return f"""
[sandbox]
writable = ["{folder}"]

[gates.move-target]
run = "{guard}touch '{folder}/please'; {wait}"
"""


def move_on_request(repo: Path, folder: Path, stop: threading.Event) -> None:
    """Somebody else landing on the target whenever the gate asks."""
    while not stop.is_set():
        if (folder / "please").exists():
            (folder / "please").unlink()
            git(repo, "-c", "user.name=m", "-c", "user.email=m@m", "commit", "-q",
                "--allow-empty", "-m", "moved")  # fmt: skip
            (folder / "moved").touch()
        time.sleep(0.02)


@pytest.mark.parametrize("once", [True, False])
def test_target_moving_during_integration(project: Path, tmp_path: Path, once: bool) -> None:
    manifest = tmp_path / "mover.toml"
    sync = tmp_path / "sync"  # where the gate and the test meet (the gate may write it)
    sync.mkdir()
    manifest.write_text(mover_gate(sync, once))
    submit(repo_info(project), [worker(project, "w1", independent_1)])
    stop = threading.Event()
    mover = threading.Thread(target=move_on_request, args=(project, sync, stop))
    mover.start()
    try:
        result = integrate(repo=project, manifest=manifest)
    finally:
        stop.set()
        mover.join()
    if once:
        assert result.ok and result.rebuilds == 1
        assert states(project) == {"w1": "landed"}
        assert git(project, "log", "-1", "--format=%s", "main^").strip() == "moved"
        assert git(project, "status", "--porcelain") == ""
    else:
        assert result.target_moving and not result.ok
        assert states(project) == {"w1": "queued"}
        assert trailers(project) == []


def test_second_integrator_says_who_holds_the_lock(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = repo_info(project).state_dir / "integrate-main.lock"
    with integrator_lock(lock, wait=False):
        code, body = run_json(capsys, "integrate", "run", "--no-wait", "--repo", str(project))
    assert code == 4 and body["error"]["code"] == "integrator-busy"
    assert f"pid {os.getpid()}" in body["error"]["message"]


def test_envelope_tampered_in_the_queue_is_rejected(project: Path) -> None:
    envelope = worker(project, "w1", independent_1)
    (entry,) = submit(repo_info(project), [envelope])
    stored = Queue.of(repo_info(project)).envelope_path(entry.id)
    fields = orjson.loads(stored.read_bytes())
    fields["diff"] = fields["diff"].replace("+one", "+evil")
    stored.write_bytes(orjson.dumps(fields))
    result = integrate(repo=project)
    assert result.envelopes[0].state == "rejected"
    assert (result.envelopes[0].details.reason or "").startswith("envelope-hash")
    assert trailers(project) == []


@pytest.mark.slow
@pytest.mark.parametrize("point", ["applying", "gating", "landing", "landed-ref"])
def test_sigkill_then_rerun(project: Path, point: str) -> None:
    envelopes = [
        worker(project, f"k{i}", lambda p, i=i: (p / f"k{i}.txt").write_text(f"{i}\n"))
        for i in range(3)
    ]
    envelopes.append(worker(project, "kbad", breaks_gate))
    submit(repo_info(project), envelopes)
    crashed = subprocess.run(
        [*CLI, "integrate", "run", "--json"],
        cwd=project,
        env={**os.environ, "DAGRUNNER_CRASH_AT": point},
        capture_output=True,
        check=False,
    )
    assert crashed.returncode == -9, crashed.stderr.decode()
    rerun = subprocess.run(
        [*CLI, "integrate", "run", "--json"],
        cwd=project,
        capture_output=True,
        check=False,
    )
    assert rerun.returncode == 1, rerun.stderr.decode()  # kbad: gates failed
    assert states(project) == {
        "k0": "landed",
        "k1": "landed",
        "k2": "landed",
        "kbad": "gates-failed",
    }
    ids = trailers(project)
    assert len(ids) == len(set(ids)) == 3, f"duplicated or missing commits: {ids}"
    assert git(project, "status", "--porcelain") == ""
    assert git(project, "rev-parse", "HEAD").strip() == git(project, "rev-parse", "main").strip()
    gate = subprocess.run(
        ["sh", "-c", "! grep -rq BROKEN --include=*.txt ."], cwd=project, check=False
    )
    assert gate.returncode == 0


def cli_json(repo: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    done = subprocess.run([*CLI, *args, "--json"], cwd=repo, env=env, capture_output=True,
                          check=False)  # fmt: skip
    return done.returncode, orjson.loads(done.stdout) if done.stdout.strip() else None


@pytest.mark.parametrize("then", ["submitted-again", "never-again", "stuck-first"])
def test_a_submit_killed_before_its_line_still_names_its_worker(project: Path, then: str) -> None:
    """Issue 48's lost item: a submit killed after it stored the envelope, before it journaled
    the item's line (an MCP submit inside serve, serve's group SIGKILLed).  The stored
    envelope still reads as queued and lands, but with no line naming its mission and worker
    its item said neither: ``status`` showed a landed item of nobody's, and a client that
    submitted again (its answer lost) was told ``duplicate`` of it.  The item must name its
    worker whether the client submits again, nobody does, or an integrator that could not
    start wrote a ``stuck`` line of it first; and land once."""
    envelope = worker(project, "w1", independent_1)
    crash = {**os.environ, "DAGRUNNER_CRASH_AT": "submitting"}
    killed = subprocess.run([*CLI, "integrate", "submit", str(envelope), "--json"], cwd=project,
                            env=crash, capture_output=True, check=False)  # fmt: skip
    assert killed.returncode == -9, killed.stderr.decode()
    (item,) = Queue.of(repo_info(project)).entries()  # stored: it is on the queue
    if then == "submitted-again":
        code, body = cli_json(project, "integrate", "submit", str(envelope))
        assert code == 0, body
        (said,) = body["submitted"]
        assert (said["id"], said["duplicate"], said["state"]) == (item, False, "queued")
    if then == "stuck-first":  # no manifest on the target: the run cannot start
        manifest = (project / "manifests" / "release.toml").read_text()
        git(project, "rm", "-q", "manifests/release.toml")
        git(project, "commit", "-q", "-m", "no manifest")
        code, body = cli_json(project, "integrate", "run")
        assert code != 0 and Queue.of(repo_info(project)).entries()[item].details.stuck, body
        commit_release_manifest(project, manifest)
    code, body = cli_json(project, "integrate", "run")
    assert code == 0, body
    code, body = cli_json(project, "integrate", "status")
    (entry,) = body["envelopes"]
    assert (entry["id"], entry["state"]) == (item, "landed")
    assert (entry.get("mission"), entry.get("worker")) == ("swarm", "w1")
    assert entry.get("provenance") == "ledger" and entry.get("target") == "main"
    assert trailers(project) == [item]


def test_a_line_a_killed_writer_left_unfinished_does_not_swallow_the_next(
    project: Path,
) -> None:
    """A writer killed in the middle of its journal line (a line across two pages, the kill
    between them; or a disk that filled) leaves a fragment with no newline.  The next line
    appended -- another process's submit -- was glued to it, and the reader skipped the two
    as one torn line: that submit's item read as nobody's (issue 48).  The fragment must be
    ended first, so only it is skipped."""
    first = worker(project, "w1", independent_1)
    second = worker(project, "w2", lambda p: (p / "two.txt").write_text("two\n"))
    code, _ = cli_json(project, "integrate", "submit", str(first))
    assert code == 0
    journal = Queue.of(repo_info(project)).journal
    whole = journal.read_bytes().splitlines(keepends=True)[0]
    with journal.open("ab") as handle:  # what the kill left: a line cut after its first bytes
        handle.write(whole.replace(b'"w1"', b'"w9"')[: len(whole) // 2])
    code, body = cli_json(project, "integrate", "submit", str(second))
    assert code == 0, body
    code, body = cli_json(project, "integrate", "status")
    said = {e["worker"]: e["state"] for e in body["envelopes"] if e.get("mission") == "swarm"}
    assert said == {"w1": "queued", "w2": "queued"}
    code, body = cli_json(project, "integrate", "run")
    assert code == 0, body
    code, body = cli_json(project, "integrate", "status")
    said = {e.get("worker"): e["state"] for e in body["envelopes"]}
    assert said == {"w1": "landed", "w2": "landed"}


def test_integration_worktree_deleted_by_hand_is_rebuilt(project: Path) -> None:
    import shutil

    submit(repo_info(project), [worker(project, "w1", independent_1)])
    first = integrate(repo=project)
    assert first.ok and states(project) == {"w1": "landed"}
    shutil.rmtree(wt.open_context(project).root / ".integration" / "main")
    submit(repo_info(project), [worker(project, "w2", lambda p: (p / "two.txt").write_text("2\n"))])
    assert integrate(repo=project).ok
    assert states(project) == {"w1": "landed", "w2": "landed"}


def test_a_target_branch_named_reports_has_its_own_integration_worktree(project: Path) -> None:
    git(project, "branch", "reports")
    submit(repo_info(project), [worker(project, "w1", independent_1)], target="reports")
    result = integrate(repo=project, target="reports")
    assert result.ok and states(project) == {"w1": "landed"}
    assert git(project, "show", "reports:feature-one.txt") == "one\n"
    assert git(project, "rev-parse", "main").strip() != git(project, "rev-parse", "reports").strip()
    # the run's reports are not inside the tree under test (nor cleaned away with it)
    slot = wt.open_context(project).root / ".integration" / "reports"
    assert git(slot, "status", "--porcelain", "--untracked-files=all") == ""
    assert (Path(result.report_dir) / "integration.json").is_file()


def test_a_users_diff_settings_do_not_change_the_envelope(project: Path) -> None:
    """``diff.noprefix`` and friends in the user's git config shape ``git diff`` output;
    an envelope's diff must stay git's plain format, or it neither validates nor applies."""
    Path(os.environ["HOME"], ".gitconfig").write_text(
        "[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n\trenames = copies\n"
        "\trelative = true\n[core]\n\tquotePath = false\n"
    )
    envelopes = [
        worker(project, "w1", independent_1),
        worker(project, "w4", everything),
    ]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project)
    assert result.ok, result.to_json()
    assert states(project) == {"w1": "landed", "w4": "landed"}


def test_a_file_named_like_a_full_disk_still_conflicts(project: Path) -> None:
    """git's messages name the envelope's paths: a path that reads "No space left on device"
    must not pass a conflict off as a disk error (which would hold the queue forever)."""
    name = "error: No space left on device"
    (project / name).write_text("one\ntwo\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "a strange name")

    def edit(text: str) -> Any:
        return lambda p: (p / name).write_text(f"one\n{text}\n")

    envelopes = [worker(project, "a", edit("from a")), worker(project, "b", edit("from b"))]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, window=1, batch=1)
    assert states(project) == {"a": "landed", "b": "conflict"}
    assert result.envelopes[-1].details.conflicts == (name,)


def test_a_trees_first_failing_gate_stops_its_other_gates(project: Path, tmp_path: Path) -> None:
    """A tree's verdict is its first failing gate: the slow gate beside it is stopped, not
    waited for (on pypa/packaging a format gate failing in 0.04 s waited 40 s for the
    tests), and the outcome names only what failed."""
    manifest = tmp_path / "two-gates.toml"
    manifest.write_text(
        """
[gates.quick]
run = "! grep -rq BROKEN --include=*.txt ."

[gates.slow]
run = "sleep 60"
timeout = "2m"
"""
    )
    submit(repo_info(project), [worker(project, "bad", breaks_gate)])
    result = integrate(repo=project, manifest=manifest, batch=1, window=1)
    (bad,) = result.envelopes
    assert bad.state == "gates-failed" and bad.details.failed_gates == ("quick",), bad
    first = next(r for r in result.pipeline if not r.confirm)
    body = orjson.loads((Path(first.report) / "run.json").read_bytes())
    status = {g["id"]: g["status"] for g in body["gates"]}
    assert status["quick"] == "failed" and status["slow"] in ("cancelled", "skipped"), status
