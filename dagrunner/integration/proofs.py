"""What the pipeline proves about each commit it lands: the gates that passed on exactly its
tree, written as a landed proof (``engine/landed.py``) once the commit is on the target."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dagrunner.engine.landed import GateProof, manifest_digest, new_proof, write_note
from dagrunner.git.command import git
from dagrunner.manifest.load import Manifest
from dagrunner.records.run import RunRecord, Status

SIGNING_KEY_ENV = "DAGRUNNER_SIGNING_KEY"


def proven_gates(record: RunRecord) -> dict[str, GateProof]:
    """The gates of one run that passed (or were answered from a pass) on its tree, keyed."""
    keys = record.cache.get("landed_keys", {}) if isinstance(record.cache, dict) else {}
    return {
        gate.id: GateProof(
            key=keys[gate.id], verdict=str(gate.status), duration=round(gate.duration, 3)
        )
        for gate in record.gates
        if gate.status in (Status.PASSED, Status.CACHED) and isinstance(keys.get(gate.id), str)
    }


def signing_key(manifest: Manifest, environ: Mapping[str, str], repo: Path) -> Path | None:
    """``DAGRUNNER_SIGNING_KEY``, else ``[integrate] signing_key`` (``~`` expanded, a relative
    path from the repository's root); None: proofs are written unsigned."""
    named = environ.get(SIGNING_KEY_ENV) or manifest.integrate.signing_key
    if not named:
        return None
    path = Path(os.path.expanduser(named))
    return path if path.is_absolute() else repo / path


def write_landed(
    repo: Path,
    *,
    commit: str,
    target: str,
    manifest: Path | None,
    gates: Mapping[str, GateProof],
    executor: str,
    key: Path | None,
) -> str | None:
    """The landed proof on ``commit``; a warning when it could not be written (or signed)."""
    tree = git(["rev-parse", "--verify", "-q", f"{commit}^{{tree}}"], cwd=repo, check=False)
    if tree.returncode != 0:
        return f"could not write the landed proof on {commit[:12]}: its tree is unknown"
    proof = new_proof(
        commit=commit,
        tree=tree.text,
        target=target,
        manifest=manifest_digest(manifest) if manifest else "",
        gates=gates,
        executor=executor,
    )
    return write_note(repo, proof, key)
