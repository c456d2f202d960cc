"""Benchmark: a real project's checks by ``dagrunner release-check`` against the project's own
runner (tox, nox, npm), pair by pair in one run.

    python scripts/bench_runner.py --project PATH --peer 'tox -e py3.11,typing'
        [--manifest FILE] [--edit src/pkg/mod.py [--edit README.md ...]] [--pairs 5] [--path DIR]
        [--figures cold,cached,edited,observe]

PATH is a checkout of a public project, installed as its contributing guide says (clone
one: nothing of it is committed here); FILE its manifest (default: PATH's
``dagrunner.toml``, what ``dagrunner init`` wrote and the user trimmed); ``--path DIR``
goes first on both PATHs (the project's virtualenv's ``bin``).  Both sides run in PATH
itself, tool caches warm (one unmeasured run of each first).

Three figures, each the median of ``--pairs`` pairs (dagrunner, then the peer) and the
median of the pairs' ratios:

- cold: ``release-check --no-cache`` against the peer;
- fully cached: ``release-check`` with nothing changed since its last run;
- edited: one line added to ``--edit`` (a comment, new each pair) before each side runs;
  given several times, one figure per file (a source file, a docs page, the README);
- observe (only when asked in ``--figures``): not against the peer, but
  ``release-check --no-cache`` with the manifest as it is against a copy of it with
  ``observe = false`` on every gate: what observing the gates' reads costs (issue 46).

``--figures`` picks which to measure (default ``cold,cached,edited``).  The peer has no cache
of its own: it runs its checks every time.  Targets (issue 35): cold <= 1.05x, fully cached
<= 0.1x, edited <= 0.8x; issue 46: a docs-only edit <= 0.05x, observe <= 1.05x.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
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
        f"{name:<13}  dagrunner {statistics.median(a):6.2f} s   peer {statistics.median(b):6.2f} s"
        f"   ratio {statistics.median(ratios):5.3f} (pairs {min(ratios):.3f}-{max(ratios):.3f})"
        f"   exit codes {sorted(codes)}"
    )


def without_observing(text: str) -> str:
    """The manifest ``text`` with ``observe = false`` in each gate's table (and none of its
    own ``observe`` lines: observed keys are opt-in, ``[defaults] observe = true``)."""
    out = []
    for line in text.splitlines(keepends=True):
        if re.fullmatch(r"observe\s*=.*\n?", line):
            continue
        out.append(line)
        if re.fullmatch(r"\[gates\.[^\]]+\]\s*(#.*)?\n?", line):
            out.append("observe = false\n")
    return "".join(out)


class editing:
    """Before each side of a pair: one line added to ``target`` (a comment, new each time);
    the file put back when done."""

    def __init__(self, target: Path) -> None:
        self.target, self.original = target, target.read_bytes()
        self.count = iter(range(10_000))
        # new in every bench run: an earlier run's edits are cached
        self.token = os.urandom(4).hex()
        suffix = target.suffix
        self.form = "<!-- {} -->" if suffix == ".md" else "// {}" if suffix in JS else "# {}"

    def __call__(self) -> None:
        line = self.form.format(f"bench edit {self.token} {next(self.count)}")
        gap = "\n\n" if self.target.suffix == ".py" else "\n"  # as ruff format wants
        self.target.write_bytes(self.original + f"{gap}{line}\n".encode())

    def __enter__(self) -> editing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.target.write_bytes(self.original)


JS = (".js", ".ts", ".mjs", ".cjs", ".tsx", ".jsx")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--peer", required=True, help="the project's own runner, as one string")
    parser.add_argument("--manifest", type=Path)
    parser.add_argument(
        "--edit", action="append", default=[],
        help="a file (relative) edited before each edited pair; again for another figure",
    )  # fmt: skip
    parser.add_argument("--figures", default="cold,cached,edited", help="which, comma-separated")
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
    figures = set(args.figures.split(","))
    print(f"project {project.name}; dagrunner: {shlex.join(ours[3:])}; peer: {args.peer}")
    timed([*ours, "--no-cache"], project, env)  # warm: tool caches, venvs, the gate cache
    timed(peer, project, env)
    if "cold" in figures:
        report("cold", *pairs(args.pairs, [*ours, "--no-cache"], peer, project, env))
    if "observe" in figures:
        # outside the tree: a file of it would be in every gate's key
        unobserved = Path(tempfile.mkdtemp()) / "unobserved.toml"
        unobserved.write_text(without_observing(manifest.read_text()))
        theirs = [PY, "-m", "dagrunner", "release-check", str(unobserved), "--quiet", "--no-cache"]
        try:
            report("observe", *pairs(args.pairs, [*ours, "--no-cache"], theirs, project, env))
        finally:
            shutil.rmtree(unobserved.parent)
    timed(ours, project, env)
    if "cached" in figures:
        report("fully cached", *pairs(args.pairs, ours, peer, project, env))
    for edited in args.edit if "edited" in figures else []:
        with editing(project / edited) as edit:
            report(f"edited {edited}", *pairs(args.pairs, ours, peer, project, env, edit))
        timed(ours, project, env)  # the tree as it was, cached again for the next figure
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
