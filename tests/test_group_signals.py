"""A signal to the integrator's whole process group (issue 48): what systemd's default stop
and a terminal's Ctrl-C send.  Its git children must not die first (``git ... failed (-15)``,
exit 3, items left ``applying``): the integrator handles the signal, every item in flight is
journaled ``queued`` again, and it ends with its documented code (``integrate run``: 130;
``integrate serve``: 0, "stopped").  A ``git`` on the PATH that holds its ``apply`` until the
test has signalled makes the moment certain: a git child is alive when the signal comes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CLI, commit_release_manifest, envelope

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.submit import submit

# A git that holds its first ``apply`` until the test says go (or 20 s pass), then runs.
# Python, not sh: a shell clears the signal mask it was started with, git and Python do not.
SLOW_GIT = """#!{python}
import os, sys, time
marker, go = {marker!r}, {go!r}
if "apply" in sys.argv[1:] and not os.path.exists(marker):
    open(marker, "w").close()
    end = time.monotonic() + 20
    while not os.path.exists(go) and time.monotonic() < end:
        time.sleep(0.05)
os.execv({git!r}, ["git", *sys.argv[1:]])
"""


def slow_git(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """An environment whose ``git`` holds its first ``apply``; the marker it writes then,
    and the file that lets it go on."""
    folder = tmp_path / "bin"
    folder.mkdir()
    marker, go = tmp_path / "applying", tmp_path / "go"
    real = shutil.which("git")
    assert real is not None
    script = folder / "git"
    script.write_text(
        SLOW_GIT.format(python=sys.executable, marker=str(marker), go=str(go), git=real)
    )
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}, marker, go


def states(repo: Path) -> dict[str, str]:
    return {e.worker or e.id: str(e.state) for e in Queue.of(repo_info(repo)).entries().values()}


def until(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.05)
    return path.exists()


@pytest.mark.parametrize(
    ("command", "sig", "code"),
    [
        ("run", signal.SIGTERM, 130),
        ("run", signal.SIGINT, 130),
        ("serve", signal.SIGTERM, 130),
        ("serve", signal.SIGINT, 130),
    ],
)
def test_a_signal_to_the_process_group_requeues_what_is_in_flight(
    repo: Path, tmp_path: Path, command: str, sig: signal.Signals, code: int
) -> None:
    commit_release_manifest(repo, '[gates.ok]\nrun = "true"\n')
    submit(repo_info(repo), [envelope(repo, "w1")])
    env, marker, go = slow_git(tmp_path)
    process = subprocess.Popen(
        [*CLI, "integrate", command, "--repo", str(repo)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the signal below reaches it and its children
    )
    try:
        assert until(marker, 60), process.communicate(timeout=5)
        assert states(repo) == {"w1": "applying"}
        began = time.monotonic()
        os.killpg(process.pid, sig)  # git is alive in the group now
        go.touch()
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert time.monotonic() - began < 12
    assert process.returncode == code, (out, err)
    assert "git-failed" not in out + err and "(-15)" not in err and "(-2)" not in err, err
    assert states(repo) == {"w1": "queued"}
