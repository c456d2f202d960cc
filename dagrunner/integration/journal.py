"""The queue's journal read back: its lines as records, and one shared, incremental index.

``JournalLine`` reads a line's JSON; ``QueueEntry`` is an item's state folded from its lines.
``JournalIndex.of(journal)``, the process's one index of a journal, reads only the bytes
appended since its last look (one ``fstat`` if none), shared by the integrator, serve's
waiters and status answers.  ``Queue.record`` wakes its waiters when this process appends;
another's appends are seen by the next look (``wait_change``: every ``LOOK`` seconds).

A journal that ``integrate prune`` compacted starts with a header line,
``{"compacted": {"base": B, "kept": K, ...}}``: the cursor of a byte at file offset ``o`` is
``B + o``, so cursors only ever grow across compactions.  ``B`` is where the journal before
ended (as a cursor): a watcher that had read all of it resumes at ``K``, the end of the
lines compaction kept (it had seen them); an older cursor (``0 < c < B``) names lines that
are gone and is answered ``watch-cursor-compacted``.
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import orjson

from dagrunner.errors import DagrunnerError
from dagrunner.files import text_of
from dagrunner.records.integration import FINAL, NO_DETAILS, Details, EnvelopeState

CHUNK = 1 << 18  # bytes of the journal read at once
LOOK = 0.5  # seconds between looks for another process's appends while waiting

# events that say something of the run, not the item: its state and details stay as they were
PASSING = ("batch-size", "target-red", "target-green", "gate-run", "named")
# events that are not a state of their own (a watcher sees their name, not the state)
NAMED = ("flaky", "speculation-reset", "overlap", "stuck", "held", *PASSING)
VERDICTS = (EnvelopeState.LANDED, EnvelopeState.GATES_FAILED)
URGENT = 1 << 30  # ``--priority urgent``: before every number, and pre-empts what gates
PRIORITIES = range(-1000, 1001)  # what --priority N takes


@dataclass
class Tally:
    """What ``integrate stats`` (and ``/metrics``) count, folded event by event: kept up by
    the shared index for the whole journal, so a scrape parses nothing; ``cutoff``: only
    what happened since then counts (a ``--since`` answer, read from the events)."""

    cutoff: float | None = None
    submitted: dict[str, float] = field(default_factory=dict)  # id -> when it was submitted
    ended: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> final state, when
    runs: dict[str, int] = field(default_factory=dict)  # id -> its gate runs (``gating``)
    resets: int = 0
    cancelled: int = 0
    flaky: int = 0
    overlaps: int = 0
    ran: int = 0  # ``gate-run`` events
    cpu: float | None = None  # None: a journal before ``gate-run`` events

    def add(
        self, name: str, item: str, state: EnvelopeState, said: str | None, details: Details,
        final: bool,
    ) -> None:  # fmt: skip
        """One event: its name (``events.Event.event``), item, state, time and details."""
        at = when(said)
        recent = self.cutoff is None or (at is not None and at >= self.cutoff)
        if name == "submitted" and at is not None:
            self.submitted.setdefault(item, at)
        elif name == "gating" and recent:
            self.runs[item] = self.runs.get(item, 0) + 1
        elif name == "speculation-reset" and recent:
            self.resets += 1
        elif name == "flaky" and recent:
            self.flaky += 1
        elif name == "overlap" and recent:
            self.overlaps += 1
        elif name == "gate-run" and recent:
            self.ran, self.cpu = self.ran + 1, (self.cpu or 0.0) + (details.gate_cpu or 0.0)
            self.cancelled += details.note == "cancelled"
        elif final and at is not None and item not in self.ended:
            self.ended[item] = (str(state), at)

    def copy(self) -> Tally:
        return replace(
            self, submitted=dict(self.submitted), ended=dict(self.ended), runs=dict(self.runs)
        )


def event_name(line: JournalLine, first: bool) -> str:
    """The name a watcher sees for ``line`` (``first``: its item's first line)."""
    return line.event if line.event in NAMED else "submitted" if first else str(line.state)


def is_final(line: JournalLine) -> bool:
    return line.state in FINAL and line.event not in NAMED


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
            details=self.details
            if line.event in PASSING
            else self.details.merged(line.details, attempt=line.state is EnvelopeState.APPLYING),
        )


