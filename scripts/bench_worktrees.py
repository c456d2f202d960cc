"""Benchmark: allocating a worker worktree on a 20,000-file repository.

    python scripts/bench_worktrees.py [--files 20000] [--repeat 3]

Prints, in one run on the same generated repository, the best of REPEAT:
  fresh      dagrunner allocate with an empty pool (git worktree add + lock + records)
  pooled     dagrunner allocate that takes a cleaned worktree from the pool
  git add    plain `git worktree add -b ... PATH HEAD`
  cp -r      copying the main checkout (what a naive tool does)
and the ratio of `git worktree add` to the pooled allocation (target: >= 5x).
dagrunner is called through its Python API (no interpreter start-up in the figure).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from dagrunner.worktrees import allocate as worktrees
from dagrunner.worktrees import lifecycle

GIT_ID = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def make_repo(root: Path, files: int) -> None:
    root.mkdir(parents=True)
    for i in range(files):
        folder = root / f"pkg{i % 200:03d}" / f"sub{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{i:05d}.txt").write_text(f"line {i}\n" * 10)
    env = {**os.environ, **GIT_ID}
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "bench"]):
        subprocess.run(["git", *argv], cwd=root, env=env, check=True)


def clock(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-wt-") as tmp:
        base = Path(tmp)
        repo = base / "repo"
        make_repo(repo, args.files)
        os.environ["DAGRUNNER_WORKTREE_ROOT"] = str(base / "root")
        os.environ["DAGRUNNER_POOL_SIZE"] = "0"
        fresh = min(
            clock(lambda i=i: worktrees.allocate(mission="bench", worker=f"fresh{i}", repo=repo))
            for i in range(args.repeat)
        )
        os.environ["DAGRUNNER_POOL_SIZE"] = str(args.repeat)
        for i in range(args.repeat):  # fill the pool with cleaned worktrees
            lifecycle.cleanup(f"bench/fresh{i}", repo=repo)
        pooled = min(
            clock(lambda i=i: worktrees.allocate(mission="bench", worker=f"pooled{i}", repo=repo))
            for i in range(args.repeat)
        )
        plain = min(
            clock(
                lambda i=i: subprocess.run(
                    [
                        "git",
                        "worktree",
                        "add",
                        "-q",
                        "-b",
                        f"plain{i}",
                        str(base / f"plain{i}"),
                        "HEAD",
                    ],
                    cwd=repo,
                    check=True,
                )
            )
            for i in range(args.repeat)
        )
        copy = min(
            clock(lambda i=i: shutil.copytree(repo, base / f"copy{i}", symlinks=True))
            for i in range(args.repeat)
        )
        print(f"repository: {args.files} files (best of {args.repeat})")
        print(f"dagrunner allocate, fresh   {fresh:7.3f}s")
        print(f"dagrunner allocate, pooled  {pooled:7.3f}s")
        print(f"git worktree add            {plain:7.3f}s")
        print(f"cp -r of the checkout       {copy:7.3f}s")
        ratio = plain / pooled
        print(
            f"git worktree add / pooled = {ratio:.1f}x   target >= 5x: {'met' if ratio >= 5 else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
