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
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.envelope import Envelope, load_envelope, repo_identity
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import append_line, crash_point, locked, read_lines
from dagrunner.git.repo import RepoInfo
from dagrunner.integration.journal import (
    PASSING,
    PRIORITIES,
    URGENT,
    Header,
    JournalIndex,
    JournalLine,
    QueueEntry,
    read_header,
    when,
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


def integrator_lock(path: Path, *, wait: bool) -> contextlib.AbstractContextManager[int]:
    """Hold the per-target integrator lock; say who holds it when it is taken."""
    return locked(
        path,
        wait=wait,
        busy=lambda who: DagrunnerError(
            "integrator-busy",
            f"another integrator holds {path.name}: {who}",
            exit_code=ExitCode.REFUSED,
            hint="wait for it, or run without --no-wait to queue behind it",
        ),
        waiting="waiting for the integrator that holds the lock ({})",
    )


# -- compaction (``integrate prune``) ------------------------------------------------------
# Every envelope leaves about 14-24 journal lines (2-3 KB), its stored envelope, a share of a
# report folder and, from an agent, an inline copy.  Compaction keeps every journal line of an
# item not final, of an item whose last line is younger than ``keep``, and of the items that
# wrote the newest ``landing`` line (a checkout a landing left behind is repaired from it) and
# each target's newest ``target-red``/``target-green`` line (``integrate status`` says a red
# target from it).  The rest of the journal goes, with the stored envelopes of the items it
# dropped, the report folders of runs older than ``keep`` that no kept item names, and inline
# envelopes and agents' release-check answers older than ``keep`` (``run.prune`` then
# compacts the worktree ledger and removes the dropped items' landed proofs).
#
# Crash-safe: envelopes go first (a journal line without its envelope is final and needs none;
# an envelope without a line would read as queued again), then the journal is written whole to
# a temporary file, fsynced and renamed over the old one, under the journal's own append lock
# (``files.append_line`` re-opens a journal a rename replaced) and the queue lock.  The new
# journal begins with a header (``journal.Header``): cursors keep growing across it, a watcher
# that had read the old journal to its end resumes without a gap, and an older cursor is
# answered ``watch-cursor-compacted``.

RUN_LINES = ("target-red", "target-green")


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """What a prune removed (or would, with ``dry_run``)."""

    dry_run: bool
    keep_seconds: float
    items_before: int
    items_after: int
    journal_bytes_before: int
    journal_bytes_after: int
    envelopes_removed: int
    reports_removed: int
    inline_removed: int
    landed: tuple[str, ...] = ()  # the commits the dropped items landed (their proofs go)
    notes_removed: int = 0
    ledger_bytes_before: int = 0
    ledger_bytes_after: int = 0
    base: int  # the cursor where the compacted journal's kept lines end (watchers at the
    # old end resume from here)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "keep_seconds": self.keep_seconds,
            "items": {"before": self.items_before, "after": self.items_after},
            "journal_bytes": {
                "before": self.journal_bytes_before,
                "after": self.journal_bytes_after,
            },
            "envelopes_removed": self.envelopes_removed,
            "reports_removed": self.reports_removed,
            "inline_removed": self.inline_removed,
            "notes_removed": self.notes_removed,
            "ledger_bytes": {"before": self.ledger_bytes_before, "after": self.ledger_bytes_after},
            "base": self.base,
        }


@dataclass
class _Journal:
    header: Header
    data: bytes
    lines: list[tuple[bytes, JournalLine | None]]


def _read(data: bytes, header: Header) -> _Journal:
    lines: list[tuple[bytes, JournalLine | None]] = []
    start = 0
    while (end := data.find(b"\n", start)) != -1:
        raw, start = data[start : end + 1], end + 1
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a line a crash cut short: nobody reads it
        if isinstance(parsed, dict) and "compacted" in parsed:
            continue  # the old header: the new one replaces it
        lines.append((raw, JournalLine.from_json(parsed)))
    return _Journal(header, data, lines)


