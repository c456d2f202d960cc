"""What outlives a seed's build: a package manager's store, and the bound on the seeds' store;
and the folders a build makes beyond its ``path`` (``also``: each workspace's ``node_modules``).

A seed with ``store = "pnpm"`` is built with ``$DAGRUNNER_SEED_STORE`` naming a folder
outside its checkout (``<root>/.seeds/stores/pnpm``) that stays after the build: the next
build of any key finds there what the last one downloaded, so it is fast and needs no
network for what it had before, and what the build records of the store (pnpm's
``storeDir``) names a folder that still exists when gates run.  That shared store is
written only by trusted builds (a base that is the target's own commit).  A build from a
tree that is not trusted (an envelope changed its lockfile, a worker's branch) gets a
private copy of it -- cloned (``FICLONE``) where the filesystem can, else copied -- which
is removed after its build: what an envelope's install scripts write into a store never
reaches another item or a trusted build (the same rule as gates' tool caches).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from dagrunner.files import atomic_write, read_regular
from dagrunner.manifest.globs import glob_regex
from dagrunner.manifest.settings import SeedSpec
from dagrunner.process import share
from dagrunner.worktrees.disk import size_of
from dagrunner.worktrees.ledger import SEED_KEY

SEEDS_DIR = ".seeds"
STORES = "stores"
STORE_ENV = "DAGRUNNER_SEED_STORE"


def shared_store(seeds: Path, name: str) -> Path:
    """The store ``name`` that trusted builds share (under the seeds' folder)."""
    return seeds / STORES / name


@contextlib.contextmanager
def build_store(
    seeds: Path, name: str, env: Mapping[str, str], *, trusted: bool
) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
    """The build's environment (``$DAGRUNNER_SEED_STORE`` set) and the folders it may write
    besides its checkout: the shared store for a trusted build, a private copy of it for
    one that is not (removed when the build is done)."""
    if not name:
        yield dict(env), ()
        return
    shared = shared_store(seeds, name)
    shared.mkdir(parents=True, exist_ok=True)
    if trusted:
        yield {**env, STORE_ENV: str(shared)}, (str(shared),)
        return
    private = seeds / STORES / ".private" / f"{name}-{uuid.uuid4().hex[:12]}"
    private.parent.mkdir(parents=True, exist_ok=True)
    try:
        # a clone of the shared store: offline-fast, and nothing written here reaches it
        shutil.copytree(shared, private, symlinks=True, copy_function=share.clone_or_copy)
        yield {**env, STORE_ENV: str(private)}, (str(private),)
    finally:
        shutil.rmtree(private, ignore_errors=True)


@dataclass(frozen=True)
class Pruned:
    """What ``prune`` removed from the store, what it kept because a worktree stands on it."""

    removed: tuple[str, ...]
    in_use_kept: int
    size_after: int

    def to_json(self) -> dict[str, object]:
        body = {"removed": list(self.removed), "in_use_kept": self.in_use_kept}
        return {**body, "size_after": self.size_after}


def trees_of(stored: Path) -> set[Path]:
    """Every folder a stored seed places (``tree``, and its ``also`` folders)."""
    found = {stored / "tree"}
    with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError, TypeError):
        meta = orjson.loads((stored / "seed.json").read_bytes())
        found |= {stored / "also" / str(a["path"]) for a in meta.get("also", ())}
    return found


def prune(root: Path, max_size: int, *, dry_run: bool = False) -> Pruned:
    """The stored seeds of the worktree root ``root``, least recently used first, until they hold at most ``max_size`` bytes;
    a seed an overlay mount stands on is never removed.  (The package managers' stores are
    not counted: every build reads them.)"""
    seeds = root / SEEDS_DIR
    keys = [p for p in seeds.iterdir() if SEED_KEY.fullmatch(p.name)] if seeds.is_dir() else []
    sizes = {p: size_of(p) for p in keys}
    trees = {p: trees_of(p) for p in keys}
    busy = share.lower_in_use(set().union(*trees.values()))
    total = sum(sizes.values())
    removed, kept = [], 0
    for path in sorted(keys, key=_last_used):
        if total <= max_size:
            break
        if trees[path] & busy:
            kept += 1
            continue
        removed.append(path.name)
        total -= sizes[path]
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
    return Pruned(tuple(removed), kept, total)


def _last_used(path: Path) -> float:
    try:
        return (path / "used").stat().st_mtime
    except OSError:
        return 0.0


MAX_DEPTH = 8  # how deep ``also`` folders are looked for


def made_also(checkout: Path, spec: SeedSpec) -> list[str]:
    """The folders the build made that ``spec.also`` names (real folders, never links), but
    ``path`` itself; neither git's folder nor a found folder is entered."""
    if not spec.also:
        return []
    patterns = [glob_regex(p) for p in spec.also]
    found: list[str] = []
    for folder, dirs, _files in os.walk(checkout):
        rel_dir = os.path.relpath(folder, checkout)
        depth = 0 if rel_dir == "." else rel_dir.count("/") + 1
        keep = []
        for name in sorted(dirs):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if name == ".git" or rel == spec.path or os.path.islink(os.path.join(folder, name)):
                continue
            if any(p.fullmatch(rel) for p in patterns):
                found.append(rel)
            elif depth < MAX_DEPTH and name != "node_modules":
                keep.append(name)
        dirs[:] = keep
    return found


PNPM_STATE = ".pnpm-workspace-state-v1.json"  # pnpm 10+, at the top of node_modules


def validated_now(copy: Path) -> None:
    """Before ``pnpm run``, pnpm (10+) looks at each manifest and lockfile newer than its
    workspace state's ``lastValidatedTimestamp``, and installs when the lockfile differs
    from the one under ``node_modules/.pnpm`` (which lacks what the install left out)
    -- with the store the running pnpm has, not the seed's, so it wants to remove
    ``node_modules`` and fails without a terminal (ERR_PNPM_ABORTED_REMOVE_MODULES_DIR_NO_TTY;
    found on preconstruct).  A tree is made after its seed's build, so every such file is
    newer; the seed is keyed on them, so they are the files the build validated: the
    state in ``copy`` (a seeded ``node_modules``) says so as of now."""
    path = copy / PNPM_STATE
    try:
        state = orjson.loads(read_regular(path, limit=1 << 24))
    except (OSError, orjson.JSONDecodeError):
        return
    if isinstance(state, dict) and isinstance(state.get("lastValidatedTimestamp"), int):
        state["lastValidatedTimestamp"] = int(time.time() * 1000)
        atomic_write(path, orjson.dumps(state, option=orjson.OPT_INDENT_2), durable=False)
