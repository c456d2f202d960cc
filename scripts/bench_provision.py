"""Benchmark: worktrees ready to work in, with a dependency seed against the plain way, in
the same run, on a real project (a clone of this repository, its own ``.[dev]`` extras).

    python scripts/bench_provision.py [--worktrees 10] [--plain 10] [--share overlay]

- Seeded: the clone's manifest gains a ``[[worktrees.seed]]`` for ``.venv`` keyed by
  ``pyproject.toml`` whose build is ``python -m venv .venv && .venv/bin/pip install -e
  '.[dev]'``; each ``worktree allocate`` returns a worktree whose venv is ready (the first
  builds the seed).
- Plain: ``worktree allocate --setup 'python -m venv .venv' --setup '.venv/bin/pip install
  -e .[dev]'``, each worktree's own venv and install (pip's cache warm, as a user's is).

Printed: each allocation's wall, p50 after the first, the roots' disk (every inode once,
the seeds' store included), and ratios.  Every worktree is checked to import its *own*
``dagrunner`` from its venv.  Needs the package registry (pip installs the extras).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from dagrunner.process import share
from dagrunner.worktrees.disk import measure

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SEED = f"""
[[worktrees.seed]]
path = ".venv"
key = ["pyproject.toml"]
build = "{PY} -m venv .venv && .venv/bin/pip install -q -e '.[dev]'"
timeout = "15m"
"""


def sh(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def allocate(
    repo: Path, root: Path, worker: str, setup: list[str], share: str
) -> tuple[float, Path]:
    env = {**os.environ, "DAGRUNNER_WORKTREE_ROOT": str(root)}
    if share:
        env["DAGRUNNER_SEED_SHARE"] = share
    argv = [PY, "-m", "dagrunner", "worktree", "allocate", "--mission", "b", "--worker", worker]
    for step in setup:
        argv += ["--setup", step]
    begun = time.perf_counter()
    out = sh(*argv, "--setup-timeout", "900", "--json", cwd=repo, env=env)
    wall = time.perf_counter() - begun
    path = Path(orjson.loads(out)["path"])
    own = sh(
        str(path / ".venv/bin/python"),
        "-c",
        "import dagrunner; print(dagrunner.__file__)",
        cwd=path,
        env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
    )
    if not own.strip().startswith(str(path)):
        raise SystemExit(f"{path} imports another checkout's dagrunner: {own}")
    return wall, path


def run(
    kind: str, repo: Path, root: Path, count: int, setup: list[str], share: str
) -> dict[str, float]:
    walls = []
    for i in range(count):
        wall, _ = allocate(repo, root, f"{kind}{i:02d}", setup, share)
        walls.append(wall)
        print(f"  {kind} {i:2d}: {wall:6.2f} s", flush=True)
    worktrees = {p.name: p for p in (next(root.iterdir()) / "b").iterdir()}
    disk = measure(next(root.iterdir()), worktrees).total
    rest = walls[1:] or walls
    return {"first": walls[0], "p50": statistics.median(rest), "sum": sum(walls), "disk": disk}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worktrees", type=int, default=10)
    parser.add_argument("--plain", type=int, default=10, help="plain-way worktrees (slow)")
    parser.add_argument("--share", default="", help="DAGRUNNER_SEED_SHARE for the seeded run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-provision-") as tmp:
        work = Path(tmp)
        repo = work / "repo"
        sh("git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo), cwd=work)
        git = ["git", "-c", "user.name=b", "-c", "user.email=b@b"]
        sh(*git, "checkout", "-q", "-b", "plain", cwd=repo)
        manifest = repo / "manifests" / "release.toml"
        manifest.write_text(manifest.read_text().replace("[defaults]", SEED + "\n[defaults]", 1))
        sh(*git, "checkout", "-q", "-b", "seeded", cwd=repo)
        sh(*git, "commit", "-qam", "a dependency seed", cwd=repo)
        print(f"seeded: {args.worktrees} worktrees", flush=True)
        seeded = run("seeded", repo, work / "seeded", args.worktrees, [], args.share)
        sh(*git, "checkout", "-q", "plain", cwd=repo)
        print(f"plain: {args.plain} worktrees", flush=True)
        steps = [f"{PY} -m venv .venv", ".venv/bin/pip install -q -e .[dev]"]
        plain = run("plain", repo, work / "plain", args.plain, steps, "")
        per_plain = plain["disk"] / args.plain
        per_seeded = seeded["disk"] / args.worktrees
        print()
        print(f"{'':24} {'seeded':>12} {'plain':>12} {'ratio':>8}")
        print(f"{'first allocation (s)':24} {seeded['first']:12.2f} {plain['first']:12.2f}")
        ratio = seeded["p50"] / plain["p50"]
        print(
            f"{'p50 after the first (s)':24} {seeded['p50']:12.2f} {plain['p50']:12.2f} {ratio:7.3f}x"
        )
        ratio = per_seeded / per_plain
        print(
            f"{'disk per worktree (MiB)':24} {per_seeded / 2**20:12.1f} {per_plain / 2**20:12.1f} "
            f"{ratio:7.3f}x"
        )
        print(
            f"(roots: seeded {seeded['disk'] / 2**20:.0f} MiB for {args.worktrees}, plain "
            f"{plain['disk'] / 2**20:.0f} MiB for {args.plain}; the seeded root holds the store)"
        )
        share.release(work, work)  # the overlay mounts, so the folder can go


if __name__ == "__main__":
    main()
