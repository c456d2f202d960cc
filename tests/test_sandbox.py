"""Hermetic gates on real processes: environment, HOME/TMPDIR, stdin, timeouts, trees, logs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import CLI, PY, check, gate_results, git, running, write_manifest

from dagrunner.report.rundir import default_runs

ENV_DUMP = f'run = ["{PY}", "-c", "import os, json; print(json.dumps(dict(os.environ)))"]'


def env_of(run_dir: Path, gate: str) -> dict[str, str]:
    import json

    text = (run_dir / "logs" / f"{gate}.log").read_text()
    return dict(json.loads(text.strip().splitlines()[0]))


def test_secret_invisible_unless_named(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    code, _, run_dir = check(
        capsys,
        repo,
        f"""
        [gates.plain]
        {ENV_DUMP}
        [gates.named]
        {ENV_DUMP}
        env = {{ pass = ["DEPLOY_TOKEN"], set = {{ MODE = "ci" }} }}
    """,
    )
    assert code == 0
    plain, named = env_of(run_dir, "plain"), env_of(run_dir, "named")
    assert "DEPLOY_TOKEN" not in plain
    assert "hunter2" not in (run_dir / "logs" / "plain.log").read_text()
    assert "AWS_SECRET_ACCESS_KEY" not in plain and "AWS_SECRET_ACCESS_KEY" not in named
    assert named["DEPLOY_TOKEN"] == "hunter2"
    assert named["MODE"] == "ci"


def test_fixed_environment_and_own_home(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commit_time = int(git(repo, "log", "-1", "--format=%ct").strip())
    code, _, run_dir = check(
        capsys,
        repo,
        f"""
        [gates.a]
        {ENV_DUMP}
        [gates.b]
        {ENV_DUMP}
    """,
    )
    assert code == 0
    a, b = env_of(run_dir, "a"), env_of(run_dir, "b")
    assert a["TZ"] == "UTC" and a["LC_ALL"] == "C.UTF-8"
    assert a["SOURCE_DATE_EPOCH"] == str(commit_time)
    assert a["HOME"] != b["HOME"] and a["TMPDIR"] != b["TMPDIR"]
    assert a["HOME"] != os.environ["HOME"]
    assert not Path(a["HOME"]).exists(), "the per-gate sandbox should be removed after the gate"


def test_stdin_is_closed(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        f"""
        [gates.a]
        run = ["{PY}", "-c", "import sys; print('stdin=' + repr(sys.stdin.read()))"]
        timeout = "20s"
    """,
    )
    assert code == 0
    assert "stdin=''" in (run_dir / "logs" / "a.log").read_text()


def test_timeout_ends_the_whole_tree_including_escapees(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = "sleep 300.0311 & setsid sleep 301.0311 & sleep 302"
    started = time.monotonic()
    code, _, run_dir = check(
        capsys,
        repo,
        f"""
        [gates.slow]
        run = "{script}"
        timeout = "1s"
        [gates.after]
        run = ["true"]
        needs = ["slow"]
    """,
    )
    assert code == 1
    assert time.monotonic() - started < 30
    gates = gate_results(run_dir)
    assert gates["slow"]["status"] == "timed-out"
    assert "timed out" in gates["slow"]["reason"]
    assert gates["after"]["status"] == "skipped"
    assert gates["after"]["skipped_because"] == "slow"
    assert "timed out after 1s" in (run_dir / "logs" / "slow.log").read_text()
    for marker in ("300.0311", "301.0311"):  # the grandchild, and an escapee (setsid)
        assert not running(marker), f"sleep {marker} outlived the timed-out gate"


def test_background_child_after_exit_is_ended_and_does_not_block(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.a]
        run = "sleep 300.0312 & echo done"
    """,
    )
    assert time.monotonic() - started < 20
    assert code == 0
    assert not running("300.0312")
    assert "leftover" in gate_results(run_dir)["a"]["reason"]


