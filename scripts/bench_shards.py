"""Benchmark: this repository's release check against the serial script a user would write,
back to back in one run, wall and CPU (issue #25).

    python scripts/bench_shards.py [--pairs 1] [--no-learn]

The serial script: ``ruff check``, ``ruff format --check``, ``mypy``, ``python -m dagrunner
graph``, ``python -m pytest -m "not lint"``, one after another, with the environment the
manifest gives its gates.  The peer: ``dagrunner release-check --no-cache`` of
``manifests/release.toml`` (its tests split into shards balanced by recorded durations).
Unless ``--no-learn``, one release check runs first so the split has durations to balance
by (what every run after the first has).  CPU is user + sys of each command and all it
waited for (``RUSAGE_CHILDREN``).  Targets: wall <= 0.55x and CPU <= 1.15x the serial
script's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERIAL = [
    ["ruff", "check", "--no-cache", "."],
    ["ruff", "format", "--check", "--no-cache", "."],
    ["mypy", "--no-incremental"],
    [sys.executable, "-m", "dagrunner", "graph", "manifests/release.toml"],
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not lint"],
]
RELEASE = [sys.executable, "-m", "dagrunner", "release-check", "--no-cache", "--quiet"]
ENV = {k: v for k, v in os.environ.items() if k in ("PATH", "VIRTUAL_ENV", "HOME")}
ENV |= {"TZ": "UTC", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}  # as the manifest gives gates


def measured(commands: list[list[str]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the commands run one after another."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for argv in commands:
        done = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True)
        if done.returncode != 0:  # timed all the same; said, so the figure is read with it
            print(f"note: {argv[:4]} exited {done.returncode}: {done.stdout[-300:]!r}")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--no-learn", action="store_true", help="no first run to learn from")
    args = parser.parse_args()
    if not args.no_learn:
        measured([RELEASE])
    serial: list[tuple[float, float]] = []
    release: list[tuple[float, float]] = []
    for _ in range(args.pairs):
        serial.append(measured(SERIAL))
        release.append(measured([RELEASE]))
    for name, runs in (("serial script", serial), ("release-check", release)):
        walls = [w for w, _ in runs]
        cpus = [c for _, c in runs]
        print(f"{name:<14} wall {statistics.median(walls):7.1f} s  cpu {statistics.median(cpus):7.1f} s"
              f"  (runs: {', '.join(f'{w:.1f}/{c:.1f}' for w, c in runs)})")  # fmt: skip
    wall_ratio = statistics.median(w for w, _ in release) / statistics.median(w for w, _ in serial)
    cpu_ratio = statistics.median(c for _, c in release) / statistics.median(c for _, c in serial)
    print(f"release-check / serial: wall {wall_ratio:.2f}x (target <= 0.55), "
          f"cpu {cpu_ratio:.2f}x (target <= 1.15)")  # fmt: skip


if __name__ == "__main__":
    main()
