"""Benchmark: 50 envelopes through the integration queue, batched vs one by one; and export speed.

    python scripts/bench_integration.py [--envelopes 50] [--gate-seconds 0.3] [--batch 10]

For each mode (one by one, then --batch N) a fresh repository is generated, N
workers each change their own file (two of them edit the same lines of one
shared file, so one conflict), every worktree is exported and submitted, and
`integrate` drains the queue with one gate of fixed cost.  Printed: wall time,
envelopes per minute, gate runs used, and outcomes.  Then the export of a
worktree with 1,000 changed files against plain `git diff --binary` of the
same change (the floor for producing the diff at all).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from dagrunner import exporting, worktrees
from dagrunner.integration import integrate
from dagrunner.queue import submit
from dagrunner.repo import repo_info

GIT_ID = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def sh(argv: list[str], cwd: Path) -> None:
    subprocess.run(argv, cwd=cwd, env={**os.environ, **GIT_ID}, check=True, capture_output=True)


def make_repo(root: Path, files: int, gate_seconds: float) -> None:
    root.mkdir(parents=True)
    (root / "manifests").mkdir()
    (root / "manifests" / "release.toml").write_text(
        f'[gates.fixed-cost]\nrun = ["sleep", "{gate_seconds}"]\n'
    )
    for i in range(files):
        (root / f"file{i:04d}.txt").write_text(f"file {i}\n" * 5)
    (root / "shared.txt").write_text("a\nb\nc\n")
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "base"],
    ):
        sh(argv, root)


def run_mode(base: Path, count: int, gate_seconds: float, batch: int) -> dict[str, object]:
    repo = base / f"repo-batch{batch}"
    make_repo(repo, count, gate_seconds)
    envelopes = []
    for i in range(count):
        path = Path(worktrees.allocate(mission="bench", worker=f"w{i:03d}", repo=repo)["path"])
        if i in (10, 11):
            (path / "shared.txt").write_text(f"a\nb from {i}\nc\n")
        else:
            (path / f"file{i:04d}.txt").write_text(f"file {i}, changed\n" * 5)
        envelopes.append(Path(exporting.export(f"bench/w{i:03d}", repo=repo)["file"]))
    submit(repo_info(repo), envelopes)
    start = time.perf_counter()
    result = integrate(repo=repo, batch=batch)
    wall = time.perf_counter() - start
    counts: dict[str, int] = {}
    for outcome in result.envelopes:
        counts[outcome.state] = counts.get(outcome.state, 0) + 1
    return {"wall": wall, "gate_runs": result.gate_runs, "counts": counts}


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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-int-") as tmp:
        base = Path(tmp)
        os.environ["DAGRUNNER_WORKTREE_ROOT"] = str(base / "root")
        os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache")
        print(f"{args.envelopes} envelopes (one conflict pair), gate of {args.gate_seconds}s")
        for batch in (1, args.batch):
            row = run_mode(base, args.envelopes, args.gate_seconds, batch)
            wall = float(row["wall"])  # type: ignore[arg-type]
            print(
                f"  batch {batch:>3}: {wall:7.2f}s  {args.envelopes / wall * 60:7.1f} envelopes/min  "
                f"{row['gate_runs']:>3} gate runs  {row['counts']}"
            )
        ours, plain = export_speed(base, args.export_files)
        print(
            f"export of {args.export_files} changed files: {ours:.3f}s  "
            f"(git diff --binary alone: {plain:.3f}s, ratio {ours / plain:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