@dataclass(frozen=True)
class Header:
    """A compacted journal's first line: cursor = ``base`` + file offset; ``kept``: the file
    offset where the lines compaction kept end (a cursor of ``base`` resumes there)."""

    base: int = 0
    kept: int = 0

    @classmethod
    def from_json(cls, data: object) -> Header | None:
        said = data.get("compacted") if isinstance(data, dict) else None
        if not isinstance(said, dict):
            return None
        base, kept = said.get("base"), said.get("kept")
        if not (isinstance(base, int) and isinstance(kept, int) and base >= 0 <= kept):
            return None
        return cls(base, kept)


def read_header(handle: Any) -> Header:
    """The header of an open journal (``Header()`` when it was never compacted)."""
    handle.seek(0)
    first = handle.readline(4096)
    if not first.startswith(b'{"compacted"') or not first.endswith(b"\n"):
        return Header()
    try:
        return Header.from_json(orjson.loads(first)) or Header()
    except orjson.JSONDecodeError:
        return Header()


def offset_of(cursor: int, header: Header, journal: Path) -> int:
    """The file offset where a watcher at ``cursor`` resumes; ``watch-cursor-compacted`` for
    a cursor into lines a compaction removed."""
    if cursor == 0:
        return 0
    if cursor == header.base:
        return header.kept
    if cursor < header.base:
        raise DagrunnerError(
            "watch-cursor-compacted",
            f"cursor {cursor} is older than the journal: integrate prune compacted what came "
            f"before cursor {header.base}",
            where=str(journal),
            hint="read the queue's state again (integrate status, or dagrunner_status) and "
            "watch from 0, or from a cursor an event gave since",
        )
    return cursor - header.base


def identity(info: os.stat_result) -> tuple[int, int]:
    return (info.st_dev, info.st_ino)


