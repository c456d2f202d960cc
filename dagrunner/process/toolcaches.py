"""Gates' own tool caches between runs (docs/cache.md), and who may write which.

- ``<tools>/<repository>/trusted/<gate>/``, the trusted tier: written only by runs of the
  repository's main checkout (the caller's own tree: not a linked worktree, not an
  envelope's tree).  Every other tree reads it, never writes it.
- ``<tools>/private/<layer>/<gate>/``, a private layer: what every other tree's gate gets,
  made from the trusted tier's folder when the gate first needs it -- copied on write: a
  reflink copy, an overlay with the trusted folder as its read-only lower layer (where this
  process may mount), else a plain copy -- and read by that tree alone:

  - ``tree-<id>``: a linked worktree's own (a worker's ``release-check``, its pre-push hook),
    kept between its runs, dropped when dagrunner removes or pools the worktree
    (``drop_worktree``, from ``prepare.release_seeds``);
  - ``run-<nonce>/<tree>``: one run's, for each tree that is not the caller's (an
    integration tree: each gate run of an item, each head run of a differential baseline;
    a swarm's worker and integrated trees), removed when the run ends.  A run holds a lock
    on its folder; one whose lock is free (its run crashed) is removed by the next run.

So what an envelope's or a worker's gate leaves for a tool (a pre-commit hook, an npm cache
entry, a mypy plugin) is executed by nothing but its own tree's later gates.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import threading
import uuid
from pathlib import Path

from dagrunner.errors import DagrunnerError
from dagrunner.git.command import git
from dagrunner.git.repo import tool_cache_root
from dagrunner.process import made, share

HOW = ("reflink", "overlay", "copy")
LAYERS = ".layers"  # a layer's overlay upper and work folders, one per gate (no gate starts with .)
OWNER = ".worktree"  # a kept layer's worktree path (a gate cannot write it: read-only to it)
NOT_A_LAYER = Path(os.devnull)  # share.release then deletes no upper layer: a kept tree's stay


class ToolCaches:
    """The tool cache folder of each gate of one run (``engine.attempts``).

    ``own``: the run's tree at ``repo`` is the caller's (False for an envelope's tree, whose
    gates see the repository read-only); its gates then use the trusted tier when ``repo``
    is the main checkout, else the worktree's kept layer.  A gate in any other tree, or in
    a tree that is not the caller's, gets this run's layer for that tree."""

    def __init__(self, repo: Path, *, own: bool) -> None:
        self.repo = repo
        common = _common_dir(repo)
        self.trusted = tool_cache_root() / _digest(common or str(repo)) / "trusted"
        self.private = tool_cache_root() / "private"
        self.tier = "run"
        if own:
            self.tier = "tree" if _linked(repo, common) else "trusted"
        self.run: Path | None = None  # this run's folder, made at its first layer
        self.kept: Path | None = None  # the worktree's kept layer, once used (unmounted at close)
        self.lock: int | None = None
        self.lock_held = threading.Lock()  # gates start in threads: one makes a folder at once

    def folder(self, gate: str, root: Path) -> Path:
        """The folder ``gate`` keeps its tools' caches in, when it runs in ``root``."""
        with self.lock_held:
            trusted = self.trusted / gate
            trusted.mkdir(parents=True, exist_ok=True)
            if root == self.repo and self.tier == "trusted":
                return trusted
            if root == self.repo and self.tier == "tree":
                layer = self.kept = self.kept or self.private / f"tree-{tree_id(root)}"
                if not (layer / OWNER).is_file():  # whose it is, for the sweep
                    layer.mkdir(parents=True, exist_ok=True)
                    (layer / OWNER).write_text(os.path.realpath(root))
            else:
                layer = self.run_folder() / _digest(str(root))[:12]
            return _layered(trusted, layer, gate)

    def main_checkout(self, root: Path) -> bool:
        """Whether ``root`` is the caller's main checkout (the trusted tier's tree)."""
        return root == self.repo and self.tier == "trusted"

    def run_folder(self) -> Path:
        """This run's folder, locked while the run lives (stale ones of crashed runs go)."""
        if self.run is None:
            self.private.mkdir(parents=True, exist_ok=True)
            _sweep(self.private)
            nonce = uuid.uuid4().hex[:16]
            staged = self.private / f".run-{nonce}"  # locked before a sweep can see it
            staged.mkdir()
            self.lock = os.open(staged / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self.lock, fcntl.LOCK_EX)
            self.run = self.private / f"run-{nonce}"
            staged.rename(self.run)
        return self.run

    def close(self) -> None:
        """The run ended: its layers go; a worktree's kept layer is unmounted (mounted
        again on its own upper layer at its next run)."""
        with self.lock_held:
            if self.kept is not None and self.kept.is_dir():
                share.release(self.kept, NOT_A_LAYER)
            if self.run is not None:
                _remove(self.run)
                self.run = None
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None


