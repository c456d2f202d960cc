"""The integration queue's journal as an event stream that orchestrators watch and wait on.

Every state change is a journal line, appended and fsynced before it takes
effect (``queue.py``), so the journal is the stream: nothing an integrator did
is missed across its restarts, or across the watcher's.  Each event carries a
``cursor``: the journal's byte offset just after its line (plus the base a compaction
left: ``journal.py``).  ``watch(since=c)`` resumes right after the event whose cursor was
``c``; the journal is only appended to between compactions (``integrate prune``), so a
cursor stays valid until one, and cursors only grow across them: a watcher that had read
to the end resumes seamlessly, an older cursor is refused (``watch-cursor-compacted``).

Event names are the envelope's state, except ``submitted`` (its first
``queued`` line), ``flaky`` and ``speculation-reset`` (``pipeline.py``), and ``overlap``
(``foresight.py``: at submit, it conflicts with an item queued ahead of it), and ``stuck``
(the queue cannot move it now: an integrator that cannot start, a refused landing).
Their JSON shape is ``docs/integration-event.schema.json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.repo import repo_info
from dagrunner.integration.journal import (
    NAMED,
    Header,
    JournalIndex,
    JournalLine,
    Tally,
    identity,
    offset_of,
    read_header,
)
from dagrunner.integration.queue import Queue, QueueEntry
from dagrunner.records.integration import FINAL, Details, EnvelopeState

POLL = 0.1  # seconds between looks at the journal while following it
CHUNK = 1 << 16  # bytes of the journal read at once: ten waiters reading from cursor 0
# hold a few small blocks each, not a quarter MiB (what their threads kept: agents/serve.py)

# What each final state means to ``integrate submit --wait`` (docs/integration.md).
WAIT_EXIT: dict[EnvelopeState, ExitCode] = {
    EnvelopeState.LANDED: ExitCode.OK,
    EnvelopeState.GATES_FAILED: ExitCode.FAILED,
    EnvelopeState.REJECTED: ExitCode.BAD_INPUT,
    EnvelopeState.CONFLICT: ExitCode.REFUSED,
    EnvelopeState.WITHDRAWN: ExitCode.REFUSED,
}


@dataclass(frozen=True)
class Event:
    """One journal line, as a watcher sees it."""

    cursor: int
    event: str
    id: str
    state: EnvelopeState
    at: str | None
    mission: str | None
    worker: str | None
    target: str | None
    details: Details

    def to_json(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "event": self.event,
            "id": self.id,
            "state": str(self.state),
            "at": self.at,
            "mission": self.mission,
            "worker": self.worker,
            "target": self.target,
            **self.details.to_json(),
        }

    @property
    def final(self) -> bool:
        return self.state in FINAL and self.event not in NAMED


class JournalReader:
    """Reads a journal's events incrementally: only the bytes appended since the last read.

    Without an ``index`` the journal is read from its start (who submitted each item is
    learnt on the way) and the events up to cursor ``since`` are passed over; with the
    process's shared ``index`` it starts at ``since`` and asks the index who submitted what,
    so a resumed wait costs what was appended since, whatever the journal's length."""

    def __init__(
        self,
        journal: Path,
        since: int = 0,
        index: JournalIndex | None = None,
        only: str | None = None,
    ) -> None:
        self.journal = journal
        self.since = since
        self.index = index
        # with an index: the events of this one item only (another item's line is not even
        # parsed: a wait from cursor 0 on a long journal holds no event of the others)
        self.item = None if index is None else only
        self.only = None if self.item is None else f'"id":"{self.item}"'.encode()
        self.file: tuple[int, int] | None = None  # the journal file read (None: not yet)
        self.header = Header()
        self.offset = 0  # how far the file has been read (always a line's end)
        self.skip = 0  # events of lines ending at or before this file offset are passed over
        self.who: dict[str, tuple[str | None, str | None]] = {}  # id -> mission, worker

    def read(self) -> list[Event]:
        """The events journaled since the last read (after cursor ``since``).  A line still
        being written (no newline yet) waits for the next read."""
        try:
            handle = self.journal.open("rb")
        except FileNotFoundError:
            if self.file is None and self.since:
                self.bad_cursor(0)
            return []
        with handle:
            info = os.fstat(handle.fileno())
            if self.file is None:
                self.header, self.file = read_header(handle), identity(info)
                self.place(handle, info.st_size)
            elif identity(info) != self.file:  # compacted since the last read
                header = read_header(handle)
                # resumes where the compaction's kept lines end, or is refused (coded)
                at = offset_of(self.header.base + self.offset, header, self.journal)
                self.header, self.file, self.offset = header, identity(info), at
            handle.seek(self.offset)
            events: list[Event] = []
            rest = b""
            # in chunks: a wait from cursor 0 on a long journal holds one chunk, not the file
            while chunk := handle.read(CHUNK):
                data, rest = rest + chunk, b""
                end = data.rfind(b"\n") + 1
                data, rest = data[:end], data[end:]
                if self.index is not None:
                    self.index.refresh()  # as far as this read: it knows who submitted what
                events += self.lines(data)
        return events

    def lines(self, data: bytes) -> list[Event]:
        """The events of ``data``, whole lines read from ``self.offset`` on."""
        events: list[Event] = []
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            raw, start = data[start:end], end + 1
            if self.only is not None and self.only not in raw:
                continue
            event = self.parse(raw, self.offset + start)
            if event is not None and (
                self.only is None or f'"id":"{event.id}"'.encode() == self.only
            ):
                events.append(event)
        self.offset += start
        return events

    def place(self, handle: Any, size: int) -> None:
        """Where the first read starts: the file offset of cursor ``since``, checked to be
        a line's end."""
        target = offset_of(self.since, self.header, self.journal)
        if target < 0 or target > size:
            self.bad_cursor(size)
        if target:
            handle.seek(target - 1)
            if handle.read(1) != b"\n":
                self.bad_cursor(size)
        self.skip = target
        if self.index is not None:
            self.offset = target
        if self.index is not None and self.item is not None:
            # nothing of the item comes before its submission: a wait from cursor 0 on a
            # long journal reads from there (what the index read since is not read again)
            with self.index.lock:
                self.index.refresh()
                begins = self.index.first.get(self.item)
                same = self.index.file == self.file and self.index.header == self.header
            if begins is not None and same and begins - self.header.base > target:
                self.offset = begins - self.header.base

    def bad_cursor(self, size: int) -> None:
        raise DagrunnerError(
            "watch-cursor",
            f"cursor {self.since} is not the end of a journal line (the journal ends at "
            f"cursor {self.header.base + size})",
            where=str(self.journal),
            hint="pass a cursor that an event gave, or 0 to read from the start",
        )

    def parse(self, raw: bytes, offset: int) -> Event | None:
        try:
            line = JournalLine.from_json(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return None  # a line a crash cut short
        if line is None:
            return None
        cursor = self.header.base + offset
        if self.index is not None:
            first = self.index.first.get(line.id) == cursor - len(raw) - 1  # where it begins
            known = self.index.entries.get(line.id)
            if known is not None:
                self.who[line.id] = (known.mission, known.worker)
        else:
            first = line.id not in self.who
        if first or line.mission or line.id not in self.who:
            self.who[line.id] = (line.mission, line.worker)
        if offset <= self.skip:
            return None
        mission, worker = self.who[line.id]
        return Event(
            cursor=cursor,
            event=line.event if line.event in NAMED else "submitted" if first else str(line.state),
            id=line.id,
            state=line.state,
            at=line.at,
            mission=mission,
            worker=worker,
            target=line.target,
            details=line.details,
        )


def _follow(reader: JournalReader, follow: bool, timeout: float | None) -> Iterator[Event]:
    """The reader's events as they are journaled, until ``follow`` is off and the journal's
    end is reached, or ``timeout`` seconds have passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        yield from reader.read()
        if not follow or (deadline is not None and time.monotonic() >= deadline):
            return
        time.sleep(POLL)


def watch(
    *,
    repo: Path | None = None,
    since: int = 0,
    follow: bool = True,
    timeout: float | None = None,
) -> Iterator[Event]:
    """Every event after cursor ``since``, as it is journaled; ``follow=False`` stops at the
    journal's end, ``timeout`` (seconds) stops following after that long."""
    yield from _follow(JournalReader(Queue.of(repo_info(repo)).journal, since), follow, timeout)


def wait_for(
    envelope_id: str, *, repo: Path | None = None, timeout: float | None = None
) -> Iterator[Event]:
    """The events of one envelope, from its submission until its final state (whoever runs
    the integrator).  Raises ``wait-timeout`` (exit 124) when ``timeout`` seconds pass first,
    and ``envelope-unknown`` when it was never submitted."""
    queue = Queue.of(repo_info(repo))
    if envelope_id not in queue.entries():
        raise DagrunnerError(
            "envelope-unknown",
            f"no envelope {envelope_id[:80]!r} was submitted to this queue",
            where=str(queue.dir),
            hint="submit it first (integrate submit), or check the id (integrate status)",
        )
    for event in _follow(JournalReader(queue.journal), True, timeout):
        if event.id == envelope_id:
            yield event
            if event.final:
                return
    raise DagrunnerError(
        "wait-timeout",
        f"envelope {envelope_id} reached no final state in {timeout:g}s",
        where=str(queue.dir),
        exit_code=ExitCode.TIMED_OUT,
        hint="run the integrator (integrate run), or wait longer (--timeout)",
    )


def final_entry(envelope_id: str, *, repo: Path | None = None) -> QueueEntry:
    """The envelope's queue entry (its latest state, with every detail)."""
    return Queue.of(repo_info(repo)).entries()[envelope_id]


# -- figures ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class QueueStats:
    """What the journal says of how the queue does (``integrate stats``)."""

    since: float | None  # seconds back from now (None: the whole journal)
    outcomes: dict[str, int]  # final state -> envelopes
    pending: int
    time_in_queue: tuple[float, ...]  # submission to final state, of the envelopes ended
    gate_runs: int  # gate runs (``gate-run`` events; an older journal: one per envelope and run)
    gate_runs_landed: int  # an older journal's: runs that judged an envelope that landed
    gate_cpu: float | None  # CPU-seconds of the gate runs (None: an older journal)
    wasted: int  # runs cancelled by a reset (a failure ahead, the target moved, urgent):
    # ``gate-run`` events noted ``cancelled`` (a journal before them: its resets)
    flaky: int  # re-runs that passed a gate that had failed
    overlaps: int  # conflicts foreseen at submit

    def quantile(self, q: float) -> float | None:
        ordered = sorted(self.time_in_queue)
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    def to_json(self) -> dict[str, Any]:
        landed = self.outcomes.get("landed", 0)
        return {
            "since": self.since,
            "outcomes": self.outcomes,
            "pending": self.pending,
            "time_in_queue": {
                "count": len(self.time_in_queue),
                "p50": self.quantile(0.5),
                "p95": self.quantile(0.95),
            },
            "gate_runs": self.gate_runs,
            "gate_runs_per_landed": round(
                (self.gate_runs if self.gate_cpu is not None else self.gate_runs_landed) / landed,
                3,
            )
            if landed
            else None,
            "wasted_gate_runs": self.wasted,
            "flaky_reruns": self.flaky,
            "overlaps": self.overlaps,
            "gate_cpu_seconds": None if self.gate_cpu is None else round(self.gate_cpu, 3),
            "gate_cpu_per_landed": round(self.gate_cpu / landed, 3)
            if landed and self.gate_cpu is not None
            else None,
        }

    def to_prometheus(self) -> str:
        """The same figures as Prometheus text metrics (exposition format 0.0.4)."""
        body = self.to_json()
        lines: list[str] = []

        def metric(name: str, kind: str, what: str, samples: list[tuple[str, object]]) -> None:
            lines.extend(
                [f"# HELP dagrunner_queue_{name} {what}", f"# TYPE dagrunner_queue_{name} {kind}"]
            )
            lines.extend(
                f"dagrunner_queue_{name}{labels} {value}"
                for labels, value in samples
                if value is not None
            )

        metric("outcomes_total", "counter", "Envelopes by final state.",
               [(f'{{state="{s}"}}', n) for s, n in sorted(self.outcomes.items())])  # fmt: skip
        metric("pending", "gauge", "Envelopes not yet in a final state.", [("", self.pending)])
        metric("time_in_queue_seconds", "summary", "Submission to final state.", [
            ('{quantile="0.5"}', body["time_in_queue"]["p50"]),
            ('{quantile="0.95"}', body["time_in_queue"]["p95"]),
            ("_count", len(self.time_in_queue)),
            ("_sum", round(sum(self.time_in_queue), 3)),
        ])  # fmt: skip
        metric(
            "gate_runs_total",
            "counter",
            "Gate runs that judged an envelope.",
            [("", self.gate_runs)],
        )
        metric("gate_runs_per_landed", "gauge", "Gate runs per landed envelope.",
               [("", body["gate_runs_per_landed"])])  # fmt: skip
        metric(
            "wasted_gate_runs_total",
            "counter",
            "Gate runs cancelled by a reset.",
            [("", self.wasted)],
        )
        metric(
            "flaky_reruns_total",
            "counter",
            "Re-runs that passed a failed gate.",
            [("", self.flaky)],
        )
        metric("overlaps_total", "counter", "Conflicts foreseen at submit.", [("", self.overlaps)])
        metric("gate_cpu_seconds_total", "counter", "CPU-seconds of the gate runs.",
               [("", body["gate_cpu_seconds"])])  # fmt: skip
        metric("gate_cpu_per_landed", "gauge", "Gate CPU-seconds per landed envelope.",
               [("", body["gate_cpu_per_landed"])])  # fmt: skip
        return "\n".join(lines) + "\n"


def queue_stats(*, repo: Path | None = None, since: float | None = None) -> QueueStats:
    """The queue's figures from its journal; ``since``: only what happened in the last
    ``since`` seconds (an envelope counts when it was submitted or ended then).  The whole
    journal's are kept up by the process's shared index (``/metrics`` parses nothing per
    scrape); a ``since`` answer reads the events."""
    if since is None:
        tally = Queue.of(repo_info(repo)).index().counted()
    else:
        tally = Tally(cutoff=time.time() - since)
        for event in watch(repo=repo, follow=False):
            tally.add(event.event, event.id, event.state, event.at, event.details, event.final)
    return stats_of(tally, since)


def stats_of(tally: Tally, since: float | None) -> QueueStats:
    outcomes: dict[str, int] = {}
    waits: list[float] = []
    for envelope_id, (state, at) in tally.ended.items():
        if tally.cutoff is not None and at < tally.cutoff:
            continue
        outcomes[state] = outcomes.get(state, 0) + 1
        if envelope_id in tally.submitted:
            waits.append(max(0.0, at - tally.submitted[envelope_id]))
    landed = [i for i, (state, _) in tally.ended.items() if state == "landed"]
    return QueueStats(
        since=since,
        outcomes=dict(sorted(outcomes.items())),
        pending=sum(1 for i in tally.submitted if i not in tally.ended),
        time_in_queue=tuple(waits),
        gate_runs=tally.ran if tally.cpu is not None else sum(tally.runs.values()),
        gate_runs_landed=sum(tally.runs.get(i, 0) for i in landed),
        gate_cpu=tally.cpu,
        # an older journal: its resets
        wasted=tally.cancelled if tally.cpu is not None else tally.resets,
        flaky=tally.flaky,
        overlaps=tally.overlaps,
    )


def median_gate_run(*, repo: Path | None = None) -> float | None:
    """The median time from an envelope's last ``gating`` line to its verdict (landed or
    gates-failed), over the journal; None before any (kept up by the shared index)."""
    return Queue.of(repo_info(repo)).index().median_gate_run()
