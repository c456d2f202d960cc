"""Benchmark: the queue at swarm volume -- the serial land loop against ``integrate run`` with
its defaults, back to back on the same envelopes, on one machine.

    python scripts/bench_swarm.py [--envelopes 60] [--culprits 3] [--conflicts 6]
                                  [--gate-seconds 1] [--red] [--anonymous] [--skip-serial]
                                  [--docs 0.33]

The peer is the way the seeds land work (and what a local agent merge queue does): one
envelope at a time, ``git apply --3way`` onto the target's head in one worktree, commit, run
the check, fast-forward the target when it passes.  dagrunner gets the same envelopes
submitted at once and ``integrate run`` with no option (batches that size themselves, the
adaptive window).  The one gate is a check of real CPU work (``--gate-seconds`` of a busy
loop, then it fails on a file saying BROKEN) that writes JUnit: ``test_new`` fails on a
culprit, naming the file it found broken as runners do (``--anonymous``: naming nothing,
so that a failed batch is halved), ``test_known`` when the target is red (``red.txt``).

Printed per side: wall, landings per hour, gate runs and gate CPU-seconds per landed
envelope, p50/p95 seconds from submit to the final state, the outcomes, and dagrunner's
ratios against the peer.  ``--red``: the target's head already fails ``test_known``;
dagrunner's manifest says ``baseline = "differential"`` (the peer, gating absolutely,
lands nothing).

``--docs F``: that fraction of the envelopes (none of the culprits or pairs) edit only a page
under ``docs/``, which the check never reads; the gate then declares ``inputs = ["**"]`` (the
tree is its input, as ``init`` writes for test runners), and the queue is run twice on the
same envelopes, its gate keyed by the files it was seen to read and (``observe = false``) by
the whole tree, as before observed reads: both ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dagrunner.git.repo import repo_info
from dagrunner.integration.events import watch
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

CHECK = '''"""The project's check: real CPU work, then JUnit with two cases."""
import atexit, os, pathlib, socket, sys, time

# The CPU this process took, from its own clock, for both sides alike, told to the bench
# (a datagram: no folder kept between runs, which would make the gate's reads unknowable)
# as it goes, so that a run killed half-way (a cancelled speculation) counts too.
mine, told = f"{{os.getpid()}}-{{time.time_ns()}}", socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
note = lambda: told.sendto(f"{{mine}} {{time.process_time()}}".encode(), "\\0{cpu_log}")
atexit.register(note)

start = time.process_time()
noted = spins = 0
while (now := time.process_time()) - start < {seconds}:
    spins += 1
    if now - noted > 0.05:
        noted = now
        note()
broken = [p.name for p in sorted(pathlib.Path(".").glob("*.txt")) if "BROKEN" in p.read_text()]
red = pathlib.Path("red.txt").exists()
cases = [("test_known", "the target is red" if red else ""),
         ("test_new", ({say}) if broken else "")]
