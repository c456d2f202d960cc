"""Benchmark: ``worktree overlaps`` on 20 live worktrees of a real repository (a clone of
this one), each with a real change, plus 10 queued envelopes, against the naive peer that
merges every pair (``prefilter=False``), in the same run.

    python scripts/bench_overlaps.py [--live 20] [--queued 10] [--repeat 3]

Changes: most workers edit a file of their own; four pairs edit the same file -- two of
them the same lines (a conflict), two of them different lines (a clean merge) -- and two
queued envelopes add the same new file with different content.  Printed: each way's wall
(median of ``--repeat``), its merge computations, and that both find the same pairs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import overlaps
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as worktrees
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import lifecycle

ROOT = Path(__file__).resolve().parent.parent
SHARED = ["dagrunner/units.py", "dagrunner/names.py", "dagrunner/files.py", "dagrunner/errors.py"]


def change(path: Path, i: int) -> None:
    """Worker ``i``'s change: pairs (0, 1) ... (6, 7) share a file; even pairs the same line."""
    if i < 8:
        target = path / SHARED[i // 2]
        lines = target.read_text().splitlines(keepends=True)
        where = 2 if (i // 2) % 2 == 0 else (2 + 25 * (i % 2))  # same line, or far apart
        lines[where] = f"# changed by worker {i}\n"
        target.write_text("".join(lines))
    else:
        own = sorted((path / "tests").glob("test_*.py"))[i % 30]
        with own.open("a") as handle:
            handle.write(f"\n# worker {i} was here\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--queued", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-overlaps-") as tmp:
        base = Path(tmp)
        os.environ["DAGRUNNER_WORKTREE_ROOT"] = str(base / "root")
        os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache")
        repo = base / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        for i in range(args.live):
            path = Path(worktrees.allocate(mission="live", worker=f"w{i:02d}", repo=repo)["path"])
            change(path, i)
        envelopes = []
        for i in range(args.queued):
            name = f"q{i:02d}"
            path = Path(worktrees.allocate(mission="queued", worker=name, repo=repo)["path"])
            if i < 2:
                (path / "NEW.md").write_text(f"added by {name}\n")
            else:
                change(path, 20 + i)
            envelopes.append(Path(exporting.export(f"queued/{name}", repo=repo)["file"]))
            lifecycle.cleanup(f"queued/{name}", force=True, repo=repo)
        submit(repo_info(repo), envelopes)
        rows = {}
        for label, prefilter in (("prefilter (ours)", True), ("every pair (naive)", False)):
            walls = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                found = overlaps(repo=repo, prefilter=prefilter)
                walls.append(time.perf_counter() - start)
            rows[label] = (statistics.median(walls), found)
        sides = len(rows["prefilter (ours)"][1].sides)
        print(f"{args.live} live worktrees, {args.queued} queued envelopes, the tip: {sides} sides")
        peer = rows["every pair (naive)"][0]
        for label, (wall, found) in rows.items():
            print(
                f"  {label:<20} {wall:6.3f}s ({wall / peer:4.2f}x naive)  {found.merges:>4} merges  "
                f"{len(found.pairs)} overlapping pairs, {sum(p.conflict for p in found.pairs)} conflicts"
            )
        same = [p.to_json() for p in rows["prefilter (ours)"][1].pairs] == [
            p.to_json() for p in rows["every pair (naive)"][1].pairs
        ]
        print(f"  the same pairs either way: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
