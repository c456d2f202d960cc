"""The durable integration queue of one repository.

Under ``<common git dir>/dagrunner/queue/``: ``envelopes/<id>.json`` holds each
submitted envelope's exact bytes (written to a temporary file, fsynced,
renamed, before ``submit`` returns), and ``journal.jsonl`` every state change,
appended and fsynced *before* the change takes effect.  An envelope's state is
its last journaled state; its position is the order of first submission.

States: ``queued`` -> ``applying`` -> ``applied`` -> ``gating`` -> ``landing`` ->
``landed``; the other final states are ``conflict``, ``gates-failed`` and
``rejected``.  A final state is final: no later line changes it.  After a crash,
anything not final is queued again (after the integrator has checked the target for
commits that already carry its id).

An item is known by its content, not by its envelope's id alone: the id is a hash
of public fields that anyone can recompute, so a second envelope with a taken id
but another diff or tree is queued as its own item (``<id>.<diff sha256[:12]>``),
and never answers for the first.  Every item names its target at submission; an
integrator takes only its own target's items (one integrator per target holds its
lock), and claims an item submitted without one (by an older dagrunner) in the
journal before it works on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.envelope import Envelope, load_envelope, repo_identity
from dagrunner.errors import DagrunnerError
from dagrunner.files import append_line, locked, read_lines
from dagrunner.git.repo import RepoInfo
from dagrunner.integration.journal import (
    PASSING,
    PRIORITIES,
    URGENT,
    JournalIndex,
    JournalLine,
    QueueEntry,
)
from dagrunner.names import is_safe_id
from dagrunner.records.integration import FINAL, NO_DETAILS, Details, EnvelopeState
from dagrunner.worktrees.ledger import now

# the line records live in ``journal.py``; their old home still names them
__all__ = [
    "PASSING",
    "PRIORITIES",
    "URGENT",
    "JournalLine",
    "Queue",
    "QueueEntry",
    "same_repository",
]


@dataclass(frozen=True)
class Queue:
    dir: Path
    target: str | None = None  # the integrator's branch: its journal lines name it

    @classmethod
    def of(cls, info: RepoInfo, *, target: str | None = None) -> Queue:
        return cls(info.state_dir / "queue", target)

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

    def record(
        self,
        envelope_id: str,
        state: EnvelopeState,
        details: Details = NO_DETAILS,
        *,
        event: str | None = None,
        **origin: str | bool,
    ) -> None:
        """Journal a state change (fsynced before it takes effect); ``origin`` is the mission,
        worker and source that ``submit`` records once; ``event`` names a change that is not
        a state of its own (``flaky``, ``speculation-reset``: see ``events.py``)."""
        line: dict[str, Any] = {"at": now(), "id": envelope_id, "state": str(state)}
        if event is not None:
            line["event"] = event
        if self.target is not None:
            line["target"] = self.target
        line.update(origin)
        line.update(details.to_json())
        append_line(self.journal, orjson.dumps(line))
        self.index().poke()

    def index(self) -> JournalIndex:
        """The process's shared, incremental index of this queue's journal."""
        return JournalIndex.of(self.journal)

    def stuck(self, code: str, message: str, hint: str) -> list[str]:
        """Journal a ``stuck`` event on each item of this target not yet final: the queue
        cannot move it now (an integrator that cannot start, a refused landing), with the
        coded error's code, message (bounded: it may quote input) and hint.  An item whose
        last line says this cause already is left alone: one event per cause."""
        said = []
        for item, entry in self.entries().items():
            if entry.state in FINAL or entry.target not in (None, self.target):
                continue
            if entry.details.stuck != code:
                details = Details(stuck=code, note=message[:500], hint=hint[:500])
                self.record(item, entry.state, details, event="stuck")
                said.append(item)
        return said

    def lines(self) -> list[JournalLine]:
        """The journal's lines, oldest first."""
        return [line for raw in read_lines(self.journal) if (line := JournalLine.from_json(raw))]

    def entries(self) -> dict[str, QueueEntry]:
        """Each envelope's latest state and details, in submission order (read incrementally:
        only what was appended since this process last looked)."""
        return self.index().snapshot(self.dir / "envelopes")

    def pending(self) -> list[str]:
        """The items not yet final for this queue's target (every target's, without one),
        highest priority first, in submission order within a priority.  An item submitted
        without a target is claimed for this one first, in the journal, under the queue
        lock: no two integrators ever take one item."""
        return self.pending_entries()[0]

    def pending_entries(self) -> tuple[list[str], dict[str, QueueEntry]]:
        """``pending``, with the entries it was read from (read under the lock)."""
        if self.target is None:
            entries = self.entries()
            ours = [i for i, e in entries.items() if e.state not in FINAL]
        else:
            with self.lock():
                entries = self.entries()
                ours = []
                for item, entry in entries.items():
                    if entry.state in FINAL or entry.target not in (None, self.target):
                        continue
                    if entry.target is None:
                        self.record(item, entry.state, event="claimed")
                    ours.append(item)
        return sorted(ours, key=lambda item: -entries[item].priority), entries  # stable

    def load(self, envelope_id: str) -> Envelope:
        """The envelope of queue item ``envelope_id`` (its ``id`` is the item's)."""
        envelope = load_envelope(self.envelope_path(envelope_id))
        if envelope.exported_id == envelope_id:
            return envelope
        return dataclasses.replace(envelope, item=envelope_id)


def same_repository(envelope: Envelope, info: RepoInfo) -> bool:
    """Whether ``envelope`` says it came from this repository (or a clone of it)."""
    return envelope.repo.same_as(repo_identity(info.root))


@contextlib.contextmanager
def stuck_on_error(queue: Queue) -> Iterator[None]:
    """A coded error that ends an integrator's run (it could not start: no manifest on the
    target, an integration worktree it cannot use; a gate run that could not start) is a
    ``stuck`` event on every item of its target: each waiter reads the cause and what to do
    in the journal, whoever started the integrator."""
    try:
        yield
    except DagrunnerError as exc:
        with contextlib.suppress(OSError, DagrunnerError):
            queue.stuck(exc.code, exc.message, exc.hint or "")
        raise
