"""The pipeline fuzzer at volume: ``python scripts/fuzz_pipeline.py --seeds 0:1000 --jobs 2``.

Runs each seeded scenario of ``tests/fuzzing.py`` (the whole integration queue on a real
repository, checked against the landing invariant) in a process of its own with a private
HOME, caches and worktree root, and prints one line per scenario that broke an invariant
(seed, what broke, the final states), then a summary.  Exit 1 when any did.  Replay one with
``--seeds N:N+1 --keep`` (its folder is kept and printed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def one(seed: int, keep: bool) -> tuple[int, list[str], dict[str, str], float, str]:
    sys.path.insert(0, str(TESTS))
    import fuzzing

    root = Path(tempfile.mkdtemp(prefix=f"fuzz-{seed}-"))
    home = root / "home"
    os.environ.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        DAGRUNNER_CACHE_DIR=str(root / "cache"),
        DAGRUNNER_WORKTREE_ROOT=str(root / "worktrees"),
        DAGRUNNER_TOOL_CACHE_DIR=str(root / "tools"),
    )
    for name in [n for n in os.environ if n.startswith("GIT_")]:
        del os.environ[name]
    try:
        outcome = fuzzing.run(seed, root / "scenario")
    except Exception as exc:  # the scenario itself could not be set up: say so, go on
        outcome = fuzzing.Outcome(seed, [f"scenario failed: {type(exc).__name__}: {exc}"])
    if not keep:  # a scenario's folders may hold read-only ones (a gate's view made them so)
        for folder, dirs, _ in os.walk(root):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(folder, name), 0o700)
        shutil.rmtree(root, ignore_errors=True)
    return seed, outcome.broken, outcome.states, outcome.seconds, str(root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:100", help="START:STOP (STOP excluded)")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios at once")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's folder")
    args = parser.parse_args()
    start, stop = (int(x) for x in args.seeds.split(":"))
    broken = 0
    t0 = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(args.jobs, max_tasks_per_child=1) as pool:
        futures = [pool.submit(one, seed, args.keep) for seed in range(start, stop)]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            seed, said, states, seconds, root = future.result()
            if done % 50 == 0:
                print(f"{done} scenarios done, {broken} broke an invariant so far")
            if said:
                broken += 1
                print(f"seed {seed}: {said} {states}" + (f" ({root})" if args.keep else ""))
            elif args.keep:
                print(f"seed {seed}: ok in {seconds:.1f} s ({root})")
            sys.stdout.flush()
    count = stop - start
    print(
        f"{count} scenarios (seeds {start}..{stop - 1}), {broken} broke an invariant, "
        f"{time.monotonic() - t0:.0f} s"
    )
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
