"""Keys from what a gate was seen to read (issue 46), on real repositories and a real store.

These drive the cache step (``RunCache``) the way the scheduler does -- a lookup once a
gate's needs have settled, the attempt's observation, the settled result -- with the
``Observation`` records an observer returns, built here: which files a run reads is the
input of these tests, the store and the keys are the real ones."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import git

from dagrunner.engine.cache import READ_SETS, Store
from dagrunner.engine.cachestep import RunCache
from dagrunner.engine.dry_run import dry_run, explain_gate
from dagrunner.engine.graph import topological_order
from dagrunner.engine.keys import KeyParts
from dagrunner.engine.plan import RunOptions
from dagrunner.engine.steps import load_step, plan_step
from dagrunner.records.run import GateResult, Observation, Status

MANIFEST = """
    [gates.build]
    run = "true"
    inputs = ["**"]
    observe = true
    [gates.test]
    run = "true"
    inputs = ["**"]
    observe = true
    needs = ["build"]
    [gates.lint]
    run = "true"
    inputs = ["src/**"]
    observe = true
    [gates.docs]
    run = "true"
    inputs = ["**"]
    observe = false
"""
# What each gate reads when it runs (test reads dist/, which build writes: not in the tree)
READS = {
    "build": {"src/a.py", "pkg.json", "dist/out.js"},
    "test": {"tests/t.py", "dist/out.js"},
    "lint": {"src/a.py", "README"},
    "docs": {"docs/guide.md"},
}


@pytest.fixture
def tree(repo: Path, tmp_path: Path) -> dict[str, Path]:
    for rel, text in {
        "src/a.py": "A = 1\n",
        "src/b.py": "B = 1\n",
        "tests/t.py": "T = 1\n",
        "pkg.json": "{}\n",
        "docs/guide.md": "guide\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    manifest = tmp_path / "m.toml"
    manifest.write_text(textwrap.dedent(MANIFEST))
    return {"repo": repo, "manifest": manifest, "store": tmp_path / "store"}


def cache_for(
    t: dict[str, Path], *, read: bool = True, trusted: str | None = None, ahead: str | None = None
) -> RunCache:
    options = RunOptions(repo=t["repo"], manifest=t["manifest"])
    repo, manifest = load_step(options)
    plan = plan_step(repo, manifest, options)
    run_dir = t["store"].parent / "runs" / os.urandom(4).hex()
    (run_dir / "logs").mkdir(parents=True)
    return RunCache(
        manifest=manifest,
        graph=plan.graph,
        repo=repo,
        envs=plan.envs,
        run_dir=run_dir,
        read=read,
        store=Store(t["store"]),
        trusted=trusted,
        ahead=ahead,
    )


def drive(
    cache: RunCache,
    seen: dict[str, Observation | None] | None = None,
    failing: frozenset[str] = frozenset(),
) -> dict[str, GateResult]:
    """One run as the scheduler makes it: each gate looked up once its needs passed; a miss
    runs (its observation, by default what ``READS`` says, complete), then settles."""
    results: dict[str, GateResult] = {}
    for gate in topological_order(cache.graph):
        hit = cache.lookup(gate)
        assert hit is None or not hasattr(hit, "done"), "no flights outside a pipeline"
        if hit is not None:
            result = GateResult(id=gate, status=hit.status, reason=hit.reason, cache=hit.cache)
        else:
            made = frozenset(p for p in READS[gate] if p.startswith("dist/")) - {
                p for n in cache.graph.predecessors(gate) for p in READS[n]
            }  # build makes dist/, which test then reads
            observed = (seen or {}).get(
                gate,
                Observation(complete=True, read=frozenset(READS[gate]), wrote=made, new=made),
            )
            cache.seen_reading(gate, observed)
            (cache.run_dir / "logs" / f"{gate}.log").write_text(f"{gate} ran\n")
            status = Status.FAILED if gate in failing else Status.PASSED
            result = GateResult(id=gate, status=status, cache=cache.miss_proof(gate))
        cache.settled(result)
        results[gate] = result
    return results


def ran(results: dict[str, GateResult]) -> set[str]:
    return {g for g, r in results.items() if r.status is not Status.CACHED}


def test_an_edit_of_a_file_no_gate_read_answers_every_gate_keyed_by_reads(
    tree: dict[str, Path],
) -> None:
    assert ran(drive(cache_for(tree))) == {"build", "test", "lint", "docs"}
    assert ran(drive(cache_for(tree))) == set()
    (tree["repo"] / "README").write_text("an edit nobody reads... but lint, outside its inputs\n")
    (tree["repo"] / "src" / "b.py").write_text("B = 2\n")  # read by nobody
    results = drive(cache_for(tree))
    # docs opted out (keyed by the whole tree); lint's inputs are src/**, and b.py is in them
    assert ran(results) == {"docs", "lint"}
    build = results["build"].cache
    assert build is not None and build.observed == {"keyed_by": "reads", "read": 2}
    assert "none of the 2 files it read changed" in results["build"].reason


def test_an_edit_of_a_read_file_reruns_the_gate_and_what_needs_it(tree: dict[str, Path]) -> None:
    drive(cache_for(tree))
    (tree["repo"] / "src" / "a.py").write_text("A = 2\n")
    # test reads no file of the tree that changed, but build's verdict key did: dist/ may differ
    assert ran(drive(cache_for(tree))) == {"build", "test", "lint", "docs"}
    assert ran(drive(cache_for(tree))) == set()
    (tree["repo"] / "tests" / "t.py").write_text("T = 2\n")
    assert ran(drive(cache_for(tree))) == {"test", "docs"}


def test_a_need_read_differently_changes_its_dependants_key(tree: dict[str, Path]) -> None:
    """Two runs of build on the same tree that read different files give different verdict
    keys; test's key holds the one its need settled on, so it is never answered from a
    verdict made downstream of the other."""
    drive(cache_for(tree))
    other = Observation(complete=True, read=frozenset({"src/b.py"}))
    results = drive(cache_for(tree, read=False), seen={"build": other})
    first = cache_for(tree)
    assert ran(results) == {"build", "test", "lint", "docs"}
    # both read sets are kept; the newest (b.py) answers first, and test follows its key
    assert len(first.store.read_sets(_parts(first, "build").shape)) == 2
    assert ran(drive(first)) == set()
    (tree["repo"] / "src" / "b.py").write_text("B = 2\n")
    assert ran(drive(cache_for(tree))) == {"lint", "docs"}  # the a.py set still answers build


def test_a_new_file_a_removed_file_a_mode_or_a_symlink_misses(tree: dict[str, Path]) -> None:
    repo = tree["repo"]
    drive(cache_for(tree))
    (repo / "new.txt").write_text("new\n")
    assert {"build", "test"} <= ran(drive(cache_for(tree)))
    (repo / "new.txt").unlink()
    assert ran(drive(cache_for(tree))) == set()  # the first verdict answers again
    (repo / "pkg.json").chmod(0o755)
    assert {"build", "test"} <= ran(drive(cache_for(tree)))
    (repo / "pkg.json").chmod(0o644)
    (repo / "link").symlink_to("src/a.py")
    drive(cache_for(tree))
    (repo / "link").unlink()
    (repo / "link").symlink_to("src/b.py")
    assert {"build", "test"} <= ran(drive(cache_for(tree)))


def test_an_incomplete_observation_keys_by_the_whole_tree_and_says_so(
    tree: dict[str, Path],
) -> None:
    lost = Observation(complete=False, why="the gate read git's database")
    cache = cache_for(tree)
    results = drive(cache, seen={"build": lost})
    proof = results["build"].cache
    assert proof is not None and proof.observed is not None
    assert proof.observed["keyed_by"] == "whole tree" and proof.observed["complete"] is False
    assert any(
        "observation incomplete (the gate read git's database)" in w and "build" in w
        for w in cache.warnings()
    )
    assert ran(drive(cache_for(tree))) == set()  # the same tree: its whole key answers
    (tree["repo"] / "README").write_text("edited\n")  # not in lint's inputs
    assert ran(drive(cache_for(tree))) == {"build", "test", "docs"}


def test_no_observation_at_all_is_the_whole_tree_key(tree: dict[str, Path]) -> None:
    drive(cache_for(tree), seen={"build": None, "test": None})
    (tree["repo"] / "README").write_text("edited\n")
    assert {"build", "test"} <= ran(drive(cache_for(tree)))


def test_a_failed_run_stores_nothing(tree: dict[str, Path]) -> None:
    drive(cache_for(tree), failing=frozenset({"build"}))
    cache = cache_for(tree)
    assert cache.store.read_sets(_parts(cache, "build").shape) == []


def test_undeclared_reads_are_named(tree: dict[str, Path]) -> None:
    cache = cache_for(tree)
    results = drive(cache)
    lint = results["lint"].cache
    assert lint is not None and lint.observed is not None
    assert lint.observed["undeclared"] == ["README"] and lint.observed["undeclared_count"] == 1
    assert lint.observed["keyed_by"] == "declared inputs"
    said = [w for w in cache.warnings() if "outside its inputs" in w]
    assert said == [
        "gate 'lint' read files outside its inputs, which its cache key does not hold: "
        "README (add them to its inputs)"
    ]
    assert "undeclared" not in (results["build"].cache.observed or {})  # type: ignore[union-attr]


def test_a_forged_or_damaged_read_set_is_never_used(tree: dict[str, Path]) -> None:
    drive(cache_for(tree))
    cache = cache_for(tree)
    (path,) = (tree["store"] / "reads").glob(f"*/{_parts(cache, 'build').shape}/*.json")
    body = orjson.loads(path.read_bytes())
    body["body"]["read"] = ["pkg.json"]  # a smaller set: src/a.py no longer counted
    path.write_bytes(orjson.dumps(body))
    (tree["repo"] / "src" / "a.py").write_text("A = 3\n")
    assert cache_for(tree).store.read_sets(_parts(cache, "build").shape) == []
    assert {"build", "test"} <= ran(drive(cache_for(tree)))


def test_only_the_newest_read_sets_are_kept(tree: dict[str, Path]) -> None:
    for n in range(READ_SETS + 2):
        (tree["repo"] / "src" / f"{n}.py").write_text(f"N = {n}\n")
    git(tree["repo"], "add", "-A")
    git(tree["repo"], "commit", "-qm", "more")  # a file outside the index is no read to key
    for n in range(READ_SETS + 2):
        seen = Observation(complete=True, read=frozenset({"src/a.py", f"src/{n}.py"}))
        drive(cache_for(tree, read=False), seen={"build": seen})
    cache = cache_for(tree)
    assert len(cache.store.read_sets(_parts(cache, "build").shape)) == READ_SETS


def test_a_read_of_a_file_outside_the_index_or_an_ignored_one_falls_back(
    tree: dict[str, Path],
) -> None:
    """An untracked file a gate opened may be a cache it wrote (standing for files it only
    stat-ed); an ignored one the tree held before it ran, the same: keyed by the whole tree."""
    (tree["repo"] / "scratch.txt").write_text("untracked\n")
    (tree["repo"] / ".gitignore").write_text("cache.bin\n")
    (tree["repo"] / "cache.bin").write_text("ignored\n")
    git(tree["repo"], "add", ".gitignore")
    git(tree["repo"], "commit", "-qm", "ignore")
    for name, why in [("scratch.txt", "outside git's index"), ("cache.bin", "before it ran")]:
        seen = Observation(complete=True, read=frozenset({"src/a.py", name}))
        cache = cache_for(tree, read=False)
        proof = drive(cache, seen={"build": seen})["build"].cache
        assert proof is not None and proof.observed is not None
        assert proof.observed["keyed_by"] == "whole tree" and why in proof.observed["why"]
    bytecode = Observation(complete=True, read=frozenset({"src/__pycache__/a.cpython-311.pyc"}))
    (tree["repo"] / "src" / "__pycache__").mkdir()
    (tree["repo"] / "src" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tree["repo"] / ".gitignore").write_text("cache.bin\n__pycache__/\n")
    git(tree["repo"], "commit", "-qam", "ignore bytecode")
    drive(cache_for(tree, read=False), seen={"build": bytecode})
    cache = cache_for(tree)
    drive(cache)
    assert cache.store.read_sets(_parts(cache, "build").shape)[0] == {"src/a.py"}


def test_reads_outside_the_snapshot_are_not_keyed(tree: dict[str, Path]) -> None:
    """An ignored or generated file (dist/, reports/) is not in the tree's snapshot: its
    content is not in the key (a need's key covers what the need writes)."""
    drive(cache_for(tree))
    cache = cache_for(tree)
    drive(cache)  # its needs settle: test's shape holds build's verdict key
    (stored,) = cache.store.read_sets(_parts(cache, "test").shape)
    assert stored == {"tests/t.py"}


def test_explain_names_the_observed_file_that_changed(tree: dict[str, Path]) -> None:
    drive(cache_for(tree))
    (tree["repo"] / "src" / "a.py").write_text("A = 9\n")
    (tree["repo"] / "README").write_text("not read by build\n")
    said = _explain(tree, "build")
    assert said["hit"] is False
    assert said["changes"] == ["observed file changed: src/a.py (the gate read it)"]
    (tree["repo"] / "extra.md").write_text("x\n")
    assert (
        "file added: extra.md (the tree's name set changed)" in _explain(tree, "build")["changes"]
    )
    (tree["repo"] / "extra.md").unlink()
    (tree["repo"] / "src" / "a.py").write_text("A = 1\n")
    assert _explain(tree, "build")["hit"] is True


def test_a_dry_run_says_what_the_read_sets_answer(tree: dict[str, Path]) -> None:
    drive(cache_for(tree))
    (tree["repo"] / "README").write_text("docs\n")
    (tree["repo"] / "tests" / "t.py").write_text("T = 2\n")
    options = RunOptions(repo=tree["repo"], manifest=tree["manifest"], cache_root=tree["store"])
    said = {gate: body["action"] for gate, body in dry_run(options)["gates"].items()}
    assert said == {"build": "cached", "test": "run", "lint": "cached", "docs": "run"}


def _explain(t: dict[str, Path], gate: str) -> dict[str, Any]:
    options = RunOptions(repo=t["repo"], manifest=t["manifest"])
    repo, manifest = load_step(options)
    plan = plan_step(repo, manifest, options)
    return explain_gate(
        manifest=manifest,
        graph=plan.graph,
        repo=repo,
        envs=plan.envs,
        gate=gate,
        store=Store(t["store"]),
        environ={},
    )


def _parts(cache: RunCache, gate: str) -> KeyParts:
    parts = cache.current(gate)
    assert not isinstance(parts, str)
    return parts


def test_an_envelopes_verdict_by_reads_holds_for_other_trees_only_once_it_landed(
    tree: dict[str, Path],
) -> None:
    """In an envelope's tree (``trusted``: the target's head) a verdict key is stored scoped
    to that tree: it answers the trees built on it (``ahead``), not a sibling; once that tree
    is the target's own, it answers every tree by its verdict key."""
    repo = tree["repo"]
    base = git(repo, "rev-parse", "HEAD").strip()

    def envelope(text: str, on: str) -> str:
        git(repo, "checkout", "-q", "--detach", on)
        (repo / "README").write_text(text)
        git(repo, "commit", "-qam", text)
        return git(repo, "rev-parse", "HEAD").strip()

    first = envelope("one\n", base)
    assert ran(drive(cache_for(tree, trusted=base))) == {"build", "test", "lint", "docs"}
    envelope("two\n", base)  # a sibling: not built on the first, which has not landed
    assert {"build", "test"} <= ran(drive(cache_for(tree, trusted=base)))
    envelope("three\n", first)  # built on the first, in the speculation
    assert ran(drive(cache_for(tree, trusted=base, ahead=first))) == {"docs"}
    envelope("four\n", first)  # the first has landed: it is the trusted head
    assert ran(drive(cache_for(tree, trusted=first))) == {"docs"}
    git(repo, "checkout", "-q", "--detach", base)
    (repo / "README").write_text("five\n")
    git(repo, "commit", "-qam", "five")  # any tree now: the verdict key is stored unscoped
    # (lint is keyed by its inputs: the README is outside them, so the reuse rule scopes it)
    assert ran(drive(cache_for(tree, trusted=base))) == {"docs", "lint"}
