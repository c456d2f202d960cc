"""Benchmark: ``worktree overlaps`` on 20 live worktrees of a real repository (a clone of
this one), each with a real change, plus 10 queued envelopes, against the naive peer that
merges every pair (``prefilter=False``), in the same run.

    python scripts/bench_overlaps.py [--live 20] [--queued 10] [--repeat 3]
    python scripts/bench_overlaps.py --long 300


Changes: most workers edit a file of their own; four pairs edit the same file -- two of
them the same lines (a conflict), two of them different lines (a clean merge) -- and two
queued envelopes add the same new file with different content.  Printed: each way's wall
(median of ``--repeat``), its merge computations, and that both find the same pairs.

``--long N``: N envelopes that all edit one file (a changelog: each its own line, two lines
apart from the next, so git merges them cleanly), plus deliberate conflicts (an envelope
editing the line of one 50 ahead, and one editing the line of such a culprit too), submitted
one ``submit`` call each and timed, the way submit foresees today (``worktrees/foresight``)
against the old pairwise way (``submit(pairwise=True)``, a clone's queue) on the same
envelopes.  Printed: submits #1, #10, #100, #200, #N each way, the totals, the ratios, and
whether both ways found exactly the same (item, other, paths) overlaps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import overlaps
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as worktrees
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import lifecycle
from dagrunner.worktrees.export import export_worktree, write_envelope

ROOT = Path(__file__).resolve().parent.parent
SHARED = ["dagrunner/units.py", "dagrunner/names.py", "dagrunner/files.py", "dagrunner/errors.py"]


def change(path: Path, i: int) -> None:
    """Worker ``i``'s change: pairs (0, 1) ... (6, 7) share a file; even pairs the same line."""
    if i < 8:
        target = path / SHARED[i // 2]
        lines = target.read_text().splitlines(keepends=True)
        where = 2 if (i // 2) % 2 == 0 else (2 + 25 * (i % 2))  # same line, or far apart
        lines[where] = f"# changed by worker {i}\n"
        target.write_text("".join(lines))
    else:
        own = sorted((path / "tests").glob("test_*.py"))[i % 30]
        with own.open("a") as handle:
            handle.write(f"\n# worker {i} was here\n")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def culprits(n: int) -> dict[int, int]:
    """Envelope -> the envelope whose line it edits too: one in 80 edits the line of the one
    50 ahead of it; the last of those is itself edited by the envelope after it."""
    edits = {i: i - 50 for i in range(60, n, 80)}
    if edits:
        last = max(edits)
        if last + 1 < n:
            edits[last + 1] = edits[last]
    return edits


def long_queue(n: int, base: Path) -> int:
    """``--long``: ``n`` changelog envelopes submitted one by one, both ways."""
    repo, peer = base / "repo", base / "peer"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "bench")
    git(repo, "config", "user.email", "bench@localhost")
    lines = [f"- entry {k}: nothing yet\n" for k in range(3 * n + 3)]
    (repo / "CHANGES.md").write_text("".join(lines))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a changelog")
    subprocess.run(["git", "clone", "-q", str(repo), str(peer)], check=True)
    head = git(repo, "rev-parse", "HEAD")
    edits = culprits(n)
    files = []
    start = time.perf_counter()
    for i in range(n):
        changed = list(lines)
        changed[3 * edits.get(i, i) + 1] = f"- entry {i}: changed by worker {i}\n"
        (repo / "CHANGES.md").write_text("".join(changed))
        envelope = export_worktree(repo, mission="long", worker=f"w{i:03d}", base=head)
        files.append(base / "envelopes" / f"{i:03d}.json")
        write_envelope(envelope, files[-1])
    (repo / "CHANGES.md").write_text("".join(lines))
    print(f"{n} envelopes exported in {time.perf_counter() - start:.1f}s; conflicts: {edits}")
    walls: dict[str, list[float]] = {"foresight": [], "pairwise": []}
    found: dict[str, set[tuple[str, str, tuple[str, ...]]]] = {
        "foresight": set(),
        "pairwise": set(),
    }
    for way, where in (("foresight", repo), ("pairwise", peer)):
        info = repo_info(where)
        for file in files:
            start = time.perf_counter()
            (done,) = submit(info, [file], pairwise=way == "pairwise")
            walls[way].append(time.perf_counter() - start)
            found[way] |= {(done.id, o.other, o.paths) for o in done.overlaps}
    ours, old = walls["foresight"], walls["pairwise"]
    marks = sorted({1, 10, 100, 200, n} & set(range(1, n + 1)))
    for way, wall in walls.items():
        at = "  ".join(f"#{m} {wall[m - 1]:.3f}s" for m in marks)
        print(f"  {way:<10} {at}  total {sum(wall):.1f}s  ({len(found[way])} overlaps)")
    if n >= 10:
        print(
            f"  #{n} / #10, foresight: {ours[-1] / ours[9]:.2f}x (pairwise: {old[-1] / old[9]:.2f}x)"
        )
        late, early = statistics.median(ours[-10:]), statistics.median(ours[5:15])
        print(f"  median of the last 10 / of #6-#15, foresight: {late / early:.2f}x")
    print(f"  total, foresight / pairwise: {sum(ours) / sum(old):.3f}x")
    same = found["foresight"] == found["pairwise"]
    print(f"  the same overlaps either way: {same}")
    for item, other, paths in sorted(found["foresight"]):
        print(f"    {item} <-> {other}: {', '.join(paths)}")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--queued", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--long", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if args.long:
        with tempfile.TemporaryDirectory(prefix="dagrunner-bench-long-") as tmp:
            return long_queue(args.long, Path(tmp))
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-overlaps-") as tmp:
        base = Path(tmp)
        os.environ["DAGRUNNER_WORKTREE_ROOT"] = str(base / "root")
        os.environ["DAGRUNNER_CACHE_DIR"] = str(base / "cache")
        repo = base / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        for i in range(args.live):
            path = Path(worktrees.allocate(mission="live", worker=f"w{i:02d}", repo=repo)["path"])
            change(path, i)
        envelopes = []
        for i in range(args.queued):
            name = f"q{i:02d}"
            path = Path(worktrees.allocate(mission="queued", worker=name, repo=repo)["path"])
            if i < 2:
                (path / "NEW.md").write_text(f"added by {name}\n")
            else:
                change(path, 20 + i)
            envelopes.append(Path(exporting.export(f"queued/{name}", repo=repo)["file"]))
            lifecycle.cleanup(f"queued/{name}", force=True, repo=repo)
        submit(repo_info(repo), envelopes)
        rows = {}
        for label, prefilter in (("prefilter (ours)", True), ("every pair (naive)", False)):
            walls = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                found = overlaps(repo=repo, prefilter=prefilter)
                walls.append(time.perf_counter() - start)
            rows[label] = (statistics.median(walls), found)
        sides = len(rows["prefilter (ours)"][1].sides)
        print(f"{args.live} live worktrees, {args.queued} queued envelopes, the tip: {sides} sides")
        peer = rows["every pair (naive)"][0]
        for label, (wall, found) in rows.items():
            print(
                f"  {label:<20} {wall:6.3f}s ({wall / peer:4.2f}x naive)  {found.merges:>4} merges  "
                f"{len(found.pairs)} overlapping pairs, {sum(p.conflict for p in found.pairs)} conflicts"
            )
        same = [p.to_json() for p in rows["prefilter (ours)"][1].pairs] == [
            p.to_json() for p in rows["every pair (naive)"][1].pairs
        ]
        print(f"  the same pairs either way: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
