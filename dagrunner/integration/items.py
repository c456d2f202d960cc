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
from dagrunner.records.integration import (
    Speculation,
    Verdict,
)
from dagrunner.records.run import RunRecord

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
    # Built again on the head without the suspect ahead of it (``without``), gated beside
    # it: if the suspect's failure is confirmed, the item goes on from its twin.
    twin: Item | None = None
    without: Item | None = None  # a twin's: the suspect it was built without
    finished: Finished | None = None  # a twin's verdict, when it came before the blame
    priority: int = 0  # its envelopes' (``--priority``; queue.URGENT pre-empts)
    tree: str = ""  # its commit's tree: a tree that failed once in the run is not gated again
    fresh: bool = False  # a batch as admitted from the queue (not a half of a failed one)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(e.id for e in self.envelopes)

    def reset(self) -> Path | None:
        """Back to waiting, in a newer generation (its runs and its twin's are cancelled);
        the slot it was built in when no run took it (the caller gives it back)."""
        self.generation += 1
        for scope in (self.scope, self.twin.scope if self.twin else None):
            if scope is not None:
                scope.cancel()  # the run ends its process trees, then frees its slot
        slot, self.slot, self.twin = self.slot, None, None
        self.stage, self.confirms, self.failing, self.flaky = Stage.WAITING, 0, (), ()
        self.proven, self.applied, self.tree = {}, [], ""
        return slot

    def drop_twin(self, *, without: Item) -> None:
        """Its twin built without ``without`` goes (that item passed): its run is cancelled."""
        if self.twin is not None and self.twin.without is without:
            if self.twin.scope is not None:
                self.twin.scope.cancel()
            self.twin = None

    def adopt(self, twin: Item) -> Path | None:
        """Go on from ``twin`` (the suspect it was built without is blamed): its tree, its run
        (in the generation that run was started for); the slot to give back, as ``reset``."""
        if self.scope is not None:
            self.scope.cancel()
        slot, self.slot, self.twin = self.slot, None, None
        self.generation, self.base, self.commit = twin.generation, twin.base, twin.commit
        self.tree = twin.tree
        self.applied, self.envelopes, self.manifest = twin.applied, twin.envelopes, twin.manifest
        self.scope, self.stage, self.confirms = twin.scope, Stage.GATING, 0
        self.failing, self.flaky, self.proven = (), (), {}
        return slot


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
    tree: str = ""  # the tree it gated
    record: RunRecord | None = None  # the run's own record (its gates' tests, for a baseline)


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
    twin: bool = False  # the item's twin (its generation: the one after the blame)
    tree: str = ""

    def speculation(
        self, finished: Finished | None, start: float, end: float, report: str
    ) -> Speculation:
        """This run as the report's timeline draws it."""
        stale = self.generation != self.item.generation and not (self.twin and finished)
        if finished is None or stale:
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
