"""The --json shapes orchestrators depend on stay as they were when records became typed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from conftest import commit_release_manifest, run_json

ALLOCATE_KEYS = [
    "id", "path", "branch", "base", "root", "session", "created", "reused", "pooled", "copied",
    "main_checkout_dirty", "ports", "seeds",
]  # fmt: skip
REALLOCATE_KEYS = [
    "id", "path", "branch", "base", "root", "session", "created", "reused", "main_checkout_dirty",
    "ports", "seeds",
]  # fmt: skip
STATUS_KEYS = [
    "id", "path", "branch", "base", "session", "created", "last_activity", "target", "retained",
    "missing", "head", "clean", "staged", "unstaged", "untracked", "unmerged", "ahead", "behind",
    "diffstat", "rebase_in_progress", "merge_in_progress", "integrated", "integrated_reason",
    "ports",  # with [worktrees] ports
]  # fmt: skip
EXPORT_KEYS = [
    "id", "file", "worktree", "empty", "base", "head", "tree", "changed_files", "diff_bytes",
    "diff_sha256",
]  # fmt: skip
INTEGRATE_KEYS = [
    "target", "start", "end", "envelopes", "gate_runs", "rebuilds", "land_blocked",
    "target_moving", "checkout_stale", "report_dir", "counts",
    # added with the speculative pipeline, after the older keys
    "confirm_runs", "resets", "window", "interrupted", "pipeline",
    "gates_reused", "gates_waited", "warnings",  # with reuse and landed proofs
    "gate_cpu", "batches", "target_red",  # batches that size themselves, differential
    "held",  # items a red target holds (absolute baseline)
]  # fmt: skip


def test_status_export_and_integrate_json_keep_their_shapes(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_release_manifest(repo, '[gates.ok]\nrun = ["true"]\n')
    base = ["--repo", str(repo)]
    _, allocated = run_json(
        capsys, "worktree", "allocate", "--mission", "m", "--worker", "w", *base
    )
    (Path(allocated["path"]) / "new.txt").write_text("x\n")
    _, status = run_json(capsys, "worktree", "status", "m/w", *base)
    assert list(status) == [*STATUS_KEYS, "conflicts_with"]  # with worktree overlaps
    _, listing = run_json(capsys, "worktree", "list", *base)
    assert [list(item) for item in listing["worktrees"]] == [[*STATUS_KEYS, "disk"]]
    assert list(listing) == ["worktrees", "disk", "kept"] and listing["kept"] == []
    out = repo.parent / "env.json"
    _, exported = run_json(capsys, "worktree", "export", "m/w", "-o", str(out), *base)
    assert list(exported) == EXPORT_KEYS
    run_json(capsys, "integrate", "submit", str(out), *base)
    _, result = run_json(capsys, "integrate", "run", *base)
    assert list(result) == INTEGRATE_KEYS
    assert result["counts"] == {"landed": 1}


SUBMIT_KEYS = ["id", "file", "duplicate", "position", "state", "envelope", "target", "provenance"]
SUBMIT_KEYS.append("overlaps")  # with the overlap events
SUBMIT_KEYS.append("again_of")  # with --requeue
# every outcome says what became of its worker's worktree ("retained: ..." unless it landed)
OUTCOME_KEYS = {
    "landed": ["id", "mission", "worker", "state", "commit", "worktree", "provenance"],
    "conflict": [
        *("id", "mission", "worker", "state", "conflicts", "hunks", "reason", "worktree"),
        "provenance",
    ],
    "gates-failed": [
        *("id", "mission", "worker", "state", "failed_gates", "report", "worktree"),
        "provenance",
    ],
    "rejected": ["id", "mission", "worker", "state", "reason", "worktree", "provenance"],
}
ENTRY = ["id", "submitted", "state", "mission", "worker", "source", "updated", "target"]
ENTRY.append("provenance")
QUEUE_KEYS = {
    "landed": [*ENTRY, "commit", "gate_run", "old", "new", "head", "position"],
    # the second envelope of the conflicting pair was foreseen at submit (an overlap event)
    "conflict": [*ENTRY, "conflicts", "hunks", "reason", "overlaps_with", "overlap_paths"],
    "gates-failed": [*ENTRY, "commit", "gate_run", "failed_gates", "report", "head", "position"],
    "rejected": [*ENTRY, "reason"],
}


def test_every_envelope_outcome_and_queue_entry_keeps_its_shape(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run that lands, conflicts, fails gates and rejects: each outcome's keys, in order."""
    commit_release_manifest(repo, '[gates.ok]\nrun = "test ! -e bad"\n')
    base = ["--repo", str(repo)]
    work = {"a": ("a.txt", "x\n"), "b": ("README", "one\n"), "c": ("README", "two\n")}
    work |= {"d": ("bad", "x\n"), "e": ("", "")}  # d fails the gate, e is empty
    files = []
    for worker, (name, text) in work.items():
        _, allocated = run_json(
            capsys, "worktree", "allocate", "--mission", "m", "--worker", worker, *base
        )
        if name:
            (Path(allocated["path"]) / name).write_text(text)
        out = str(repo.parent / f"{worker}.json")
        run_json(capsys, "worktree", "export", f"m/{worker}", "-o", out, *base)
        files.append(out)
    _, submitted = run_json(capsys, "integrate", "submit", *files, *base)
    assert [list(s) for s in submitted["submitted"]] == [SUBMIT_KEYS] * 5
    code, result = run_json(capsys, "integrate", "run", *base)
    assert code == 1  # d failed its gates
    states = {e["worker"]: e["state"] for e in result["envelopes"]}
    assert states == {
        "a": "landed", "b": "landed", "c": "conflict", "d": "gates-failed", "e": "rejected"
    }  # fmt: skip
    for outcome in result["envelopes"]:
        assert list(outcome) == OUTCOME_KEYS[outcome["state"]], outcome["state"]
    assert result["counts"] == {"conflict": 1, "gates-failed": 1, "landed": 2, "rejected": 1}
    _, queue = run_json(capsys, "integrate", "status", *base)
    # eta: with the ETA per item; target_red: with differential gating
    assert list(queue) == ["envelopes", "counts", "eta", "target_red"]
    for entry in queue["envelopes"]:
        assert list(entry) == QUEUE_KEYS[entry["state"]], entry["state"]


