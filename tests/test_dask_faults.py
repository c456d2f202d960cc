"""Distributed runs that cannot hang: each test has a cluster of its own (real ``dask
scheduler``/``dask worker`` processes) and breaks it -- the last worker SIGKILLed, the only
worker big enough gone, a worker frozen with SIGSTOP (alive but unreachable), workers
killed and replaced, the whole cluster lost.  The run is a real ``dagrunner release-check``
process with a hard deadline: a hang fails the test instead of holding the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from clusters import Cluster, cluster, wait_for_workers
from conftest import CLI, running

pytestmark = pytest.mark.slow


def release_check(
    repo: Path, manifest: str, address: str, *, limit: float
) -> tuple[int, float, Path]:
    """The CLI on ``manifest``: its exit code, its wall time and its run dir; a run that
    outlives ``limit`` seconds is killed and fails the test."""
    (repo / "m.toml").write_text(textwrap.dedent(manifest))
    run_dir = repo.parent / f"run-{time.monotonic_ns()}"
    began = time.monotonic()
    try:
        done = subprocess.run(
            [*CLI, "release-check", "m.toml", "--repo", str(repo), "--executor", address,
             "--report-dir", str(run_dir), "--quiet", "--no-cache"],
            cwd=repo, capture_output=True, timeout=limit,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"release-check did not end within {limit:g} s: the run hangs")
    assert b"Traceback" not in done.stderr, done.stderr.decode()[-3000:]
    return done.returncode, time.monotonic() - began, run_dir


def gates(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: orjson.loads(p.read_bytes()) for p in (run_dir / "gates").glob("*.json")}


def when_running(marker: str, then: Callable[[], None], *, times: int = 1) -> threading.Thread:
    """Call ``then`` each time a new process with ``marker`` in its arguments appears."""

    def watch() -> None:
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while len(seen) < times and time.monotonic() < deadline:
            new = set(running(marker)) - seen
            if new:
                seen |= new
                then()
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def kill_workers(made: Cluster, sig: int = signal.SIGKILL) -> None:
    for pid in made.worker_pids():
        os.kill(pid, sig)


def test_the_last_workers_death_ends_the_run(repo: Path, tmp_path: Path) -> None:
    """One worker (no nanny); when it is SIGKILLed under a running gate, that attempt ends
    worker-lost naming it, and the gate that had not started waits for a worker at most
    ``wait_for_workers`` and ends dask-no-capacity -- never a pass, never a hang."""
    with cluster(tmp_path / "c", 2) as made:
        worker = made.worker_pids()
        watcher = when_running("300.0771", lambda: kill_workers(made))
        code, wall, run_dir = release_check(
            repo,
            """
            [executor]
            wait_for_workers = "3s"
            [gates.one]
            run = "sleep 300.0771"
            timeout = "120s"
            cpu = 2
            [gates.two]
            run = "sleep 300.0771"
            timeout = "120s"
            cpu = 2
            """,
            made.address,
            limit=90,
        )
        watcher.join()
    assert worker and code == 1
    assert wall < 45, wall  # the loss seen within seconds, then 3 s of waiting for a worker
    found = gates(run_dir)
    reasons = sorted(g["reason"] for g in found.values())
    assert [g["status"] for g in found.values()] == ["failed", "failed"], found
    assert reasons[0].startswith("dask-no-capacity"), reasons
    assert reasons[1].startswith("worker-lost") and "tcp://" in reasons[1], reasons
    lost = next(g for g in found.values() if g["reason"].startswith("worker-lost"))
    assert lost["attempts"][0]["error"].startswith("worker-lost")
    assert (run_dir / "run.json").exists() and (run_dir / "junit.xml").exists()


def test_a_gate_no_remaining_worker_can_fit_ends_dask_no_capacity(
    repo: Path, tmp_path: Path
) -> None:
    """The only cpu=4 worker dies under one big gate: the other big gate, which the
    remaining cpu=1 worker can never take, ends dask-no-capacity; the small gate passes."""
    with cluster(tmp_path / "c", 4, 1) as made:
        big = made.worker_pids()[0]
        watcher = when_running("300.0772", lambda: os.kill(big, signal.SIGKILL))
        code, _, run_dir = release_check(
            repo,
            """
            [executor]
            wait_for_workers = "3s"
            [gates.big1]
            run = "sleep 300.0772"
            cpu = 4
            [gates.big2]
            run = "sleep 300.0772"
            cpu = 4
            [gates.small]
            run = "sleep 4"
            cpu = 1
            """,
            made.address,
            limit=90,
        )
        watcher.join()
    assert code == 1
    found = gates(run_dir)
    assert found["small"]["status"] == "passed", found["small"]
    reasons = sorted(found[g]["reason"].split(":")[0] for g in ("big1", "big2"))
    assert reasons == ["dask-no-capacity", "worker-lost"], reasons


def test_an_unreachable_worker_times_out_on_the_submitter(repo: Path, tmp_path: Path) -> None:
    """SIGSTOP freezes the worker (alive, listed, unreachable): the submitter ends the
    attempt timed-out (worker-unreachable) past timeout + grace + margin; when the worker
    comes back, the gate's tree there is ended."""
    with cluster(tmp_path / "c", 2) as made:
        watcher = when_running("300.0773", lambda: kill_workers(made, signal.SIGSTOP))
        try:
            code, wall, run_dir = release_check(
                repo,
                """
                [executor]
                margin = "2s"
                [gates.stuck]
                run = "sleep 300.0773"
                timeout = "2s"
                """,
                made.address,
                limit=60,
            )
            watcher.join()
        finally:
            kill_workers(made, signal.SIGCONT)
        stuck = gates(run_dir)["stuck"]
        assert code == 1 and stuck["status"] == "timed-out", stuck
        assert "worker-unreachable" in stuck["reason"], stuck["reason"]
        deadline = time.monotonic() + 30
        while running("300.0773") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running("300.0773"), "the gate outlived its worker's return"
    assert wall < 2 + 3 + 2 + 15, wall  # timeout + grace + margin, and the run's own costs


