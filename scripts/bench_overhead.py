"""Benchmark: dagrunner's fixed overhead, against peers measured in the same run (issue #11).

    python scripts/bench_overhead.py [--runs 5] [--release]

Printed, each a median of ``--runs`` whole commands (wall time, this machine):

1. ``dagrunner --version`` against ``python -c pass`` (target <= 0.10 s).
2. The swarm's small calls on a one-file change: ``worktree allocate``, ``worktree
   export``, ``integrate submit`` (target <= 0.25 s each).
3. Three graphs of ``sleep 0.2`` gates on 2 slots, the whole ``release-check`` against
   ``ninja -j2`` on the same graph (target within 1.10x of ninja).
4. Per trivial gate: 200 and 400 independent ``true`` gates, dagrunner against ninja
   (target <= 2.5x ninja): the whole command divided by 200, and the slope (what 200
   more gates cost), which leaves start-up out.
5. Export of a worktree with 1,000 changed files against ``git diff --binary`` of the
   same change (target <= 2.5x).
6. With ``--release``: a fully cached ``release-check`` of this repository's own
   ``manifests/release.toml`` (one uncached run first; target <= 0.5 s).

And the floors under those figures, so that a ratio can be read against what no change
to dagrunner's own code can remove: the interpreter with the two libraries every run
needs (``import trio, networkx``) against the graphs' budget (0.10x ninja), and the CPU
one gate's containment chain (``contain.jail``: setpriv, unshare, the init) costs
against ninja's whole per-gate cost.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAG = [sys.executable, "-m", "dagrunner"]
IMPORTS = "import trio, networkx"  # what every release-check needs before its first gate
ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b"}
ENV |= {"GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
# As on a user's machine, compiled modules are kept: with PYTHONDONTWRITEBYTECODE set
# (some CI images set it), every command would compile dagrunner's modules anew.
ENV.pop("PYTHONDONTWRITEBYTECODE", None)


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env or ENV, check=True, capture_output=True)
    return time.perf_counter() - start


def median(runs: int, once: Callable[[], float]) -> float:
    return statistics.median(once() for _ in range(runs))


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=ENV, check=True, capture_output=True)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README").write_text("hello\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")
    return path


def graphs() -> dict[str, dict[str, list[str]]]:
    fan = {"c0": [], "c1": ["c0"], "c2": ["c1"], "c3": ["c2"]}
    fan |= {f"f{i}": ["c3"] for i in range(15)} | {"join": [f"f{i}" for i in range(15)]}
    side = {f"c{i}": ([f"c{i - 1}"] if i else []) for i in range(6)}
    side |= {f"i{i}": [] for i in range(10)}
    rng = random.Random(7)
    layered: dict[str, list[str]] = {}
    for layer in range(6):
        for i in range(5):
            above = [f"l{layer - 1}_{j}" for j in range(5)] if layer else []
            layered[f"l{layer}_{i}"] = rng.sample(above, min(len(above), rng.randint(0, 2)))
    return {"chain4 -> fan15 -> join": fan, "chain6 + 10 independent": side, "layered": layered}


def write_graph(folder: Path, graph: dict[str, list[str]], command: str) -> None:
    lines = []
    for gate, needs in graph.items():
        lines += [f"[gates.{gate}]", f'run = "{command}"', f"needs = {needs!r}".replace("'", '"')]
    (folder / "m.toml").write_text("\n".join(lines) + "\n")
    ninja = ["rule run", f"  command = {command}", ""]
    for gate, needs in graph.items():
        deps = " ".join(f"{n}.done" for n in needs)
        ninja.append(f"build {gate}.done: run{' | ' + deps if deps else ''}")
    (folder / "build.ninja").write_text("\n".join(ninja) + "\n")


def compare_graph(
    folder: Path, graph: dict[str, list[str]], command: str, runs: int
) -> tuple[float, float]:
    write_graph(folder, graph, command)
    ours = median(
        runs,
        lambda: run(
            [*DAG, "release-check", "m.toml", "--quiet", "--no-cache", "--jobs", "2"], folder
        ),
    )

    def ninja() -> float:
        shutil.rmtree(folder / ".ninja_log", ignore_errors=True)
        (folder / ".ninja_log").unlink(missing_ok=True)
        return run([shutil.which("ninja") or "ninja", "-j2"], folder)

    return ours, median(runs, ninja)


def containment_floor(base: Path, runs: int = 100) -> tuple[str, float]:
    """This machine's containment mode and the CPU (ms) one contained ``true`` costs."""
    sys.path.insert(0, str(ROOT))
    from dagrunner.process.contain import detect, jail

    (base / "floor-hide").mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for n in range(runs):
        cage = jail(["true"], token=f"floor{n}", work=base, hide=base / "floor-hide",
                    cwd=base, memory=None, max_pids=None)  # fmt: skip
        subprocess.run(cage.argv, check=True, stdin=subprocess.DEVNULL)
        cage.remove()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return detect().mode, cpu / runs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--release", action="store_true", help="also the cached release-check")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dagrunner-bench-overhead-"))
    env = {
        **ENV,
        "DAGRUNNER_WORKTREE_ROOT": str(base / "wt"),
        "DAGRUNNER_CACHE_DIR": str(base / "c"),
    }
    try:
        version = median(args.runs, lambda: run([*DAG, "--version"], base))
        python = median(args.runs, lambda: run([sys.executable, "-c", "pass"], base))
        print(f"dagrunner --version {version:.3f} s; python -c pass {python:.3f} s "
              f"({version / python:.2f}x; target <= 0.10 s)")  # fmt: skip
        libraries = median(args.runs, lambda: run([sys.executable, "-c", IMPORTS], base))
        print(f"floor: python -c '{IMPORTS}' {libraries:.3f} s")

        repo = make_repo(base / "repo")
        times: dict[str, list[float]] = {"allocate": [], "export": [], "submit": []}
        for n in range(args.runs):
            where = ["--repo", str(repo)]
            worker = ["--mission", "b", "--worker", f"w{n}"]
            times["allocate"].append(
                run([*DAG, "worktree", "allocate", *worker, *where], repo, env)
            )
            folder = next((base / "wt").glob(f"*/b/w{n}"))
            (folder / "one.txt").write_text(f"{n}\n")
            out = str(base / f"e{n}.json")
            times["export"].append(
                run([*DAG, "worktree", "export", f"b/w{n}", "-o", out, *where], repo, env)
            )
            times["submit"].append(run([*DAG, "integrate", "submit", out, *where], repo, env))
        print("swarm calls (one-file change): " + ", ".join(
            f"{k} {statistics.median(v):.3f} s" for k, v in times.items()) + " (target <= 0.25 s)")  # fmt: skip

        for name, graph in graphs().items():
            folder = make_repo(base / name.replace(" ", "_").replace(">", ""))
            ours, ninja = compare_graph(folder, graph, "sleep 0.2", args.runs)
            print(f"graph {name}: dagrunner {ours:.2f} s, ninja -j2 {ninja:.2f} s, "
                  f"ratio {ours / ninja:.2f} (target <= 1.10: {ours - ninja:.2f} s over ninja "
                  f"for a budget of {ninja * 0.1:.2f} s; the libraries' import alone "
                  f"{libraries:.2f} s)")  # fmt: skip
        whole: dict[int, tuple[float, float]] = {}
        for count in (200, 400):
            trivial: dict[str, list[str]] = {f"t{i}": [] for i in range(count)}
            whole[count] = compare_graph(make_repo(base / f"trivial{count}"), trivial, "true",
                                         args.runs)  # fmt: skip
        ours, ninja = whole[200]
        print(f"per trivial gate (200 x true, 2 slots), whole command / 200: dagrunner "
              f"{ours / 200 * 1000:.2f} ms, ninja {ninja / 200 * 1000:.2f} ms, "
              f"ratio {ours / ninja:.2f} (target <= 2.5)")  # fmt: skip
        ours_slope = (whole[400][0] - whole[200][0]) / 200
        ninja_slope = (whole[400][1] - whole[200][1]) / 200
        print(f"per trivial gate, slope (400 - 200 gates) / 200: dagrunner "
              f"{ours_slope * 1000:.2f} ms, ninja {ninja_slope * 1000:.2f} ms, "
              f"ratio {ours_slope / ninja_slope:.2f} (target <= 2.5)")  # fmt: skip
        mode, chain = containment_floor(base)
        print(f"floor: one contained `true` ({mode}) costs {chain:.2f} ms of CPU, "
              f"{chain / 2:.2f} ms a gate on 2 cores: {chain / 2 / 1000 / ninja_slope:.1f}x "
              f"ninja's slope before dagrunner does anything")  # fmt: skip

        big = make_repo(base / "big")
        for i in range(1000):
            (big / f"f{i}.txt").write_text(f"{i}\n")
        git(big, "add", "-A")
        git(big, "commit", "-q", "-m", "files")
        run(
            [*DAG, "worktree", "allocate", "--mission", "x", "--worker", "y", "--repo", str(big)],
            big,
            env,
        )
        folder = next((base / "wt").glob("*/x/y"))
        rounds = iter(range(1_000_000))

        def fresh_change() -> None:
            """New content in every file: each export is a first one (no blob written yet)."""
            n = next(rounds)
            for i in range(1000):
                (folder / f"f{i}.txt").write_text(f"{i} changed in round {n}\n")

        def export_command() -> float:
            fresh_change()
            return run([*DAG, "worktree", "export", "x/y", "-o", str(base / "big.json"),
                        "--repo", str(big)], big, env)  # fmt: skip

        def export_step() -> float:
            from dagrunner.worktrees import (
                export as exporting,  # in this process: the step without start-up
            )

            fresh_change()
            os.environ["DAGRUNNER_WORKTREE_ROOT"] = env["DAGRUNNER_WORKTREE_ROOT"]
            start = time.perf_counter()
            exporting.export("x/y", output=base / "big.json", repo=big)
            return time.perf_counter() - start

        def plain_diff() -> float:
            fresh_change()
            return run(["git", "diff", "--binary", "--full-index"], folder)

        ours = median(args.runs, export_command)
        step = median(args.runs, export_step)
        plain = median(args.runs, plain_diff)
        print(f"export of 1,000 changed files: whole command {ours:.3f} s, the export step "
              f"{step:.3f} s; git diff --binary {plain:.3f} s; ratio {ours / plain:.2f} "
              f"(command), {step / plain:.2f} (step) (target <= 2.5)")  # fmt: skip

        if args.release:
            run([*DAG, "release-check", "--quiet"], ROOT)
            cached = median(args.runs, lambda: run([*DAG, "release-check", "--quiet"], ROOT))
            print(
                f"cached release-check of manifests/release.toml: {cached:.2f} s (target <= 0.5 s)"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