def test_huge_output_is_bounded_and_runner_memory_stays_flat(repo: Path, tmp_path: Path) -> None:
    write_manifest(
        repo,
        """
        [gates.loud]
        run = "head -c 314572800 /dev/zero | tr '\\\\0' x"
        log_limit = "64K"
    """,
    )
    report = tmp_path / "run"
    proc = subprocess.Popen(
        [
            *CLI,
            "release-check",
            "m.toml",
            "--quiet",
            "--report-dir",
            str(report),
        ],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, to read its rusage
    assert proc.returncode == 0
    log = (report / "logs" / "loud.log").read_bytes()
    assert len(log) < 64 * 1024 + 512
    assert b"314507264 bytes left out" in log  # 300 MiB minus the 64 KiB kept
    assert log.startswith(b"x" * 1000) and log.endswith(b"x" * 1000)
    # ru_maxrss (KiB on Linux) covers the runner and everything it waited for -- and, as
    # the kernel counts it, the pages a child shares with this test process between fork
    # and exec: a child that does nothing, started the same way, is the floor.
    floor = subprocess.Popen([sys.executable, "-c", "pass"])
    _, _, idle = os.wait4(floor.pid, 0)
    floor.returncode = 0
    grew = usage.ru_maxrss - max(idle.ru_maxrss, 48 * 1024)
    assert grew < 150 * 1024, f"runner peaked at {usage.ru_maxrss} KiB (floor {idle.ru_maxrss})"


def test_flaky_gate_is_reported_flaky(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.flaky]
        run = "if [ -f once ]; then echo second; else touch once; echo first; exit 7; fi"
        retries = 2
        [gates.broken]
        run = "echo nope; exit 3"
        retries = 1
    """,
    )
    assert code == 1
    gates = gate_results(run_dir)
    assert gates["flaky"]["status"] == "flaky"
    assert "attempt 2 after exit code 7" in gates["flaky"]["reason"]
    assert len(gates["flaky"]["attempts"]) == 2
    assert (run_dir / "logs" / "flaky.try1.log").read_text().strip() == "first"
    assert (run_dir / "logs" / "flaky.log").read_text().strip() == "second"
    assert gates["broken"]["status"] == "failed"
    assert len(gates["broken"]["attempts"]) == 2


def test_missing_program_fails_with_a_reason(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.a]
        run = ["tools/no-such-program-xyz", "--flag"]
    """,
    )
    assert code == 1  # a program named by a path is looked for when it starts
    reason = gate_results(run_dir)["a"]["reason"]
    assert "could not start 'tools/no-such-program-xyz'" in reason


def measured(capsys: pytest.CaptureFixture[str], repo: Path, gate: str, body: str) -> Any:
    """The record of one passing gate, its tree sampled every 50 ms."""
    manifest = f'[governor]\nsample_interval = "50ms"\n[gates.{gate}]\n{body}\n'
    code, _, run_dir = check(capsys, repo, manifest)
    assert code == 0, gate_results(run_dir)[gate]
    return gate_results(run_dir)[gate]


