"""Stale git lock files: found before any work, cleared where ours, named where not.

A git command that is killed leaves ``*.lock`` files behind (``refs/heads/X.lock``,
``index.lock``), and every later command that needs them fails.  Before the
integrator spends a gate run, it looks for the locks landing will need.  A
lock counts as held while any git process works in the repository, or when it goes away
within a second (a git working elsewhere held it); otherwise it is stale.  A stale lock in
the integrator's own worktree is removed (the integrator lock says nobody else uses it); so
is a stale one of the repository's refs (the target's, ``packed-refs``, ``HEAD``) that no
process has open -- a git writing a lock file holds it open until it renames it, so an
unopened one outlived its writer: a service killed in the middle of a landing (or of the
branch cleanup after it) needs no human (issue 48).  One of the target's checkout (its
``index.lock``) is the user's: it stops the run with ``stale-git-lock`` naming the file and
the command that clears it, as does any lock a process still holds.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from pathlib import Path

import psutil

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.command import git

LIVE_GRACE = 1.0  # seconds a found lock may take to go away before it counts as stale


def git_dir(worktree: Path) -> Path:
    return Path(git(["rev-parse", "--absolute-git-dir"], cwd=worktree).text)


def _git_running_in(places: list[Path]) -> bool:
    """Whether a git process has its cwd in one of ``places`` (so its locks are live)."""
    roots = [str(p.resolve()) for p in places]
    for proc in psutil.process_iter(["name", "cwd"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["name"] != "git" or not proc.info["cwd"]:
                continue
            if any(proc.info["cwd"] == r or proc.info["cwd"].startswith(r + "/") for r in roots):
                return True
    return False


def _held_open(path: Path) -> bool:
    """Whether any process we may look into has ``path`` open (a git writing a lock file
    holds it open until it renames it into place).  One we may not (a container's init, as
    root too) is not a git of this repository's: those run as us, or as root."""
    target = str(path)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or not ours to look into
            if any(found.path == target for found in proc.open_files()):
                return True
    return False


def check_locks(
    *, common_dir: Path, ref: str, checkout: Path | None, own_worktrees: list[Path]
) -> list[str]:
    """Clear our own stale locks (``own_worktrees``: every integration slot of this target);
    raise ``stale-git-lock`` for another one. The cleared paths.  ``HEAD.lock`` counts too:
    moving a branch that HEAD names writes HEAD's reflog under it."""
    others = [common_dir / f"{ref}.lock", common_dir / "packed-refs.lock", common_dir / "HEAD.lock"]
    if checkout is not None:
        others += [git_dir(checkout) / "index.lock", git_dir(checkout) / "HEAD.lock"]
    ours = [
        git_dir(own) / name
        for own in own_worktrees
        if (own / ".git").exists()
        for name in ("index.lock", "HEAD.lock")
    ]
    found = [p for p in dict.fromkeys([*others, *ours]) if p.exists()]
    places = [common_dir, *own_worktrees] + ([checkout] if checkout is not None else [])
    deadline = time.monotonic() + LIVE_GRACE
    while True:
        if not found:
            return []
        if _git_running_in(places):
            return []  # a live git command holds them; landing will wait or fail on its own
        if time.monotonic() >= deadline:
            break
        # A git that works elsewhere (another target's integrator, in its own worktree)
        # holds a shared lock -- packed-refs, HEAD -- for milliseconds: one that goes away
        # was live.  Only a lock that stays is stale.
        time.sleep(0.1)
        found = [p for p in found if p.exists()]
    cleared = []
    repository = {common_dir / f"{ref}.lock", common_dir / "packed-refs.lock"}
    repository.add(common_dir / "HEAD.lock")
    for path in found:
        if path in ours or (path in repository and not _held_open(path)):
            path.unlink(missing_ok=True)
            cleared.append(str(path))
            continue
        raise DagrunnerError(
            "stale-git-lock",
            f"{path} is left over from a git process that is gone, or held by another "
            "process (the target's checkout, or one still running); the target cannot move",
            where=str(path),
            exit_code=ExitCode.ENVIRONMENT,
            hint=f"check that no git command is running in this repository, then: "
            f"rm {shlex.quote(str(path))}",
        )
    return cleared
