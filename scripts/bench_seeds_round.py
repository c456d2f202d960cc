"""Benchmark: the swarm round on a real JavaScript workspace, with the ``node_modules`` seed
``dagrunner init`` proposes against the same round without it, pair by pair (issue 44).

    python scripts/bench_seeds_round.py --project PATH [--pairs 3] [--path DIR]
                                        [--edits FILE] [--only seeded|plain] [--install-only]

PATH is a checkout of a public JavaScript workspace, installed as its CI says, whose
``dagrunner.toml`` (what ``init`` wrote, with a ``[[worktrees.seed]]`` for ``node_modules``)
is committed; nothing of it is committed here.  ``--path DIR`` goes first on every PATH (a
newer Node).  Each round runs in a fresh clone of PATH with its own worktree root, gate
cache and tool caches, and is the round of docs/real-projects.md: five workers allocate,
edit and commit, export; all five are submitted at once; ``integrate run`` drains them.
The edits (``--edits``, JSON ``{"w1": [path, old, new], ...}``, ``old`` empty: ``new`` goes
first in the file) default to manypkg's: w1 and w2 good changes in different files, w3 and
w4 the same line changed differently, w5 a test broken.  Expected: w1, w2, w3 ``landed``,
w4 ``conflict``, w5 ``gates-failed``; each round's outcomes are printed and checked.

- seeded: the manifest as committed; ``worktree allocate`` with no setup (the seed is
  built by the round's first allocation, from a package-manager store warmed beforehand,
  as a user's is after a first install).
- plain: the same manifest without the seed, as a user without seeds would make it work:
  each worktree allocated with ``--setup`` running the seed's build command (the user's
  package cache warm), and a ``js-install`` gate (the same command) that every other gate
  needs, so each integration tree installs once (its tool cache warmed by a release check
  in the clone first).

Unmeasured before each round: the clone, its main checkout's install, one ``release-check``
there (the gate cache and tool caches a user has; ``--install-only``: of the plain side's
install gate alone, the one cache the round reads -- an envelope's tree is never the
checkout's, and the target's head is run, never answered from the cache, to judge a blame).  Measured: from the first allocation to
the end of ``integrate run``.  Printed per round: the wall, its worktree part, the
outcomes; then the medians and the median of the pairs' ratios (seeded / plain).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from dagrunner.git.repo import repo_info, worktree_root
from dagrunner.process import share
from dagrunner.worktrees import seeds, seedstores

MANYPKG = {
    "w1": ["packages/find-root/src/index.ts", "", "// Finds the root of a monorepo.\n"],
    "w2": ["packages/cli/src/logger.ts", "", "// Colours and formats what the CLI prints.\n"],
    "w3": ["README.md", "Bun or Lerna monorepos.", "Bun and Lerna monorepos."],
    "w4": ["README.md", "Bun or Lerna monorepos.", "Bun or Lerna workspaces."],
    "w5": [
        "packages/get-packages/src/index.test.ts",
        '"yarn-workspace-base-pkg-a"',
        '"yarn-workspace-base-pkg-x"',
    ],
}
EXPECTED = {"w1": "landed", "w2": "landed", "w3": "landed", "w4": "conflict"}
EXPECTED["w5"] = "gates-failed"
DAGRUNNER = [sys.executable, "-m", "dagrunner"]


def sh(argv: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "b@b"}
    env |= {"GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "b@b"}
    return sh(["git", *args], cwd, env)


def without_seed(text: str, install: str) -> str:
    """The manifest ``text`` with its seed table cut and a ``js-install`` gate every other
    gate needs (``install``: the seed's build, run in the tree)."""
    text = re.sub(r"(?ms)^\[\[worktrees\.seed\]\].*?(?=^\[|\Z)", "", text)
    gates = list(tomllib.loads(text).get("gates", {}))
    for gate in gates:
        block = re.search(rf"(?ms)^\[gates\.{re.escape(gate)}\]\n.*?(?=^\[|\Z)", text)
        assert block is not None, gate
        body = block[0]
        if re.search(r"(?m)^needs = \[", body):
            body = re.sub(r"(?m)^needs = \[", 'needs = ["js-install", ', body, count=1)
        else:
            body = re.sub(r"(?m)^(run = .*)$", r'\1\nneeds = ["js-install"]', body, count=1)
        text = text.replace(block[0], body)
    gate = (
        "\n# the seed's build, in each tree (the round without seeds)\n[gates.js-install]\n"
        f'run = {json.dumps(["sh", "-c", install])}\ninputs = ["**"]\n'
        'estimate = "30s"\nmemory = "1G"\n'
    )
    first = text.find("\n[gates.")
    text = text[:first] + "\n" + gate + text[first:]
    tomllib.loads(text)
    return text


def plain_install(build: str) -> str:
    """The seed's build as a user runs it in a tree: without the seed's store (the package
    manager's own cache instead)."""
    build = re.sub(r'\S+="\$DAGRUNNER_SEED_STORE[^"]*"\s+', "", build)
    build = re.sub(
        r'--(cache-folder|store-dir|cache-dir|cache)\s+"\$DAGRUNNER_SEED_STORE[^"]*"', "", build
    )
    # and without the variables set before it (yarn berry's ``YARN_ENABLE_GLOBAL_CACHE=true``,
    # its default): ``--setup`` runs its words, not a shell line
    return " ".join(re.sub(r"^(\s*[A-Za-z_]\w*=\S*\s+)+", "", build).split())


def seed_of(project: Path) -> dict[str, object]:
    manifest = tomllib.loads((project / "dagrunner.toml").read_text())
    seeds = manifest.get("worktrees", {}).get("seed", [])
    if not seeds:
        raise SystemExit(f"{project}/dagrunner.toml has no [[worktrees.seed]] to compare")
    return dict(seeds[0])


class Round:
    """One round in a fresh clone of the project, with its own worktree root and caches."""

    def __init__(self, project: Path, work: Path, mode: str, args: argparse.Namespace) -> None:
        self.mode, self.args = mode, args
        self.folder = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=work))
        self.repo = self.folder / "repo"
        self.env = dict(os.environ)
        self.env["PATH"] = f"{args.path}:{self.env['PATH']}" if args.path else self.env["PATH"]
        for name, sub in (("WORKTREE_ROOT", "wt"), ("CACHE_DIR", "cache")):
            self.env[f"DAGRUNNER_{name}"] = str(self.folder / sub)
        self.env["DAGRUNNER_TOOL_CACHE_DIR"] = str(self.folder / "tools")
        self.seed = seed_of(project)
        self.install = plain_install(str(self.seed["build"]))
        git(work, "clone", "-q", str(project), str(self.repo))
        if mode == "plain":
            path = self.repo / "dagrunner.toml"
            path.write_text(without_seed(path.read_text(), self.install))
            git(self.repo, "commit", "-qam", "bench: no seed; an install gate")

    def prepare(self, store: Path | None) -> None:
        """What a user has before the round: the main checkout installed, its release check
        run once (gate cache, tool caches), and (seeded) the package manager's store.  The
        plain round's main checkout is installed by that run's ``js-install`` gate, which
        so fills its tool cache (the package manager's), as a user's first run would."""
        if self.mode == "seeded":
            sh(["sh", "-c", self.install], self.repo, self.env)
        # --install-only: of that run, only what the round reads (the plain side's install
        # gate's tool cache): a project whose checks take minutes pays them in the round
        only = ["--only", "js-install"] if self.args.install_only else []
        if not (self.args.install_only and self.mode == "seeded"):
            check = [*DAGRUNNER, "release-check", "--quiet", *only]
            sh(check, self.repo, self.env, check=False)
        if store is not None and self.seed.get("store"):
            stores = self.stores()
            stores.mkdir(parents=True, exist_ok=True)
            shutil.copytree(store, stores / str(self.seed["store"]), symlinks=True)

    def stores(self) -> Path:
        """The package managers' stores of this clone's worktree root (which is named by a
        hash of the clone's path, under ``DAGRUNNER_WORKTREE_ROOT``)."""
        root = worktree_root(repo_info(self.repo), self.env)
        return seeds.seeds_dir(root) / seedstores.STORES

    def run(self, edits: dict[str, list[str]]) -> dict[str, object]:
        """The round: allocate, edit, commit, export five workers; submit; integrate."""
        setup = ["--setup", self.install]
        start = time.perf_counter()
        files, allocations = [], []
        for worker, (path, old, new) in edits.items():
            began = time.perf_counter()
            extra = setup if self.mode == "plain" else []
            allocate = ["worktree", "allocate", "--mission", "m", "--worker", worker, "--json"]
            said = sh([*DAGRUNNER, *allocate, *extra], self.repo, self.env)
            allocations.append(time.perf_counter() - began)
            tree = Path(json.loads(said)["path"])
            target = tree / path
            text = target.read_text()
            if old and old not in text:
                raise SystemExit(f"{worker}: {old!r} is not in {path}")
            target.write_text(text.replace(old, new, 1) if old else new + text)
            # The project's own commit hooks (husky's, set up by its install) are the
            # worker's, not the round's: only the plain side's worktrees would run them
            # (its --setup install makes them), and w5's broken test would stop its commit.
            git(tree, "commit", "--no-verify", "-qam", f"{worker}: edit {path}")
            out = self.folder / f"{worker}.json"
            sh([*DAGRUNNER, "worktree", "export", f"m/{worker}", "-o", str(out)], tree, self.env)
            files.append(str(out))
        worktrees = time.perf_counter() - start
        sh([*DAGRUNNER, "integrate", "submit", *files], self.repo, self.env)
        said = sh([*DAGRUNNER, "integrate", "run", "--json"], self.repo, self.env, check=False)
        wall = time.perf_counter() - start
        result = json.loads(said.strip().splitlines()[-1])
        states = {e["worker"]: e["state"] for e in result["envelopes"]}
        failed = {e["worker"]: e.get("failed_gates", []) for e in result["envelopes"]}
        return {
            "wall": wall,
            "worktrees": worktrees,
            "allocations": allocations,
            "states": states,
            "failed": failed,
            "tests": failed_tests(result),
        }

    def remove(self) -> None:
        """The round's worktrees (their seeds may be mounts), then its folder."""
        share.release(self.folder, self.folder)
        shutil.rmtree(self.folder, ignore_errors=True)


