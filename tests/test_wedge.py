"""A built seed is read as hostile outside the sandbox, and the integrator obeys SIGTERM
whatever one of its threads is blocked on (issue 43, item 5): real ``dagrunner integrate
run`` processes, a real FIFO a tree's seed build leaves, a real signal."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from conftest import commit_release_manifest

from dagrunner.files import read_regular
from dagrunner.git.repo import repo_info
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import seeds

CLI = [sys.executable, "-m", "dagrunner"]
# A seed whose build holds the checkout's path (so it is relocated) and, where the tree's
# key file says so, leaves a named pipe: a tree's build script is untrusted code.
BUILD = (
    "mkdir -p .venv/bin && echo '*' > .venv/.gitignore && pwd > .venv/bin/activate && "
    "if grep -q hostile requirements.txt; then mkfifo .venv/bin/pipe; fi"
)
MANIFEST = f"""
[[worktrees.seed]]
path = ".venv"
key = ["requirements.txt"]
build = "{BUILD}"

[gates.check]
run = ["sh", "-c", "test -f .venv/bin/activate"]
"""


@pytest.fixture
def seeded(repo: Path) -> Path:
    (repo / ".gitignore").write_text("reports/\n.venv/\n")
    (repo / "requirements.txt").write_text("# nothing yet\n")
    commit_release_manifest(repo, MANIFEST)
    return repo


def queued_envelope(repo: Path, pin: str) -> str:
    """An envelope that changes the seed's key file; its id (submitted)."""
    path = Path(wt.allocate(mission="m", worker="dep", repo=repo)["path"])
    (path / "requirements.txt").write_text(f"# {pin}\n")
    out = path.parent / "dep.json"
    exporting.export("m/dep", output=out, repo=repo)
    return submit(repo_info(repo), [out])[0].id


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Integrators the test starts, each in its own session: whatever a test leaves
    running (a wedge it reproduces) is killed with its group."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()  # reaped, its pipes closed


def start_integrator(
    repo: Path, started: list[subprocess.Popen[bytes]], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [*CLI, "integrate", "run", "--json", "--window", "1"],
        cwd=repo,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    started.append(process)
    return process


def status_of(repo: Path, item: str) -> str:
    done = subprocess.run(
        [*CLI, "integrate", "status", "--json"], cwd=repo, capture_output=True, check=True
    )
    entries = orjson.loads(done.stdout)["envelopes"]
    return str(next(e["state"] for e in entries if e["id"] == item))


def test_a_fifo_a_trees_seed_build_leaves_never_wedges_the_integrator(
    seeded: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    item = queued_envelope(seeded, "hostile")
    integrator = start_integrator(seeded, processes)
    try:
        out, err = integrator.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the integrator wedged on the FIFO the tree's seed build left")
    assert integrator.returncode == 0, err.decode()
    result = orjson.loads(out)
    assert [e["state"] for e in result["envelopes"]] == ["landed"], result
    assert status_of(seeded, item) == "landed"
    # the stored seed holds files, folders and links only: the pipe was dropped, and said
    store = seeds.seeds_dir(Path(wt.allocate(mission="m", worker="x", repo=seeded)["root"]))
    specials = [
        p
        for p in store.rglob("*")
        if not (p.is_symlink() or stat.S_ISREG(p.lstat().st_mode) or p.is_dir())
    ]
    assert specials == []
    dropped = [orjson.loads(m.read_bytes()).get("dropped") for m in store.glob("*/seed.json")]
    assert ["bin/pipe"] in dropped, dropped


def test_sigterm_ends_a_wedged_integrator_within_10s_and_its_item_stays_queued(
    seeded: Path, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    item = queued_envelope(seeded, "plain")
    fifo = tmp_path / "wedge"
    os.mkfifo(fifo)
    # the applying thread opens a FIFO nobody writes: a syscall no signal interrupts
    integrator = start_integrator(seeded, processes, {"DAGRUNNER_HANG_AT": f"applying:{fifo}"})
    journal = seeded / ".git" / "dagrunner" / "queue" / "journal.jsonl"
    deadline = time.monotonic() + 60
    while b'"applying"' not in (journal.read_bytes() if journal.exists() else b""):
        assert integrator.poll() is None, integrator.communicate()[1].decode()
        assert time.monotonic() < deadline, "the integrator never started applying"
        time.sleep(0.05)
    # the open(2) is the next step after journaling: signalled before or in it, it wedges
    sent = time.monotonic()
    integrator.send_signal(signal.SIGTERM)
    try:
        _out, err = integrator.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("the integrator did not end within 10 s of SIGTERM")
    took = time.monotonic() - sent
    assert took < 10, took
    assert integrator.returncode == 130, err.decode()
    assert b"interrupted" in err, err.decode()
    assert status_of(seeded, item) == "queued"


def test_read_regular_refuses_what_is_not_a_regular_file_without_blocking(
    tmp_path: Path,
) -> None:
    fifo, link, big, plain = (tmp_path / n for n in ("fifo", "link", "big", "plain"))
    os.mkfifo(fifo)
    plain.write_bytes(b"text")
    link.symlink_to(plain)
    big.write_bytes(b"x" * 100)
    assert read_regular(plain, limit=10) == b"text"
    for path in (fifo, link, tmp_path):
        with pytest.raises(OSError):
            read_regular(path, limit=10)
    with pytest.raises(OSError):
        read_regular(big, limit=10)
