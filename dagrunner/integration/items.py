"""What the integration pipeline tracks per queue item: its stage, its speculative head
and tree, and the verdicts its gate runs send back (``pipeline.py`` drives them)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from dagrunner.engine.landed import GateProof
from dagrunner.manifest.load import Manifest
from dagrunner.records.integration import Speculation, Verdict

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope

MAX_AUTO_WINDOW = 4


class Stage(enum.Enum):
    WAITING = "waiting"  # to be built on the speculative head
    BUILT = "built"  # applied on it, its gates not started yet
    GATING = "gating"
    PASSED = "passed"
    SUSPECT = "suspect"  # failed while an item ahead was undecided: confirmed once they pass
    FAILED = "failed"  # confirmed: judged when it reaches the front
    DEFERRED = "deferred"  # conflicts on a speculative head: built again at the front


@dataclass(eq=False)
class Item:
    envelopes: list[Envelope]
    stage: Stage = Stage.WAITING
    generation: int = 0  # a reset makes the runs of earlier generations stale
    base: str = ""  # the speculative head it was applied on
    commit: str = ""  # its tree: what lands
    manifest: Path | None = None
    applied: list[tuple[Envelope, str]] = field(default_factory=list)
    confirms: int = 0
    failing: tuple[str, ...] = ()
    flaky: tuple[str, ...] = ()
    report: str = ""
    scope: trio.CancelScope | None = None
    slot: Path | None = None  # the worktree it was just built in, until its run takes it
    proven: Mapping[str, GateProof] = field(default_factory=dict)  # its landed proof's gates

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(e.id for e in self.envelopes)


@dataclass(frozen=True)
class Finished:
    """One gate run's verdict, sent from its task to the controller."""

    item: Item
    generation: int
    passed: bool
    failing: tuple[str, ...]
    report: str
    confirm: bool
    proven: Mapping[str, GateProof] = field(default_factory=dict)  # what passed on its tree


def auto_window(manifest: Manifest, cpu: float) -> int:
    """The adaptive ceiling: as many whole gate runs as the governor's CPU holds (1 to 4)."""
    need = sum(gate.cpu for gate in manifest.gates.values()) or 1.0
    return max(1, min(MAX_AUTO_WINDOW, int(cpu // need)))


@dataclass(frozen=True)
class GateRun:
    """One gate run of an item, as it was when launched (a reset item changes; this does not)."""

    item: Item
    number: int
    position: int
    confirm: bool
    generation: int
    base: str
    commit: str
    manifest: Path | None
    only: tuple[str, ...]
    ids: tuple[str, ...]
    scope: trio.CancelScope
    slot: Path | None  # built there; None: take a free one and move it to ``commit``

    def speculation(
        self, finished: Finished | None, start: float, end: float, report: str
    ) -> Speculation:
        """This run as the report's timeline draws it."""
        if finished is None or self.generation != self.item.generation:
            verdict = Verdict.CANCELLED
        elif finished.passed:
            verdict = Verdict.FLAKY if self.confirm else Verdict.PASSED
        else:
            verdict = Verdict.CONFIRMED if self.confirm else Verdict.FAILED
        return Speculation(
            gate_run=self.number,
            envelopes=self.ids,
            head=self.base,
            commit=self.commit,
            position=self.position,
            start=start,
            end=end,
            verdict=verdict,
            confirm=self.confirm,
            gates=finished.failing if finished else (),
            report=report,
        )
