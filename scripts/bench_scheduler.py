"""Benchmark: dagrunner's scheduler against ninja and make -j on the same synthetic DAGs.

    python scripts/bench_scheduler.py [--slots N] [--unit SECONDS] [--trivial N]

For each graph, each tool runs once to warm up (ninja and dagrunner learn the
gates' durations from that run, as they would on a CI machine with history),
then once measured.  Printed per graph and tool: makespan, makespan divided by
the lower bound max(critical path, work / slots), and against the known
optimum where the graph was built to have one.  Then the per-gate overhead on
trivial gates: (wall of N trivial gates - wall of one) / N, and its ratio to
ninja's.  dagrunner's makespan is its scheduling wall from run.json (Python's
start-up is reported separately, and counted in the per-gate figure's baseline).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(frozen=True)
class Node:
    name: str
    seconds: float
    needs: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    title: str
    nodes: tuple[Node, ...]  # listed in the order a naive tool would take them
    optimum: float | None  # known by construction, else None

    def lower_bound(self, slots: int) -> float:
        finish: dict[str, float] = {}
        for node in self.nodes:  # nodes are listed after their needs
            finish[node.name] = node.seconds + max((finish[n] for n in node.needs), default=0.0)
        work = sum(n.seconds for n in self.nodes)
        return max(max(finish.values()), work / slots)


def topo(nodes: list[Node]) -> list[Node]:
    done: set[str] = set()
    out: list[Node] = []
    pending = list(nodes)
    while pending:
        for node in pending:
            if all(n in done for n in node.needs):
                out.append(node)
                done.add(node.name)
                pending.remove(node)
                break
    return out


def chain_beside_independents(unit: float, slots: int, length: int) -> Case:
    # Independent gates are named to sort (and are listed) first; only critical-path
    # order starts the chain at once, which the optimum (= lower bound) requires.
    ind = [Node(f"aa-ind-{i:02d}", unit, ()) for i in range(length * (slots - 1))]
    chain = [
        Node(f"zz-chain-{i:02d}", unit, (f"zz-chain-{i - 1:02d}",) if i else ())
        for i in range(length)
    ]
    return Case("chain beside independents", tuple(ind + chain), length * unit)


def chain_fan_join(unit: float, slots: int, length: int, fan: int) -> Case:
    chain = [Node(f"c{i:02d}", unit, (f"c{i - 1:02d}",) if i else ()) for i in range(length)]
    last = chain[-1].name
    fans = [Node(f"f{i:02d}", unit, (last,)) for i in range(fan)]
    join = Node("join", unit, tuple(f.name for f in fans))
    optimum = length * unit + math.ceil(fan / slots) * unit + unit
    return Case("chain, fan-out, join", tuple([*chain, *fans, join]), optimum)


def random_layered(unit: float, seed: int) -> Case:
    rng = random.Random(seed)
    nodes: list[Node] = []
    previous: list[str] = []
    for layer in range(5):
        current = []
        for i in range(rng.randint(2, 6)):
            name = f"l{layer}n{i}"
            needs = (
                tuple(sorted(rng.sample(previous, k=min(len(previous), rng.randint(1, 2)))))
                if previous
                else ()
            )
            nodes.append(Node(name, unit * rng.choice([1, 2, 3]), needs))
            current.append(name)
        previous = current
    return Case(f"random layered (seed {seed})", tuple(topo(nodes)), None)


def trivial(count: int) -> Case:
    return Case(
        f"{count} trivial gates", tuple(Node(f"t{i:04d}", 0.0, ()) for i in range(count)), None
    )


# -- tools ---------------------------------------------------------------------------


def command(node: Node) -> str:
    return f"sleep {node.seconds:g}" if node.seconds else "true"


def run_make(case: Case, slots: int, work: Path) -> float:
    lines = [
        ".PHONY: all " + " ".join(n.name for n in case.nodes),
        "all: " + " ".join(n.name for n in case.nodes),
    ]
    for node in case.nodes:
        lines.append(f"{node.name}: {' '.join(node.needs)}\n\t@{command(node)}")
    (work / "Makefile").write_text("\n".join(lines) + "\n")
    return timed(["make", "-s", "-j", str(slots)], work)


def run_ninja(case: Case, slots: int, work: Path) -> float:
    lines = ["rule r", "  command = $cmd", ""]
    for node in case.nodes:
        deps = " ".join(f"out/{n}" for n in node.needs)
        lines.append(f"build out/{node.name}: r {deps}".rstrip())
        lines.append(f"  cmd = {command(node)}")
    lines.append("default " + " ".join(f"out/{n.name}" for n in case.nodes))
    (work / "build.ninja").write_text("\n".join(lines) + "\n")
    ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
    return timed([ninja, "-j", str(slots)], work)  # outputs are never made: every run rebuilds all


def run_dagrunner(case: Case, slots: int, work: Path) -> tuple[float, float]:
    lines = [f'[governor]\ncpu = {slots}\nsample_interval = "1s"\n[env]\npass = ["PATH"]']
    for node in case.nodes:
        run = f'["sleep", "{node.seconds:g}"]' if node.seconds else '["true"]'
        needs = ", ".join(f'"{n}"' for n in node.needs)
        lines.append(f'[gates.{node.name}]\nrun = {run}\nneeds = [{needs}]\nmemory = "1M"')
    (work / "bench.toml").write_text("\n".join(lines) + "\n")
    report = work / "report"
    shutil.rmtree(report, ignore_errors=True)
    wall = timed(
        [
            sys.executable,
            "-m",
            "dagrunner",
            "release-check",
            "bench.toml",
            "--quiet",
            "--report-dir",
            str(report),
        ],
        work,
    )
    inner = float(orjson.loads((report / "run.json").read_bytes())["wall"])
    return wall, inner


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=os.environ)
    return time.perf_counter() - start


def measure(case: Case, slots: int, root: Path) -> dict[str, float]:
    result: dict[str, float] = {}
    for tool in ("make", "ninja", "dagrunner"):
        work = root / f"{tool}-{abs(hash(case.title))}"
        work.mkdir(parents=True, exist_ok=True)
        for _ in range(2):  # warm-up, then measured
            if tool == "make":
                result[tool] = run_make(case, slots, work)
            elif tool == "ninja":
                result[tool] = run_ninja(case, slots, work)
            else:
                outer, inner = run_dagrunner(case, slots, work)
                result[tool], result["dagrunner-startup"] = inner, outer - inner
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--unit", type=float, default=0.25)
    parser.add_argument("--trivial", type=int, default=500)
    args = parser.parse_args()
    slots, unit = args.slots, args.unit
    cases = [
        chain_beside_independents(unit, slots, 12),
        chain_fan_join(unit, slots, 8, 7),
        random_layered(unit, 1),
        random_layered(unit, 2),
    ]
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-") as tmp:
        os.environ["DAGRUNNER_CACHE_DIR"] = str(Path(tmp) / "cache")
        root = Path(tmp)
        print(
            f"slots={slots} unit={unit}s  (makespan / lower bound; / known optimum where there is one)"
        )
        print(f"{'graph':<30} {'tool':<10} {'makespan':>9} {'/bound':>7} {'/optimum':>9}")
        for case in cases:
            bound = case.lower_bound(slots)
            times = measure(case, slots, root)
            for tool in ("dagrunner", "ninja", "make"):
                opt = f"{times[tool] / case.optimum:9.3f}" if case.optimum else f"{'-':>9}"
                print(
                    f"{case.title:<30} {tool:<10} {times[tool]:8.3f}s {times[tool] / bound:7.3f} {opt}"
                )
            print(
                f"{'':<30} (dagrunner start-up and report writing outside the makespan: "
                f"{times['dagrunner-startup']:.2f}s)"
            )
        one, many = trivial(1), trivial(args.trivial)
        t1, tn = measure(one, slots, root), measure(many, slots, root)
        print(
            f"\nper-gate overhead on trivial gates ((wall of {args.trivial} - wall of 1) / {args.trivial}):"
        )
        per: dict[str, float] = {}
        for tool in ("dagrunner", "ninja", "make"):
            outer_n = tn[tool] + (tn["dagrunner-startup"] if tool == "dagrunner" else 0.0)
            outer_1 = t1[tool] + (t1["dagrunner-startup"] if tool == "dagrunner" else 0.0)
            per[tool] = max(outer_n - outer_1, 0.0) / args.trivial
        for tool in ("dagrunner", "ninja", "make"):
            ratio = per[tool] / per["ninja"] if per["ninja"] else float("inf")
            print(f"  {tool:<10} {per[tool] * 1000:7.2f} ms/gate   {ratio:5.2f}x ninja")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