body = "".join(
    f'<testcase classname="check" name="{{name}}">'
    + (f'<failure message="{{why}}"/>' if why else "")
    + "</testcase>"
    for name, why in cases
)
failures = sum(1 for _, why in cases if why)
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/junit.xml").write_text(
    f'<testsuite name="check" tests="2" failures="{{failures}}">{{body}}</testsuite>'
)
sys.exit(1 if failures else 0)
'''


def sh(argv: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env={**os.environ, **GIT_ID}, check=check, capture_output=True, text=True
    )


def make_repo(root: Path, args: argparse.Namespace) -> None:
    root.mkdir(parents=True)
    (root / "manifests").mkdir()
    baseline = 'baseline = "differential"\n' if args.red else ""
    keyed = 'inputs = ["**"]\nobserve = true\n' if args.docs else ""
    (root / "manifests" / "release.toml").write_text(
        f"[integrate]\n{baseline}\n[gates.check]\ncpu = 1\n{keyed}"
        'run = ["python3", "check.py"]\njunit = "out/junit.xml"\n'
    )
    say = '"something is broken"' if args.anonymous else '", ".join(broken)'
    check = CHECK.format(seconds=args.gate_seconds, cpu_log=args.cpu_log, say=say)
    (root / "check.py").write_text(check)
    (root / ".gitignore").write_text("out/\n")
    for i in range(args.envelopes):
        (root / f"file{i:04d}.txt").write_text(f"file {i}\n" * 5)
    (root / "shared.txt").write_text("".join(f"line {n}\n\n\n\n" for n in range(64)))
    if args.docs:
        (root / "docs").mkdir()
        for i in range(args.envelopes):
            (root / "docs" / f"page{i:04d}.md").write_text(f"# Page {i}\n")
    if args.red:
        (root / "red.txt").write_text("the target's own head fails test_known\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"]):
        sh(argv, root)
    sh(["git", "commit", "-q", "-m", "base"], root)


def roles(args: argparse.Namespace) -> dict[int, str]:
    """Which envelope is a culprit, and which pairs conflict (the second of a pair is the
    conflict: both edit the same line of shared.txt), spread over the queue."""
    n = args.envelopes
    said: dict[int, str] = {}
    step = round(1 / args.docs) if args.docs else 0
    for k in range(args.culprits):
        said[(k * n) // max(1, args.culprits) + n // (2 * max(1, args.culprits))] = "culprit"
    pairs = args.conflicts // 2
    for k in range(pairs):
        first = (k * n) // max(1, pairs) + 1
        while first in said or first + 1 in said:
            first += 1
        said[first], said[first + 1] = f"pair{k}", f"pair{k}"
    for i in range(step - 1, n, step) if step else ():
        said.setdefault(i, "docs")
    return said


def change(path: Path, i: int, role: str) -> None:
    if role == "culprit":
        (path / f"file{i:04d}.txt").write_text("BROKEN\n")
    elif role == "docs":
        (path / "docs" / f"page{i:04d}.md").write_text(f"# Page {i}\n\nEdited by worker {i}.\n")
    elif role.startswith("pair"):
        shared = path / "shared.txt"
        lines = shared.read_text().splitlines(keepends=True)
        lines[4 * int(role[4:])] = f"line edited by worker {i}\n"
        shared.write_text("".join(lines))
    else:
        (path / f"file{i:04d}.txt").write_text(f"file {i}, changed\n" * 5)


@dataclass
class Side:
    wall: float
    landed: int
    gate_runs: int
    gate_cpu: float
    waits: list[float]
    outcomes: dict[str, int]

    def per_hour(self) -> float:
        return self.landed / self.wall * 3600

    def per_landed(self, value: float) -> float:
        return value / self.landed if self.landed else float("inf")

    def percentiles(self) -> tuple[float, float]:
        """p50 and p95 of the seconds from submit to each envelope's final state."""
        waits = sorted(self.waits) or [0.0]
        return statistics.median(waits), waits[min(len(waits) - 1, round(0.95 * (len(waits) - 1)))]

    def line(self, name: str) -> str:
        p50, p95 = self.percentiles()
        return (
            f"  {name:<10} {self.wall:7.2f}s  {self.per_hour():7.0f} landed/h  "
            f"{self.per_landed(self.gate_runs):5.2f} gate runs/landed  "
            f"{self.per_landed(self.gate_cpu):5.2f} gate CPU-s/landed  "
            f"p50 {p50:6.2f}s p95 {p95:6.2f}s  {self.outcomes}"
        )


def serial(repo: Path, envelopes: list[Path], args: argparse.Namespace) -> Side:
    """One at a time: apply on the head, commit, check, fast-forward."""
    from dagrunner.envelope import parse_envelope

    tree = repo.parent / f"{repo.name}-serial"
    sh(["git", "worktree", "add", "-q", "--detach", str(tree), "main"], repo)
    outcomes: dict[str, int] = {}
    waits: list[float] = []
    runs = landed = 0
    spent(args)  # nothing before counts
    start = time.perf_counter()
    for file in envelopes:
        envelope = parse_envelope(file.read_bytes(), where=str(file))
        head = sh(["git", "rev-parse", "main"], repo).stdout.strip()
        sh(["git", "reset", "-q", "--hard", head], tree)
        sh(["git", "clean", "-qfdx"], tree)
        patch = tree.parent / f"{tree.name}.diff"
        patch.write_bytes(envelope.diff)
        if sh(["git", "apply", "--3way", "--index", str(patch)], tree, check=False).returncode:
            state = "conflict"
        else:
            sh(["git", "commit", "-q", "-m", envelope.id], tree)
            checked = subprocess.run(["python3", "check.py"], cwd=tree, capture_output=True)
            runs += 1
            if checked.returncode == 0:
                new = sh(["git", "rev-parse", "HEAD"], tree).stdout.strip()
                sh(["git", "update-ref", "refs/heads/main", new, head], repo)
                state, landed = "landed", landed + 1
            else:
                state = "gates-failed"
        outcomes[state] = outcomes.get(state, 0) + 1
        waits.append(time.perf_counter() - start)
    return Side(time.perf_counter() - start, landed, runs, spent(args), waits, outcomes)


class Told:
    """What each check told of its CPU (its newest word: killed or not), by datagram."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.taken: dict[str, float] = {}
        self.lock = threading.Lock()
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind("\0" + name)
        threading.Thread(target=self.listen, daemon=True).start()

    def listen(self) -> None:
        while True:
            who, _, cpu = self.socket.recv(256).decode().partition(" ")
            with self.lock:
                self.taken[who] = max(self.taken.get(who, 0.0), float(cpu))

    def spent(self) -> float:
        time.sleep(0.2)  # the last words in flight
        with self.lock:
            taken, self.taken = sum(self.taken.values()), {}
        return taken


def spent(args: argparse.Namespace) -> float:
    """The CPU-seconds the checks took since the last look."""
    told: Told = args.told
    return told.spent()


def dagrunner(repo: Path, envelopes: list[Path], args: argparse.Namespace) -> Side:
    """Submit them all, then ``integrate run`` with its defaults."""
    spent(args)
    start = time.perf_counter()
    submitted = time.time()
    submit(repo_info(repo), envelopes)
    result = integrate(repo=repo)
    wall = time.perf_counter() - start
    if args.timeline:  # each gate run: when, how it ended, which envelopes (by number)
        for run in result.pipeline:
            ids = [e.split(".")[1] if "." in e else e for e in run.envelopes] or [
                "the target's head"
            ]
            print(
                f"  {run.gate_run:3d} {run.start:6.2f}-{run.end:6.2f}s {run.verdict!s:10s}"
                f"{' confirm' if run.confirm else ''} {ids[0]}..{ids[-1]} ({len(run.envelopes)})"
            )
    outcomes: dict[str, int] = {}
    for outcome in result.envelopes:
        outcomes[str(outcome.state)] = outcomes.get(str(outcome.state), 0) + 1
    waits = []
    for event in watch(repo=repo, follow=False):
        if event.final and event.at:
            import datetime as dt

            waits.append(dt.datetime.fromisoformat(event.at).timestamp() - submitted)
    return Side(
        wall,
        outcomes.get("landed", 0),
        result.gate_runs,
        spent(args),
        waits,
        outcomes,
    )


def envelopes_of(repo: Path, args: argparse.Namespace) -> list[Path]:
    said = roles(args)
    files = []
    for i in range(args.envelopes):
        path = Path(worktrees.allocate(mission="swarm", worker=f"w{i:03d}", repo=repo)["path"])
        change(path, i, said.get(i, ""))
        files.append(Path(exporting.export(f"swarm/w{i:03d}", repo=repo)["file"]))
    return files


def measured() -> str:
    """Which dagrunner this run measures: an editable install follows whichever checkout
    last installed it (a CI proof's clone, say), not the one the script is in."""
    import dagrunner

    where = Path(dagrunner.__file__).resolve().parents[1]
    said = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=where, capture_output=True, text=True
    )
    return f"dagrunner from {where} at {said.stdout.strip() or 'no git checkout'}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envelopes", type=int, default=60)
    parser.add_argument("--culprits", type=int, default=3)
    parser.add_argument("--conflicts", type=int, default=6, help="envelopes in conflicting pairs")
    parser.add_argument("--gate-seconds", type=float, default=1.0)
    parser.add_argument("--red", action="store_true", help="the target's head fails test_known")
    parser.add_argument(
        "--anonymous", action="store_true", help="the check's failure names no file (halving)"
    )
    parser.add_argument("--skip-serial", action="store_true")
    parser.add_argument(
        "--timeline", action="store_true", help="print the queue's gate runs, one a line"
    )
    parser.add_argument(
        "--docs", type=float, default=0.0, help="the fraction of envelopes editing docs only"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-swarm-") as tmp:
        base = Path(tmp)
        os.environ["DAGRUNNER_WORKTREE_ROOT"] = str(base / "root")
        os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache")
        repo = base / "repo"
        args.cpu_log = f"dagrunner-bench-swarm-{os.getpid()}"
        args.told = Told(args.cpu_log)
        make_repo(repo, args)
        files = envelopes_of(repo, args)
        print(
            f"{args.envelopes} envelopes ({args.culprits} culprits, {args.conflicts} in "
            f"conflicting pairs), one gate of {args.gate_seconds}s CPU, "
            f"{'a red target, ' if args.red else ''}on {os.cpu_count()} cores"
        )
        print(measured())
        peer = None
        if not args.skip_serial:
            peer_repo = base / "peer"
            sh(["git", "clone", "-q", str(repo), str(peer_repo)], base)
            peer = serial(peer_repo, files, args)
            print(peer.line("serial"))
        whole = None
        if args.docs:
            # the same queue, its gate keyed by the whole tree as before observed reads
            whole_repo = base / "whole"
            sh(["git", "clone", "-q", str(repo), str(whole_repo)], base)
            manifest = whole_repo / "manifests" / "release.toml"
            manifest.write_text(manifest.read_text().replace("observe = true", "observe = false"))
            sh(["git", "commit", "-qam", "the whole tree keys the check"], whole_repo)
            os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache-whole")
            whole = dagrunner(whole_repo, files, args)
            print(whole.line("whole-tree"))
            os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache")
        ours = dagrunner(repo, files, args)
        print(ours.line("dagrunner"))
        if whole is not None and whole.landed and ours.landed:
            print(
                f"  observed / whole-tree keys: gate CPU-s/landed "
                f"{ours.per_landed(ours.gate_cpu) / whole.per_landed(whole.gate_cpu):.2f}x, "
                f"gate runs/landed "
                f"{ours.per_landed(ours.gate_runs) / whole.per_landed(whole.gate_runs):.2f}x, "
                f"wall {ours.wall / whole.wall:.2f}x"
            )
        if peer is not None and peer.landed:
            print(
                f"  ratios: wall {ours.wall / peer.wall:.2f}x, landings/h "
                f"{ours.per_hour() / peer.per_hour():.2f}x, gate CPU-s/landed "
                f"{ours.per_landed(ours.gate_cpu) / peer.per_landed(peer.gate_cpu):.2f}x, "
                f"gate runs/landed "
                f"{ours.per_landed(ours.gate_runs) / peer.per_landed(peer.gate_runs):.2f}x, "
                f"p50 {ours.percentiles()[0] / peer.percentiles()[0]:.2f}x, "
                f"p95 {ours.percentiles()[1] / peer.percentiles()[1]:.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
