"""What the pipeline proves about each commit it lands, and the landing invariant in one
place (docs/security.md, "The landing invariant").

An item lands only when every gate of the target's manifest has a pass for exactly the tree
that lands: from a gate run on that tree, or a verdict under that tree's key from a trusted
source (the gate cache, a landed proof) -- or, under the differential baseline, a failure
that trusted runs of the target's own head have too (a gate that ran and failed the same way:
never one skipped or cancelled, which ``Failures`` counts hard).  A confirmation re-runs
every gate without such a pass -- failed, skipped behind a failed need, cancelled by the
tree's first failure, never started -- so ``flaky`` means all of them passed on the re-run.

``pipeline.py`` asks ``gaps`` before every landing, whatever path led there; the tree's
passes are gathered per tree by ``passes``, and the gates a confirmation runs by ``rerun``.
The gates that passed on exactly the landed tree, keyed, are written as its landed proof
(``engine/landed.py``) once the commit is on the target.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from dagrunner.engine.landed import GateProof, manifest_digest, new_proof, write_note
from dagrunner.git.command import git
from dagrunner.manifest.load import Manifest, load_manifest
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


# -- the landing invariant ---------------------------------------------------------------


def required(manifest: Path | None) -> tuple[str, ...]:
    """Every gate of the manifest that judges a tree, in its order (a split gate by its own
    name).  No manifest (an item never built) requires one that can never pass."""
    if manifest is None:
        return ("(no manifest)",)
    return tuple(load_manifest(manifest).gates)


def passes(record: RunRecord | None) -> frozenset[str]:
    """The gates that passed in one run (from a run, a retry or the cache: ``Status.ok``);
    a split gate by its own name when every shard of it passed."""
    if record is None:
        return frozenset()
    ok: dict[str, bool] = {}
    for gate in record.gates:
        name = gate.shard_of or gate.id
        ok[name] = ok.get(name, True) and gate.status.ok
    return frozenset(name for name, passed in ok.items() if passed)


def failures(record: RunRecord | None) -> frozenset[str]:
    """The gates of one run that did not pass (a split gate by its own name)."""
    if record is None:
        return frozenset()
    return frozenset(g.shard_of or g.id for g in record.gates if not g.status.ok)


def gaps(
    required: Iterable[str], passed: Iterable[str], excused: Iterable[str] = ()
) -> tuple[str, ...]:
    """The gates of ``required`` with neither a pass on the tree nor an excuse: () is the
    only answer that lets a tree land."""
    have = set(passed) | set(excused)
    return tuple(gate for gate in required if gate not in have)


def rerun(manifest: Path | None, passed: Iterable[str]) -> tuple[str, ...]:
    """What a confirmation runs: every gate of the manifest without a pass on the tree."""
    return gaps(required(manifest), passed)
