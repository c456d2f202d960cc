"""What the target lets onto the integration queue's worktree: an envelope re-read from the
queue is refused (with the reason its outcome gives) when it is of another repository,
starts from a base that is not here, holds no change, or touches a path the target's
``[integrate] protected`` names without ``--allow-protected``; and which of its files
change how later work is judged (flagged in its outcome and the report)."""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

from dagrunner.envelope import Envelope
from dagrunner.git.command import git
from dagrunner.git.repo import RepoInfo
from dagrunner.integration.queue import same_repository
from dagrunner.manifest.globs import glob_regex
from dagrunner.records.integration import Details


def refusal(
    envelope: Envelope, *, info: RepoInfo, protected: tuple[str, ...], allow_protected: bool
) -> str:
    """Why ``envelope`` may not be applied ('' when it may)."""
    if not same_repository(envelope, info):
        return "envelope-foreign-repo"
    base = git(["cat-file", "-e", f"{envelope.base}^{{commit}}"], cwd=info.root, check=False)
    if base.returncode:
        return "envelope-unknown-base: its base commit is not here"
    if envelope.empty or not envelope.diff:
        return "empty: the envelope holds no change"
    held = protected_paths(envelope.touched, protected)
    if held and not allow_protected:
        return (
            f"protected-path: it touches {', '.join(held[:5])}, which the target's "
            "[integrate] protected names; submit it with --allow-protected to let it in"
        )
    return ""


# Files that change how git merges, checks out or diffs later work, or which gates judge it.
JUDGING_NAMES = frozenset({".gitattributes", ".gitmodules", ".worktreeinclude"})


def judging_files(touched: frozenset[str], manifest: Path) -> tuple[str, ...]:
    """The paths among ``touched`` that change how later work is judged."""
    return tuple(
        sorted(
            p for p in touched if PurePosixPath(p).name in JUDGING_NAMES or p == manifest.as_posix()
        )
    )


def protected_paths(touched: frozenset[str], protected: tuple[str, ...]) -> list[str]:
    """The paths among ``touched`` that a glob of ``[integrate] protected`` matches."""
    patterns = [glob_regex(g) for g in protected]
    return sorted(p for p in touched if any(r.match(p) for r in patterns))


def flagged(details: Details, judging: tuple[str, ...], manifest: Path) -> Details:
    """An outcome's details with what its envelope changes of the judging flagged: the
    manifest (gated by the target's own all the same) and the other judging files."""
    if manifest.as_posix() in judging:
        details = dataclasses.replace(
            details,
            manifest_changed=True,
            note=details.note or f"it changes {manifest}; it was gated by the target's own",
        )
    if judging:
        details = dataclasses.replace(
            details,
            judging_changed=judging,
            note=details.note or f"it changes how later work is judged ({', '.join(judging[:3])})",
        )
    return details
