"""The worktree ledger (DESIGN.md's "allocation manifest"): an append-only JSON-lines
record of every worktree event.

Lives under the repository's common git dir (``.git/dagrunner/allocations.jsonl``).
Each event is one line written with a single ``write`` under an exclusive lock
and fsynced, so a reader never sees a torn line (and skips a line a crash cut
short).  The current state of each worktree is the fold of
its events.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from dagrunner.fsutil import append_line, locked, read_lines

EVENTS = {
    "allocated",
    "claimed",
    "released",
    "exported",
    "retained",
    "cleaned",
    "pooled",
    "missing",
    "pruned",
}


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

    def append(self, event: str, wt_id: str, **fields: Any) -> dict[str, Any]:
        assert event in EVENTS, event
        record = {"at": now(), "event": event, "id": wt_id, **fields}
        append_line(self.path, orjson.dumps(record))
        return record

    def events(self) -> list[dict[str, Any]]:
        return read_lines(self.path)

    def state(self) -> dict[str, dict[str, Any]]:
        """Each worktree's current state, from its events (removed ones are left out)."""
        states: dict[str, dict[str, Any]] = {}
        for event in self.events():
            wt_id = event["id"]
            kind = event["event"]
            if kind == "allocated":
                states[wt_id] = {
                    **event,
                    "created": event["at"],
                    "session": event.get("session"),
                    "last_activity": event["at"],
                }
                continue
            state = states.get(wt_id)
            if state is None:
                continue
            state["last_activity"] = event["at"]
            if kind == "claimed":
                state["session"] = event.get("session")
            elif kind == "released":
                state["session"] = None
            elif kind == "retained":
                state["retained"] = event.get("reason")
            elif kind == "exported":
                record = {
                    k: event.get(k) for k in ("envelope", "tree", "file", "diff_sha256", "session")
                }
                state["exported"] = record
                # Every export, by envelope id: the proof that this worktree produced it.
                state.setdefault("exports", {})[event.get("envelope")] = record
            elif kind in ("cleaned", "pooled", "pruned", "missing"):
                if kind == "missing":
                    state["missing"] = True
                else:
                    states.pop(wt_id)
        return states
