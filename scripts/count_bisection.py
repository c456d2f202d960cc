"""Gate runs to find d culprits among n: ``python scripts/count_bisection.py 16:11 24:5,18``.

Each scenario ``N:CULPRITS`` (positions from 1, comma-separated) runs ``integrate run`` on a
fresh real repository: N envelopes, each changing its own file, the culprits writing BROKEN
into theirs, all submitted at once and gated as one batch (``--batch``, default N) in a window
of 2, by one gate that fails on BROKEN and names nothing (``--named``: it prints
``path:line`` as a linter does).  ``--every N`` runs every position of one culprit among N.
Printed per scenario: the gate runs of envelopes (the target head's own run aside), of them
confirmations and cancelled ones, and the rounds (a run's round is one more than the highest
round of the runs that had ended when it started: from the runs' order, not their times);
``--trace``: each run.  Counts are what the pipeline decides, not timings; the gate sleeps
``--gate-seconds`` (default 0.5) so that runs launched together overlap.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

ID = ["-c", "user.name=count", "-c", "user.email=count@localhost"]


def scenario(n: int, bad: set[int], args: argparse.Namespace, root: Path) -> str:
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.run import integrate
    from dagrunner.integration.submit import submit
    from dagrunner.worktrees import allocate as worktrees
    from dagrunner.worktrees import export as exporting

    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "README").write_text("count\n")
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], [*ID, "commit", "-q", "-m", "0"]):
        subprocess.run(["git", *argv], cwd=repo, check=True)
    envelopes = []
    for i in range(1, n + 1):
        name = f"n{i:02d}"
        path = Path(worktrees.allocate(mission="m", worker=name, repo=repo, session=name)["path"])
        (path / f"{name}.txt").write_text("BROKEN\n" if i in bad else f"{i}\n")
        out = root / f"{name}.envelope.json"
        exporting.export(f"m/{name}", output=out, repo=repo)
        envelopes.append(out)
    say = "grep -rn BROKEN --include=*.txt .; " if args.named else ""
    gate = root / "gate.toml"
    check = f"sleep {args.gate_seconds}; {say}! grep -rq BROKEN --include=*.txt ."
    gate.write_text(f'[gates.check]\nrun = "{check}"\n')
    submit(repo_info(repo), envelopes)
    result = integrate(repo=repo, manifest=gate, batch=args.batch or n, window=2)
    runs = [r for r in result.pipeline if r.envelopes]
    rounds: dict[int, int] = {}
    for run in sorted(runs, key=lambda r: r.start):
        ended = [rounds[o.gate_run] for o in runs if o.gate_run in rounds and o.end <= run.start]
        rounds[run.gate_run] = 1 + max(ended, default=0)
    cancelled = sum(str(r.verdict) == "cancelled" for r in runs)
    line = (
        f"{n}:{','.join(map(str, sorted(bad)))}{' named' if args.named else ''}: "
        f"{len(runs)} runs ({result.confirm_runs} confirmations, {cancelled} cancelled), "
        f"{max(rounds.values(), default=0)} rounds"
    )
    if args.trace:
        for run in runs:
            who = f"{run.envelopes[0].split('.')[1]}..{run.envelopes[-1].split('.')[1]}"
            line += f"\n  round {rounds[run.gate_run]}: {who} {run.verdict}"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="N:CULPRITS, e.g. 24:5,18")
    parser.add_argument("--every", type=int, help="every position of one culprit among N")
    parser.add_argument("--named", action="store_true", help="the failure names the file")
    parser.add_argument("--batch", type=int, help="the batch size (default: all N)")
    parser.add_argument("--gate-seconds", type=float, default=0.5)
    parser.add_argument("--trace", action="store_true", help="print each run")
    args = parser.parse_args()
    todo = [
        (int(n), {int(x) for x in bad.split(",")})
        for n, bad in (s.split(":") for s in args.scenarios)
    ]
    todo += [(args.every, {i}) for i in range(1, (args.every or 0) + 1)]
    total = 0
    for n, bad in todo:
        with tempfile.TemporaryDirectory(prefix="count-") as folder:
            root = Path(folder)
            os.environ.update(
                HOME=str(root / "home"),
                XDG_CACHE_HOME=str(root / "home" / ".cache"),
                DAGRUNNER_CACHE_DIR=str(root / "cache"),
                DAGRUNNER_WORKTREE_ROOT=str(root / "worktrees"),
                DAGRUNNER_TOOL_CACHE_DIR=str(root / "tools"),
            )
            line = scenario(n, bad, args, root)
            total += int(line.split(": ")[1].split()[0])
            print(line, flush=True)
    if len(todo) > 1:
        print(f"{total} runs in {len(todo)} scenarios")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
