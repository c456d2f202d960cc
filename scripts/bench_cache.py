"""Benchmark: a fully cached rerun on a generated repository, against a cold run and `git status`.

    python scripts/bench_cache.py [--files 10000] [--gates 500]

Generates a git repository of FILES files in GATES packages, and a manifest
with one gate per package (inputs = that package's files; every tenth gate
also needs the previous one).  Measures, in one run on this machine:
  cold    -- first `dagrunner release-check` (every gate runs and is stored)
  cached  -- the same command again (every gate is a cache hit)
  status  -- `git status --porcelain` on the same repository, the physical
             floor for noticing what changed
and prints each wall time and the ratios cached/cold and cached/status.
Timings are whole commands (process start-up included), best of --repeat.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

GIT_ID = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def make_repo(root: Path, files: int, gates: int) -> None:
    root.mkdir(parents=True)
    for i in range(files):
        pkg = root / "src" / f"pkg{i % gates:04d}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i:05d}.py").write_text(f"VALUE_{i} = {i}\n" * 20)
    (root / ".gitignore").write_text("reports/\n")
    lines = ['name = "bench"', "[governor]", 'sample_interval = "1s"', "[env]", 'pass = ["PATH"]']
    for g in range(gates):
        needs = f'needs = ["p{g - 1:04d}"]' if g % 10 == 9 else ""
        lines += [
            f"[gates.p{g:04d}]",
            'run = ["true"]',
            f'inputs = ["src/pkg{g:04d}/**"]',
            'memory = "1M"',
            needs,
        ]
    (root / "release.toml").write_text("\n".join(lines) + "\n")
    env = {**os.environ, **GIT_ID}
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "bench"]):
        subprocess.run(["git", *argv], cwd=root, env=env, check=True)


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--gates", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-cache-") as tmp:
        root = Path(tmp) / "repo"
        make_repo(root, args.files, args.gates)
        env = {**os.environ, "DAGRUNNER_CACHE_DIR": str(Path(tmp) / "cache")}
        check = [sys.executable, "-m", "dagrunner", "release-check", "release.toml", "--quiet"]
        cold, out = timed([*check, "--json", "--report-dir", str(Path(tmp) / "cold")], root, env)
        assert orjson.loads(out)["cache"]["stored"] == args.gates, (
            "cold run did not store every gate"
        )
        cached = float("inf")
        hits = 0
        for i in range(args.repeat):
            took, out = timed(
                [*check, "--json", "--report-dir", str(Path(tmp) / f"warm{i}")], root, env
            )
            cached = min(cached, took)
            hits = orjson.loads(out)["cache"]["hits"]
        status = min(
            timed(["git", "status", "--porcelain"], root, env)[0] for _ in range(args.repeat)
        )
        print(f"repository: {args.files} files, {args.gates} gates (cache hits on rerun: {hits})")
        print(f"cold run      {cold:8.3f}s")
        print(f"cached rerun  {cached:8.3f}s   ({cached / cold:.3f} of cold)")
        print(f"git status    {status:8.3f}s   (cached rerun = {cached / status:.1f}x git status)")
        print(f"target: cached rerun under 1 s: {'met' if cached < 1.0 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