SPEED_KEYS = [
    "wall", "serial_sum", "speedup", "critical_path", "work", "capacity_cpu", "lower_bound",
    "efficiency", "cache_saved", "cache_hits", "governor_wait",
]  # fmt: skip
MISS_KEYS = ["budget", "limit", "measured", "message"]


def test_speed_and_budget_evidence_keep_their_shapes(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = repo / "m.toml"
    manifest.write_text(
        '[budget]\nmax_wall = "1ms"\nmin_speedup = 5\nmax_duration = { a = "1ms" }\n'
        '[gates.a]\nrun = "sleep 0.05"\n[gates.b]\nrun = "sleep 0.05"\nneeds = ["a"]\n'
    )
    code, body = run_json(capsys, "release-check", str(manifest), "--repo", str(repo))
    assert code == 1
    assert list(body["speed"]) == SPEED_KEYS
    assert list(body["speed"]["critical_path"]) == ["gates", "duration"]
    assert body["speed"]["critical_path"]["gates"] == ["a", "b"]
    assert list(body["budget"]) == ["declared", "ok", "misses"]
    assert [m["budget"] for m in body["budget"]["misses"]] == [
        "max_wall", "min_speedup", "gates.a.max_duration"
    ]  # fmt: skip
    assert all(list(m) == MISS_KEYS for m in body["budget"]["misses"])
    run = orjson.loads((Path(body["run_dir"]) / "run.json").read_bytes())
    assert run["speed"] == body["speed"] and run["budget"] == body["budget"]


def test_a_conflict_after_a_speculative_attempt_carries_no_commit_of_that_attempt(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An item applied on a speculative head (a half of a failed batch, without the item it
    conflicts with), then queued again and found in conflict on the real head: its status
    names no commit, head or gate run of the abandoned attempt (CI saw a conflict with one)."""
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.queue import Queue
    from dagrunner.records.integration import Details, EnvelopeState

    commit_release_manifest(repo, '[gates.ok]\nrun = ["true"]\n')
    base = ["--repo", str(repo)]
    _, allocated = run_json(
        capsys, "worktree", "allocate", "--mission", "m", "--worker", "w", *base
    )
    (Path(allocated["path"]) / "a.txt").write_text("x\n")
    out = str(repo.parent / "w.json")
    run_json(capsys, "worktree", "export", "m/w", "-o", out, *base)
    _, submitted = run_json(capsys, "integrate", "submit", out, *base)
    item = submitted["submitted"][0]["id"]
    queue = Queue.of(repo_info(repo), target="main")
    queue.record(item, EnvelopeState.APPLYING)
    queue.record(item, EnvelopeState.APPLIED, Details(commit="1" * 40))
    queue.record(item, EnvelopeState.GATING, Details(gate_run=3, head="2" * 40, position=1))
    queue.record(item, EnvelopeState.QUEUED, Details(note="speculation reset"))
    queue.record(item, EnvelopeState.APPLYING)
    queue.record(item, EnvelopeState.CONFLICT, Details(conflicts=("a.txt",), reason="r"))
    _, status = run_json(capsys, "integrate", "status", *base)
    [entry] = status["envelopes"]
    assert entry["state"] == "conflict"
    assert list(entry) == [*ENTRY, "conflicts", "reason"]
