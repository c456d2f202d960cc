"""Benchmark: a real project's checks by ``dagrunner release-check`` against the project's own
runner (tox, nox, npm), pair by pair in one run.

    python scripts/bench_runner.py --project PATH --peer 'tox -e py3.11,typing'
        [--manifest FILE] [--edit src/pkg/mod.py] [--pairs 5] [--path DIR]

PATH is a checkout of a public project, installed as its contributing guide says (clone
one: nothing of it is committed here); FILE its manifest (default: PATH's
``dagrunner.toml``, what ``dagrunner init`` wrote and the user trimmed); ``--path DIR``
goes first on both PATHs (the project's virtualenv's ``bin``).  Both sides run in PATH
itself, tool caches warm (one unmeasured run of each first).

Three figures, each the median of ``--pairs`` pairs (dagrunner, then the peer) and the
median of the pairs' ratios:

- cold: ``release-check --no-cache`` against the peer;
- fully cached: ``release-check`` with nothing changed since its last run;
- edited: one line added to ``--edit`` (a comment, new each pair) before each side runs.

The peer has no cache of its own: it runs its checks every time.  Targets (issue 35):
cold <= 1.05x, fully cached <= 0.1x, edited <= 0.8x.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PY = sys.executable


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    begun = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - begun, done.returncode


def pairs(
    n: int, ours: list[str], peer: list[str], cwd: Path, env: dict[str, str],
    before: Callable[[], None] = lambda: None,
) -> tuple[list[float], list[float], set[int]]:  # fmt: skip
    a, b, codes = [], [], set()
    for _ in range(n):
        before()
        wall, code = timed(ours, cwd, env)
        a.append(wall)
        codes.add(code)
        before()
        wall, code = timed(peer, cwd, env)
        b.append(wall)
        codes.add(code)
    return a, b, codes


def report(name: str, a: list[float], b: list[float], codes: set[int]) -> None:
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    print(
        f"{name:<13} dagrunner {statistics.median(a):6.2f} s   peer {statistics.median(b):6.2f} s"
        f"   ratio {statistics.median(ratios):5.3f} (pairs {min(ratios):.3f}-{max(ratios):.3f})"
        f"   exit codes {sorted(codes)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--peer", required=True, help="the project's own runner, as one string")
    parser.add_argument("--manifest", type=Path)
    parser.add_argument("--edit", help="a source file (relative) edited before each edited pair")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--path", help="first on both PATHs (the project's venv's bin)")
    args = parser.parse_args()
    project = args.project.resolve()
    manifest = (args.manifest or project / "dagrunner.toml").resolve()
    env = dict(os.environ)
    if args.path:
        env["PATH"] = f"{args.path}:{env['PATH']}"
        env["VIRTUAL_ENV"] = str(Path(args.path).parent)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    ours = [PY, "-m", "dagrunner", "release-check", str(manifest), "--quiet"]
    peer = shlex.split(args.peer)
    peer = ["/bin/sh", "-c", args.peer] if any(c in args.peer for c in "&|;") else peer
    print(f"project {project.name}; dagrunner: {shlex.join(ours[3:])}; peer: {args.peer}")
    timed([*ours, "--no-cache"], project, env)  # warm: tool caches, venvs, the gate cache
    timed(peer, project, env)
    report("cold", *pairs(args.pairs, [*ours, "--no-cache"], peer, project, env))
    timed(ours, project, env)
    report("fully cached", *pairs(args.pairs, ours, peer, project, env))
    if args.edit:
        target = project / args.edit
        original = target.read_bytes()
        count = iter(range(10_000))
        token = os.urandom(4).hex()  # new in every bench run: an earlier run's edits are cached
        comment = "//" if target.suffix in (".js", ".ts", ".mjs", ".cjs") else "#"

        def edit() -> None:
            line = f"\n{comment} bench edit {token} {next(count)}\n"
            target.write_bytes(original + line.encode())

        try:
            report("edited", *pairs(args.pairs, ours, peer, project, env, before=edit))
        finally:
            target.write_bytes(original)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
