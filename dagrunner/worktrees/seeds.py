"""Dependency seeds: ``[[worktrees.seed]]`` folders built once per key, in every worktree.

A seed's key is the bytes of its key files at the allocation's base (their blob ids), its
path and build command, its ``tools``' fingerprints and the platform.  It is built once per
key -- under a lock, so concurrent allocations of one key build it once -- in a clean
checkout of the base, through the door every non-gate command takes (``process.command``:
contained, a hermetic environment from the manifest's ``[env]``, its own HOME, a timeout
that ends its tree), and stored as ``<root>/.seeds/<key>/tree``.  The build, its key files
and its ``[env]`` come from the base's manifest (trusted), never from a worker.

What a build writes holds the checkout's absolute path (a venv's ``pyvenv.cfg``, its
scripts' ``#!`` lines, an editable install's ``.pth``): the text files that hold it are
listed when the seed is stored and rewritten in each worktree's copy to that worktree's
path, so what runs there is that worktree's own code.  ``process/share`` says how the copy is made.
What a build left is read as untrusted code's (a tree's build is): a FIFO, socket or device
is dropped before the seed is stored, and every file is read through ``files.read_regular``.
A seed's ``also`` globs name more folders its one build makes (each workspace's
``node_modules``), stored and placed beside ``path``; its ``store`` is a package manager's
store that outlives the build (``seedstores``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import shutil
import stat
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import atomic_write, locked, read_regular
from dagrunner.git.command import git
from dagrunner.manifest.globs import glob_regex
from dagrunner.manifest.load import EnvSpec, Manifest
from dagrunner.manifest.settings import SeedSpec
from dagrunner.process import share
from dagrunner.records.worktree import SeedUse
from dagrunner.worktrees.seedstores import SEEDS_DIR, build_store, made_also, validated_now

FORMAT = 1
TAIL_LINES = 20
SCAN_LIMIT = 64 * 1024 * 1024  # files larger than this are never rewritten (nor read)


@dataclass(frozen=True)
class Folder:
    """One folder of a built seed: where it goes in a worktree, where it is stored, and its
    text files (relative to it) that hold the path of the checkout it was built in."""

    path: str
    tree: Path
    relocate: tuple[str, ...]


@dataclass(frozen=True)
class Seed:
    """A built seed in the store: its ``path`` first, then the ``also`` folders it made."""

    spec: SeedSpec
    key: str
    built_in: str  # the absolute path of the checkout it was built in
    folders: tuple[Folder, ...]

    @property
    def tree(self) -> Path:
        return self.folders[0].tree


@dataclass(frozen=True)
class Builds:
    """Where and how one call's seeds are built: the store, the repository, the build's
    environment, what it must not see and what it may write besides its checkout."""

    store: Path
    repo: Path
    env: Mapping[str, str]
    hide: Path | None = None
    writable: tuple[str, ...] = ()
    trusted: bool = True  # may write the shared package stores (``seedstores``)


def seeds_dir(root: Path) -> Path:
    return root / SEEDS_DIR


def layer_of(root: Path, wt_id: str, n: int) -> Path:
    """The folder of a worktree's own layer of its ``n``-th seed (overlay)."""
    return seeds_dir(root) / "layers" / wt_id.replace("/", "+") / str(n)


def key_of(repo: Path, base: str, spec: SeedSpec, fingerprints: Sequence[str]) -> str:
    """The seed's key: its key files' blob ids at ``base``, its build, tools and platform."""
    patterns = [glob_regex(p) for p in spec.key]
    listing = git(["ls-tree", "-r", "-z", "--full-tree", base], cwd=repo).stdout
    files = []
    for entry in listing.split(b"\0"):
        meta, tab, name = entry.partition(b"\t")
        path = name.decode("utf-8", "surrogateescape")
        if tab and any(p.fullmatch(path) for p in patterns):
            files.append([path, meta.split()[2].decode()])
    parts = {
        "format": FORMAT,
        "path": spec.path,
        "build": spec.build,
        "files": sorted(files),
        "tools": list(fingerprints),
        "platform": [sys.platform, platform.machine(), *platform.libc_ver()],
    }
    if spec.also or spec.store:  # (absent otherwise: the keys of seeds built before stay)
        parts |= {"also": list(spec.also), "store": spec.store}
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]