def drop_worktree(path: Path) -> None:
    """The kept layer of the linked worktree at ``path``, which is about to be removed or
    pooled (another worker's next): unmounted and deleted."""
    if path.is_dir():
        _remove(tool_cache_root() / "private" / f"tree-{tree_id(path)}")


def linked_worktree(repo: Path) -> str | None:
    """``repo``'s ``tree_id`` when it is a linked worktree (a worker's); None when it is the
    main checkout of its git dir (the caller's own tree), or outside git."""
    return tree_id(repo) if _linked(repo, _common_dir(repo)) else None


def _linked(repo: Path, common: str | None) -> bool:
    """Whether ``repo`` is a linked worktree of the git dir ``common``, not its main checkout
    (nor outside git): the one decision of who is trusted, for tool caches and verdicts."""
    return bool(common) and not _main_checkout(repo, common or "")


def tree_id(path: Path) -> str:
    """A worktree's layer name: its real path and the identity of its ``.git`` file, so a
    worktree made again at the same path (removed by plain git, or given out again by the
    pool) starts from nothing.  The inode number alone is not that: a file system hands a
    freed one out again (ext4 at once), so its birth time (else its change time) goes too."""
    real = os.path.realpath(path)
    dot = os.path.join(real, ".git")
    try:
        found = os.lstat(dot)
    except OSError:
        return _digest(f"{real}\0-")
    birth = made.born_at(dot)
    when = f"b{birth}" if birth is not None else f"c{found.st_ctime_ns}"
    return _digest(f"{real}\0{found.st_dev}:{found.st_ino}:{when}")


def _layered(trusted: Path, layer: Path, gate: str) -> Path:
    """``layer/gate``: made from ``trusted`` the first time, its overlay mounted again on
    its upper layer after a run unmounted it."""
    folder, upper = layer / gate, layer / LAYERS / gate
    layer.mkdir(parents=True, exist_ok=True)
    if folder.is_dir():
        if (upper / "upper").is_dir():
            share.remount(trusted, layer, gate, upper)  # no-op when mounted, or written to
        return folder
    how = _how(layer)
    try:
        share.place(trusted, layer, gate, how, upper, lambda _: None)
    except DagrunnerError:  # the mount failed where the probe's succeeded: a copy then
        share.place(trusted, layer, gate, "copy", upper, lambda _: None)
    except OSError:
        if not folder.is_dir():
            raise
        # another run of the same worktree made it just now
    return folder


def _how(layer: Path) -> str:
    """How a layer is made from the trusted tier: ``DAGRUNNER_TOOL_SHARE``, else the first
    of reflink, overlay, copy this machine can do there."""
    forced = os.environ.get("DAGRUNNER_TOOL_SHARE", "")
    if forced in HOW and (forced == "copy" or share.can(forced, layer.parent)):
        return forced
    return next(how for how in HOW if how == "copy" or share.can(how, layer.parent))


