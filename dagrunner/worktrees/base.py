"""The manifest at an allocation's base commit: what ``[worktrees]`` asks of each worktree.

It is read from the base (the target's history, trusted), never from a worker's files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dagrunner.git.command import git
from dagrunner.manifest.load import DEFAULT_MANIFEST, STARTER_MANIFEST, Manifest, load_manifest


def base_manifest(repo: Path, base: str) -> Manifest | None:
    """The manifest at ``base`` when it has a ``[worktrees]`` table (None otherwise)."""
    for rel in (DEFAULT_MANIFEST, STARTER_MANIFEST):
        shown = git(["show", f"{base}:{Path(rel).as_posix()}"], cwd=repo, check=False)
        if shown.returncode == 0:
            if b"worktrees" not in shown.stdout:  # most manifests: no parse on this path
                return None
            with tempfile.TemporaryDirectory(prefix="dagrunner-manifest-") as tmp:
                path = Path(tmp) / Path(rel).name
                path.write_bytes(shown.stdout)
                return load_manifest(path)
    return None