def _fingerprints(spec: SeedSpec, env: Mapping[str, str], cwd: Path) -> list[str]:
    from dagrunner.process.command import tool_fingerprint  # trio: only where seeds are

    return [tool_fingerprint(command, env, cwd)[0] for command in spec.tools]


def build_env(manifest: Manifest, caller: Mapping[str, str], epoch: int) -> dict[str, str]:
    from dagrunner.process.sandbox import gate_environment

    return gate_environment(
        common=manifest.env, gate=EnvSpec(), caller=caller, source_date_epoch=epoch
    )


def ensure(
    root: Path,
    repo: Path,
    base: str,
    manifest: Manifest,
    caller: Mapping[str, str],
    *,
    trusted: bool = True,
    hide: Path | None = None,
) -> list[tuple[Seed, bool]]:
    """Every seed of ``manifest`` for ``base``, built where the store lacks it; with whether
    this call built it.  ``trusted`` False (a base that is not the target's own commit: a
    worker's branch): built contained (``hide``: the cache store) and stored under a key of
    that base alone, so no allocation of a trusted base is ever handed it, as verdicts are
    scoped.  ``seed-build-failed`` (1), ``seed-not-ignored`` (2)."""
    if not manifest.worktrees.seeds:
        return []  # the process door (trio) is imported only where seeds are
    store, env = _store_and_env(root, repo, base, manifest, caller)
    # the sandbox's writable places: an npm or pip cache the build may fill and read
    place = Builds(store, repo, env, hide, manifest.sandbox.writable, trusted)
    found = []
    for spec in manifest.worktrees.seeds:
        key = key_of(repo, base, spec, _fingerprints(spec, env, store))
        found.append(_ensure_one(place, base, spec, key if trusted else scoped(key, base)))
    return found


def scoped(key: str, commit: str) -> str:
    """The key of a seed built from ``commit``, not trusted: it serves that commit alone."""
    return hashlib.sha256(f"{key} scoped to {commit}".encode()).hexdigest()[:32]


def for_tree(
    root: Path,
    repo: Path,
    commit: str,
    trusted: str,
    manifest: Manifest,
    caller: Mapping[str, str],
    *,
    hide: Path | None = None,
) -> list[tuple[Seed, bool]]:
    """Every seed of ``manifest`` (the target's: trusted) for ``commit``, a tree under test
    that is not trusted yet (an integrated one).  A seed whose key files are those of
    ``trusted`` (the target's head) is the trusted one, built from ``trusted``; one whose key
    files the tree changed is built from that tree, contained (``hide``: the cache store),
    and stored under a key of that commit alone, so no allocation ever gets it: what the
    tree's build scripts did stays with the tree (docs/worktrees.md, "Seeds and trust")."""
    if not manifest.worktrees.seeds:
        return []
    store, env = _store_and_env(root, repo, trusted, manifest, caller)
    writable = manifest.sandbox.writable
    trusted_builds = Builds(store, repo, env, None, writable)
    contained = Builds(store, repo, env, hide, writable, trusted=False)
    found = []
    for spec in manifest.worktrees.seeds:
        prints = _fingerprints(spec, env, store)
        key = key_of(repo, commit, spec, prints)
        if key == key_of(repo, trusted, spec, prints):
            found.append(_ensure_one(trusted_builds, trusted, spec, key))
            continue
        try:
            found.append(_ensure_one(contained, commit, spec, scoped(key, commit)))
        except DagrunnerError as exc:  # the tree's own key files: its failure is the tree's
            exc.details["from_tree"] = True
            raise
    return found


def _store_and_env(
    root: Path, repo: Path, base: str, manifest: Manifest, caller: Mapping[str, str]
) -> tuple[Path, dict[str, str]]:
    store = seeds_dir(root)
    store.mkdir(parents=True, exist_ok=True)
    epoch = int(git(["show", "-s", "--format=%ct", base], cwd=repo).text or 0)
    return store, build_env(manifest, caller, epoch)


