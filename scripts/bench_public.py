"""Benchmark: a public project's own release gates, as ``dagrunner init`` writes them, run by
``release-check`` and by ``make -j2`` with the same commands and ``needs``, in one run.

    python scripts/bench_public.py --project PATH [--pairs 3]

PATH is a checkout of a public project (clone one: nothing of it is committed here).  Its
``dagrunner.toml`` is what ``dagrunner init`` writes for it, less the gates whose programs
are not installed; the Makefile has one target per gate with the same recipe and
prerequisites.  Printed, medians of ``--pairs`` interleaved runs: cold (``--no-cache``)
against ``make -j2``, a fully cached run, and where a fully cached run's time goes (the
functions it spends the most in, by cProfile's cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import orjson

PY = sys.executable


def timed(argv: list[str], cwd: Path) -> float:
    begun = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - begun
    if done.returncode != 0:
        raise SystemExit(
            f"{shlex.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return wall


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(orjson.dumps(v).decode() for v in values) + "]"


def manifest_and_makefile(project: Path) -> tuple[str, str, list[str]]:
    """The manifest ``init`` writes, less gates whose programs are missing; its Makefile."""
    out = subprocess.run(
        [PY, "-m", "dagrunner", "init", "--dry-run", "--json"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    body = orjson.loads(out.stdout)
    data = tomllib.loads(body["text"])
    missing = set(body.get("missing_tools", []))
    gates: dict[str, Any] = {}
    for name, gate in data.get("gates", {}).items():
        run = gate["run"]
        program = run[0] if isinstance(run, list) else shlex.split(run)[0]
        if program not in missing:
            gates[name] = gate
    lines = [f"name = {orjson.dumps(data.get('name', 'release')).decode()}", "", "[env]"]
    env = data.get("env", {})
    lines.append(f"pass = {_toml_list(env.get('pass', ['PATH']))}")
    lines += ["", "[defaults]", 'timeout = "15m"']
    make = [".PHONY: release " + " ".join(gates), f"release: {' '.join(gates)}", ""]
    for name, gate in gates.items():
        run = gate["run"]
        lines += ["", f"[gates.{name}]"]
        lines.append(
            f"run = {_toml_list(run) if isinstance(run, list) else orjson.dumps(run).decode()}"
        )
        for key in ("inputs", "tools", "needs"):
            if key in gate:
                lines.append(f"{key} = {_toml_list(gate[key])}")
        if "estimate" in gate:
            lines.append(f"estimate = {orjson.dumps(gate['estimate']).decode()}")
        recipe = shlex.join(run) if isinstance(run, list) else run
        make += [f"{name}: {' '.join(gate.get('needs', []))}", f"\t{recipe}", ""]
    return "\n".join(lines) + "\n", "\n".join(make), list(gates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-public-") as tmp:
        project = Path(tmp) / "project"
        subprocess.run(["git", "clone", "-q", str(args.project), str(project)], check=True)
        manifest, makefile, gates = manifest_and_makefile(project)
        (project / "dagrunner.toml").write_text(manifest)
        (Path(tmp) / "Makefile").write_text(makefile)
        print(f"gates: {', '.join(gates)}")
        check = [PY, "-m", "dagrunner", "release-check", "-q", "dagrunner.toml"]
        env_note = {k: os.environ.get(k, "") for k in ("CI",)}
        make = ["make", "-s", "-j2", "-f", str(Path(tmp) / "Makefile"), "release"]
        timed(check, project)  # warm the OS's caches and the history (cheap-first, ETA)
        cold, made, cached = [], [], []
        for _ in range(args.pairs):
            made.append(timed(make, project))
            cold.append(timed([*check, "--no-cache"], project))
        timed(check, project)
        for _ in range(args.pairs):
            cached.append(timed(check, project))
        m_cold, m_make, m_cached = map(statistics.median, (cold, made, cached))
        print(
            f"make -j2                    {m_make:7.2f} s  ({', '.join(f'{x:.2f}' for x in made)})"
        )
        print(
            f"release-check --no-cache    {m_cold:7.2f} s  ({', '.join(f'{x:.2f}' for x in cold)})"
        )
        print(f"  ratio                     {m_cold / m_make:7.3f}x  (target <= 0.95x)")
        print(f"release-check, fully cached {m_cached:7.2f} s  (target <= 0.5 s) {env_note}")
        profile = cProfile.Profile()
        here = os.getcwd()
        os.chdir(project)
        try:
            from dagrunner.cli.main import run_cli

            profile.runcall(run_cli, ["release-check", "-q", "dagrunner.toml"])
        finally:
            os.chdir(here)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(18)
        print("\nwhere a fully cached run's time goes (in process, cumulative):")
        print("\n".join(text.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
