"""``integrate stats`` and ``/metrics`` from the process's shared journal index (issue 48): a
scrape reads what was appended since the last, never the whole journal again, and says what
reading the events says."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from conftest import commit_release_manifest, envelope

from dagrunner.git.repo import repo_info
from dagrunner.integration.events import queue_stats
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit


def test_the_indexs_figures_are_the_events_own(repo: Path) -> None:
    commit_release_manifest(
        repo, '[gates.ok]\nrun = "true"\n[gates.picky]\nrun = "test ! -e bad1.txt"\n'
    )
    submit(repo_info(repo), [envelope(repo, "good0"), envelope(repo, "bad1")])
    assert sorted(o.state for o in integrate(repo=repo).envelopes) == ["gates-failed", "landed"]
    submit(repo_info(repo), [envelope(repo, "waiting")])
    whole = queue_stats(repo=repo).to_json()
    read = queue_stats(repo=repo, since=1e9).to_json()  # from the events, everything recent
    assert whole == {**read, "since": None}
    assert whole["outcomes"] == {"gates-failed": 1, "landed": 1} and whole["pending"] == 1
    assert whole["gate_runs"] >= 2 and whole["time_in_queue"]["count"] == 2


def test_a_scrape_reads_only_what_was_appended_since_the_last(repo: Path) -> None:
    journal = Queue.of(repo_info(repo)).journal
    journal.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        orjson.dumps(
            {
                "at": "2025-01-01T00:00:00+00:00",
                "id": f"old.{n}",
                "state": state,
                "target": "main",
                "note": "x" * 120,
            }
        )
        for n in range(4000)
        for state in ("queued", "applying", "gating", "landing", "landed")
    ]
    journal.write_bytes(b"\n".join(lines) + b"\n")
    began = time.perf_counter()
    first = queue_stats(repo=repo)
    cold = time.perf_counter() - began
    assert first.outcomes == {"landed": 4000} and first.pending == 0
    with journal.open("ab") as handle:  # another process submits one more
        handle.write(orjson.dumps({"at": "2025-01-02T00:00:00+00:00", "id": "new.0",
                                   "state": "queued", "target": "main"}) + b"\n")  # fmt: skip
    warm = []
    for _ in range(5):
        began = time.perf_counter()
        again = queue_stats(repo=repo)
        warm.append(time.perf_counter() - began)
        assert again.pending == 1 and again.outcomes == {"landed": 4000}
    assert min(warm) < cold / 5, (cold, warm)


def test_a_wait_from_cursor_0_reads_from_its_items_submission(repo: Path) -> None:
    from dagrunner.agents.follow import wait
    from dagrunner.agents.tools import Binding
    from dagrunner.integration.events import watch

    commit_release_manifest(repo, '[gates.ok]\nrun = "true"\n')
    journal = Queue.of(repo_info(repo)).journal
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_bytes(
        b"".join(
            orjson.dumps({"at": "2025-01-01T00:00:00+00:00", "id": f"old.{n}", "state": s}) + b"\n"
            for n in range(2000)
            for s in ("queued", "landed")
        )
    )
    mine = submit(repo_info(repo), [envelope(repo, "mine")])[0].id
    ahead = queue_stats(repo=repo)  # the process's index has read the journal already
    assert ahead.pending == 1
    said = wait(Binding(repo=repo, drive=False), mine, timeout_seconds=2.0, cursor=0)
    expected = [e.to_json() for e in watch(repo=repo, follow=False) if e.id == mine]
    assert [e["event"] for e in said["events"]] == ["submitted"] and said["events"] == expected
    assert said["cursor"] == expected[-1]["cursor"] and not said["final"]
