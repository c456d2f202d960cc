"""The trailers the integrator writes on each commit, and reading them back strictly.

``Dagrunner-Envelope`` names the envelope and ``Dagrunner-Envelope-Sha256`` its
diff's hash.  Recovery after a crash counts an envelope as landed only when a
commit on the target carries exactly one of each and the hash matches the
queued envelope: text that anyone else wrote into a message proves nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagrunner.git.command import git
from dagrunner.names import is_safe_id

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope

TRAILER = "Dagrunner-Envelope"
SHA_TRAILER = "Dagrunner-Envelope-Sha256"


def commit_message(envelope: Envelope) -> str:
    """The integrator's commit message for a (validated) envelope."""
    return (
        f"dagrunner: integrate {envelope.mission}/{envelope.worker}\n\n"
        f"{TRAILER}: {envelope.id}\nDagrunner-Mission: {envelope.mission}\n"
        f"Dagrunner-Worker: {envelope.worker}\nDagrunner-Base: {envelope.base}\n"
        f"{SHA_TRAILER}: {envelope.diff_sha256}\n"
    )


def landed_on_target(repo: Path, ref: str) -> dict[str, tuple[str, str]]:
    """Envelope id -> (commit, diff sha256) for commits on the target that carry both trailers.

    Parsed strictly: a commit counts only with exactly one id and one hash,
    as the integrator writes them; anything else is somebody else's text.
    """
    fmt = "%H%x1f" + "%x1f".join(
        f"%(trailers:key={key},valueonly,separator=%x1e)" for key in (TRAILER, SHA_TRAILER)
    )
    log = git(["log", f"--format={fmt}%x1d", "-n", "5000", ref], cwd=repo).stdout.decode(
        "utf-8", "replace"
    )
    found: dict[str, tuple[str, str]] = {}
    for entry in log.split("\x1d"):
        parts = entry.strip().split("\x1f")
        if len(parts) != 3:
            continue
        commit, ids, shas = parts
        ids_list, sha_list = ids.strip().split("\x1e"), shas.strip().split("\x1e")
        if len(ids_list) == 1 and len(sha_list) == 1 and is_safe_id(ids_list[0].strip()):
            found.setdefault(ids_list[0].strip(), (commit, sha_list[0].strip()))
    return found