def test_peak_memory_measured_and_flagged(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hog = measured(
        capsys,
        repo,
        "hog",
        f'run = ["{PY}", "-c", "import time; b = bytearray(200 * 1024 * 1024); time.sleep(1.0)"]'
        '\nmemory = "32M"',
    )
    assert hog["peak_rss"] > 150 * 1024 * 1024
    assert hog["memory_exceeded"] is True
    assert "well past the declared" in hog["reason"]


DEEP = """import subprocess, sys, time
depth = int(sys.argv[1])
if depth < 2:  # the gate, then its child: each starts the next level and waits
    sys.exit(subprocess.run([sys.executable, __file__, str(depth + 1)]).returncode)
b = bytearray(120 << 20)
t = time.process_time() + 0.4
while time.process_time() < t:
    pass
time.sleep(0.3)
"""


def test_a_grandchilds_memory_and_cpu_count_for_the_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process two levels down is measured: found from the gate's own cgroup where it
    has one (no /proc scan), else by the scan."""
    (repo / "deep.py").write_text(DEEP)
    deep = measured(capsys, repo, "deep", f'run = ["{PY}", "deep.py", "0"]')
    assert deep["peak_rss"] > 100 << 20
    assert deep["attempts"][0]["cpu_seconds"] >= 0.3


def test_escaped_orphan_of_a_passed_gate_is_ended(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body, run_dir = check(
        capsys,
        repo,
        """
        [gates.a]
        run = "setsid sleep 300.0313 > /dev/null 2>&1 &"
    """,
    )
    assert code == 0
    assert not running("300.0313")
    # Seen in a sample before the gate exited: ended by the gate's own check;
    # never seen: ended by the runner's orphan sweep.  Either way it is said.
    reason = gate_results(run_dir)["a"]["reason"]
    said_by_sweep = any("left running by a finished gate" in w for w in body["warnings"])
    assert "leftover" in reason or said_by_sweep, (reason, body["warnings"])


def test_without_namespaces_an_escaped_orphan_is_swept(repo: Path) -> None:
    """Where a gate has no PID namespace (DAGRUNNER_CONTAINMENT=session: a machine without
    one), an orphan that left the gate's group re-parents to the runner and its sweep ends
    it; with a namespace nothing can re-parent, and no sweep scans /proc."""
    import json

    path = write_manifest(repo, '[gates.a]\nrun = "setsid sleep 300.0317 > /dev/null 2>&1 &"\n')
    done = subprocess.run(
        [*CLI, "release-check", str(path), "--json", "--no-cache"],
        cwd=repo,
        env={**os.environ, "DAGRUNNER_CONTAINMENT": "session"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not running("300.0317")
    body = json.loads(done.stdout)
    reason = gate_results(default_runs(repo) / "latest")["a"]["reason"]
    said_by_sweep = any("left running by a finished gate" in w for w in body["warnings"])
    assert "leftover" in reason or said_by_sweep, (reason, body["warnings"])


def test_nested_runner_leaves_its_own_childrens_inherited_token_alone(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner inside a gate inherits that gate's token; its own children (git, a helper)
    carry it too and are not orphans of its gates: the sweep must leave them alone."""
    monkeypatch.setenv("DAGRUNNER_GATE_TOKEN", "token-of-an-outer-gate")
    helper = subprocess.Popen(["sleep", "30.0341"])
    try:
        code, _, _ = check(capsys, repo, '[gates.a]\nrun = "sleep 1.5"\n')
        assert code == 0
        assert helper.poll() is None, "the runner's own child was swept as an orphan"
    finally:
        helper.kill()
        helper.wait()


def test_the_callers_activated_venv_comes_first_whatever_launched_dagrunner(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyenv's shims (and pipx, and the like) start dagrunner with their own interpreter's
    folder first on PATH: the gates ran that Python, not the venv the caller had activated."""
    tools = repo.parent / "tools"
    for name in ("venv", "launcher"):
        (tools / name / "bin").mkdir(parents=True)
        script = tools / name / "bin" / "tellme"
        script.write_text(f"#!/bin/sh\necho {name}\n")
        script.chmod(0o755)
    launcher, venv = tools / "launcher" / "bin", tools / "venv"
    monkeypatch.setenv("PATH", f"{launcher}:{venv / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    manifest = '[env]\npass = ["PATH", "VIRTUAL_ENV"]\n[gates.which]\nrun = ["tellme"]\n'
    code, _, run_dir = check(capsys, repo, manifest)
    assert code == 0
    assert (run_dir / "logs" / "which.log").read_text().split()[0] == "venv"


def test_short_processes_cpu_counts_where_the_gate_has_a_cgroup(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Twenty children that each spin 50 ms and exit between two samples: the kernel's
    count (the gate's cgroup) sees them all; where there is no cgroup, sampling is what
    there is, and the figure is at least never more than what was spent."""
    from dagrunner.process.contain import detect

    spin = "import time\nt = time.process_time() + 0.05\nwhile time.process_time() < t: pass"
    (repo / "spin.py").write_text(spin)
    short = measured(capsys, repo, "short", f'run = "for i in $(seq 20); do {PY} spin.py; done"')
    cpu = short["attempts"][0]["cpu_seconds"]
    if "cgroup" in detect().mode:
        assert cpu >= 20 * 0.05, cpu
    assert cpu < 60


@pytest.mark.skipif(shutil.which("yarn") is None, reason="yarn is installed by .ci/run")
def test_yarn_1_in_a_gate_prints_its_scripts_output_and_no_warning_of_its_own(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """yarn 1 run as root looks for its global prefix only in /usr/local and
    /usr/local/share/.yarn, both read-only in the gate's view: every ``yarn run`` warned
    "Cannot find a suitable global folder" on stderr, and a project's snapshot tests of a
    CLI's stderr failed only inside a gate (manypkg).  Another user's yarn falls back to
    ``~/.yarn``, the gate's own HOME, which is where the gate's global prefix must be."""
    scripts = '"scripts": {"hello": "echo hello"}'
    (repo / "package.json").write_text(f'{{"name": "p", "license": "MIT", {scripts}}}\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a yarn project")
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [gates.yarn]
        run = ["sh", "-c", "yarn --silent run hello && yarn global bin && echo home=$HOME"]
        """,
    )
    log = (run_dir / "logs" / "yarn.log").read_text()
    assert code == 0, log
    assert "warning" not in log and "suitable global folder" not in log, log
    lines = log.splitlines()
    home = next(line.removeprefix("home=") for line in lines if line.startswith("home="))
    assert lines[0] == "hello", log
    assert lines[1] == f"{home}/.yarn/bin", "yarn's global prefix is the gate's own HOME"


def test_a_view_bubblewrap_could_not_set_up_is_started_again_and_a_gate_saying_bwrap_is_not(
    tmp_path: Path,
) -> None:
    """bubblewrap dies when a mount of the machine goes while it copies the mount table
    (containers/bubblewrap#650: a tool-cache overlay of another gate, say): the gate never
    started, and is started again.  Here the view cannot be set up at all (a folder of this
    process's /proc, which the gate's own /proc lacks): started four times, then failed.  A
    gate that itself prints a 'bwrap:' line and exits 1 is not started again."""
    import trio

    from dagrunner.process.contain import detect
    from dagrunner.process.logs import SETUP_NOTE
    from dagrunner.process.sandbox import SETUP_WAITS, GateJob, run_job

    if not (detect().bwrap and detect().views):
        pytest.skip("needs bubblewrap to hold gates' views")
    tree = tmp_path / "tree"
    tree.mkdir()

    def job(name: str, script: str, **extra: Any) -> GateJob:
        return GateJob(gate=name, argv=("/bin/sh", "-c", script), cwd=str(tree),
                       env={"PATH": "/usr/bin:/bin"}, sandbox_dir=str(tmp_path / name),
                       log_path=str(tmp_path / f"{name}.log"), log_limit=1 << 20, timeout=60.0,
                       **extra)  # fmt: skip

    unset = trio.run(run_job, job("unset", "echo ran", read_only=(f"/proc/{os.getpid()}",)))
    log = (tmp_path / "unset.log").read_text()
    assert unset.unset and unset.exit_code == 1 and not unset.passed
    assert log.count("bwrap: ") == len(SETUP_WAITS) + 1 and "ran" not in log, log
    assert log.count(SETUP_NOTE) == len(SETUP_WAITS), log

    said = trio.run(run_job, job("said", "echo 'bwrap: not really' >&2; exit 1"))
    log = (tmp_path / "said.log").read_text()
    assert not said.unset and said.exit_code == 1
    assert log.count("bwrap: ") == 1 and SETUP_NOTE not in log, log
