"""Real Dask clusters for tests: ``dask scheduler`` and ``dask worker`` processes (the CLI
programs), each worker with its own remote dir, on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SCHEDULER = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
WORKER = [sys.executable, "-m", "distributed.cli.dask_worker"]


def start_scheduler(scheduler_file: Path) -> subprocess.Popen[bytes]:
    """``dask scheduler`` on a free port; returns once it has written ``scheduler_file``."""
    proc = subprocess.Popen(
        [*SCHEDULER, "--port", "0", "--dashboard-address", ":0",
         "--scheduler-file", str(scheduler_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not scheduler_file.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the scheduler did not start"
        time.sleep(0.1)
    return proc


def wait_for_workers(scheduler_file: Path, count: int) -> dict[str, dict[str, float]]:
    """Each worker's address and declared resources, once ``count`` of them are there."""
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file), timeout="30s") as client:  # type: ignore[no-untyped-call]
        client.wait_for_workers(count, timeout=60)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        return {a: dict(w.get("resources") or {}) for a, w in workers.items()}


@dataclass
class Cluster:
    """A scheduler and its workers, all processes of this test."""

    base: Path
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    nannies: list[bool] = field(default_factory=list)

    @property
    def scheduler_file(self) -> Path:
        return self.base / "scheduler.json"

    @property
    def address(self) -> str:
        """The address as ``--executor`` takes it (dask://HOST:PORT)."""
        address: str = json.loads(self.scheduler_file.read_text())["address"]
        return "dask://" + address.removeprefix("tcp://")

    def add_worker(
        self, cpu: float, *, nanny: bool = False, name: str = "", env: dict[str, str] | None = None
    ) -> None:
        name = name or f"w{len(self.workers)}"
        own = {k: v for k, v in os.environ.items() if not k.startswith(("DAGRUNNER_", "GIT_"))}
        own |= {"DAGRUNNER_REMOTE_DIR": str(self.base / name / "remote"), **(env or {})}
        (self.base / name).mkdir(parents=True, exist_ok=True)
        self.nannies.append(nanny)
        self.workers.append(
            subprocess.Popen(
                [*WORKER, "--scheduler-file", str(self.scheduler_file), "--dashboard-address",
                 ":0", "--nthreads", str(max(1, int(cpu))), "--resources", f"cpu={cpu:g}",
                 "--local-directory", str(self.base / name / "dir"),
                 *([] if nanny else ["--no-nanny"])],
                env=own, cwd=self.base / name, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip

    def worker_pids(self) -> list[int]:
        """The worker processes themselves: a nanny's child, else the process we started."""
        pids = []
        for proc, nanny in zip(self.workers, self.nannies, strict=True):
            if not nanny:
                pids += [proc.pid] if proc.poll() is None else []
                continue
            for child in psutil.Process(proc.pid).children() if proc.poll() is None else []:
                try:
                    if "spawn_main" in " ".join(child.cmdline()):
                        pids.append(child.pid)
                except psutil.Error:  # it just died (a zombie until the nanny reaps it)
                    continue
        return pids

    def stop(self) -> None:
        for proc in [*reversed(self.workers), self.scheduler]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def cluster(
    base: Path, *cpus: float, nanny: bool = False, env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """A scheduler and one worker per entry of ``cpus`` (``cpu=N`` each, ``env`` added to
    their environment), ready."""
    base.mkdir(parents=True, exist_ok=True)
    made = Cluster(base, start_scheduler(base / "scheduler.json"))
    try:
        for cpu in cpus:
            made.add_worker(cpu, nanny=nanny, env=env)
        wait_for_workers(made.scheduler_file, len(cpus))
        yield made
    finally:
        made.stop()
