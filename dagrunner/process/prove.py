"""The sandbox proves itself: a fixed escape suite, run as a real gate on this machine.

``dagrunner doctor --prove`` writes the suite into a scratch repository and runs it with
``release-check`` as any gate runs, with targets set up outside: a secret in the invoking
user's (scratch) home, the cache store's key, a folder outside every allowed place, a
block device where root can attach one (a loop device over a scratch image), a loopback
listener on the host, the runner's own pid.  Each line says ``held`` or ``LEAKED``; what
the gate cannot judge from inside (a file outside, a process left behind) the runner
checks from outside.  docs/security.md has the table of lines and what holds each.

``SUITE`` is standard-library Python only (``-I -S``): the gate's interpreter is the
runner's, and nothing of the caller's or the tree's is imported.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.git.repo import cache_root
from dagrunner.process.contain import Containment

SUITE_VERSION = 1
LINES = (
    "sysctl-write",
    "block-device",
    "mknod",
    "mount",
    "write-outside",
    "cache-key",
    "hidden-home",
    "signal-runner",
    "leave-cgroup",
    "host-loopback",
    "outlive-gate",
)

# The suite itself: a standard-library script, run by path (never imported here).
SUITE = Path(__file__).with_name("escapes.py")


@dataclass(frozen=True)
class ProveLine:
    line: str
    held: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "held": self.held, "detail": self.detail}


@dataclass(frozen=True)
class Proof:
    """What the suite found on this machine, and under which containment."""

    suite: int
    held: bool
    lines: tuple[ProveLine, ...]
    containment: str
    at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "held": self.held,
            "containment": self.containment,
            "at": self.at,
            "lines": [line.to_json() for line in self.lines],
        }


def containment_key(found: Containment) -> str:
    """Which view a proof is of: its tool, and whether the gate is root of a user namespace."""
    if not found.views:
        return "pidns" if found.pidns else "session"
    return f"{found.to_json()['views_by']}{'+userns' if found.userns else ''}"


def proofs_file() -> Path:
    """Where the suite's last verdict per containment is kept (beside the caches)."""
    return cache_root().parent / "proofs.json"


def last_proof(found: Containment) -> dict[str, Any] | None:
    """The suite's last verdict under ``found``'s containment on this machine (None: never
    run here): what ``run.json`` records beside the containment."""
    with contextlib.suppress(OSError, ValueError):
        known = orjson.loads(proofs_file().read_bytes())
        said = known.get(containment_key(found)) if isinstance(known, dict) else None
        return said if isinstance(said, dict) else None
    return None


def prove(env: Mapping[str, str], *, isolation: bool, containment: str) -> Proof:
    """Run the suite as a gate of a scratch repository (``env``: the caller's, whose
    ``DAGRUNNER_CONTAINMENT`` picks the view); ``isolation``: this machine gives gates a
    network of their own, so an isolated gate's reach of the host's loopback is tried."""
    # Beside the caller's caches (in its home, a folder the view covers), not under /tmp,
    # which every gate gets a private copy of: a target there would prove nothing.
    base = cache_root().parent
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prove-", dir=base) as tmp:
        place = Path(tmp)
        spec, expect = _targets(place)
        with _listener() as port, _loop_device(place) as block:
            spec |= {"port": port, "block": block, "expect": expect}
            (place / "spec.json").write_bytes(orjson.dumps(spec))
            done = _run(place, env, isolation)
        lines = _judge(done, place, spec, isolation)
    held = all(line.held for line in lines)
    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return Proof(SUITE_VERSION, held, tuple(lines), containment, at)


def _targets(place: Path) -> tuple[dict[str, Any], dict[str, str]]:
    home, store, outside = place / "home", place / "store", Path(_outside(place))
    for folder in (home, store):
        folder.mkdir()
    secret, key = secrets.token_hex(16), secrets.token_hex(16)
    (home / "secret").write_text(secret)
    (store / "key").write_text(key)
    spec = {
        "outside": str(outside),
        "key": str(store / "key"),
        "secret": str(home / "secret"),
        "runner": 0,  # set by the gate's manifest run: the release-check's own pid
        "marker": f"dagrunner-prove-{secrets.token_hex(8)}",
    }
    return spec, {"cache-key": key, "hidden-home": secret}


def _outside(place: Path) -> str:
    """A folder outside every place a gate may write and outside the covers (the view's
    read-only root itself, where this user may write there: /var/lib as root), else in
    the scratch place.  Whether the gate wrote it is judged from outside."""
    for parent in ("/var/lib", "/srv", "/opt"):
        if os.access(parent, os.W_OK):
            with contextlib.suppress(OSError):
                return tempfile.mkdtemp(prefix="dagrunner-prove-outside-", dir=parent)
    folder = place / "outside"
    folder.mkdir()
    return str(folder)