class JournalIndex:
    """Every item's entry, folded from a journal read incrementally, shared by the process's
    readers (``JournalIndex.of``): the integrator, the waiters and status answers."""

    _shared: ClassVar[dict[Path, JournalIndex]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def of(cls, journal: Path) -> JournalIndex:
        key = journal.absolute()
        with cls._shared_lock:
            index = cls._shared.get(key)
            if index is None:
                index = cls._shared[key] = cls(journal)
            return index

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.generation = 0  # bumped at every change seen (or poked): what waiters wait for
        self._start(None)

    def _start(self, file: tuple[int, int] | None) -> None:
        self.file = file  # the journal file read (a compaction replaces it)
        self.header = Header()
        self.offset = 0  # how far it was read: always a line's end
        self.entries: dict[str, QueueEntry] = {}
        self.first: dict[str, int] = {}  # id -> cursor where its first line (its submission)
        # begins: a wait on it reads from there
        self.envelopes: tuple[int, list[str]] = (-1, [])  # envelopes folder's mtime, its ids
        # what status answers from the whole journal, kept up as it is read:
        self.red: dict[str, dict[str, Any]] = {}  # target -> what it fails (``red_targets``)
        self.gating: dict[str, float] = {}  # id -> when its last gate run began
        self.took: list[float] = []  # gate runs' durations to a verdict, sorted
        self.landing: tuple[str | None, str | None] | None = None  # the newest: old, new
        self.tally = Tally()  # what ``integrate stats`` and ``/metrics`` say

    def refresh(self) -> None:
        """Read what was appended since the last look (the whole journal when it was
        replaced by a compaction); wake the waiters when anything was."""
        with self.lock:
            try:
                handle = self.journal.open("rb")
            except FileNotFoundError:
                if self.file is not None:
                    self._start(None)
                    self._bump()
                return
            with handle:
                info = os.fstat(handle.fileno())
                if identity(info) != self.file or info.st_size < self.offset:
                    self._start(identity(info))
                    self.header = read_header(handle)
                    self._bump()
                if info.st_size == self.offset:
                    return
                handle.seek(self.offset)
                rest = b""
                while chunk := handle.read(CHUNK):  # a chunk at a time: bounded memory
                    data = rest + chunk
                    end = data.rfind(b"\n") + 1
                    rest = data[end:]
                    self._fold(data[:end])

    def _fold(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            begin, raw, start = start, data[start:end], end + 1
            try:
                line = JournalLine.from_json(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue  # a line a crash cut short
            if line is None:
                continue
            current = self.entries.get(line.id)
            if current is None:
                self.first[line.id] = self.header.base + self.offset + begin
            name = event_name(line, current is None)
            self.tally.add(name, line.id, line.state, line.at, line.details, is_final(line))
            if current is None:
                current = QueueEntry(id=line.id, state=EnvelopeState.QUEUED, submitted=line.at)
            self.entries[line.id] = current.followed_by(line)
            self._figures(line)
        if start:
            self.offset += start
            self._bump()

    def _figures(self, line: JournalLine) -> None:
        if line.state is EnvelopeState.LANDING:
            self.landing = (line.details.old, line.details.new)
        goal = line.target or ""
        if line.event == "target-red":
            self.red[goal] = {
                "fails": list(line.details.target_red or ()),
                "since": line.details.red_since,
                "head": line.details.head,  # the head it was said of
                "at": line.at,
                "said": line.details.note or "",
            }
        elif line.event == "target-green":
            self.red.pop(goal, None)
        if line.event in NAMED or (at := when(line.at)) is None:
            return
        if line.state is EnvelopeState.GATING:
            self.gating[line.id] = at
        elif line.state in VERDICTS and line.id in self.gating:
            bisect.insort(self.took, at - self.gating.pop(line.id))

    def median_gate_run(self) -> float | None:
        """The median time from an item's last ``gating`` line to its verdict (landed or
        gates-failed); None before any."""
        with self.lock:
            self.refresh()
            took = self.took
            return round(took[len(took) // 2], 3) if took else None

    def last_landing(self) -> tuple[str | None, str | None] | None:
        """The newest ``landing`` line's heads (from, to), if any."""
        with self.lock:
            self.refresh()
            return self.landing

    def counted(self) -> Tally:
        """The whole journal's figures (a copy: the caller reads it unlocked)."""
        with self.lock:
            self.refresh()
            return self.tally.copy()

    def red_targets(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            self.refresh()
            return {goal: dict(said) for goal, said in self.red.items()}

    def _bump(self) -> None:
        self.generation += 1
        self.changed.notify_all()

    def poke(self) -> None:
        """This process appended: wake the waiters now (they read it themselves)."""
        with self.lock:
            self._bump()

    def wait_change(self, seen: int, timeout: float) -> int:
        """Until the journal changed after generation ``seen`` or ``timeout`` seconds pass
        (looking for other processes' appends every ``LOOK`` seconds); the generation now."""
        with self.lock:
            self.refresh()
            if self.generation == seen and timeout > 0:
                self.changed.wait(min(timeout, LOOK))
                self.refresh()
            return self.generation

    def snapshot(self, folder: Path) -> dict[str, QueueEntry]:
        """Every item's entry in submission order, with an envelope stored in ``folder``
        whose line a crash lost as queued (the folder is listed again only when it changed)."""
        with self.lock:
            self.refresh()
            found = dict(self.entries)
            try:
                stamp = folder.stat().st_mtime_ns
            except FileNotFoundError:
                return found
            if stamp != self.envelopes[0]:
                paths = sorted(folder.glob("*.json"), key=_mtime)
                self.envelopes = (stamp, [p.stem for p in paths])
            for stem in self.envelopes[1]:
                found.setdefault(stem, QueueEntry(id=stem, state=EnvelopeState.QUEUED))
            return found


def when(at: str | None) -> float | None:
    """A journal line's time as a timestamp (None when it has none, or not one of ours)."""
    try:
        return dt.datetime.fromisoformat(at).timestamp() if at else None
    except ValueError:
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