def test_chaos_workers_killed_and_replaced_then_the_whole_cluster_lost(
    repo: Path, tmp_path: Path
) -> None:
    """Workers under nannies are SIGKILLed one after another (each comes back), then the
    scheduler and every nanny are: the run ends by itself with exit 1 -- never 0, never 70
    -- and every attempt either ran to its end or is named worker-lost/timed-out/no
    capacity; run.json and junit.xml list every gate."""
    names = [f"g{i}" for i in range(24)]  # 48 s of work on 4 slots: the loss comes mid-run
    manifest = '[executor]\nwait_for_workers = "3s"\n' + "".join(
        f'[gates.{n}]\nrun = "sleep 2.{i:02d}0774"\ntimeout = "60s"\nretries = 1\n'
        for i, n in enumerate(names)
    )
    with cluster(tmp_path / "c", 2, 2, nanny=True) as made:
        stop = threading.Event()

        def chaos() -> None:
            markers = [f"2.{i:02d}0774" for i in range(len(names))]
            while not any(running(m) for m in markers):  # the run checked its workers: go
                if stop.wait(0.1):
                    return
            for _ in range(3):
                if stop.wait(2.0):
                    return
                pids = made.worker_pids()
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
            stop.wait(2.5)
            for proc in [made.scheduler, *made.workers]:
                proc.kill()
            kill_workers(made)

        thread = threading.Thread(target=chaos, daemon=True)
        thread.start()
        code, _, run_dir = release_check(repo, manifest, made.address, limit=150)
        stop.set()
        thread.join()
    assert code == 1
    found = gates(run_dir)
    assert sorted(found) == sorted(names)
    allowed = ("worker-lost", "timed-out", "dask-no-capacity", "worker-unreachable")
    for gate in found.values():
        for attempt in gate["attempts"]:
            ran = attempt["exit_code"] == 0 and not attempt["error"]
            assert ran or attempt["error"].startswith(allowed), attempt
        assert gate["status"] in ("passed", "flaky", "failed", "timed-out"), gate
    errors = [a["error"] for g in found.values() for a in g["attempts"]]
    assert any(e.startswith("worker-lost") for e in errors), errors  # the chaos did happen
    assert any(g["status"] in ("passed", "flaky") for g in found.values())
    run = orjson.loads((run_dir / "run.json").read_bytes())
    assert sorted(g["id"] for g in run["gates"]) == sorted(names)
    assert any(w.startswith("lost the Dask scheduler") for w in run["warnings"]), run["warnings"]
    cases = ET.parse(run_dir / "junit.xml").getroot().iter("testcase")
    assert sorted(c.get("name", "") for c in cases) == sorted(names)


def _store(made: Cluster) -> Path:
    return made.base / "w0" / "remote"


