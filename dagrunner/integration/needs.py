"""What the integrator's helpers need of it: ``IntegratorLike``, the one surface that
``landing``, ``recovery`` and ``pipeline`` may use.  ``steps.Integrator`` provides it; the
helpers type against this protocol, so none of them imports ``steps`` back (the room has no
import circle, not even under ``TYPE_CHECKING``).  The run's result is not on it: the
helpers return what they did (``Landing``, ``PipelineTally``) and the integrator records it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from dagrunner.envelope import Envelope
from dagrunner.integration.queue import Queue
from dagrunner.records.integration import (
    Details,
    EnvelopeOutcome,
    EnvelopeState,
    LandOutcome,
)
from dagrunner.worktrees.allocate import Context

Batch = int | Literal["auto"] | None  # --batch: N, auto, or None (the manifest's, else auto)


class IntegratorLike(Protocol):
    """One integrator run of one target (``steps.Integrator``)."""

    ctx: Context
    repo: Path
    target: str
    ref: str
    batch: Batch  # None: the manifest's, else auto
    env: Mapping[str, str]
    executor: str
    queue: Queue
    wt: Path  # the first integration worktree
    reports: Path
    outcomes: dict[str, EnvelopeOutcome]
    stop: bool
    git_lock: threading.Lock
    guarded: tuple[Path, ...]  # what an envelope's gates may read, never write

    def head(self) -> str: ...
    def prepare_worktree(self, head: str, path: Path | None = None) -> None: ...
    def reset(self, commit: str, path: Path | None = None) -> None: ...
    def slots(self) -> list[Path]: ...
    def manifest_rel(self) -> Path: ...
    def trusted_manifest(self, head: str, tree: Path | None = None) -> Path: ...
    def target_checkout(self) -> Path | None: ...
    def outcome(self, envelope_id: str, state: EnvelopeState, details: Details) -> None: ...
    def finish(self, envelope_id: str, state: EnvelopeState, details: Details) -> None: ...
    def admit(self, envelope_id: str) -> Envelope | None: ...
    def apply(
        self,
        envelope: Envelope,
        wt: Path | None = None,
        *,
        final: bool = True,
    ) -> str | None: ...
    def land(
        self,
        old: str,
        applied: list[tuple[Envelope, str]],
        new: str | None = None,
        *,
        flaky: tuple[str, ...] = (),
    ) -> LandOutcome: ...
    def landed(
        self, applied: list[tuple[Envelope, str]], old: str, new: str, flaky: tuple[str, ...] = ()
    ) -> None: ...
    def clean_workers(self, ids: list[str]) -> dict[str, str]: ...
    def note_workers(self, kept: dict[str, str]) -> None: ...
