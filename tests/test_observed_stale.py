"""No stale pass, ever (issue 46): random edit sequences against an uncached oracle.

Each gate's verdict depends on what it reads, its name set or what its need wrote: a file's
content (through a grandchild in another language), a symlink's target, an executable bit
and a file's existence (seen by ``stat`` alone, never opened), a listed folder, and a
need's output outside the tree's snapshot.  After every edit (content, new file, deletion,
rename, symlink, mode) the cached run's verdicts must equal ``--no-cache``'s."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, check, git

from dagrunner.process import observe
from dagrunner.process.contain import detect

MANIFEST = """
    [env]
    pass = ["PATH"]
    [gates.make]
    run = "mkdir -p dist; cp f2 dist/out"
    inputs = ["**"]
    observe = true
    [gates.use]
    run = "! grep -q bad dist/out"
    inputs = ["**"]
    observe = true
    needs = ["make"]
    [gates.deep]
    run = "sh -c '{py} deep.py'"
    inputs = ["**"]
    observe = true
    [gates.link]
    run = "! grep -q bad ln"
    inputs = ["**"]
    observe = true
    [gates.mode]
    run = "test ! -x f3"
    inputs = ["**"]
    observe = true
    [gates.exists]
    run = "test ! -e d/flag"
    inputs = ["**"]
    observe = true
    [gates.listing]
    run = "! ls d | grep -q bad"
    inputs = ["**"]
    observe = true
    [gates.imports]
    run = ["{py}", "-c", "import lib.mod"]
    inputs = ["**"]
    observe = true
    [gates.statcache]
    run = ["{py}", "statcache.py", ".statcache"]
    inputs = ["**"]
    observe = true
    [gates.treecache]
    run = ["{py}", "statcache.py", "ucache.json"]
    inputs = ["**"]
    observe = true
    [gates.toolcache]
    run = '{py} statcache.py "$XDG_CACHE_HOME/statcache"'
    inputs = ["**"]
    observe = true
"""
FILES = ["f1", "f2", "f3", "d/x", "d/y", "lib/mod.py"]
# A tool with a cache validated by stat (as ruff's, mypy's, black's, eslint's): a file whose
# size and mtime it has seen is not opened again, its verdict taken from the cache
STATCACHE = """\
import json, os, sys
cache = sys.argv[1]
try:
    seen = json.load(open(cache))
except (OSError, ValueError):
    seen = {}
bad = False
for name in ["f1", "f2", "d/x"]:
    try:
        st = os.stat(name)
    except OSError:
        continue
    stamp = [st.st_mtime_ns, st.st_size]
    if seen.get(name, [None])[0] != stamp:
        seen[name] = [stamp, "bad" in open(name).read()]
    bad = bad or seen[name][1]