def test_worker_stores_are_pruned_and_a_checkout_in_use_is_kept(repo: Path, tmp_path: Path) -> None:
    """Two states of the repository leave two sources in the worker's store; `cache prune
    --executor` with --max-age 0 keeps the checkout a running gate uses, and once nothing
    runs removes it and every source, the store smaller than before."""
    with cluster(tmp_path / "c", 2) as made:
        for text in ("one\n", "two\n"):
            (repo / "README").write_text(text)
            code, _, _ = release_check(repo, '[gates.a]\nrun = "true"\n', made.address, limit=60)
            assert code == 0
        store = _store(made) / "store.git"
        refs = subprocess.run(
            ["git", "for-each-ref", "refs/trees/"], cwd=store, capture_output=True, text=True
        ).stdout.split("\n")
        assert len([r for r in refs if r]) == 2, refs
        (repo / "m.toml").write_text('[gates.b]\nrun = "sleep 300.0775 & sleep 4; kill $!"\n')
        held = subprocess.Popen(
            [*CLI, "release-check", "m.toml", "--repo", str(repo), "--executor", made.address,
             "--report-dir", str(tmp_path / "held"), "--quiet", "--no-cache"],
            cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not running("300.0775"):
            assert time.monotonic() < deadline and held.poll() is None
            time.sleep(0.1)
        prune = [*CLI, "cache", "prune", "--executor", made.address, "--max-age", "0s", "--json"]
        during = orjson.loads(subprocess.run(prune, capture_output=True, check=True).stdout)
        assert held.wait(timeout=60) == 0  # the gate ran on in its checkout
        after = orjson.loads(subprocess.run(prune, capture_output=True, check=True).stdout)
        (address,) = wait_for_workers(made.scheduler_file, 1)
    first, second = during["workers"][address], after["workers"][address]
    assert first["busy"] == 1 and first["removed"] == [], first
    assert first["dropped_refs"] >= 1  # the earlier states' sources
    assert second["busy"] == 0 and len(second["removed"]) == 1, second
    assert second["size_after"] < second["size_before"], second
    assert not list((_store(made) / "slots").glob("*/"))


def test_each_run_start_bounds_the_workers_stores(repo: Path, tmp_path: Path) -> None:
    """A worker whose operator bounds its store to no age keeps only the source of the
    latest run once the next one starts: the earlier checkout and its source are gone."""
    with cluster(tmp_path / "c", 2, env={"DAGRUNNER_REMOTE_MAX_AGE": "0s"}) as made:
        for text in ("one\n", "two\n", "three\n"):
            (repo / "README").write_text(text)
            code, _, _ = release_check(repo, '[gates.a]\nrun = "true"\n', made.address, limit=60)
            assert code == 0
        deadline = time.monotonic() + 20  # the bound is applied beside the run, not awaited
        while True:
            listed = subprocess.run(
                ["git", "for-each-ref", "refs/trees/"], cwd=_store(made) / "store.git",
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            if len(listed) <= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert len(listed) == 3, listed  # one ref: "<sha> commit refs/trees/<sha>"


def test_attempts_go_straight_to_the_worker_and_through_the_scheduler_when_they_must(
    repo: Path, tmp_path: Path
) -> None:
    """With the scheduler frozen (SIGSTOP), an attempt still runs and answers: the call goes
    from the submitter to the worker and back.  A worker that does not answer from here puts
    the calls back through the scheduler, with a warning, and attempts still run."""
    import trio

    from dagrunner.executors.base import Machine
    from dagrunner.executors.dask import DaskExecutor
    from dagrunner.process.sandbox import GateJob

    work = tmp_path / "work"
    work.mkdir()

    def attempt(executor: DaskExecutor, name: str) -> int | None:
        job = GateJob(
            gate=name, argv=("true",), cwd=str(repo), env={"PATH": os.environ["PATH"]},
            sandbox_dir=str(work / name), log_path=str(work / f"{name}.log"),
            log_limit=1 << 16, timeout=30.0,
        )  # fmt: skip

        async def run() -> int | None:
            with trio.fail_after(20):
                return (await executor.execute(job)).exit_code

        return trio.run(run)

    with cluster(tmp_path / "c", 1) as made:
        executor = DaskExecutor(made.address)
        try:
            [worker] = [m.name for m in executor.machines()]
            assert executor._actors.direct
            assert attempt(executor, "warm") == 0  # the source shipped, the actor made
            made.scheduler.send_signal(signal.SIGSTOP)
            try:
                assert attempt(executor, "frozen") == 0
            finally:
                made.scheduler.send_signal(signal.SIGCONT)
            assert executor.warnings == []

            executor._route([Machine(worker, 1, 0), Machine("tcp://127.0.0.1:1", 1, 0)])
            [warning] = executor.warnings  # nothing listens there
            assert "tcp://127.0.0.1:1 does not answer this machine straight" in warning
            assert not executor._actors.direct
            assert attempt(executor, "proxied") == 0
        finally:
            executor.close()
