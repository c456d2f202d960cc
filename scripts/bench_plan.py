"""Benchmark: planning a 10,000-gate manifest, against ninja's dry run of the same graph.

    python scripts/bench_plan.py [--gates N] [--runs K]

Two graphs of N gates: a chain listed dependents-first (the order that made
cycle detection quadratic), and a random layered DAG (each gate needs up to 3
gates of the layer before).  For each, the whole `dagrunner graph --format
json` command (load, validate, build, levels, critical path) is timed, and
`ninja -n` on an equivalent build.ninja (parse, build the graph, plan every
edge, run nothing) as the peer.  Printed: median seconds of K runs and the
ratio.  The target is dagrunner under 2 s for 10,000 gates.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def chain(count: int) -> dict[str, list[str]]:
    return {f"g{i}": ([f"g{i - 1}"] if i else []) for i in reversed(range(count))}


def layered(count: int, seed: int = 1) -> dict[str, list[str]]:
    rng = random.Random(seed)
    width = max(1, int(count**0.5))
    names = [f"g{i}" for i in range(count)]
    needs: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        layer = i // width
        previous = names[(layer - 1) * width : layer * width] if layer else []
        needs[name] = rng.sample(previous, min(len(previous), rng.randint(0, 3)))
    return needs


def write_inputs(folder: Path, graph: dict[str, list[str]]) -> tuple[Path, Path]:
    manifest = folder / "plan.json"
    manifest.write_text(
        json.dumps({"gates": {g: {"run": ["true"], "needs": n} for g, n in graph.items()}})
    )
    lines = ["rule run", "  command = true", ""]
    for gate, needs in graph.items():
        deps = " ".join(f"{n}.done" for n in needs)
        lines.append(f"build {gate}.done: run{' | ' + deps if deps else ''}")
    lines.append(f"default {' '.join(f'{g}.done' for g in graph)}")
    (folder / "build.ninja").write_text("\n".join(lines) + "\n")
    return manifest, folder


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gates", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    ninja = shutil.which("ninja")
    print(f"planning {args.gates} gates; median of {args.runs} runs, whole commands")
    for name, graph in (
        ("chain, dependents first", chain(args.gates)),
        ("random layered", layered(args.gates)),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
            manifest, build_dir = write_inputs(folder, graph)
            ours = statistics.median(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "dagrunner",
                        "graph",
                        str(manifest),
                        "--repo",
                        tmp,
                        "--format",
                        "json",
                    ],
                    folder,
                )
                for _ in range(args.runs)
            )
            line = f"{name:<26} dagrunner {ours:7.3f}s"
            if ninja:
                peer = statistics.median(timed([ninja, "-n"], build_dir) for _ in range(args.runs))
                line += f"   ninja -n {peer:7.3f}s   ratio {ours / peer:6.2f}x"
            print(line + ("   (target < 2 s: met)" if ours < 2 else "   (target < 2 s: MISSED)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
