"""Gates are untrusted: they cannot forge a verdict, read the runner's secrets, or outlive
their limits -- each tried as a hostile gate would (issue #9, items 7-10)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from conftest import CLI, check, gate_results, run_json, running, write_manifest

from dagrunner.process.contain import detect

contained = pytest.mark.skipif(
    not detect().pidns, reason="needs a PID and mount namespace (root, or user namespaces)"
)


def wait_until(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


# -- 7. cache forgery ------------------------------------------------------------------------

CACHEABLE = """
[gates.judge]
run = "{run}"
inputs = ["README"]
"""


def test_forged_cache_entry_is_a_miss(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Path(os.environ["DAGRUNNER_CACHE_DIR"])
    # A genuine pass gives the forger a well-formed entry to copy.
    code, _, _ = check(capsys, repo, CACHEABLE.format(run="true"))
    assert code == 0
    genuine = orjson.loads(next(store.glob("entries/*/*.json")).read_bytes())
    path = write_manifest(repo, CACHEABLE.format(run="exit 1"))
    _, explained = run_json(capsys, "cache", "explain", "judge", str(path), "--repo", str(repo))
    key = explained["key"]
    body = {**genuine["body"], "key": key}
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    for name, signature in (
        ("digest", hashlib.sha256(canonical).hexdigest()),  # the old, unkeyed scheme
        ("hmac", hashlib.sha256(canonical).hexdigest()),  # a guess at the new one
    ):
        entry = store / "entries" / key[:2] / f"{key}.json"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_bytes(orjson.dumps({"body": body, name: signature}))
        entry.with_suffix(".log").write_bytes(next(store.glob("entries/*/*.log")).read_bytes())
        code, summary, run_dir = check(capsys, repo, CACHEABLE.format(run="exit 1"))
        assert code == 1, "a forged entry turned a failing gate into a pass"
        assert gate_results(run_dir)["judge"]["status"] == "failed"
        assert any("forged or damaged" in w or "corrupt" in w for w in summary["warnings"])


@contained
def test_gate_can_neither_read_the_cache_key_nor_write_an_entry(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Path(os.environ["DAGRUNNER_CACHE_DIR"])
    check(capsys, repo, CACHEABLE.format(run="true"))  # makes the store and its key
    key = (store / "key").read_bytes()
    _, _, run_dir = check(
        capsys,
        repo,
        f"""
        [gates.forger]
        run = "ls -la $STORE; cat $STORE/key; mkdir -p $STORE/entries/ff && echo x > $STORE/entries/ff/forged.json; echo done"
        env = {{ set = {{ STORE = "{store}" }} }}
        """,
    )
    log = (run_dir / "logs" / "forger.log").read_bytes()
    assert key not in log
    assert b"done" in log
    assert not (store / "entries" / "ff" / "forged.json").exists()


# -- 8. secrets ------------------------------------------------------------------------------

SECRET = "ghp_s3cr3t-value-1234567890"


@contained
def test_gate_cannot_read_the_runners_environment_through_proc(repo: Path) -> None:
    # The runner is its own process, started with the secret in its environment: /proc shows
    # a process's environment as it was at exec, so an in-process runner would prove nothing.
    path = write_manifest(
        repo,
        """
        [gates.snoop]
        run = '''tr '\\0' '\\n' < /proc/$PPID/environ; for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done; true'''
        """,
    )
    run_dir = repo / "reports" / "snoop-run"
    proc = subprocess.run(
        [
            *CLI,
            "release-check",
            str(path),
            "--repo",
            str(repo),
            "--quiet",
            "--report-dir",
            str(run_dir),
        ],
        env={**os.environ, "GITHUB_TOKEN": SECRET},
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    log = (run_dir / "logs" / "snoop.log").read_text()
    assert "DAGRUNNER_GATE_TOKEN" in log  # it did read environments: its own namespace's
    assert SECRET not in log and "GITHUB_TOKEN" not in log
    assert SECRET not in (run_dir / "index.html").read_text()


def test_secret_that_reaches_a_log_anyway_is_redacted(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    (repo / "leak.txt").write_text(f"token={SECRET}\n")
    code, _, run_dir = check(capsys, repo, '[gates.leak]\nrun = "cat leak.txt"\n')
    assert code == 0
    log = (run_dir / "logs" / "leak.log").read_text()
    assert SECRET not in log and "token=[redacted: $GITHUB_TOKEN]" in log
    assert SECRET not in (run_dir / "index.html").read_text()
    assert SECRET not in (run_dir / "junit.xml").read_text()


def test_a_passed_variable_is_not_redacted(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PUBLIC_SETTING", "visible-value-123")
    code, _, run_dir = check(
        capsys, repo, '[env]\npass = ["PUBLIC_SETTING"]\n[gates.a]\nrun = "echo $PUBLIC_SETTING"\n'
    )
    assert code == 0 and "visible-value-123" in (run_dir / "logs" / "a.log").read_text()


# -- 9. limits that cannot be escaped ---------------------------------------------------------------


@contained
def test_fork_bomb_is_held_by_its_pids_limit(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, body, run_dir = check(
        capsys,
        repo,
        """
        [governor]
        max_pids = 300
        [gates.bomb]
        run = "trap '' TERM; while :; do setsid sleep 1000.51 & done"
        timeout = "2s"
        """,
    )
    assert code == 1 and gate_results(run_dir)["bomb"]["status"] in ("failed", "timed-out")
    assert time.monotonic() - started < 30
    assert wait_until(lambda: not running("1000.51"), 10), "the bomb's processes outlived it"
    assert body["machine"]["containment"]["mode"] == detect().mode
    if detect().pids is not None:
        assert "Cannot fork" in (run_dir / "logs" / "bomb.log").read_text()


@contained
def test_tree_that_ignores_sigterm_and_escapes_ends_at_its_timeout(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.stubborn]
        run = "trap '' TERM; (trap '' TERM; setsid env -i sleep 1000.56 &); sleep 1000.57"
        timeout = "1s"
        """,
    )
    assert code == 1 and gate_results(run_dir)["stubborn"]["status"] == "timed-out"
    for marker in ("1000.56", "1000.57"):
        assert wait_until(lambda m=marker: not running(m), 10), f"sleep {marker} survived"


