"""The gates that judge an envelope: the target's own manifest, never the tree under test.

An envelope could rewrite ``manifests/release.toml`` to a single ``true`` gate
and so approve itself, if gates were read after the patch is applied.  So the
manifest is read from the target's head with ``git show`` (a path in the
repository), or is the caller's own file (an absolute path).  Reading it from
the tree under test is an explicit opt-in for single-user set-ups.
"""

from __future__ import annotations

from pathlib import Path

from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write
from dagrunner.git.command import git
from dagrunner.manifest.load import DEFAULT_MANIFEST, STARTER_MANIFEST


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
        raise DagrunnerError(
            "manifest-not-found",
            f"the target {target!r} has no {rel.as_posix()} at {head[:12]}",
            key="--manifest",
            hint="commit the manifest on the target branch, or pass --manifest /absolute/path",
        )
    atomic_write(dest, blob.stdout)  # whole or absent: a reused partial file would drop gates
    return dest
