"""The durable integration queue of one repository.

Under ``<common git dir>/dagrunner/queue/``: ``envelopes/<id>.json`` holds each
submitted envelope's exact bytes (written to a temporary file, fsynced,
renamed, before ``submit`` returns), and ``journal.jsonl`` every state change,
appended and fsynced *before* the change takes effect.  An envelope's state is
its last journaled state; its position is the order of first submission.

States: ``queued`` -> ``applying`` -> ``applied`` -> ``gating`` -> ``landing`` ->
``landed``; the other final states are ``conflict``, ``gates-failed`` and
``rejected``.  After a crash, anything not final is queued again (after the
integrator has checked the target for commits that already carry its id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.envelope import Envelope, load_envelope, parse_envelope, repo_identity
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import append_line, atomic_write, locked, read_lines
from dagrunner.ledger import now
from dagrunner.names import is_safe_id
from dagrunner.outcomes import FINAL
from dagrunner.repo import RepoInfo


@dataclass(frozen=True)
class Queue:
    dir: Path

    @classmethod
    def of(cls, info: RepoInfo) -> Queue:
        return cls(info.state_dir / "queue")

    @property
    def journal(self) -> Path:
        return self.dir / "journal.jsonl"

    def envelope_path(self, envelope_id: str) -> Path:
        if not is_safe_id(envelope_id):  # ids are validated at submit; this is the last line
            raise DagrunnerError(
                "envelope-name",
                f"{envelope_id[:80]!r} is not a safe envelope id",
                hint="envelope ids are mission.worker.hash as export writes them",
            )
        return self.dir / "envelopes" / f"{envelope_id}.json"

    def lock(self) -> Any:
        return locked(self.dir / "queue.lock")

    def record(self, envelope_id: str, state: str, **details: Any) -> dict[str, Any]:
        entry = {"at": now(), "id": envelope_id, "state": state, **details}
        append_line(self.journal, orjson.dumps(entry))
        return entry

    def entries(self) -> dict[str, dict[str, Any]]:
        """Each envelope's latest state and details, in submission order."""
        found: dict[str, dict[str, Any]] = {}
        for event in read_lines(self.journal):
            current = found.setdefault(event["id"], {"id": event["id"], "submitted": event["at"]})
            current.update({k: v for k, v in event.items() if k != "at"})
            current["updated"] = event["at"]
        # an envelope file whose "queued" line a crash lost is still submitted
        folder = self.dir / "envelopes"
        if folder.is_dir():
            for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
                found.setdefault(path.stem, {"id": path.stem, "state": "queued", "submitted": None})
        return found

    def pending(self) -> list[str]:
        return [i for i, e in self.entries().items() if e.get("state") not in FINAL]

    def load(self, envelope_id: str) -> Envelope:
        return load_envelope(self.envelope_path(envelope_id))


def same_repository(identity: dict[str, Any], info: RepoInfo) -> bool:
    here = repo_identity(info.root)
    if identity.get("common_dir") == here["common_dir"]:
        return True
    return bool(set(identity.get("root_commits", [])) & set(here["root_commits"]))


def submit(info: RepoInfo, files: Iterable[Path]) -> list[dict[str, Any]]:
    """Put envelopes on the queue (durably) and return each one's position.

    Every file is validated first; a bad one raises (exit 2) and nothing is queued.
    An id already on the queue is not queued twice.
    """
    envelopes: list[tuple[Path, Envelope, bytes]] = []
    for path in files:
        # Read once, validate those bytes, store those bytes: no second read can differ.
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DagrunnerError(
                "envelope-unreadable",
                exc.strerror or str(exc),
                where=str(path),
                hint="check the path",
            ) from None
        envelope = parse_envelope(raw, where=str(path))
        if not same_repository(envelope.fields["repo"], info):
            raise DagrunnerError(
                "envelope-foreign-repo",
                "the envelope was exported from another repository",
                where=str(path),
                hint="submit it to the repository its worktree belongs to",
            )
        envelopes.append((path, envelope, raw))
    queue = Queue.of(info)
    results = []
    with queue.lock():
        known = queue.entries()
        for path, envelope, raw in envelopes:
            order = list(known)
            if envelope.id in known:
                results.append(
                    {
                        "id": envelope.id,
                        "file": str(path),
                        "duplicate": True,
                        "position": order.index(envelope.id) + 1,
                        "state": known[envelope.id].get("state"),
                    }
                )
                continue
            try:
                atomic_write(queue.envelope_path(envelope.id), raw)
                queue.record(
                    envelope.id,
                    "queued",
                    mission=envelope.fields["mission"],
                    worker=envelope.fields["worker"],
                    source=str(path),
                )
            except OSError as exc:
                # atomic_write leaves nothing behind; a file without its line is not queued
                queue.envelope_path(envelope.id).unlink(missing_ok=True)
                raise DagrunnerError(
                    "queue-write-failed",
                    f"could not store the envelope: {exc.strerror or exc}",
                    where=str(queue.dir),
                    exit_code=ExitCode.ENVIRONMENT,
                    details={"queued_before": [r["id"] for r in results]},
                    hint="free disk space (or fix permissions) under the queue folder, then "
                    "submit again; envelopes listed as queued_before are already queued",
                ) from None
            known[envelope.id] = {"id": envelope.id, "state": "queued"}
            results.append(
                {
                    "id": envelope.id,
                    "file": str(path),
                    "duplicate": False,
                    "position": len(known),
                    "state": "queued",
                }
            )
    return results


def submit_files(files: Iterable[Path], *, repo: Path | None = None) -> list[dict[str, Any]]:
    """``submit`` for the repository at ``repo`` (default: the current directory)."""
    from dagrunner.repo import repo_info

    return submit(repo_info(repo), files)
