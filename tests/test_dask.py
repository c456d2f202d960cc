"""Gates on a real Dask LocalCluster through the same scheduler, governor and sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import check, gate_results, running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
    ) as cluster:
        yield "dask://" + str(cluster.scheduler_address).split("://", 1)[1]


def test_gates_run_on_the_cluster(
    repo: Path, capsys: pytest.CaptureFixture[str], dask_address: str
) -> None:
    code, body, run_dir = check(
        capsys,
        repo,
        """
        [gates.a]
        run = "echo on-worker pid $$; echo $HOME"
        [gates.b]
        run = "echo second; exit 3"
        needs = ["a"]
        [gates.c]
        run = "sleep 300.0331 & echo $! > grandchild.pid; sleep 301"
        timeout = "1s"
    """,
        "--executor",
        dask_address,
    )
    assert code == 1
    gates = gate_results(run_dir)
    assert gates["a"]["status"] == "passed"
    assert "on-worker pid" in (run_dir / "logs" / "a.log").read_text()
    assert gates["b"]["status"] == "failed" and gates["b"]["exit_code"] == 3
    assert gates["c"]["status"] == "timed-out"
    assert not running("300.0331")
    assert body["options"]["executor"] == dask_address


def test_unreachable_scheduler_is_an_environment_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body, _ = check(
        capsys, repo, '[gates.a]\nrun = ["true"]\n', "--executor", "dask://127.0.0.1:1?timeout=1s"
    )
    assert code == 3
    assert body["error"]["code"] == "dask-unreachable"
    assert not (repo / "reports").exists()