def _ensure_one(place: Builds, base: str, spec: SeedSpec, key: str) -> tuple[Seed, bool]:
    with locked(place.store / f"{key}.lock"):
        seed = load(place.store, key, spec)
        built = seed is None
        if seed is None:
            seed = _build(place, base, spec, key)
    (place.store / key / "used").touch()
    return seed, built


def load(store: Path, key: str, spec: SeedSpec) -> Seed | None:
    """The stored seed of ``key`` (None when not built, or stored by another format)."""
    try:
        meta = orjson.loads((store / key / "seed.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    folders = [Folder(spec.path, store / key / "tree", _strings(meta.get("relocate")))]
    for also in meta.get("also", ()):
        rel = also.get("path") if isinstance(also, dict) else None
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
            return None  # not what this module writes: built again
        folders.append(Folder(rel, store / key / "also" / rel, _strings(also.get("relocate"))))
    return Seed(spec, key, str(meta.get("built_in", "")), tuple(folders))


def _strings(value: object) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def check_ignored(checkout: Path, path: str) -> None:
    """``seed-not-ignored`` when git would see a seed's folder ``path`` in ``checkout``: tracked at
    the base, or (once built or placed) holding a file git does not ignore -- which the
    first ``git add -A`` would commit.  A folder ignored by its own ``.gitignore`` (what
    ``python -m venv`` and ``uv`` write: ``*``) is ignored."""
    tracked = git(["ls-files", "--", path], cwd=checkout).text
    seen = ""
    if not tracked and (checkout / path).is_dir():
        seen = git(
            ["ls-files", "--others", "--exclude-standard", "--", path],
            cwd=checkout,
        ).text
    if tracked or seen:
        raise DagrunnerError(
            "seed-not-ignored",
            f"the seed {path!r} is "
            + ("tracked at the base" if tracked else "not ignored by git at the base"),
            key="worktrees.seed.path",
            hint=f"add /{path}/ to .gitignore (a seed is a git-ignored folder)",
        )


def remove_checkout(repo: Path, path: Path) -> None:
    git(["worktree", "remove", "--force", "--force", str(path)], cwd=repo, check=False)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    git(["worktree", "prune"], cwd=repo, check=False)


def _build(place: Builds, base: str, spec: SeedSpec, key: str) -> Seed:
    from dagrunner.process.command import run_command

    store, repo = place.store, place.repo
    checkout = store / ".build" / f"{key[:12]}-{uuid.uuid4().hex[:8]}"
    checkout.parent.mkdir(parents=True, exist_ok=True)
    git(["worktree", "add", "-q", "--detach", str(checkout), base], cwd=repo)
    try:
        check_ignored(checkout, spec.path)
        argv = ["sh", "-c", spec.build] if isinstance(spec.build, str) else list(spec.build)
        with build_store(store, spec.store, place.env, trusted=place.trusted) as (env, mine):
            done = run_command(
                argv,
                cwd=checkout,
                env=env,
                timeout=spec.timeout,
                own_home=True,
                hide=place.hide,
                writable=(*place.writable, *mine),
            )
        made = checkout / spec.path
        why = done.why
        if not why and (made.is_symlink() or not made.is_dir()):
            why = f"it ended well but made no folder {spec.path}"
        also = [] if why else made_also(checkout, spec)
        for rel in () if why else (spec.path, *also):
            check_ignored(checkout, rel)  # now with what the build wrote (its own .gitignore)
        if why:
            log = store / f"{key}.log"
            atomic_write(log, done.output)
            tail = done.output.decode("utf-8", "replace").strip().splitlines()[-TAIL_LINES:]
            raise DagrunnerError(
                "seed-build-failed",
                f"building the seed {spec.path!r} failed ({why}); nothing was allocated",
                where=str(log),
                exit_code=ExitCode.FAILED,
                details={"seed": spec.path, "output_tail": tail},
                hint="last output lines: " + (" | ".join(tail[-5:]) or "(none)"),
            )
        dropped = _drop_specials(made)
        needle = str(checkout).encode()
        relocate = _holding(made, needle)
        staged = store / f".{key}.{uuid.uuid4().hex[:8]}"
        staged.mkdir()
        made.rename(staged / "tree")
        folders = [Folder(spec.path, store / key / "tree", tuple(relocate))]
        listed = []
        for rel in also:
            moved = staged / "also" / rel
            moved.parent.mkdir(parents=True, exist_ok=True)
            dropped += [f"{rel}/{d}" for d in _drop_specials(checkout / rel)]
            holding = _holding(checkout / rel, needle)
            (checkout / rel).rename(moved)
            folders.append(Folder(rel, store / key / "also" / rel, tuple(holding)))
            listed.append({"path": rel, "relocate": holding})
        meta = {"format": FORMAT, "built_in": str(checkout), "relocate": relocate}
        meta |= {"path": spec.path, "base": base, "built": _now(), "dropped": dropped}
        meta["also"] = listed
        atomic_write(staged / "seed.json", orjson.dumps(meta))
        staged.rename(store / key)
    finally:
        remove_checkout(repo, checkout)
    return Seed(spec, key, str(checkout), tuple(folders))


def _drop_specials(tree: Path) -> list[str]:
    """What is under ``tree`` besides files, folders and links (a FIFO, a socket, a device
    a build left), removed -- a seed holds no such thing, and nothing outside the sandbox
    ever opens one (``open`` of a FIFO waits for a writer forever); their paths."""
    dropped = []
    for folder, _dirs, names in os.walk(tree):
        for name in names:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                os.unlink(path)
                dropped.append(os.path.relpath(path, tree))
    return sorted(dropped)


def _holding(tree: Path, needle: bytes) -> list[str]:
    """The text files (and links) under ``tree`` that hold ``needle``; each read as a file
    untrusted code wrote (``read_regular``: never a FIFO, never past ``SCAN_LIMIT``)."""
    found = []
    for folder, _dirs, names in os.walk(tree):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, tree)
            if os.path.islink(path):
                if needle in os.fsencode(os.readlink(path)):
                    found.append(rel)
                continue
            try:
                data = read_regular(path, limit=SCAN_LIMIT)
            except OSError:
                continue
            if needle in data and b"\0" not in data:
                found.append(rel)
    return sorted(found)


def provision(
    seed: Seed, folder: Folder, worktree: Path, how: str, layer: Path, *, built: bool
) -> SeedUse:
    """``folder`` of ``seed`` in ``worktree`` (it must not exist there), its paths made the
    worktree's."""
    dest = safe_dest(worktree, folder.path)
    if dest.exists() or dest.is_symlink():
        raise _occupied(dest)
    old, new = seed.built_in.encode(), str(worktree).encode()

    def relocate(copy: Path) -> None:  # the copy's paths made the worktree's
        for rel in folder.relocate:
            target = copy / rel
            if target.is_symlink():
                link = os.fsencode(os.readlink(target)).replace(old, new)
                target.unlink()
                os.symlink(link, target)
            else:
                try:
                    data = read_regular(target, limit=SCAN_LIMIT)
                except OSError:
                    continue  # no longer a regular file of a size we read: left as it is
                mode = target.lstat().st_mode
                atomic_write(target, data.replace(old, new), durable=False)
                os.chmod(target, mode & 0o7777)
        validated_now(copy)

    share.place(folder.tree, worktree, folder.path, how, layer, relocate)
    return SeedUse(path=folder.path, key=seed.key, how=how, built=built)


def stored_tree(root: Path, use: SeedUse) -> Path:
    """Where the folder a worktree's ``use`` placed is stored."""
    also = seeds_dir(root) / use.key / "also" / use.path
    return also if also.is_dir() else seeds_dir(root) / use.key / "tree"


def safe_dest(worktree: Path, rel: str) -> Path:
    """``worktree/rel`` with every folder above it real (made where missing): a link the
    worktree holds never takes a seed elsewhere."""
    here = worktree
    for part in rel.split("/")[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            raise _occupied(here)
        here.mkdir(exist_ok=True)
    return worktree / rel


def _occupied(path: Path) -> DagrunnerError:
    return DagrunnerError(
        "path-occupied",
        f"{path} is in the way of a seed (a file, a link, or a folder already there)",
        where=str(path),
        exit_code=ExitCode.REFUSED,
        hint="a seed's folder must be missing from the base and its parents real folders",
    )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
