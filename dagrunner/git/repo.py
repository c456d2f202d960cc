"""The repository and dagrunner's places beside it: discovery, the common git dir, the
worktree root and the cache root.

The worktree root is ``DAGRUNNER_WORKTREE_ROOT``, else
``$XDG_CACHE_HOME/dagrunner/worktrees``, else ``~/.cache/dagrunner/worktrees``,
namespaced per repository (``<name>-<hash of the common git dir>``).  A root
inside the repository is refused unless ``DAGRUNNER_ALLOW_IN_REPO_WORKTREES=1``,
and so are ``/`` and relative roots.  Nothing here creates anything but the
root folder itself, and only once every check that could refuse has passed.
The cache root is ``DAGRUNNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/dagrunner/cache``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import is_inside
from dagrunner.git.command import git, toplevel

MIN_GIT = (2, 17)  # worktree move/remove
LOW_DISK = 1 << 30
FULL_DISK = 64 << 20
DISK_FULL = ("No space left on device", "Out of diskspace", "Disk quota exceeded")


@dataclass(frozen=True, kw_only=True)
class RepoInfo:
    root: Path  # the work tree we were pointed at (for a bare repository, the git dir)
    common_dir: Path
    bare: bool
    git_version: tuple[int, ...]

    @property
    def state_dir(self) -> Path:
        """Where dagrunner keeps this repository's records (inside the common git dir)."""
        return self.common_dir / "dagrunner"


def git_version() -> tuple[int, ...]:
    text = git(["--version"], cwd=Path.cwd()).text
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise DagrunnerError(
            "git-version",
            f"cannot read git's version from {text!r}",
            exit_code=ExitCode.ENVIRONMENT,
            hint="check which git is first on PATH (git --version)",
        )
    return tuple(int(part) for part in match.groups() if part is not None)


def repo_info(path: Path | None) -> RepoInfo:
    """The repository at ``path`` (default: the current directory); exit 3 outside git."""
    where = (path or Path.cwd()).resolve()
    if not where.is_dir():
        raise DagrunnerError(
            "repo-not-found", "no such directory", where=str(where), hint="check --repo"
        )
    probe = git(
        ["rev-parse", "--is-bare-repository", "--git-common-dir", "--show-toplevel"],
        cwd=where,
        check=False,
    )
    if probe.returncode != 0:
        raise DagrunnerError(
            "not-a-repository",
            "not inside a git repository",
            where=str(where),
            exit_code=ExitCode.ENVIRONMENT,
            hint="run from a git work tree or pass --repo",
        )
    lines = probe.text.splitlines()
    bare = lines[0] == "true"
    common = Path(lines[1])
    if not common.is_absolute():
        common = (where / common).resolve()
    root = Path(lines[2]) if len(lines) > 2 and not bare else common
    return RepoInfo(root=root, common_dir=common, bare=bare, git_version=git_version())


def checkout_branch(info: RepoInfo) -> str:
    """The branch of the main checkout (``main`` for a bare repository or a detached HEAD):
    the default target of ``integrate submit`` and ``integrate run``."""
    if not info.bare:
        head = git(["symbolic-ref", "--short", "-q", "HEAD"], cwd=info.root, check=False).text
        if head:
            return head
    return "main"


def root_base(env: Mapping[str, str]) -> Path:
    explicit = env.get("DAGRUNNER_WORKTREE_ROOT")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(xdg) / "dagrunner" / "worktrees"


def namespace(info: RepoInfo) -> str:
    name = re.sub(
        r"[^A-Za-z0-9._-]",
        "_",
        info.common_dir.parent.name if not info.bare else info.common_dir.name,
    )
    ident = hashlib.sha256(str(info.common_dir.resolve()).encode()).hexdigest()[:10]
    return f"{name or 'repo'}-{ident}"


