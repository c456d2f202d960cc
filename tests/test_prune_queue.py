"""``integrate prune`` (issue 48): the journal compacted to what live items and watchers need,
the stored envelopes of dropped items removed; cursors stay meaningful (a watcher at the old
end goes on, an older cursor is a coded error); appends from other processes while it
compacts are never lost; a SIGKILL in its middle leaves a queue that reads the same; a
running integrator is never pruned under (``integrator-busy``); ``serve --prune-every``
prunes as it goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import CLI, commit_release_manifest, envelope

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate, integrator_lock
from dagrunner.integration.submit import submit


def cli(repo: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    done = subprocess.run(
        [*CLI, *args, "--repo", str(repo), "--json"],
        capture_output=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    lines = [orjson.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines[0] if len(lines) == 1 else lines


def states(repo: Path) -> dict[str, str]:
    return {e.worker or e.id: str(e.state) for e in Queue.of(repo_info(repo)).entries().values()}


@pytest.fixture
def history(repo: Path) -> Path:
    """Three items landed, one queued behind them (not run)."""
    commit_release_manifest(repo, '[gates.ok]\nrun = "true"\n')
    submit(repo_info(repo), [envelope(repo, f"old{i}") for i in range(3)])
    assert all(o.state == "landed" for o in integrate(repo=repo).envelopes)
    submit(repo_info(repo), [envelope(repo, "live")])
    return repo


def test_prune_keeps_what_live_items_and_watchers_need(history: Path) -> None:
    queue = Queue.of(repo_info(history))
    code, events = cli(history, "integrate", "watch", "--once")
    assert code == 0
    end, middle = events[-1]["cursor"], events[len(events) // 2]["cursor"]
    before = queue.journal.stat().st_size
    code, kept = cli(history, "integrate", "prune", "--keep", "1h")
    assert code == 0 and kept["items"] == {"before": 4, "after": 4}, kept  # all young
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0, pruned
    # the newest landing's item stays (a checkout it left half updated is repaired from it)
    assert pruned["items"] == {"before": 4, "after": 2} and pruned["envelopes_removed"] == 2
    assert queue.journal.stat().st_size < before / 2
    assert states(history) == {"live": "queued", "old2": "landed"}
    assert sorted(p.stem for p in (queue.dir / "envelopes").iterdir()) == sorted(queue.entries())
    # a watcher that had read everything goes on with nothing missed, nothing twice
    code, after = cli(history, "integrate", "watch", "--once", "--since", str(end))
    assert code == 0 and after == [], after
    code, stale = cli(history, "integrate", "watch", "--once", "--since", str(middle))
    assert code == 2 and stale["error"]["code"] == "watch-cursor-compacted", stale
    code, whole = cli(history, "integrate", "watch", "--once")
    assert code == 0 and [e["event"] for e in whole if e["worker"] == "live"] == ["submitted"]
    assert whole[0]["cursor"] > end  # cursors only grow across a compaction
    live = next(e["id"] for e in whole if e["worker"] == "live")
    # the queue works on: the live item lands; a watcher from the old end sees it
    result = integrate(repo=history)
    assert [o.state for o in result.envelopes] == ["landed"]
    code, news = cli(history, "integrate", "watch", "--once", "--since", str(end))
    assert code == 0 and news[-1]["event"] == "landed" and news[-1]["id"] == live
    code, stats = cli(history, "integrate", "stats")
    assert code == 0 and stats["outcomes"] == {"landed": 2}, stats


APPENDER = """
import sys
from pathlib import Path
from dagrunner.integration.queue import Queue
from dagrunner.records.integration import EnvelopeState
queue, stop, n = Queue(Path(sys.argv[1]), "main"), Path(sys.argv[3]), 0
while not stop.exists():
    queue.record(f"{sys.argv[2]}.{n}", EnvelopeState.QUEUED, mission="m", worker=sys.argv[2])
    n += 1
print(n)
"""


def test_appends_from_other_processes_while_it_compacts_are_never_lost(
    history: Path, tmp_path: Path
) -> None:
    queue = Queue.of(repo_info(history))
    stop = tmp_path / "stop"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(queue.dir), f"w{i}", str(stop)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for _ in range(6):  # each drops the final items; the writers' lines are all live
            code, _ = cli(history, "integrate", "prune", "--keep", "0s")
            assert code == 0
    finally:
        stop.touch()
    written = [int(w.communicate(timeout=30)[0]) for w in writers]
    found = Queue.of(repo_info(history)).entries()
    for i, count in enumerate(written):
        assert sum(1 for k in found if k.startswith(f"w{i}.")) == count, (i, count)


def test_a_kill_in_the_middle_of_a_prune_leaves_a_queue_that_reads_the_same(
    history: Path,
) -> None:
    code, _ = cli(history, "integrate", "prune", "--keep", "0s",
                  env={"DAGRUNNER_CRASH_AT": "pruning"})  # fmt: skip
    assert code == -9
    assert states(history) == {f"old{i}": "landed" for i in range(3)} | {"live": "queued"}
    code, pruned = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 0 and pruned["items"]["after"] == 2, pruned
    assert states(history) == {"live": "queued", "old2": "landed"}


def test_a_running_integrator_is_never_pruned_under(history: Path) -> None:
    lock = repo_info(history).state_dir / "integrate-main.lock"
    with integrator_lock(lock, wait=False):
        code, said = cli(history, "integrate", "prune", "--keep", "0s")
    assert code == 4 and said["error"]["code"] == "integrator-busy", said
    assert "--prune-every" in said["error"]["hint"]


def test_serve_prunes_as_it_goes(history: Path) -> None:
    server = subprocess.Popen(
        [*CLI, "integrate", "serve", "--repo", str(history), "--prune-every", "1s",
         "--prune-keep", "0s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and states(history) != {"live": "landed"}:
            time.sleep(0.2)  # "live" lands, then every other final item is pruned
        assert states(history) == {"live": "landed"}
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=20)
    assert server.returncode == 130 and "pruned" in err, (out, err)  # stopped by a signal