def kept_lines(journal: _Journal, cutoff: float) -> tuple[list[bytes], set[str], set[str]]:
    """The lines a compaction keeps, the items kept and the items dropped."""
    entries: dict[str, QueueEntry] = {}
    last: dict[str, float] = {}
    newest_run: dict[str, int] = {}  # target -> index of its newest red/green line
    newest_landing = -1
    for index, (_, line) in enumerate(journal.lines):
        if line is None:
            continue
        current = entries.get(line.id) or QueueEntry(id=line.id, state=EnvelopeState.QUEUED)
        entries[line.id] = current.followed_by(line)
        last[line.id] = max(last.get(line.id, 0.0), when(line.at) or time.time())
        if line.event in RUN_LINES:
            newest_run[line.target or ""] = index
        if line.state is EnvelopeState.LANDING and line.event is None:
            newest_landing = index
    kept = {i for i, e in entries.items() if e.state not in FINAL or last[i] >= cutoff}
    # the item of the newest landing, and of each target's newest red or green word, is
    # kept whole: what it says is still read (a checkout to repair, a red target)
    for index in {*newest_run.values(), newest_landing} - {-1}:
        if (line := journal.lines[index][1]) is not None:
            kept.add(line.id)
    out = [raw for raw, line in journal.lines if line is not None and line.id in kept]
    return out, kept, set(entries) - kept


def prune_queue(queue: Queue, reports: Path | None, keep: float, *, dry_run: bool) -> Pruned:
    """Compact ``queue``'s journal and remove what only dropped items needed (the caller holds
    every integrator lock it could take: see ``run.prune``)."""
    cutoff = time.time() - keep
    with queue.lock():
        queue.journal.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(queue.journal, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # appenders wait, then find the file replaced
            with os.fdopen(os.dup(fd), "rb") as handle:
                header = read_header(handle)
                handle.seek(0)
                journal = _read(handle.read(), header)
            lines, kept, dropped = kept_lines(journal, cutoff)
            envelopes = [queue.envelope_path(i) for i in sorted(dropped)]
            envelopes = [p for p in envelopes if p.exists()]
            body = b"".join(lines)
            new_header = _header_bytes(header.base + len(journal.data), len(body))
            if not dropped:  # nothing to drop: the journal (and every cursor) stays as it is
                new_header, body = b"", journal.data
            elif not dry_run:
                for path in envelopes:
                    path.unlink(missing_ok=True)
                _fsync_dir(queue.dir / "envelopes")
                crash_point("pruning")  # envelopes gone, the journal not yet compacted
                _replace(queue.journal, new_header + body)
        finally:
            os.close(fd)
    named = {e.details.report for i, e in queue.entries().items() if i in kept}
    removed_reports = _old_folders(reports, cutoff, {Path(r).name for r in named if r}, dry_run)
    state_dir = queue.dir.parent
    inline = _old_files(state_dir / "inbox", cutoff, dry_run)
    inline += _old_files(state_dir / "agent-runs", cutoff, dry_run)
    return Pruned(
        dry_run=dry_run,
        keep_seconds=keep,
        items_before=len(kept) + len(dropped),
        items_after=len(kept),
        journal_bytes_before=len(journal.data),
        journal_bytes_after=len(new_header) + len(body),
        envelopes_removed=len(envelopes),
        reports_removed=removed_reports,
        inline_removed=inline,
        landed=tuple(
            sorted(
                {
                    line.details.commit
                    for _, line in journal.lines
                    if line is not None and line.id in dropped and line.details.commit
                }
            )
        ),
        base=header.base + len(journal.data),
    )


def _header_bytes(base: int, body: int) -> bytes:
    """The header line: ``kept`` is the file offset where the kept lines end, which counts
    the header's own length (found in a step or two: a number's width rarely changes)."""
    kept = body
    while True:
        line = orjson.dumps({"compacted": {"base": base, "kept": kept, "at": now()}}) + b"\n"
        if len(line) + body == kept:
            return line
        kept = len(line) + body


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _old_folders(root: Path | None, cutoff: float, named: set[str], dry_run: bool) -> int:
    if root is None or not root.is_dir():
        return 0
    removed = 0
    for folder in root.iterdir():
        if folder.name in named or folder.is_symlink() or not folder.is_dir():
            continue
        if folder.stat().st_mtime < cutoff:
            removed += 1
            if not dry_run:
                shutil.rmtree(folder, ignore_errors=True)
    return removed


def _old_files(folder: Path, cutoff: float, dry_run: bool) -> int:
    if not folder.is_dir():
        return 0
    removed = 0
    for path in folder.iterdir():
        if path.is_file() and path.stat().st_mtime < cutoff:
            removed += 1
            if not dry_run:
                path.unlink(missing_ok=True)
    return removed
