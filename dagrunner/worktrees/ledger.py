"""The worktree ledger (DESIGN.md's "allocation manifest"): an append-only JSON-lines
record of every worktree event.

Lives under the repository's common git dir (``.git/dagrunner/allocations.jsonl``).
Each event is one line written with a single ``write`` under an exclusive lock
and fsynced, so a reader never sees a torn line (and skips a line a crash cut
short).  The current state of each worktree is the fold of
its events.  ``compact`` (``integrate prune``) drops the lines no fold reads any more:
those of removed worktrees, so the ledger's size follows the live worktrees, not history.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.files import append_line, atomic_write, crash_point, locked, read_lines, text_of
from dagrunner.manifest.settings import seed_path
from dagrunner.records.worktree import SeedUse

SEED_KEY = re.compile(r"[0-9a-f]{32}")

EVENTS = {
    "allocating",  # an allocation begun: what to undo if it never reaches "allocated"
    "allocated",
    "claimed",
    "released",
    "exported",
    "retained",
    "cleaned",
    "pooled",
    "missing",
    "pruned",
    "synced",  # moved onto the target's tip (worktree sync): a new base
}


def _ports(raw: object) -> tuple[int, ...]:
    """The ports of an ``allocated`` line (anything else in it reads as none)."""
    if not isinstance(raw, list):
        return ()
    return tuple(p for p in raw if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536)


def _seeds(raw: object) -> tuple[SeedUse, ...]:
    """The seeds of an ``allocated`` line: only well-formed ones (a forged line names at
    most a key, only ever a folder of the store, and a path inside its worktree)."""
    if not isinstance(raw, list):
        return ()
    found = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        path, key, how = item.get("path"), item.get("key"), item.get("how")
        if (
            isinstance(path, str)
            and isinstance(key, str)
            and SEED_KEY.fullmatch(key)
            and how in ("reflink", "overlay", "copy")
        ):
            try:
                found.append(SeedUse(path=seed_path(path), key=key, how=str(how)))
            except ValueError:
                continue
    return tuple(found)


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class Ledger:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / "allocations.jsonl"

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Serialise allocations and cleanups of this repository (across processes)."""
        with locked(self.dir / "worktrees.lock"):
            yield

    def append(self, event: str, wt_id: str, **fields: Any) -> str:
        """Write one event (fsynced); its time."""
        assert event in EVENTS, event
        at = now()
        append_line(self.path, orjson.dumps({"at": at, "event": event, "id": wt_id, **fields}))
        return at

    def events(self) -> list[dict[str, Any]]:
        """The raw events, oldest first (the file's own shape)."""
        return read_lines(self.path)

    def unfinished(self) -> dict[str, dict[str, Any]]:
        """Worktree id -> the allocation a killed process began and never recorded as done."""
        begun: dict[str, dict[str, Any]] = {}
        for event in self.events():
            wt_id, kind = event.get("id"), event.get("event")
            if isinstance(wt_id, str) and kind == "allocating":
                begun[wt_id] = event
            elif isinstance(wt_id, str) and kind in ("allocated", "pruned"):
                begun.pop(wt_id, None)
        return begun

    def compact(self, *, dry_run: bool = False) -> tuple[int, int]:
        """Keep only the lines ``state`` and ``unfinished`` read: a live worktree's from its
        last ``allocated`` on, and the ``allocating`` line of an allocation a kill left
        unfinished; the lines of removed worktrees go.  Both read the same after.  Written
        whole to a temporary file, fsynced and renamed over the ledger under the worktrees
        lock and the ledger's own append lock (``append_line`` waits, then appends to the
        new file): a kill leaves the old ledger or the new one.  Its size (bytes) before
        and after."""
        with self.exclusive():
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return 0, 0
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                with os.fdopen(os.dup(fd), "rb") as handle:
                    data = handle.read()
                kept = b"".join(needed_lines(data))
                if len(kept) < len(data) and not dry_run:
                    crash_point("compacting-ledger")
                    atomic_write(self.path, kept)
            finally:
                os.close(fd)
        return len(data), len(kept)

    def state(self) -> dict[str, WorktreeRecord]:
        """Each worktree's current state, from its events (removed ones are left out)."""
        states: dict[str, WorktreeRecord] = {}
        for event in self.events():
            wt_id, kind, at = event.get("id"), event.get("event"), event.get("at")
            if not isinstance(wt_id, str) or not isinstance(at, str):
                continue  # not a line this ledger writes
            if kind == "allocated":
                states[wt_id] = WorktreeRecord(
                    id=wt_id,
                    path=str(event.get("path")),
                    branch=str(event.get("branch")),
                    base=str(event.get("base")),
                    created=at,
                    last_activity=at,
                    session=text_of(event.get("session")),
                    ports=_ports(event.get("ports")),
                    seeds=_seeds(event.get("seeds")),
                )
                continue
            state = states.get(wt_id)
            if state is None:
                continue
            if kind in ("cleaned", "pooled", "pruned"):
                states.pop(wt_id)
                continue
            change: dict[str, Any] = {"last_activity": at}
            if kind == "claimed":
                change["session"] = text_of(event.get("session"))
            elif kind == "released":
                change["session"] = None
            elif kind == "retained":
                change["retained"] = text_of(event.get("reason"))
            elif kind == "missing":
                change["missing"] = True
            elif kind == "synced":
                change["base"] = str(event.get("base"))
            elif kind == "exported":
                change["exports"] = (*state.exports, ExportRecord.from_event(event))
            states[wt_id] = dataclasses.replace(state, **change)
        return states