def _sweep(private: Path) -> None:
    """Remove the run folders no live run holds (their run crashed or was killed), and
    the kept layers of worktrees that are gone (removed by plain git, or deleted)."""
    for layer in private.glob("tree-*"):
        try:
            owner = (layer / OWNER).read_text()
        except OSError:
            continue  # being made
        if f"tree-{tree_id(Path(owner))}" != layer.name:
            _remove(layer)
    for run in private.glob("run-*"):
        try:
            held = os.open(run / ".lock", os.O_RDWR)
        except OSError:
            continue  # being removed, or not a run's
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its run lives
        finally:
            os.close(held)
        _remove(run)


def _remove(layer: Path) -> None:
    """A layer's overlays unmounted (their upper layers with them), then its folder."""
    if layer.is_dir():
        share.release(layer, layer)
        shutil.rmtree(layer, ignore_errors=True)


def _common_dir(repo: Path) -> str | None:
    """The git dir ``repo``'s worktrees share (what keys the trusted tier); None outside
    git."""
    found = git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=repo, check=False)
    return found.text if found.returncode == 0 and found.text else None


def _main_checkout(repo: Path, common: str) -> bool:
    """Whether ``repo`` is the main checkout of the git dir ``common``: its ``.git`` is that
    very folder, not a link -- never decided by what git reads from the tree (a worker may
    rewrite its worktree's ``.git`` file to name the main one, or a ``commondir`` in it)."""
    dot = repo / ".git"
    try:
        real = dot.is_dir() and not dot.is_symlink()
    except OSError:
        return False
    return real and os.path.realpath(dot) == os.path.realpath(common)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# The variables that point common tools' caches somewhere (each under the gate's folder),
# set unless the manifest set them: pre-commit's hook environments, mypy, ruff, npm, and
# everything that follows XDG (pip, uv, pyright, black, pre-commit's default).
TOOL_CACHES = {
    "XDG_CACHE_HOME": "",
    "PRE_COMMIT_HOME": "pre-commit",
    "MYPY_CACHE_DIR": "mypy",
    "RUFF_CACHE_DIR": "ruff",
    "npm_config_cache": "npm",
}


def with_tool_caches(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` with each tool cache variable it lacks pointed under ``folder``, and npm's
    update check off (a fresh HOME made npm ask the network on every gate run)."""
    env = dict(env)
    for name, sub in TOOL_CACHES.items():
        env.setdefault(name, str(folder / sub) if sub else str(folder))
    env.setdefault("npm_config_update_notifier", "false")
    return env


# Caches a tool keeps in the main worktree when it runs in a linked one, unless told where:
# turbo (2.8 and later) replays the main checkout's .turbo/cache in every linked worktree (a
# worker's own turbo runs write it too). In any tree but the main checkout each is pointed at
# the tree's own folder (relative: the tree's), as in a fresh clone; in an envelope's tree
# that is on the gate's layer, seen by the gates that need it.
TREE_CACHES = {"TURBO_CACHE_DIR": ".turbo/cache"}


def with_tree_caches(env: dict[str, str]) -> dict[str, str]:
    """``env`` with each of ``TREE_CACHES`` it lacks set: for a gate in a linked tree."""
    return {**TREE_CACHES, **env}


# Download caches, addressed by content: what they hold never stands for a file of the tree
CONTENT_ADDRESSED = frozenset({"npm", "pip"})


def warm(folder: Path, top: bool = True) -> bool:
    """Whether a folder kept between a gate's runs (its tool caches, a ``writable`` one)
    holds anything a tool may trust by ``stat``: any file or link at any depth.  Folders
    alone hold nothing (yarn 1 makes ``yarn/v6/.tmp`` at every ``yarn run`` and leaves it
    empty: counted warm, every yarn gate fell back to the whole tree)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if top and entry.name in CONTENT_ADDRESSED:
                    continue
                if not entry.is_dir(follow_symlinks=False) or warm(Path(entry.path), False):
                    return True
    except FileNotFoundError:
        return not top  # not made yet: cold (one vanishing inside: assume the worst)
    except OSError:
        return True  # unreadable: assume the worst
    return False