@contained
def test_escapee_that_drops_the_token_is_ended_and_reported(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys, repo, '[gates.a]\nrun = "(setsid env -i sleep 1000.52 &); sleep 0.2; exit 0"\n'
    )
    assert code == 0
    assert wait_until(lambda: not running("1000.52"), 5)
    assert "leftover" in gate_results(run_dir)["a"]["reason"]


@contained
def test_sigkill_of_the_runner_ends_every_gate_tree(repo: Path) -> None:
    path = write_manifest(
        repo,
        """
        [gates.a]
        run = "setsid sleep 1000.53 & sleep 1000.54"
        [gates.b]
        run = ["sleep", "1000.55"]
        """,
    )
    runner = subprocess.Popen(
        [*CLI, "release-check", str(path), "--repo", str(repo), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: running("1000.54") and running("1000.55"), 20)
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
        for marker in ("1000.53", "1000.54", "1000.55"):
            assert wait_until(lambda m=marker: not running(m), 10), f"sleep {marker} survived"
    finally:
        runner.kill()


@contained
@pytest.mark.skipif(detect().memory is None, reason="no memory cgroup delegated here")
def test_enforced_memory_limit_ends_a_gate_past_its_declaration(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [governor]
        enforce = true
        [gates.greedy]
        run = ["python3", "-c", "b = bytearray(400 * 2**20); print('allocated')"]
        memory = "64M"
        """,
    )
    assert code == 1 and gate_results(run_dir)["greedy"]["status"] == "failed"
    assert "allocated" not in (run_dir / "logs" / "greedy.log").read_text()


# -- 10. fingerprint commands are gates too ------------------------------------------------------------


def test_tool_command_cannot_stall_planning_or_outlive_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, body, _ = check(
        capsys,
        repo,
        """
        [gates.a]
        run = ["true"]
        inputs = ["README"]
        tools = ["sh -c 'sleep 45.61 & sleep 1; echo v1'"]
        """,
    )
    assert code == 0
    assert time.monotonic() - started < 20, "a background child of a tool command stalled it"
    assert not running("45.61")
    assert body["wall"] >= 1.0, "time spent on fingerprints is not counted in the wall"


def test_every_attempts_log_of_a_retried_gate_is_redacted(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    (repo / "leak.txt").write_text(f"token={SECRET}\n")
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.leak]
        run = "cat leak.txt; test -e second || { touch second; exit 1; }"
        retries = 1
        """,
    )
    assert code == 0
    logs = sorted((run_dir / "logs").glob("leak*.log"))
    assert [p.name for p in logs] == ["leak.log", "leak.try1.log"]
    for log in logs:
        text = log.read_text()
        assert SECRET not in text and "[redacted: $GITHUB_TOKEN]" in text


def test_a_runner_never_takes_a_live_runner_of_another_pid_namespace_for_dead() -> None:
    """A nested run inside a gate sees its own /proc: pids of runners outside its namespace
    are not there.  Only folders of its own namespace may be judged stale and removed."""
    from dagrunner.process import cgroups, contain

    found = contain.detect().memory or contain.detect().pids
    if found is None:
        pytest.skip("no delegated cgroup here")
    directory = found.parent
    ours = cgroups.pid_namespace()
    other = directory / f"dagrunner-{ours + 1}-999999"  # alive, seen from another namespace
    dead = directory / f"dagrunner-{ours}-999999"  # dead, in ours
    for folder in (other, dead):
        folder.mkdir(exist_ok=True)
    try:
        cgroups.remove_stale(directory)
        assert other.is_dir() and not dead.exists()
    finally:
        for folder in (other, dead):
            if folder.exists():
                folder.rmdir()
