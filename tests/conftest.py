"""Shared fixtures: real temporary git repositories and an isolated home/cache."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from dagrunner.cli.main import run_cli
from dagrunner.process import observe, share
from dagrunner.process.contain import detect
from dagrunner.report.rundir import default_runs

PY = sys.executable
CLI = [sys.executable, "-m", "dagrunner"]  # the command line, as a user runs it


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Point HOME and every cache at a temporary folder, and fail a test that writes to the real home."""
    home = tmp_path_factory.mktemp("home")
    real_cache = Path.home() / ".cache" / "dagrunner"
    before = real_cache.exists()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("DAGRUNNER_CACHE_DIR", str(home / "dagrunner-cache"))
    monkeypatch.setenv("DAGRUNNER_WORKTREE_ROOT", str(home / "worktrees"))
    # Beside the home, not in it: a gate's tool cache is bound writable into its view, and a
    # test's home sits under /tmp, where that would make the home's path in the gate's own
    # private /tmp (the probes of what a gate may write would see it there).
    monkeypatch.setenv("DAGRUNNER_TOOL_CACHE_DIR", str(tmp_path_factory.mktemp("tools")))
    for name in list(os.environ):
        if name.startswith("GIT_"):
            monkeypatch.delenv(name)
    # run inside a gate (the project's own release check), the tests would hand the gate's
    # own list of its tree's paths to the selectors they run in their repositories
    monkeypatch.delenv("DAGRUNNER_PATHS", raising=False)
    yield home
    share.release(home, home)  # a test's seeds' overlay mounts, so its folder can go
    assert real_cache.exists() == before, "a test wrote to the real ~/.cache/dagrunner"


@functools.cache
def can_mount() -> bool:
    """Whether this process may make mounts: root with its capabilities -- not a root gate,
    which keeps only a few (docs/security.md, "Root"), nor an ordinary user."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository with one commit, and a ``reports/`` folder git ignores."""
    root = tmp_path / "repo with space"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("reports/\n")
    (root / "README").write_text("hello\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "init")
    return root


BROKEN_GATE = """
[gates.check]
run = "! grep -rq BROKEN --include=*.txt ."
"""


@pytest.fixture
def project(repo: Path) -> Path:
    """A repository whose release gate fails on the word BROKEN in a .txt file, with files
    of every kind an envelope carries (binary, a rename, a mode change, a deletion)."""
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text(BROKEN_GATE)
    (repo / "shared.txt").write_text("one\ntwo\nthree\n")
    (repo / "logo.bin").write_bytes(bytes(range(256)) * 4)
    (repo / "old name.txt").write_text("rename me\n" * 5)
    (repo / "run.sh").write_text("#!/bin/sh\necho run\n")
    (repo / "obsolete.txt").write_text("delete me\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project")
    return repo


def commit_release_manifest(repo: Path, body: str) -> None:
    """Commit ``body`` as the repository's ``manifests/release.toml`` (what integration reads)."""
    (repo / "manifests").mkdir(exist_ok=True)
    (repo / "manifests" / "release.toml").write_text(body)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "manifest")


def write_manifest(repo: Path, body: str, name: str = "m.toml") -> Path:
    path = repo / name
    path.write_text(textwrap.dedent(body))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """Run the CLI in-process with --json; its exit code and the one JSON object it printed."""
    code = run_cli([*argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, f"expected one JSON line, got {out!r}"
    return code, orjson.loads(out[0])


def gate_results(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: orjson.loads(p.read_bytes()) for p in (run_dir / "gates").glob("*.json")}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, help="K/N: run only the K-th of N stable shards")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--shard K/N`` keeps the tests whose id hashes to K; release.toml runs the shards in parallel."""
    shard = config.getoption("--shard")
    if not shard:
        return
    index, total = (int(part) for part in str(shard).split("/"))
    keep = [item for item in items if zlib.crc32(item.nodeid.encode()) % total == index - 1]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


# A manifest's head where its gates must run side by side whatever the machine's load (the
# governor would start them one at a time, and a relay would have no gate beside it)
SIDE_BY_SIDE = """
    [governor]
    max_load = 1000
    [env]
    pass = ["PATH"]
"""


def check(
    capsys: pytest.CaptureFixture[str], repo: Path, manifest: str, *args: str
) -> tuple[int, dict[str, Any], Path]:
    """Run ``release-check`` on ``manifest`` text in ``repo``: exit code, JSON summary, run dir."""
    path = write_manifest(repo, manifest)
    code, body = run_json(capsys, "release-check", str(path), "--repo", str(repo), "--quiet", *args)
    run_dir = Path(body["run_dir"]) if "run_dir" in body else default_runs(repo)
    return code, body, run_dir


def running(marker: str) -> list[int]:
    """Pids of live processes whose command line holds ``marker``.

    Gates may run in their own PID namespace, where ``$!`` is not a pid of ours:
    tests find a gate's processes by a unique argument instead.
    """
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def envelope(repo: Path, name: str) -> Path:
    """A worker ``m/NAME`` that adds ``NAME.txt``, exported: its envelope's path."""
    from dagrunner.worktrees import allocate as wt
    from dagrunner.worktrees import export as exporting

    path = Path(wt.allocate(mission="m", worker=name, repo=repo)["path"])
    (path / f"{name}.txt").write_text(f"{name}\n")
    out = path.parent / f"{name}.json"
    exporting.export(f"m/{name}", output=out, repo=repo)
    return out


def skip_unless_reads_observed() -> None:
    """Skip where gates' reads are not observed (no bubblewrap view, fanotify refused:
    inside a gate, say, as in this repository's own release check)."""
    found = detect()
    if not (found.bwrap and found.views) or observe.refused():
        pytest.skip("this machine does not observe gates' reads (dagrunner doctor: observe)")
