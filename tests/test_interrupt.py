"""Ctrl-C and SIGTERM: running trees are ended, the run is recorded as interrupted, the report written."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from conftest import CLI, running, write_manifest


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_interrupts_cleanly(repo: Path, tmp_path: Path, sig: signal.Signals) -> None:
    write_manifest(
        repo,
        """
        [gates.quick]
        run = ["true"]
        [gates.slow]
        run = "sleep 300.0321 & echo $! > child.pid; sleep 301"
        needs = ["quick"]
        [gates.after]
        run = ["true"]
        needs = ["slow"]
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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_for(repo / "child.pid")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err
    run = orjson.loads((report / "run.json").read_bytes())
    assert run["status"] == "interrupted"
    statuses = {g["id"]: g["status"] for g in run["gates"]}
    assert statuses == {"slow": "interrupted", "after": "skipped", "quick": "passed"}
    assert (report / "index.html").exists() and (report / "junit.xml").exists()
    assert not running("300.0321")
    assert b"INTERRUPTED" in out