def worktree_root(info: RepoInfo, env: Mapping[str, str] | None = None) -> Path:
    """This repository's worktree root, checked (exit 3 when unsafe or unusable) and created."""
    env = os.environ if env is None else env
    base = root_base(env)
    if not base.is_absolute() or base.resolve() == Path("/"):
        raise DagrunnerError(
            "unsafe-root",
            f"the worktree root {str(base)!r} is "
            + ("the filesystem root" if base.is_absolute() else "not an absolute path"),
            exit_code=ExitCode.ENVIRONMENT,
            hint="set DAGRUNNER_WORKTREE_ROOT to an absolute folder of its own, "
            "such as ~/.cache/dagrunner/worktrees",
        )
    root = base / namespace(info)
    in_repo = is_inside(root, info.root) or is_inside(root, info.common_dir)
    if in_repo and env.get("DAGRUNNER_ALLOW_IN_REPO_WORKTREES") != "1":
        raise DagrunnerError(
            "unsafe-root",
            f"the worktree root {root} is inside the repository {info.root}",
            exit_code=ExitCode.ENVIRONMENT,
            hint="set DAGRUNNER_WORKTREE_ROOT outside the repository "
            "(or DAGRUNNER_ALLOW_IN_REPO_WORKTREES=1 if you really mean it)",
        )
    dangling = next((p for p in [root, *root.parents] if p.is_symlink() and not p.exists()), None)
    if dangling is not None:
        raise DagrunnerError(
            "root-dangling",
            f"the worktree root's folder {dangling} is a symbolic link to "
            f"{os.readlink(dangling)!r}, which does not exist",
            exit_code=ExitCode.ENVIRONMENT,
            hint="create the folder it points to, remove the link, or set "
            "DAGRUNNER_WORKTREE_ROOT elsewhere",
        )
    existing = next((p for p in [root, *root.parents] if p.exists()), None)
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        raise DagrunnerError(
            "root-unwritable",
            f"cannot create or write {root} ({existing} is not writable)",
            exit_code=ExitCode.ENVIRONMENT,
            hint="set DAGRUNNER_WORKTREE_ROOT to a writable folder",
        )
    free = shutil.disk_usage(existing).free
    if free < FULL_DISK:
        raise DagrunnerError(
            "disk-full",
            f"only {free >> 20} MiB free under {existing}",
            exit_code=ExitCode.ENVIRONMENT,
            hint="free some space or move DAGRUNNER_WORKTREE_ROOT",
        )
    root.mkdir(parents=True, exist_ok=True)
    return root


def resolve_repo(repo: Path | None) -> Path:
    base = (repo or Path.cwd()).resolve()
    if not base.is_dir():
        raise DagrunnerError(
            "repo-not-found", "no such directory", where=str(base), hint="check --repo"
        )
    return toplevel(base) or base


def remote_root() -> Path:
    """Where a Dask worker keeps checkouts of shipped sources: ``DAGRUNNER_REMOTE_DIR``,
    else ``remote/`` under the cache root."""
    explicit = os.environ.get("DAGRUNNER_REMOTE_DIR")
    return Path(explicit) if explicit else cache_root() / "remote"


def cache_root() -> Path:
    """``DAGRUNNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/dagrunner/cache``, else ``~/.cache/...``."""
    explicit = os.environ.get("DAGRUNNER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "dagrunner" / "cache"


def tool_cache_root() -> Path:
    """Where gates' own tool caches live between runs (``DAGRUNNER_TOOL_CACHE_DIR``, else
    ``tools`` beside the gate cache): never inside a tree under test, never in the store
    that gates cannot see."""
    explicit = os.environ.get("DAGRUNNER_TOOL_CACHE_DIR")
    return Path(explicit) if explicit else cache_root().parent / "tools"


def remove_worktrees(repo: Path, paths: Sequence[Path]) -> None:
    """Unlock and remove worktrees dagrunner made and owns (integration slots), files and
    registration; one that cannot be removed is left as it is."""
    for path in paths:
        git(["worktree", "unlock", str(path)], cwd=repo, check=False)
        git(["worktree", "remove", "--force", "--force", str(path)], cwd=repo, check=False)
    if paths:
        git(["worktree", "prune"], cwd=repo, check=False)


def out_of_disk(stderr: str, places: Sequence[Path]) -> bool:
    """Whether git failed for want of disk space: it said so on one of its own error lines
    *and* a disk it writes (one of ``places``) is nearly full.  (Paths an envelope names
    appear in git's messages: a file called "No space left on device" must not turn its
    conflict into a disk error that would hold the queue forever.)"""
    said = any(
        line.startswith(("fatal:", "error:")) and sign in line
        for line in stderr.splitlines()
        for sign in DISK_FULL
    )
    return said and any(shutil.disk_usage(place).free < FULL_DISK for place in places)


def check_branch(info: RepoInfo, goal: str) -> None:
    """``goal`` must be a branch of this repository (``unknown-target`` otherwise)."""
    if (
        goal.startswith("-")
        or git(["check-ref-format", "--branch", goal], cwd=info.root, check=False).returncode
        or git(
            ["rev-parse", "--verify", "-q", f"refs/heads/{goal}"], cwd=info.root, check=False
        ).returncode
    ):
        raise DagrunnerError(
            "unknown-target",
            f"{goal[:80]!r} is not a branch of this repository",
            hint="pass --target with an existing branch (or check out the branch to land on)",
        )
