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

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.envelope import Envelope, load_envelope, repo_identity
from dagrunner.errors import DagrunnerError
from dagrunner.files import append_line, locked, read_lines, text_of
from dagrunner.git.repo import RepoInfo
from dagrunner.names import is_safe_id
from dagrunner.records.integration import FINAL, NO_DETAILS, Details, EnvelopeState
from dagrunner.worktrees.ledger import now

# events that say something of the run, not the item: its state and details stay as they were
PASSING = ("batch-size", "target-red", "target-green", "gate-run", "named")
URGENT = 1 << 30  # ``--priority urgent``: before every number, and pre-empts what gates
PRIORITIES = range(-1000, 1001)  # what --priority N takes


def _priority(raw: object) -> int | None:
    if raw == "urgent":
        return URGENT
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw in PRIORITIES else None


@dataclass(frozen=True, kw_only=True)
class JournalLine:
    """One line of the journal, read back (``Queue.record`` writes it): the one reader of
    its JSON, for the queue's entries, the event stream and recovery alike."""

    id: str
    state: EnvelopeState  # an unknown state reads as queued: judged again, never skipped
    at: str | None = None
    event: str | None = None  # a change that is not a state of its own (flaky, claimed, ...)
    target: str | None = None
    mission: str | None = None  # these, on the line that submitted it
    worker: str | None = None
    source: str | None = None
    envelope: str | None = None
    provenance: str | None = None
    allow_protected: bool = False
    priority: int | None = None  # on the line that submitted it (URGENT: "urgent")
    details: Details = NO_DETAILS

    @classmethod
    def from_json(cls, data: object) -> JournalLine | None:
        """The line, or None for one this journal does not write (or a crash cut short)."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return None
        try:
            state = EnvelopeState(str(data.get("state")))
        except ValueError:
            state = EnvelopeState.QUEUED
        return cls(
            id=data["id"],
            state=state,
            at=text_of(data.get("at")),
            event=text_of(data.get("event")),
            target=text_of(data.get("target")),
            mission=text_of(data.get("mission")),
            worker=text_of(data.get("worker")),
            source=text_of(data.get("source")),
            envelope=text_of(data.get("envelope")),
            provenance=text_of(data.get("provenance")),
            allow_protected=data.get("allow_protected") is True,
            priority=_priority(data.get("priority")),
            details=Details.from_json(data),
        )


@dataclass(frozen=True)
class QueueEntry:
    """One envelope on the queue: its latest state, and every detail its journal lines gave."""

    id: str
    state: EnvelopeState
    submitted: str | None = None
    mission: str | None = None
    worker: str | None = None
    source: str | None = None  # the file it was submitted from
    updated: str | None = None
    target: str | None = None  # the branch it is for (None: submitted before targets, unclaimed)
    envelope: str | None = None  # the envelope's own id, where another item holds that id
    provenance: str | None = None  # whether the ledger proves which worktree exported it
    allow_protected: bool = False  # submitted with --allow-protected ([integrate] protected)
    priority: int = 0  # higher first; URGENT pre-empts what gates
    details: Details = NO_DETAILS

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "submitted": self.submitted,
            "state": str(self.state),
        }
        for key in ("mission", "worker", "source", "updated", "target", "envelope", "provenance"):
            if (value := getattr(self, key)) is not None:
                body[key] = value
        if self.allow_protected:
            body["allow_protected"] = True
        if self.priority:
            body["priority"] = "urgent" if self.priority == URGENT else self.priority
        return {**body, **self.details.to_json()}

    def followed_by(self, line: JournalLine) -> QueueEntry:
        """This entry after one more journal line.  A final entry stays as it is, and the
        first target to claim an entry keeps it: a line of another integrator's cannot undo
        either."""
        if self.state in FINAL:
            return self
        if self.target is not None and line.target is not None and line.target != self.target:
            return self
        return QueueEntry(
            id=self.id,
            state=self.state if line.event in PASSING else line.state,
            submitted=self.submitted,
            mission=line.mission or self.mission,
            worker=line.worker or self.worker,
            source=line.source or self.source,
            updated=line.at or self.updated,
            target=self.target or line.target,
            envelope=self.envelope or line.envelope,
            provenance=self.provenance or line.provenance,
            allow_protected=self.allow_protected or line.allow_protected,
            priority=self.priority if line.priority is None else line.priority,
            # a batch's size and the target's colour are the run's news, not the item's
            details=self.details if line.event in PASSING else self.details.merged(line.details),
        )


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
        """Each envelope's latest state and details, in submission order."""
        found: dict[str, QueueEntry] = {}
        for line in self.lines():
            current = found.get(line.id) or QueueEntry(
                id=line.id, state=EnvelopeState.QUEUED, submitted=line.at
            )
            found[line.id] = current.followed_by(line)
        # an envelope file whose "queued" line a crash lost is still submitted
        folder = self.dir / "envelopes"
        if folder.is_dir():
            for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
                found.setdefault(path.stem, QueueEntry(id=path.stem, state=EnvelopeState.QUEUED))
        return found

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
