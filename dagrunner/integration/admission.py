"""What the target lets onto the integration queue's worktree: an envelope re-read from the
queue is refused (with the reason its outcome gives) when it is of another repository,
starts from a base that is not here, holds no change, or touches a path the target's
``[integrate] protected`` names without ``--allow-protected``; and which of its files
change how later work is judged (flagged in its outcome and the report).

And the gates that judge an envelope: the target's own manifest, never the tree under test.
An envelope could rewrite ``manifests/release.toml`` to a single ``true`` gate and so approve
itself, if gates were read after the patch is applied.  So the manifest is read from the
target's head with ``git show`` (a path in the repository), or is the caller's own file (an
absolute path).  Reading it from the tree under test is an explicit opt-in for single-user
set-ups (``trusted_manifest``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write
from dagrunner.git.command import git
from dagrunner.git.repo import RepoInfo
from dagrunner.integration.queue import same_repository
from dagrunner.manifest.globs import glob_regex
from dagrunner.manifest.load import DEFAULT_MANIFEST, STARTER_MANIFEST
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


def manifest_rel(given: Path | None) -> Path:
    """The manifest's path inside the repository (a relative ``--manifest``, or the default)."""
    return DEFAULT_MANIFEST if given is None or given.is_absolute() else given


def trusted_manifest(
    *,
    repo: Path,
    head: str,
    target: str,
    given: Path | None,
    tree_under_test: Path | None,
    folder: Path,
) -> Path:
    """A file holding the manifest that judges envelopes on ``target`` at ``head``.

    ``given`` absolute: the caller's file.  ``tree_under_test``: the opt-in that
    reads it from there.  Otherwise the blob at ``head`` is written under ``folder``.
    Raises ``manifest-not-found`` when the target has no such file.
    """
    if given is not None and given.is_absolute():
        return given
    rel = manifest_rel(given)
    if tree_under_test is not None:
        return tree_under_test / rel
    dest = folder / head[:12] / rel.name
    if dest.is_file():  # this head's manifest, already read (bisection gates it again)
        return dest
    blob = git(["show", f"{head}:{rel.as_posix()}"], cwd=repo, check=False)
    if blob.returncode != 0 and given is None:  # no manifests/release.toml: what init wrote
        blob = git(["show", f"{head}:{STARTER_MANIFEST.as_posix()}"], cwd=repo, check=False)
    if blob.returncode != 0:
        tried = rel.as_posix() + (f" (nor {STARTER_MANIFEST.as_posix()})" if given is None else "")
        raise DagrunnerError(
            "manifest-not-found",
            f"the target {target!r} has no {tried} at {head[:12]}",
            key="--manifest",
            hint=f"commit a manifest on the target branch ({rel.as_posix()}, or "
            f"{STARTER_MANIFEST.as_posix()}: `dagrunner init` writes one), or pass --manifest "
            "/absolute/path",
        )
    atomic_write(dest, blob.stdout)  # whole or absent: a reused partial file would drop gates
    return dest
