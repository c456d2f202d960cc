"""A linked worktree's ``.git`` file, restored from git's own registry before git runs there.

A linked worktree finds its repository through the ``.git`` file at its root
(``gitdir: <common dir>/worktrees/<id>``).  That file lies in the tree that
gates test, so a gate can rewrite it -- to point at the user's repository, say,
where the integrator's next ``reset --hard`` would move the user's branch.  So
the integrator rewrites it from the registry (whose ``gitdir`` file names the
worktree's path) before it runs git in an integration worktree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dagrunner.files import atomic_write


def registered_admin(common_dir: Path, worktree: Path) -> Path | None:
    """The admin folder git registered for ``worktree`` (None when it has none)."""
    wanted = str(worktree / ".git")
    folder = common_dir / "worktrees"
    if not folder.is_dir():
        return None
    for admin in folder.iterdir():
        try:
            named = (admin / "gitdir").read_text().strip()
        except OSError:
            continue
        if named == wanted:
            return admin
    return None


def pin_gitfile(common_dir: Path, worktree: Path, admin: Path | None = None) -> Path | None:
    """Make ``worktree/.git`` name its registered admin folder again (whatever replaced it);
    the admin folder, or None when the worktree is not registered (nothing is touched)."""
    admin = admin or registered_admin(common_dir, worktree)
    if admin is None:
        return None
    gitfile = worktree / ".git"
    expected = f"gitdir: {admin}\n".encode()
    try:
        if not gitfile.is_symlink() and gitfile.is_file() and gitfile.read_bytes() == expected:
            return admin
    except OSError:
        pass
    if gitfile.is_dir() and not gitfile.is_symlink():
        shutil.rmtree(gitfile)
    else:
        gitfile.unlink(missing_ok=True)
    atomic_write(gitfile, expected)
    return admin