@contextlib.contextmanager
def _listener() -> Iterator[int]:
    """A TCP listener on the host's loopback, accepting until the suite is over."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                server.accept()[0].close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        server.close()


@contextlib.contextmanager
def _loop_device(place: Path) -> Iterator[str]:
    """A block device for the suite to try (root with losetup: a loop device over a
    scratch image, detached after); '' where none can be had."""
    losetup = shutil.which("losetup")
    if os.geteuid() != 0 or losetup is None:
        yield ""
        return
    image = place / "disk.img"
    image.write_bytes(b"dagrunner-prove" * 70000)
    found = subprocess.run(
        [losetup, "--find", "--show", "--read-only", str(image)], capture_output=True, text=True
    )
    device = found.stdout.strip() if found.returncode == 0 else ""
    try:
        yield device
    finally:
        if device:
            subprocess.run([losetup, "--detach", device], capture_output=True)


MANIFEST = """
[env]
set = {{ PYTHONDONTWRITEBYTECODE = "1" }}

[gates.prove]
run = ["{python}", "-I", "-S", "suite.py", "spec.json"]
{isolated}
"""
ISOLATED = """
[gates.prove-isolated]
run = ["{python}", "-I", "-S", "suite.py", "spec.json", "isolated"]
network = "isolated"
"""


def _run(place: Path, env: Mapping[str, str], isolation: bool) -> subprocess.CompletedProcess[str]:
    repo = place / "repo"
    repo.mkdir()
    python = sys.executable
    shutil.copy(SUITE, repo / "suite.py")
    (repo / "m.toml").write_text(
        MANIFEST.format(python=python, isolated=ISOLATED.format(python=python) if isolation else "")
    )
    shutil.copy(place / "spec.json", repo / "spec.json")
    subprocess.run(["git", "init", "-q", str(repo)], capture_output=True, check=True)
    child = {
        **env,
        "HOME": str(place / "home"),
        "XDG_CACHE_HOME": str(place / "xdg"),
        "DAGRUNNER_CACHE_DIR": str(place / "store"),
        "DAGRUNNER_TOOL_CACHE_DIR": str(place / "tools"),
    }
    runner = subprocess.Popen(
        [python, "-m", "dagrunner", "release-check", "m.toml", "--no-cache", "--json"],
        cwd=repo,
        env=child,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    # the runner's pid is known only now: the suite reads it from its spec, written before
    # any gate starts (the plan takes longer than this write)
    spec = orjson.loads((repo / "spec.json").read_bytes())
    (repo / "spec.json").write_bytes(orjson.dumps({**spec, "runner": runner.pid}))
    try:
        out, err = runner.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        runner.kill()
        out, err = runner.communicate()
        err += "\nthe suite's run did not end within 300 s"
    return subprocess.CompletedProcess(runner.args, runner.returncode, out, err)


def _judge(
    done: subprocess.CompletedProcess[str], place: Path, spec: dict[str, Any], isolation: bool
) -> list[ProveLine]:
    found: dict[str, ProveLine] = {}
    logs = place / "repo" / ".git" / "dagrunner" / "reports" / "latest" / "logs"
    for gate in ("prove", "prove-isolated"):
        with contextlib.suppress(OSError, ValueError):
            text = (logs / f"{gate}.log").read_text().strip().splitlines()
            said = [
                line for line in text if line.startswith('[{"line"')
            ]  # dagrunner's notes follow
            for item in orjson.loads(said[-1]):
                found[item["line"]] = ProveLine(item["line"], item["held"], item["detail"])
    outside = Path(spec["outside"])
    if (outside / "planted").exists():
        found["write-outside"] = ProveLine("write-outside", False, f"wrote {outside}/planted")
    shutil.rmtree(outside, ignore_errors=True)
    survivors = _survivors(spec["marker"])
    if "outlive-gate" in found:
        found["outlive-gate"] = ProveLine(
            "outlive-gate",
            not survivors,
            f"{len(survivors)} process(es) outlived the gate (ended now)"
            if survivors
            else "nothing outlived the gate",
        )
    lines = []
    for name in LINES:
        if name in found:
            lines.append(found[name])
        elif name == "host-loopback" and not isolation:
            why = "no network namespace for gates here: an isolated gate does not start"
            lines.append(ProveLine(name, True, why))
        else:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no answer"]
            lines.append(ProveLine(name, False, f"not tried: the suite did not run ({last[0]})"))
    return lines


def _survivors(marker: str) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if marker in (proc.info.get("cmdline") or []):
                found.append(proc.pid)
                proc.kill()
    return found
