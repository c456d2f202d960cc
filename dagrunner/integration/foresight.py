"""What a submit foresees: an envelope that conflicts, on its content, with one queued ahead
of it for the same target is journaled with an ``overlap`` event (both ids, the paths), so
an orchestrator can stop or re-plan that worker before its turn (``integrate watch``
streams it).  Envelopes whose paths do not meet are never merged (``worktrees/overlaps``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.git.repo import RepoInfo
from dagrunner.records.integration import Details
from dagrunner.worktrees.overlaps import Side, envelope_side, merge, shared


@dataclass(frozen=True)
class Foreseen:
    other: str  # the item queued ahead
    paths: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"with": self.other, "paths": list(self.paths)}

    def details(self) -> Details:
        return Details(overlaps_with=self.other, overlap_paths=self.paths)


def loaded(load: Callable[[str], Envelope], items: Iterable[str]) -> list[tuple[str, Envelope]]:
    """The envelopes of ``items`` that can be read (a damaged one is integrate's to reject)."""
    found = []
    for item in items:
        with contextlib.suppress(DagrunnerError):
            found.append((item, load(item)))
    return found


def conflicts_ahead(
    info: RepoInfo, envelope: Envelope, ahead: Iterable[tuple[str, Envelope]]
) -> list[Foreseen]:
    """The items ``ahead`` (id, envelope) whose tree conflicts with ``envelope``'s."""
    found: list[Foreseen] = []
    mine: Side | str | None = None
    for other_id, other in ahead:
        if not shared(frozenset(envelope.paths), frozenset(other.paths)):
            continue
        with contextlib.suppress(DagrunnerError):  # a base this repository lacks: no foresight
            mine = mine or envelope_side(info.root, envelope)
            theirs = envelope_side(info.root, other)
            if isinstance(mine, Side) and isinstance(theirs, Side):
                conflict, paths = merge(info.common_dir, mine, theirs)
                if conflict:
                    found.append(Foreseen(other_id, paths))
    return found
