"""Benchmark: a project's release gates run by ``release-check`` and by ``make -j2`` with the
same commands and ``needs``, back to back in one run.

    python scripts/bench_public.py --project PATH [--manifest FILE] [--pairs 3] [--path DIR]

PATH is a checkout of a project (clone a public one: nothing of it is committed here); it is
cloned again into a temporary folder.  FILE is its manifest (default: the ``dagrunner.toml``
that ``dagrunner init`` writes for it).  The Makefile is made from the manifest: a target
per gate, the same command (a string run by ``sh -c``, as make does), the same ``needs``;
a ``split`` gate becomes the shards a first run would have (no history: files shared out
evenly, as a make user would write them).  ``--path DIR`` goes first on both PATHs (the
project's virtualenv's ``bin``).

Printed, medians of ``--pairs`` interleaved runs: cold (``--no-cache``) against ``make
-j2``, a fully cached run, and where a fully cached run's time goes (cProfile's cumulative
top, in process).  ``PYTHONDONTWRITEBYTECODE`` is unset for both sides.
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
from collections.abc import Mapping
from pathlib import Path

from dagrunner.engine.shards import expand
from dagrunner.manifest.load import load_manifest

PY = sys.executable


def timed(argv: list[str], cwd: Path, env: dict[str, str], *, ok: bool = True) -> float:
    begun = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - begun
    if ok and done.returncode != 0:
        tail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise SystemExit(f"{shlex.join(argv)} failed ({done.returncode}):\n{tail}")
    return wall


def makefile(manifest_path: Path, project: Path) -> tuple[str, list[str]]:
    """A Makefile with the manifest's gates (split ones as their first run's shards)."""
    manifest = load_manifest(manifest_path)
    expanded, _ = expand(manifest, project, float(os.cpu_count() or 1), {})
    targets = []
    lines: list[str] = []
    for gate in expanded.gates.values():
        run = gate.run if isinstance(gate.run, str) else shlex.join(gate.run)
        needs = [n for need in gate.needs for n in _shards_of(need, expanded.gates)]
        cwd = f"cd {shlex.quote(gate.cwd)} && " if gate.cwd not in ("", ".") else ""
        lines += [f"{gate.id}: {' '.join(needs)}", f"\t@{cwd}{run.replace('$', '$$')}", ""]
        targets.append(gate.id)
    head = [f".PHONY: release {' '.join(targets)}", f"release: {' '.join(targets)}", ""]
    return "\n".join(head + lines), targets


def _shards_of(need: str, gates: Mapping[str, object]) -> list[str]:
    if need in gates:
        return [need]
    return sorted(g for g in gates if g.startswith(f"{need}-") and g[len(need) + 1 :].isdigit())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--manifest", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--path", type=Path, help="put first on PATH (a virtualenv's bin)")
    args = parser.parse_args()
    env = dict(os.environ)
    env.pop("CI", None)
    # a user's machine keeps bytecode: with this set, every Python on both sides compiles
    # its modules again on each run (this machine's shell sets it)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.path:
        env["PATH"] = f"{args.path.resolve()}:{env['PATH']}"
        env["VIRTUAL_ENV"] = str(args.path.resolve().parent)
    with tempfile.TemporaryDirectory(prefix="bench-public-") as tmp:
        project = Path(tmp) / "project"
        subprocess.run(["git", "clone", "-q", str(args.project), str(project)], check=True)
        manifest = project / "dagrunner.toml"
        if args.manifest:
            manifest.write_bytes(args.manifest.read_bytes())
        else:
            subprocess.run([PY, "-m", "dagrunner", "init"], cwd=project, env=env, check=True)
        text, targets = makefile(manifest, project)
        (Path(tmp) / "Makefile").write_text(text)
        print(f"{len(targets)} gates (make's shards): {', '.join(targets)}", flush=True)
        check = [PY, "-m", "dagrunner", "release-check", "-q", str(manifest)]
        make = ["make", "-s", "-k", "-j2", "-f", str(Path(tmp) / "Makefile"), "release"]
        timed(make, project, env)  # warm the OS's caches (and check make passes)
        timed([*check, "--no-cache"], project, env)  # and record the history a user would have
        cold, made, cached = [], [], []
        for _ in range(args.pairs):
            made.append(timed(make, project, env))
            cold.append(timed([*check, "--no-cache"], project, env))
        timed(check, project, env)
        for _ in range(args.pairs):
            cached.append(timed(check, project, env))
        m_cold, m_make, m_cached = map(statistics.median, (cold, made, cached))

        def each(values: list[float]) -> str:
            return ", ".join(f"{v:.2f}" for v in values)

        print(f"make -j2                     {m_make:7.2f} s  ({each(made)})")
        print(f"release-check --no-cache     {m_cold:7.2f} s  ({each(cold)})")
        print(f"  ratio                      {m_cold / m_make:7.3f}x  (target <= 0.95x)")
        print(f"release-check, fully cached  {m_cached:7.2f} s  ({each(cached)}; target <= 0.5 s)")
        profile = cProfile.Profile()
        here, saved = os.getcwd(), dict(os.environ)
        os.chdir(project)
        os.environ.clear()
        os.environ.update(env)
        try:
            from dagrunner.cli.main import run_cli

            profile.runcall(run_cli, ["release-check", "-q", str(manifest)])
        finally:
            os.chdir(here)
            os.environ.clear()
            os.environ.update(saved)
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(25)
        print("\nwhere a fully cached run's time goes (in process, after imports; cumulative):")
        print("\n".join(out.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
