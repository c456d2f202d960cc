"""The pipeline fuzzer: seeded scenarios of the whole integration queue on a real repository,
each checked against the landing invariant (docs/security.md) by an oracle that knows what
every tree really fails.

A scenario mixes gates that flake once on some trees, a ``needs`` chain, fail-fast
cancellations (a slow gate beside a fast one), failures that name the culprit's file or name
nothing, batches, conflicting pairs, a red target under either baseline, workers that need
another (queued before them, or after them: ``early``, which passes only in a batch holding
that one), and hostile envelopes whose gate plants a hook in its tool cache
(``PRE_COMMIT_HOME``) that later trees' gates run.  After ``integrate run`` (a subprocess, bounded: a hang is a broken invariant):

- every landed commit fails nothing the oracle's check finds (what the target itself failed
  at the start aside, under the differential baseline), and the target's tip passes a
  trusted, uncached ``release-check`` of the same manifest (flakes and tool caches off);
- no envelope whose tree passes alone on the target ends ``gates-failed``;
- nothing is left queued, applying or gating (but an item held on a red target under the
  absolute baseline: queued, never blamed for the target's failure).

``tests/test_fuzz_pipeline.py`` runs a fixed set of seeds; ``scripts/fuzz_pipeline.py`` runs
thousands.  The caller provides an isolated HOME and caches (``tests/conftest.py`` does).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting

KINDS = ("good", "good", "good", "broken", "lintbad", "pair", "plant-pass", "plant-fail")
MARKS = {"broken": "BROKEN", "lintbad": "LINTBAD"}
FINAL = {"landed", "conflict", "gates-failed", "rejected"}
HANG = 240.0  # seconds an integrator may take on a scenario before it is a hang


@dataclass(frozen=True)
class Worker:
    name: str
    kind: str  # good, broken (the check fails), lintbad (lint fails), pair (edits one line
    # of shared.txt, as its twin does), plant-pass / plant-fail (hostile: plants a hook),
    # needs (its check fails without the good worker queued right before it: ``text``;
    # early: queued before it, so it never passes alone: only what it lands with mends it),
    # pairbad (a pair's first twin that breaks the check), needsline (its check fails
    # without the line of shared.txt that ``text`` says: the second twin's)
    text: str = ""


@dataclass(frozen=True)
class Scenario:
    seed: int
    workers: tuple[Worker, ...]
    window: int
    batch: str
    baseline: str  # absolute | differential
    named: bool  # the check prints the files it failed on (a failure that names its culprit)
    chain: bool  # check needs lint: a failed lint skips it
    slow: bool  # a slow gate beside: a fast failure cancels it (fail-fast)
    flaky: tuple[str, ...]  # gates that fail the first run on about a third of trees
    red: bool  # the target itself fails the docs gate
    hostile: bool  # the check runs what its tool cache holds
    observed: bool = False  # gates keyed by the tree: by what they are seen to read (issue 46)
    # observed only: a relay gate beside the check copies the tree's text files into a new
    # file, which the check reads instead when it is there (a file another gate made); the
    # workers' files are in the target already, so an edit leaves the tree's names as they were
    relay: bool = False
    # a worker that needs the good one queued right before it (its check fails without it):
    # a pair of them, split, must not blame the second for its tree without the first
    needs: bool = False
    # the first twin of a pair breaks the check, and a worker behind the second needs the
    # second's line of shared.txt: the second applies once the first failed (it lands), and
    # so does the one that needs it -- never judged without it
    clash: bool = False
    # workers editing only a page no gate reads (``pages/``: no suspects by reads); a
    # page-liar adds a BROKEN file, its changed_files saying it modified it
    pages: bool = False
    # clash only: the first twin's break is certain (exit 127, a missing program: never
    # re-run), so the second, put aside behind it, goes back in its place at once
    certain: bool = False
    # a worker queued up to three places ahead of the good one it needs (``early``): it fails
    # alone and passes only in a batch that holds that one too -- what lands must still be
    # a tree that passed, and a split must not blame what the early one broke on another
    early: bool = False

    @classmethod
    def of(cls, seed: int, *, early: bool = True) -> Scenario:
        """The scenario of ``seed``.  ``early=False``: as drawn before the early kind was
        added (the seeds pinned in ``tests/test_fuzz_pipeline.py`` keep their scenarios)."""
        rng = random.Random(seed)
        hostile = rng.random() < 0.3
        kinds = [k for k in KINDS if hostile or not k.startswith("plant")]
        workers: list[Worker] = []
        for i in range(rng.randint(3, 7)):
            kind = rng.choice(kinds)
            workers.append(Worker(f"w{i:02d}", kind, f"{kind} {seed} {i}"))
            if kind == "pair":
                workers.append(Worker(f"w{i:02d}b", "pair", f"twin {seed} {i}"))
        rng.shuffle(workers)
        scenario = cls(
            seed=seed,
            workers=tuple(workers),
            window=rng.randint(1, 4),
            batch=rng.choice(["1", "2", "3", "auto", "auto"]),
            baseline=rng.choice(["absolute", "differential"]),
            named=rng.random() < 0.5,
            chain=rng.random() < 0.5,
            slow=rng.random() < 0.4,
            flaky=tuple(g for g in ("lint", "check") if rng.random() < 0.4),
            red=rng.random() < 0.25,
            hostile=hostile,
            observed=rng.random() < 0.5,  # drawn last: the seeds' other draws stay as they were
            relay=rng.random() < 0.5,
        )
        good = next((i for i, w in enumerate(workers) if w.kind == "good"), None)
        if rng.random() < 0.3 and good is not None:  # drawn last, as the two above
            workers.insert(good + 1, Worker(f"{workers[good].name}n", "needs", workers[good].name))
            scenario = replace(scenario, workers=tuple(workers), needs=True)
        pair = next((w.name.rstrip("b") for w in workers if w.kind == "pair"), None)
        twins = [
            i for i, w in enumerate(workers) if w.kind == "pair" and w.name.rstrip("b") == pair
        ]
        if rng.random() < 0.3 and len(twins) == 2:  # drawn last, as the three above
            # the pair's first twin breaks the check; one behind the second needs its line
            first, second = (workers[i] for i in twins)
            workers[twins[0]] = replace(first, kind="pairbad")
            workers.insert(twins[1] + 1, Worker(f"{second.name}l", "needsline", second.text))
            scenario = replace(scenario, workers=tuple(workers), clash=True)
        if rng.random() < 0.5:  # drawn last, as the ones above
            for j in range(rng.randint(2, 6)):
                kind = "page-liar" if hostile and rng.random() < 0.3 else "page"
                at = rng.randint(0, len(workers))
                workers.insert(at, Worker(f"p{j:02d}", kind, f"{kind} {seed} {j}"))
            scenario = replace(scenario, workers=tuple(workers), pages=True)
        if rng.random() < 0.5 and scenario.clash:  # drawn last, as the ones above
            scenario = replace(scenario, certain=True)
        good = next((i for i, w in enumerate(workers) if w.kind == "good"), None)
        if early and rng.random() < 0.3 and good is not None:  # drawn last, as the ones above
            ahead = Worker(f"{workers[good].name}e", "early", workers[good].name)
            workers.insert(max(0, good - rng.randint(0, 3)), ahead)
            scenario = replace(scenario, workers=tuple(workers), early=True)
        return scenario

    def manifest(self, state: Path) -> str:
        """The target's manifest: every gate a function of the tree, but for its flakes."""

        def flake(gate: str) -> str:
            if gate not in self.flaky:
                return ""
            mark = f"{state}/flaked-{gate}-$t"
            return (
                f"t=$(git rev-parse 'HEAD^{{tree}}'); "
                # which trees flake, by their workers' files (not the manifest, which names
                # this scenario's folder): the same in a replay; ${k}, as "$k{gate}" would be
                # a variable of that name (it was: empty, the same checksum, never a flake)
                f"k=$(git ls-tree -r HEAD -- '*.txt' | cksum); "
                f"if [ ! -e '{state}/steady' ] && "
                f'[ $(( $(printf %s "${{k}}{gate}{self.seed}" | cksum | cut -d" " -f1) % 3 )) = 0 ] && '
                f'mkdir "{mark}" 2>/dev/null; then echo flaked; exit 1; fi; '
            )

        grep = "-rl" if self.named else "-rq"
        hook = ""
        if self.hostile:
            # A tool that runs what its cache holds (a pre-commit hook environment): a hostile
            # tree plants an answer there for the trees gated after it.
            hook = (
                'mkdir -p "$PRE_COMMIT_HOME"; h="$PRE_COMMIT_HOME/hook.sh"; '
                "if [ -f PLANTPASS.txt ]; then printf '#!/bin/sh\\nexit 0\\n' > \"$h\"; fi; "
                "if [ -f PLANTFAIL.txt ]; then printf '#!/bin/sh\\ncat victim\\nexit 1\\n' "
                '> "$h"; cp PLANTFAIL.txt "$PRE_COMMIT_HOME/victim"; fi; '
                'if [ -f "$h" ] && [ ! -f PLANTPASS.txt ] && [ ! -f PLANTFAIL.txt ]; then '
                'cd "$PRE_COMMIT_HOME" && exec sh "$h"; fi; '
            )

        def gate(name: str, run: str, needs: str = "") -> str:  # a TOML literal string
            keyed = ""
            if self.observed:  # keyed by its reads; only a flaky gate keeps a folder
                keyed = 'inputs = ["**"]\nobserve = true\n'
                keyed += f'writable = ["{state}"]\n' if name in self.flaky else ""
            return f"[gates.{name}]\nrun = '''{run}'''\n{keyed}" + (
                f'needs = ["{needs}"]\n' if needs else ""
            )

        # a worker's file that says NEEDS w: w's file must say what the good worker wrote
        needs = (
            'for f in $(grep -rl "^NEEDS " --include=*.txt .); do '
            'd=$(sed -n "s/^NEEDS //p" "$f"); grep -q "^good " "./$d.txt" || exit 1; done; '
            if self.needs
            else ""
        )
        if self.clash:  # a worker's file that says NEEDSLINE l: shared.txt must hold line l
            needs += (
                'for f in $(grep -rl "^NEEDSLINE " --include=*.txt .); do '
                'l=$(sed -n "s/^NEEDSLINE //p" "$f"); grep -qx "$l" shared.txt || exit 1; done; '
            )
        if self.certain:  # the first twin's line: a missing program, as certain as it gets
            needs = "if grep -q BROKEN shared.txt; then echo ./shared.txt; exit 127; fi; " + needs
        gates = [
            gate("lint", f"{flake('lint')}! grep -rq LINTBAD --include=*.txt ."),
            gate(
                "check",
                f"{hook}{flake('check')}{needs}! grep {grep} BROKEN --include=*.txt .",
                "lint" if self.chain else "",
            ),
        ]
        if self.observed and self.relay:  # the same verdict, read through another gate's file
            gates[1] = gates[1].replace(
                f"! grep {grep} BROKEN --include=*.txt .",
                "sleep 0.3; if [ -e relay/all ]; then ! grep -q BROKEN relay/all; "
                f"else ! grep {grep} BROKEN --include=*.txt .; fi",
            )
            gates.append(
                gate(
                    "relay",
                    "mkdir -p relay; cat ./*.txt > relay/all.part; mv relay/all.part relay/all",
                )
            )
        if self.slow:
            gates.append(gate("slow", "sleep 0.6; ! grep -rq BROKEN --include=*.txt ."))
        if self.red:
            gates.append(gate("docs", "! grep -rq REDMARK --include=*.txt ."))
        shared = "" if self.observed else f'[sandbox]\nwritable = ["{state}"]\n\n'
        head = f'{shared}[integrate]\nbaseline = "{self.baseline}"\n'
        return head + "\n" + "\n".join(gates)

    def passes_alone(self, worker: Worker, states: dict[str, str]) -> bool:
        """Whether the worker's tree, alone on the target, fails nothing the target does not
        (on a red target under the absolute baseline it is held, never blamed); a worker
        that needs another, once that one landed (held on a red target, it did not)."""
        if worker.kind == "needs":
            return states.get(worker.text) == "landed"
        if worker.kind == "needsline":
            twin = next(w for w in self.workers if w.kind == "pair" and w.text == worker.text)
            return states.get(twin.name) == "landed"
        return worker.kind in ("good", "pair", "page")

    def change(self, worker: Worker, path: Path) -> None:
        """What the worker does in its worktree."""
        if worker.kind == "page":
            (path / "pages" / f"{worker.name}.md").write_text(f"{worker.text}\n")
            return
        if worker.kind == "page-liar":
            (path / f"{worker.name}.txt").write_text("BROKEN\n")
            return
        if worker.kind in ("pair", "pairbad"):  # both of a pair edit the same line: one conflicts
            bad = " BROKEN" if worker.kind == "pairbad" else ""
            (path / "shared.txt").write_text(f"one\n{worker.text}{bad}\nthree\n")
            return
        if worker.kind == "needsline":
            (path / f"{worker.name}.txt").write_text(f"NEEDSLINE {worker.text}\n")
            return
        if worker.kind in ("needs", "early"):
            (path / f"{worker.name}.txt").write_text(f"NEEDS {worker.text}\n")
            return
        plant = {"plant-pass": "PLANTPASS.txt", "plant-fail": "PLANTFAIL.txt"}.get(worker.kind)
        if plant:
            # hostile: it fails its own check (BROKEN), so it never lands, after planting; a
            # failing hook names a victim's file, so that the victim is blamed
            victim = next((w for w in self.workers if w.kind == "good"), worker)
            (path / plant).write_text(f"BROKEN\n./{victim.name}.txt\n")
            return
        mark = MARKS.get(worker.kind, "")
        (path / f"{worker.name}.txt").write_text(f"{worker.text}\n{mark}\n")