os.makedirs(os.path.dirname(cache) or ".", exist_ok=True)
json.dump(seen, open(cache, "w"))
sys.exit(1 if bad else 0)
"""
# the grandchild in another language: sh -> Python -> cat, which opens f1
DEEP = """\
import subprocess, sys
sys.exit(b"bad" in subprocess.run(["cat", "f1"], capture_output=True).stdout)
"""


@pytest.fixture
def tree(repo: Path) -> Path:
    found = detect()
    if not (found.bwrap and found.views) or observe.refused():
        pytest.skip("this machine does not observe gates' reads (dagrunner doctor: observe)")
    for rel in FILES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("good\n")
    (repo / "ln").symlink_to("f1")
    (repo / "deep.py").write_text(DEEP)
    (repo / "statcache.py").write_text(STATCACHE)
    (repo / "lib" / "__init__.py").write_text("")
    (repo / "lib" / "mod.py").write_text("X = 1\n")
    (repo / ".gitignore").write_text("reports/\ndist/\n__pycache__/\n.statcache\n*.ignored\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    return repo


KINDS = ["content", "content", "new", "delete", "rename", "symlink", "mode"]


def edit(repo: Path, rng: random.Random, kind: str) -> str:
    """One edit of the tree of this kind, its details random; what it did, for the message."""
    present = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file())
    present = [p for p in present if p in FILES or p.startswith("d/")]
    present += ["lib/mod.py"] * (kind == "content" and (repo / "lib/mod.py").exists())
    if kind == "content" and present:
        path = rng.choice(present)
        python = ["X = 1\n", "X = 2\n", "raise SystemExit(1)\n"]
        (repo / path).write_text(
            rng.choice(python if path.endswith(".py") else ["good\n", "bad\n"])
        )
        return f"write {path}"
    if kind == "new":
        path = rng.choice(["d/flag", "d/bad-name", "d/z", "new.txt"])
        (repo / path).write_text("good\n")
        return f"new {path}"
    if kind == "delete" and present:
        path = rng.choice(present)
        (repo / path).unlink()
        return f"delete {path}"
    if kind == "rename" and present:
        path = rng.choice(present)
        to = rng.choice(["d/flag", "d/bad-name", "d/renamed", "moved.txt"])
        (repo / path).rename(repo / to)
        return f"rename {path} {to}"
    if kind == "symlink":
        target = rng.choice(["f1", "f2", "d/x", "missing"])
        (repo / "ln").unlink(missing_ok=True)
        (repo / "ln").symlink_to(target)
        return f"ln -> {target}"
    f3 = repo / "f3"
    if not f3.exists():
        f3.write_text("good\n")
    f3.chmod(f3.stat().st_mode ^ 0o111)
    return "chmod f3"


def verdicts(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> dict[str, str]:
    _, body, _ = check(capsys, repo, MANIFEST.format(py=PY), *args)
    found: dict[str, Any] = {g["id"]: g["status"] for g in body["gates"]}
    return {g: "passed" if s == "cached" else s for g, s in found.items()}


@pytest.mark.parametrize("seed", [46, 4646])
def test_random_edits_never_get_a_stale_answer(
    capsys: pytest.CaptureFixture[str], tree: Path, seed: int
) -> None:
    rng = random.Random(seed)
    verdicts(capsys, tree)
    done = []
    hits = 0
    kinds = rng.sample(KINDS, len(KINDS))  # every kind of edit in each sequence
    for kind in kinds:
        done.append(edit(tree, rng, kind))
        if rng.random() < 0.3:
            done.append(edit(tree, rng, rng.choice(KINDS)))
        _, body, _ = check(capsys, tree, MANIFEST.format(py=PY))
        cached = {g["id"]: g["status"] for g in body["gates"]}
        hits += sum(1 for s in cached.values() if s == "cached")
        oracle = verdicts(capsys, tree, "--no-cache")
        answered = {g: "passed" if s == "cached" else s for g, s in cached.items()}
        assert answered == oracle, f"stale after {done}: cached {cached}, oracle {oracle}"
    assert hits, "no gate was ever answered from the cache: the test proves nothing"


def test_caches_that_trust_stat_never_answer_for_an_edit(
    capsys: pytest.CaptureFixture[str], tree: Path
) -> None:
    """The sequences that a cache validated by stat turns stale, if its reads were trusted:
    a run that opens only what changed (the rest taken from bytecode, from ``.statcache``
    ignored in the tree, ``ucache.json`` not ignored, or a cache in the gate's tool cache),
    then an edit of what it did not open."""
    steps = [
        ("f1", "good, once more\n"),  # statcache and toolcache open only f1 now
        ("f2", "bad\n"),  # ... and must see this
        ("lib/__init__.py", "# imports runs again: lib.mod from its bytecode\n"),
        ("lib/mod.py", "raise SystemExit(1)\n"),  # ... and must see this
        ("d/bad.ignored", "git ignores me, ls does not\n"),  # listing lists it
    ]
    verdicts(capsys, tree)
    for done, (path, text) in enumerate(steps):
        (tree / path).write_text(text)
        _, body, _ = check(capsys, tree, MANIFEST.format(py=PY))
        cached = {g["id"]: g["status"] for g in body["gates"]}
        oracle = verdicts(capsys, tree, "--no-cache")
        answered = {g: "passed" if s == "cached" else s for g, s in cached.items()}
        assert answered == oracle, f"stale after {steps[: done + 1]}: {cached}, {oracle}"