def needed_lines(data: bytes) -> list[bytes]:
    """The lines of a ledger's ``data`` that its folds still read (``Ledger.compact``),
    each ending in a newline, in their order."""
    lines: list[tuple[bytes, str | None, object, object]] = []
    for raw in data.split(b"\n"):
        with contextlib.suppress(orjson.JSONDecodeError):
            event = orjson.loads(raw) if raw.strip() else None
            if isinstance(event, dict):
                lines.append((raw + b"\n", text_of(event.get("id")), event.get("event"),
                              event.get("at")))  # fmt: skip
    since: dict[str, int] = {}  # live worktree -> index of its last "allocated" line
    begun: dict[str, int] = {}  # unfinished allocation -> index of its "allocating" line
    for index, (_, wt_id, kind, at) in enumerate(lines):
        if wt_id is None:
            continue
        if kind == "allocating":  # as ``unfinished`` reads it
            begun[wt_id] = index
        elif kind in ("allocated", "pruned"):
            begun.pop(wt_id, None)
        if not isinstance(at, str):
            continue  # as ``state`` reads it
        if kind == "allocated":
            since[wt_id] = index
        elif kind in ("cleaned", "pooled", "pruned"):
            since.pop(wt_id, None)
    return [
        raw
        for index, (raw, wt_id, _, _) in enumerate(lines)
        if wt_id is not None
        and (index >= since.get(wt_id, len(lines)) or begun.get(wt_id) == index)
    ]


@dataclass(frozen=True)
class ExportRecord:
    """One recorded export: the proof that a worktree produced an envelope."""

    envelope: str | None
    tree: str | None
    diff_sha256: str | None
    session: str | None  # the session that held the worktree when it exported
    file: str | None

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> ExportRecord:
        return cls(
            envelope=text_of(event.get("envelope")),
            tree=text_of(event.get("tree")),
            diff_sha256=text_of(event.get("diff_sha256")),
            session=text_of(event.get("session")),
            file=text_of(event.get("file")),
        )


@dataclass(frozen=True)
class WorktreeRecord:
    """A worktree as the ledger knows it: the fold of its events."""

    id: str
    path: str
    branch: str
    base: str
    created: str
    last_activity: str
    session: str | None = None  # the session that holds its claim
    retained: str | None = None  # why a cleanup last kept it
    missing: bool = False  # its folder was found gone
    exports: tuple[ExportRecord, ...] = ()
    ports: tuple[int, ...] = ()  # leased at allocation ([worktrees] ports)
    seeds: tuple[SeedUse, ...] = ()  # provisioned at allocation ([[worktrees.seed]])

    def export_of(self, envelope_id: str) -> ExportRecord | None:
        """The latest recorded export of ``envelope_id`` from this worktree."""
        found = [e for e in self.exports if e.envelope == envelope_id]
        return found[-1] if found else None

    def exported(self, envelope_id: str, tree: str, diff_sha256: str) -> ExportRecord | None:
        """The recorded export of exactly that envelope (id, tree and diff) from this
        worktree: the proof that it produced it."""
        found = self.export_of(envelope_id)
        if found is None or found.tree != tree or found.diff_sha256 != diff_sha256:
            return None
        return found
