"""Benchmark: 50 envelopes through the integration queue -- one by one, batched, and the
speculative pipeline -- with and without culprits; and export speed.

    python scripts/bench_integration.py [--envelopes 50] [--gate-seconds 0.3] [--batch 10]

For each mode (one by one; --batch N; --window 2; --window 4; --window 4 --batch 5) and
each scenario (0 culprits; 2 culprits and one flaky gate), a fresh repository is
generated, N workers each change their own file (two of them edit the same lines of
one shared file, so one conflict), every worktree is exported and submitted, and
`integrate` drains the queue with one gate of fixed cost (sleep, cpu 1).  Printed:
wall time, envelopes per minute, gate runs (of which confirmation re-runs), outcomes,
the ratio against one by one in the same scenario, and whether the target's tree is
exactly the base plus the landed envelopes.  Then the export of a worktree with 1,000
changed files against plain `git diff --binary` of the same change.

    python scripts/bench_integration.py --scenario blame [--gate-seconds 1.5]

One culprit among 9 envelopes (the third), one gate of 1.5 s: the pipeline with
``--window 2`` against one by one, in the same run (blame without waiting).

    python scripts/bench_integration.py --scenario reuse [--envelopes 12] [--gate-seconds 1]

Two gates: ``heavy`` (``inputs = ["src/**"]``, which no envelope changes) and ``check`` (no
inputs, fails on the culprits), ``--window 4``; against the same queue with ``heavy``'s
``inputs`` removed (nothing to reuse).  Printed: wall, heavy's runs, gates reused.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import TRAILER, integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as worktrees
from dagrunner.worktrees import export as exporting

GIT_ID = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def sh(argv: list[str], cwd: Path) -> None:
    subprocess.run(argv, cwd=cwd, env={**os.environ, **GIT_ID}, check=True, capture_output=True)


CULPRITS = (7, 31)  # write BROKEN: the gate fails on them
FLAKY = 20  # adds the file whose first gate run fails once


def make_repo(
    root: Path, files: int, gate_seconds: float, marker: Path | None = None, manifest: str = ""
) -> None:
    root.mkdir(parents=True)
    (root / "manifests").mkdir()
    flaky = (
        f"if [ -e flaky-trigger.txt ] && mkdir '{marker}' 2>/dev/null; then exit 1; fi; "
        if marker is not None
        else ""
    )
    # the flaky gate's marker is outside the tree: the gate may write only what is named
    writable = f'[sandbox]\nwritable = ["{marker.parent}"]\n\n' if marker is not None else ""
    (root / "manifests" / "release.toml").write_text(
        manifest
        or f"{writable}[integrate]\nwindow = 1\n\n[gates.fixed-cost]\ncpu = 1\n"
        f'run = "sleep {gate_seconds}; {flaky}! grep -rq BROKEN --include=*.txt ."\n'
    )
    (root / "src").mkdir()
    (root / "src" / "lib.txt").write_text("what heavy reads\n")
    for i in range(files):
        (root / f"file{i:04d}.txt").write_text(f"file {i}\n" * 5)
    (root / "shared.txt").write_text("a\nb\nc\n")
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "base"],
    ):
        sh(argv, root)


def change(path: Path, i: int, culprits: bool) -> None:
    if i in (10, 11):
        (path / "shared.txt").write_text(f"a\nb from {i}\nc\n")
    elif culprits and i in CULPRITS:
        (path / f"culprit{i}.txt").write_text("BROKEN\n")
    else:
        (path / f"file{i:04d}.txt").write_text(f"file {i}, changed\n" * 5)
        if culprits and i == FLAKY:
            (path / "flaky-trigger.txt").write_text("the first gate run that sees me fails\n")


def exact_tree(repo: Path, base: str, scratch: Path) -> bool:
    """The target's tree is the base plus exactly the landed envelopes, in landing order."""
    queue = Queue.of(repo_info(repo))
    sh(["git", "worktree", "add", "-q", "--detach", str(scratch), base], repo)
    log = subprocess.run(
        ["git", "log", "--reverse", f"--format=%(trailers:key={TRAILER},valueonly)", "main"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for envelope_id in log:
        diff = queue.load(envelope_id).diff
        (scratch.parent / "p.diff").write_bytes(diff)
        sh(["git", "apply", "--index", str(scratch.parent / "p.diff")], scratch)

    def tree(cwd: Path, *argv: str) -> str:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True).stdout

    landed = {i for i, e in queue.entries().items() if e.state == "landed"}
    return set(log) == landed and tree(scratch, "git", "write-tree") == tree(
        repo, "git", "rev-parse", "main^{tree}"
    )


def run_mode(
    base: Path, count: int, gate_seconds: float, batch: int, window: int, culprits: bool
) -> dict[str, object]:
    name = f"repo-b{batch}-w{window}-{'c' if culprits else 'clean'}"
    repo = base / name
    make_repo(repo, count, gate_seconds, base / f"{name}.flaky" if culprits else None)
    start_commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    envelopes = []
    for i in range(count):
        path = Path(worktrees.allocate(mission="bench", worker=f"w{i:03d}", repo=repo)["path"])
        change(path, i, culprits)
        envelopes.append(Path(exporting.export(f"bench/w{i:03d}", repo=repo)["file"]))
    submit(repo_info(repo), envelopes)
    start = time.perf_counter()
    result = integrate(repo=repo, batch=batch, window=window)
    wall = time.perf_counter() - start
    counts: dict[str, int] = {}
    for outcome in result.envelopes:
        counts[str(outcome.state)] = counts.get(str(outcome.state), 0) + 1
    flaky = sum(1 for o in result.envelopes if o.details.flaky_gates)
    return {
        "wall": wall,
        "gate_runs": result.gate_runs,
        "confirm_runs": result.confirm_runs,
        "counts": counts,
        "flaky": flaky,
        "exact": exact_tree(repo, start_commit, base / f"{name}-check" / "tree"),
    }


def queue_of(repo: Path, count: int, culprits: tuple[int, ...]) -> None:
    envelopes = []
    for i in range(count):
        path = Path(worktrees.allocate(mission="bench", worker=f"w{i:03d}", repo=repo)["path"])
        if i in culprits:
            (path / f"culprit{i}.txt").write_text("BROKEN\n")
        else:
            (path / f"file{i:04d}.txt").write_text(f"file {i}, changed\n" * 5)
        envelopes.append(Path(exporting.export(f"bench/w{i:03d}", repo=repo)["file"]))
    submit(repo_info(repo), envelopes)


def blame(base: Path, gate_seconds: float) -> None:
    """One culprit among 9: --window 2 against one by one."""
    print(f"9 envelopes, the third a culprit, gate of {gate_seconds}s, cpu 1")
    walls = {}
    for window in (1, 2):
        repo = base / f"blame-w{window}"
        make_repo(repo, 9, gate_seconds)
        queue_of(repo, 9, (2,))
        start = time.perf_counter()
        result = integrate(repo=repo, window=window)
        walls[window] = time.perf_counter() - start
        counts: dict[str, int] = {}
        for outcome in result.envelopes:
            counts[str(outcome.state)] = counts.get(str(outcome.state), 0) + 1
        print(
            f"  --window {window}: {walls[window]:6.2f}s ({walls[window] / walls[1]:4.2f}x one "
            f"by one)  {result.gate_runs} gate runs ({result.confirm_runs} re-runs)  {counts}"
        )


REUSE = """[gates.heavy]
cpu = 1
run = "sleep {s}; echo ran >> '{runs}'; cat src/lib.txt >/dev/null"
{inputs}
[gates.check]
cpu = 0.25
run = "! grep -rq BROKEN --include=*.txt ."
"""


def reuse(base: Path, count: int, gate_seconds: float) -> None:
    """heavy's inputs never change: reused (and single-flighted) against declared none."""
    culprits = (3, count // 2 + 1)
    print(
        f"{count} envelopes, culprits at {culprits}, --window 4; heavy {gate_seconds}s "
        "(inputs src/**, which no envelope changes) + check"
    )
    walls = {}
    for declared in (False, True):
        repo = base / f"reuse-{declared}"
        runs = base / f"reuse-{declared}.runs"
        inputs = 'inputs = ["src/**"]\n' if declared else ""
        manifest = REUSE.format(s=gate_seconds, runs=runs, inputs=inputs)
        make_repo(
            repo, count, gate_seconds, manifest=f'[sandbox]\nwritable = ["{base}"]\n' + manifest
        )
        queue_of(repo, count, culprits)
        start = time.perf_counter()
        result = integrate(repo=repo, window=4)
        walls[declared] = time.perf_counter() - start
        heavy = runs.read_text().count("ran") if runs.exists() else 0
        print(
            f"  {'with inputs (reuse)' if declared else 'no inputs (no reuse)':<22}"
            f"{walls[declared]:6.2f}s ({walls[declared] / walls[False]:4.2f}x)  "
            f"heavy ran {heavy:>2}x  gates reused {result.gates_reused} "
            f"(waited {result.gates_waited})  {result.gate_runs} tree runs"
        )


def export_speed(base: Path, files: int) -> tuple[float, float]:
    repo = base / "export-repo"
    make_repo(repo, files, 0.0)
    path = Path(worktrees.allocate(mission="bench", worker="big", repo=repo)["path"])
    for i in range(files):
        (path / f"file{i:04d}.txt").write_text(f"file {i}, changed by the worker\n" * 5)
    start = time.perf_counter()
    exporting.export("bench/big", repo=repo, output=base / "big.json")
    ours = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run(["git", "diff", "--binary", "HEAD"], cwd=path, check=True, capture_output=True)
    plain = time.perf_counter() - start
    return ours, plain


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envelopes", type=int, default=50)
    parser.add_argument("--gate-seconds", type=float, default=0.3)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--export-files", type=int, default=1000)
    parser.add_argument("--scenario", choices=["queue", "blame", "reuse"], default="queue")
    parser.add_argument("--culprits-only", action="store_true", help="queue: only the culprit rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-int-") as tmp:
        base = Path(tmp)
        os.environ["DAGRUNNER_WORKTREE_ROOT"] = str(base / "root")
        os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache")
        if args.scenario == "blame":
            blame(base, args.gate_seconds if args.gate_seconds != 0.3 else 1.5)
            return 0
        if args.scenario == "reuse":
            count = args.envelopes if args.envelopes != 50 else 12
            reuse(base, count, args.gate_seconds if args.gate_seconds != 0.3 else 1.0)
            return 0
        modes = [(1, 1), (args.batch, 1), (1, 2), (1, 4), (5, 4)]
        for culprits in (True,) if args.culprits_only else (False, True):
            print(
                f"{args.envelopes} envelopes (one conflict pair"
                + (f", culprits at {CULPRITS}, a flaky gate at {FLAKY}" if culprits else "")
                + f"), gate of {args.gate_seconds}s, cpu 1, on {os.cpu_count()} cores"
            )
            one_by_one = 0.0
            for batch, window in modes:
                row = run_mode(base, args.envelopes, args.gate_seconds, batch, window, culprits)
                wall = float(row["wall"])  # type: ignore[arg-type]
                rate = args.envelopes / wall * 60
                one_by_one = one_by_one or rate
                print(
                    f"  --batch {batch:<2} --window {window}: {wall:6.2f}s "
                    f"{rate:6.1f}/min ({rate / one_by_one:4.2f}x one by one)  "
                    f"{row['gate_runs']:>3} gate runs ({row['confirm_runs']} re-runs)  "
                    f"{row['counts']} flaky={row['flaky']}  exact tree: {row['exact']}"
                )
        ours, plain = export_speed(base, args.export_files)
        print(
            f"export of {args.export_files} changed files: {ours:.3f}s  "
            f"(git diff --binary alone: {plain:.3f}s, ratio {ours / plain:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