def failed_tests(result: dict[str, object]) -> list[str]:
    """The failing tests the gates-failed envelopes' reports name."""
    names: list[str] = []
    for entry in result.get("envelopes", []):  # type: ignore[attr-defined]
        report = entry.get("report")
        if entry.get("state") != "gates-failed" or not report:
            continue
        for gate in Path(report).glob("gates/*.json"):
            cases = (json.loads(gate.read_text()).get("tests") or {}).get("cases", [])
            names += [c["name"] for c in cases if c.get("outcome") in ("failed", "error")]
    return names


def fmt(values: object) -> str:
    return " ".join(f"{v:.1f}" for v in values)  # type: ignore[attr-defined]


def warm_store(project: Path, work: Path, args: argparse.Namespace) -> Path | None:
    """The package manager's store after one seed build (unmeasured), kept for each round."""
    first = Round(project, work, "seeded", args)
    sh([*DAGRUNNER, "worktree", "allocate", "--mission", "warm", "--worker", "w"],
       first.repo, first.env)  # fmt: skip
    store = first.stores() / str(first.seed.get("store", ""))
    if first.seed.get("store") and not store.is_dir():
        raise SystemExit(f"the first build left no store at {store}")
    kept = work / "store" if first.seed.get("store") else None
    if kept is not None:
        shutil.copytree(store, kept, symlinks=True)
    first.remove()
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--path", default="", help="a folder first on every PATH")
    parser.add_argument("--edits", type=Path, help="JSON: worker -> [path, old, new]")
    parser.add_argument("--only", choices=("seeded", "plain"), help="one side, one round each")
    parser.add_argument("--keep", action="store_true", help="keep the rounds' folders")
    parser.add_argument(
        "--install-only",
        action="store_true",
        help="before each round, release-check only the plain side's install gate",
    )
    args = parser.parse_args()
    project = args.project.resolve()
    edits = json.loads(args.edits.read_text()) if args.edits else MANYPKG
    work = Path(tempfile.mkdtemp(prefix="bench-seeds-round-"))
    print(f"work folder {work}; load {os.getloadavg()[0]:.2f}", flush=True)
    store = warm_store(project, work, args)
    walls: dict[str, list[float]] = {"seeded": [], "plain": []}
    ratios = []
    for pair in range(args.pairs):
        order = ("seeded", "plain") if pair % 2 == 0 else ("plain", "seeded")
        here = {}
        for mode in order:
            if args.only and mode != args.only:
                continue
            one = Round(project, work, mode, args)
            one.prepare(store if mode == "seeded" else None)
            got = one.run(edits)
            exact = got["states"] == {w: EXPECTED[w] for w in edits if w in EXPECTED}
            print(
                f"pair {pair + 1} {mode:6}: wall {got['wall']:6.1f} s (worktrees "
                f"{got['worktrees']:5.1f} s; allocations {fmt(got['allocations'])}) "
                f"{'exact' if exact else 'WRONG'} {got['states']} "
                f"failed {got['failed']} tests {got['tests']} "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            here[mode] = float(got["wall"])  # type: ignore[arg-type]
            walls[mode].append(here[mode])
            if not args.keep:
                one.remove()
        if len(here) == 2:
            ratios.append(here["seeded"] / here["plain"])
    for mode, values in walls.items():
        if values:
            print(f"{mode:6}: median wall {statistics.median(values):6.1f} s of {values}")
    if ratios:
        print(f"seeded / plain: median of pairs {statistics.median(ratios):.3f} ({ratios})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