@dataclass
class Outcome:
    seed: int
    broken: list[str] = field(default_factory=list)  # each invariant broken, said
    states: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.broken


def git(repo: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "f", "GIT_AUTHOR_EMAIL": "f@f"}
    env |= {"GIT_COMMITTER_NAME": "f", "GIT_COMMITTER_EMAIL": "f@f"}
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout


def dagrunner(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The CLI as a user runs it, bounded: its exit code, stdout and stderr; -1 when it hung."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dagrunner", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=HANG,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return -1, "", ""
    return done.returncode, done.stdout, done.stderr


def make_repo(scenario: Scenario, root: Path, state: Path) -> tuple[Path, str]:
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text("reports/\nrelay/\n")
    (repo / "shared.txt").write_text("one\ntwo\nthree\n")
    (repo / "README.txt").write_text("REDMARK\n" if scenario.red else "fine\n")
    if scenario.observed and scenario.relay:  # workers edit their file: the names stay
        for worker in scenario.workers:
            (repo / f"{worker.name}.txt").write_text("fine\n")
    for worker in (w for w in scenario.workers if w.kind == "page"):
        (repo / "pages").mkdir(exist_ok=True)
        (repo / "pages" / f"{worker.name}.md").write_text("a page\n")
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text(scenario.manifest(state))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project")
    return repo, git(repo, "rev-parse", "HEAD").strip()


def run(seed: int, root: Path, *, early: bool = True) -> Outcome:
    """One scenario in ``root`` (an empty folder): its outcome, with every broken invariant."""
    import time

    started = time.monotonic()
    scenario = Scenario.of(seed, early=early)
    outcome = Outcome(seed)
    state = root / "state"
    state.mkdir(parents=True)
    repo, base = make_repo(scenario, root, state)
    envelopes = []
    for worker in scenario.workers:
        made = wt.allocate(mission="fuzz", worker=worker.name, repo=repo, session=worker.name)
        path = Path(made["path"])
        scenario.change(worker, path)
        out = root / f"{worker.name}.envelope.json"
        exporting.export(f"fuzz/{worker.name}", output=out, repo=repo)
        if worker.kind == "page-liar":  # its account says a plain edit: it only groups it
            fields = orjson.loads(out.read_bytes())
            for change in fields["changed_files"]:
                change.update(kind="modified", old_mode=change["mode"])
            out.write_bytes(orjson.dumps(fields))
        envelopes.append(out)
    submit(repo_info(repo), envelopes)
    args = ["integrate", "run", "--json", "--window", str(scenario.window)]
    code, _, said = dagrunner(repo, *args, "--batch", scenario.batch)
    if code == -1:
        outcome.broken.append(f"integrate run hung (over {HANG:.0f} s)")
    elif code not in (0, 1):
        outcome.broken.append(f"integrate run exited {code}: {said[-2000:]}")
    entries = Queue.of(repo_info(repo)).entries().values()
    outcome.states = {e.id.split(".")[1]: str(e.state) for e in entries}
    for worker in scenario.workers:
        got = outcome.states.get(worker.name, "missing")
        if got == "queued" and scenario.red and scenario.baseline == "absolute":
            continue  # held: the target fails docs, so nothing can land; never blamed for it
        if got not in FINAL:
            outcome.broken.append(f"{worker.name} ({worker.kind}) left {got}")
        elif got == "gates-failed" and scenario.passes_alone(worker, outcome.states):
            outcome.broken.append(f"{worker.name} ({worker.kind}) passes alone, ended gates-failed")
    landed = git(repo, "rev-list", "--reverse", f"{base}..main").split()
    for commit in landed:
        for mark in ("BROKEN", "LINTBAD") + (
            ("REDMARK",) if scenario.baseline == "absolute" else ()
        ):
            hit = git(repo, "grep", "-l", mark, commit, "--", "*.txt", check=False).strip()
            if hit:
                outcome.broken.append(f"landed {commit[:12]} fails on {mark}: {hit}")
        # (not the early kind: it is mended only at its batch's end, and the commits inside a
        # batch are not gated alone, docs/integration.md)
        for worker in (w for w in scenario.workers if w.kind == "needs"):
            has = git(repo, "grep", "-l", "^NEEDS", commit, "--", f"{worker.name}.txt", check=False)
            dep = git(repo, "grep", "-l", "^good ", commit, "--", f"{worker.text}.txt", check=False)
            if has.strip() and not dep.strip():
                outcome.broken.append(f"landed {commit[:12]} holds {worker.name} without its need")
    # landings keep the queue's order (held items rejoin the queue behind: a red target,
    # absolute baseline)
    subjects = git(repo, "log", "--reverse", "--format=%s", f"{base}..main").splitlines()
    order = [w.name for w in scenario.workers]
    landed_in = [s.rsplit("/", 1)[-1] for s in subjects if s.rsplit("/", 1)[-1] in order]
    if landed_in != sorted(landed_in, key=order.index) and not (
        scenario.red and scenario.baseline == "absolute"
    ):
        outcome.broken.append(f"landed out of the queue's order: {landed_in}")
    outcome.broken += stale_cached(repo, root)
    if landed:
        outcome.broken += oracle(scenario, repo, root, state)
    outcome.seconds = time.monotonic() - started
    return outcome


# What each gate fails on (every gate is a function of the tree's text files, but flakes)
FAILS_ON = {"lint": "LINTBAD", "check": "BROKEN", "slow": "BROKEN", "docs": "REDMARK"}


def stale_cached(repo: Path, root: Path) -> list[str]:
    """Every verdict the queue answered from the cache on a tree where its gate fails: a
    stale pass, even where another gate failed the tree (so nothing landed by it)."""
    found = []
    trees = Path(os.environ.get("DAGRUNNER_WORKTREE_ROOT", root / "worktrees"))
    for record in sorted(trees.glob("*/.integration/.reports/*/*/run.json")):
        run = orjson.loads(record.read_bytes())
        commit = (run.get("git") or {}).get("commit")
        for gate in run.get("gates", []):
            mark = FAILS_ON.get(gate.get("id", ""))
            if gate.get("status") != "cached" or not mark or not commit:
                continue
            hit = git(repo, "grep", "-l", mark, commit, "--", "*.txt", check=False).strip()
            if hit:
                found.append(f"{gate['id']} answered from the cache on {commit[:12]}: {hit}")
    return found


def oracle(scenario: Scenario, repo: Path, root: Path, state: Path) -> list[str]:
    """A trusted, uncached release check of the target's tip (no flakes, fresh tool caches):
    what it fails beyond what the target failed at the start."""
    (state / "steady").touch()
    tip = root / "tip"
    git(repo, "worktree", "add", "-q", "--detach", str(tip), "main")
    env = {**os.environ, "DAGRUNNER_TOOL_CACHE_DIR": str(root / "oracle-tools")}
    report = root / "oracle-report"
    args = ["release-check", "--no-cache", "--json", "--report-dir", str(report)]
    code, out, said = dagrunner(tip, *args, env=env)
    if code == -1:
        return ["the oracle's release check hung"]
    try:
        summary = orjson.loads(out)
    except orjson.JSONDecodeError:
        return [f"the oracle's release check said no JSON (exit {code}): {said[-1000:]}"]
    failed = {
        g["id"] for g in summary.get("gates", []) if g.get("status") not in ("passed", "cached")
    }
    allowed = {"docs"} if scenario.red and scenario.baseline == "differential" else set()
    if code not in (0, 1) or not summary.get("gates"):
        return [f"the oracle's release check exited {code}: {said[-1000:]}"]
    if not failed - allowed:
        return []
    why = {  # what failed it, so that a finding that does not replay can still be read
        g["id"]: f"{g.get('status')}: {g.get('reason')}"
        for g in summary.get("gates", [])
        if g["id"] in failed - allowed
    }
    run_dir = Path(str(summary.get("run_dir") or report))
    logs = {gate: _tail(run_dir / "logs" / f"{gate}.log") for gate in failed - allowed}
    return [f"the target's tip fails {sorted(failed - allowed)}: {why} {logs}"]


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-300:]
    except OSError:
        return "(no log)"
