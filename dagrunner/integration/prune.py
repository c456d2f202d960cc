"""``integrate prune [--keep DUR]``: the queue's state bounded by what is still needed.

Every envelope leaves about 14-24 journal lines (2-3 KB), its stored envelope, a share of a
report folder, a landed proof (a git note) and, from an agent, an inline copy; and every
worktree a few ledger lines.  Pruning keeps every journal line of an item not final, of an
item whose last line is younger than ``keep``, and of the items that wrote the newest
``landing`` line (a checkout a landing left behind is repaired from it) and each target's
newest ``target-red``/``target-green`` line (``integrate status`` says a red target from it).
The rest of the journal goes, with the stored envelopes and the landed proofs of the items
it dropped (a proof on a branch's or tag's tip stays: CI answers from the tip's), the report
folders of runs older than ``keep`` that no kept item names, inline envelopes and agents'
release-check answers older than ``keep``; and the worktree ledger keeps only what its live
worktrees and an allocation a kill left unfinished need (``Ledger.compact``).

Crash-safe: envelopes go first (a journal line without its envelope is final and needs none;
an envelope without a line would read as queued again), then the journal is written whole to
a temporary file, fsynced and renamed over the old one, under the journal's own append lock
(``files.append_line`` re-opens a journal a rename replaced) and the queue lock.  The new
journal begins with a header (``journal.Header``): cursors keep growing across it, a watcher
that had read the old journal to its end resumes without a gap, and an older cursor is
answered ``watch-cursor-compacted``.  The ledger is compacted the same way, after the queue
lock is let go (a cleanup holds the worktrees lock, then the queue's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.engine.landed import NOTES_REF
from dagrunner.errors import DagrunnerError
from dagrunner.files import crash_point
from dagrunner.git.command import IDENTITY, git
from dagrunner.integration.journal import Header, JournalLine, QueueEntry, read_header, when
from dagrunner.integration.queue import Queue
from dagrunner.integration.steps import integrator_lock
from dagrunner.records.integration import FINAL, EnvelopeState
from dagrunner.worktrees.allocate import open_context
from dagrunner.worktrees.ledger import now

DEFAULT_KEEP = 7 * 86400.0  # seconds: a week of final items, for stats and `why`
RUN_LINES = ("target-red", "target-green")


def prune(
    *,
    repo: Path | None = None,
    keep: float = DEFAULT_KEEP,
    dry_run: bool = False,
    held: Path | None = None,
) -> Pruned:
    """``integrate prune``: the journal compacted to what live items (and final ones younger
    than ``keep`` seconds) need, and what only the others needed removed (``prune.py``).
    Every integrator lock of the repository is taken first, never waited for (``held``: the
    one the caller holds, ``serve --prune-every``): ``integrator-busy`` while one runs."""
    ctx = open_context(repo)
    with contextlib.ExitStack() as stack:
        for lock in sorted(ctx.info.state_dir.glob("integrate-*.lock")):
            if held is not None and lock == held:
                continue
            try:
                stack.enter_context(integrator_lock(lock, wait=False))
            except DagrunnerError as exc:
                raise DagrunnerError(
                    exc.code,
                    exc.message,
                    exit_code=exc.exit_code,
                    hint="prune when no integrator runs, or let `integrate serve "
                    "--prune-every DUR` prune as it goes",
                ) from None
        reports = ctx.root / ".integration" / ".reports"
        pruned = prune_queue(Queue.of(ctx.info), reports, keep, dry_run=dry_run)
        # after the queue lock is let go: a cleanup takes the worktrees lock, then the queue's
        before, after = ctx.ledger.compact(dry_run=dry_run)
        notes = drop_notes(ctx.info.root, pruned.landed, dry_run=dry_run)
        return dataclasses.replace(
            pruned, ledger_bytes_before=before, ledger_bytes_after=after, notes_removed=notes
        )


def drop_notes(root: Path, commits: tuple[str, ...], *, dry_run: bool) -> int:
    """Remove the landed proofs (``refs/notes/dagrunner``) on ``commits``, in one notes
    commit, except one on the tip of a branch or tag: ``release-check --reuse-landed``
    answers from the proof on the commit it checks, which is a tip.  Another commit's CI
    without its proof runs every gate: slower, never a wrong pass.  How many (would) go."""
    if not commits:
        return 0
    listed = git(["notes", f"--ref={NOTES_REF}", "list"], cwd=root, check=False)
    noted = {line.split()[1] for line in listed.text.splitlines() if len(line.split()) == 2}
    tips = git(
        ["for-each-ref", "--format=%(objectname) %(*objectname)", "refs/heads", "refs/remotes",
         "refs/tags"],
        cwd=root,
    ).text.split()  # fmt: skip
    drop = sorted((set(commits) & noted) - set(tips))
    if drop and not dry_run:
        git(
            ["notes", f"--ref={NOTES_REF}", "remove", "--ignore-missing", "--stdin"],
            cwd=root,
            input="\n".join(drop).encode() + b"\n",
            env=IDENTITY,
        )
    return len(drop)


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
