"""Benchmark: a warm tool cache still pays in an integration tree (issue 43).

    python scripts/bench_tool_caches.py [--rounds 5]
    DAGRUNNER_TOOL_SHARE=copy python scripts/bench_tool_caches.py   # the copy fallback

One gate, ``hooks``, modelled on pre-commit: its hook environment lives under
``$PRE_COMMIT_HOME`` and is installed only when missing (``python -m venv`` with pip,
offline: a real environment of ~1,000 files, a few seconds), then the hook runs with it
(the environment's python imports pip and reads every file of the tree).  Real
``pre-commit`` is used instead when ``python -m pre_commit`` works and ``--pre-commit``
is given (it then needs its hook repositories, so the network).

The main checkout's ``release-check`` warms the trusted tier once (the cold install is
printed).  Then, in each round, interleaved: the same gate in the main checkout
(``release-check --no-cache``, the trusted tier itself), and the same gate in an
integration tree (one envelope submitted and integrated, its gate run on a private layer
made from the trusted tier).  Compared: the gate run's own wall (``run.json`` speed.wall:
the schedule, the layer made, the gate) and the gate's attempt, median of the rounds; and
whether any integration run installed the environment again (it must not).
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

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as worktrees
from dagrunner.worktrees import export as exporting

GIT_ID = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}

CLI = [sys.executable, "-m", "dagrunner"]

# the model of pre-commit: install the hook environment once, run the hook with it
HOOKS = """set -e
env="$PRE_COMMIT_HOME/env"
if [ ! -f "$env/ready" ]; then
  echo "installing the hook environment"
  mkdir -p "$PRE_COMMIT_HOME"
  {python} -m venv "$env"
  touch "$env/ready"
fi
"$env/bin/python" - <<'EOF'
import pathlib, pip  # the hook: its environment's own python and packages
n = sum(len(p.read_bytes()) for p in pathlib.Path(".").rglob("*.py"))
print("hook ran over", n, "bytes")
EOF
"""


def sh(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env={**os.environ, **GIT_ID}, check=True, capture_output=True, text=True
    )
    return done.stdout


def make_repo(root: Path, pre_commit: bool) -> None:
    root.mkdir(parents=True)
    for i in range(200):
        (root / "src").mkdir(exist_ok=True)
        (root / "src" / f"m{i:03d}.py").write_text(f"VALUE = {i}\n" * 50)
    (root / ".gitignore").write_text("reports/\n")
    (root / "hooks.sh").write_text(HOOKS.format(python=sys.executable))
    run = '["pre-commit", "run", "--all-files"]' if pre_commit else '["sh", "hooks.sh"]'
    (root / "manifests").mkdir()
    (root / "manifests" / "release.toml").write_text(
        f'[env]\npass = ["PATH"]\n\n[gates.hooks]\nrun = {run}\ncpu = 1\n'
    )
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "bench"]):
        sh(["git", *argv], root)


def main_run(repo: Path) -> tuple[float, float, str]:
    """A release check of the main checkout: (run wall, gate attempt, the gate's log)."""
    done = subprocess.run(
        [*CLI, "release-check", "manifests/release.toml", "--no-cache", "--json", "--quiet"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    body = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, body
    return measured(Path(body["run_dir"]))


def measured(run_dir: Path) -> tuple[float, float, str]:
    run = orjson.loads((run_dir / "run.json").read_bytes())
    gate = orjson.loads((run_dir / "gates" / "hooks.json").read_bytes())
    attempt = float(gate["duration"])
    return run["speed"]["wall"], attempt, (run_dir / "logs" / "hooks.log").read_text()


def integration_run(repo: Path, n: int) -> tuple[float, float, str]:
    """One envelope integrated: its gate run's (run wall, gate attempt, log)."""
    path = Path(worktrees.allocate(mission="bench", worker=f"w{n}", repo=repo)["path"])
    (path / "src" / f"new{n}.py").write_text(f"NEW = {n}\n")
    out = path.parent / f"w{n}.json"
    exporting.export(f"bench/w{n}", output=out, repo=repo)
    submit(repo_info(repo), [out])
    result = integrate(repo=repo, window=1)
    assert [e.state.value for e in result.envelopes] == ["landed"], result.envelopes
    (run_dir,) = sorted(Path(result.report_dir).glob("gates-*"))
    return measured(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pre-commit", action="store_true", help="real pre-commit (network)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        place = Path(tmp)
        os.environ.update(
            DAGRUNNER_CACHE_DIR=str(place / "cache"),
            DAGRUNNER_TOOL_CACHE_DIR=str(place / "tools"),
            DAGRUNNER_WORKTREE_ROOT=str(place / "worktrees"),
        )
        repo = place / "repo"
        make_repo(repo, args.pre_commit)
        start = time.perf_counter()
        _, cold, log = main_run(repo)
        assert "installing" in log or args.pre_commit, log
        how = os.environ.get("DAGRUNNER_TOOL_SHARE") or "auto: reflink, overlay, copy"
        print(f"layers made by {how}")
        print(
            f"cold: the trusted tier's first run installs: gate {cold:.2f} s "
            f"(run {time.perf_counter() - start:.2f} s)"
        )
        mains, ints, reinstalled = [], [], 0
        for n in range(args.rounds):
            mains.append(main_run(repo)[:2])
            wall, attempt, log = integration_run(repo, n)
            ints.append((wall, attempt))
            reinstalled += "installing" in log
            print(
                f"round {n + 1}: main checkout run {mains[-1][0]:.3f} s (gate "
                f"{mains[-1][1]:.3f}), integration tree run {wall:.3f} s (gate {attempt:.3f})"
            )
        main_wall = statistics.median(w for w, _ in mains)
        int_wall = statistics.median(w for w, _ in ints)
        main_gate = statistics.median(a for _, a in mains)
        int_gate = statistics.median(a for _, a in ints)
        print(
            f"median run wall: main checkout {main_wall:.3f} s, integration tree "
            f"{int_wall:.3f} s: {int_wall / main_wall:.2f}x (target <= 1.2x)"
        )
        print(
            f"median gate attempt: main {main_gate:.3f} s, integration {int_gate:.3f} s: "
            f"{int_gate / main_gate:.2f}x; reinstalled in {reinstalled} of "
            f"{args.rounds} integration runs; cold install {cold / main_gate:.1f}x a warm run"
        )


if __name__ == "__main__":
    main()
