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

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.envelope import Envelope, load_envelope, parse_envelope, repo_identity
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import append_line, atomic_write, locked, read_lines, text_of
from dagrunner.git.command import git
from dagrunner.git.repo import RepoInfo, checkout_branch
from dagrunner.integration.foresight import Foreseen, conflicts_ahead, loaded
from dagrunner.names import is_safe_id
from dagrunner.records.integration import FINAL, NO_DETAILS, Details, EnvelopeState
from dagrunner.worktrees.ledger import now


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
            state=line.state,
            submitted=self.submitted,
            mission=line.mission or self.mission,
            worker=line.worker or self.worker,
            source=line.source or self.source,
            updated=line.at or self.updated,
            target=self.target or line.target,
            envelope=self.envelope or line.envelope,
            provenance=self.provenance or line.provenance,
            allow_protected=self.allow_protected or line.allow_protected,
            details=self.details.merged(line.details),
        )


@dataclass(frozen=True)
class Submitted:
    """What ``submit`` did with one file: queued it, or found the very same envelope (id,
    diff and tree) already queued.  ``id`` is the item's id on the queue, which ``--wait``,
    ``status`` and ``watch`` speak of; ``envelope`` is the envelope's own."""

    id: str
    envelope: str
    file: str
    duplicate: bool
    position: int
    state: EnvelopeState
    target: str
    provenance: str
    overlaps: tuple[Foreseen, ...] = ()  # queued ahead and conflicting with it

    def to_json(self) -> dict[str, Any]:
        return {  # new keys go last: orchestrators read this shape
            "id": self.id,
            "file": self.file,
            "duplicate": self.duplicate,
            "position": self.position,
            "state": str(self.state),
            "envelope": self.envelope,
            "target": self.target,
            "provenance": self.provenance,
            "overlaps": [o.to_json() for o in self.overlaps],
        }


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

    def lines(self) -> list[JournalLine]:
        """The journal's lines, oldest first."""
        return [line for raw in read_lines(self.journal) if (line := JournalLine.from_json(raw))]

    def entries(self) -> dict[str, QueueEntry]:
        """Each envelope's latest state and details, in submission order."""
        found: dict[str, QueueEntry] = {}
        for line in self.lines():
            current = found.get(line.id) or QueueEntry(
                id=line.id, state=EnvelopeState.QUEUED, submitted=line.at
            )
            found[line.id] = current.followed_by(line)
        # an envelope file whose "queued" line a crash lost is still submitted
        folder = self.dir / "envelopes"
        if folder.is_dir():
            for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
                found.setdefault(path.stem, QueueEntry(id=path.stem, state=EnvelopeState.QUEUED))
        return found

    def pending(self) -> list[str]:
        """The items not yet final for this queue's target (every target's, without one).
        An item submitted without a target is claimed for this one first, in the journal,
        under the queue lock: no two integrators ever take one item."""
        if self.target is None:
            return [i for i, e in self.entries().items() if e.state not in FINAL]
        with self.lock():
            ours = []
            for item, entry in self.entries().items():
                if entry.state in FINAL or entry.target not in (None, self.target):
                    continue
                if entry.target is None:
                    self.record(item, entry.state, event="claimed")
                ours.append(item)
            return ours

    def load(self, envelope_id: str) -> Envelope:
        """The envelope of queue item ``envelope_id`` (its ``id`` is the item's)."""
        envelope = load_envelope(self.envelope_path(envelope_id))
        if envelope.exported_id == envelope_id:
            return envelope
        return dataclasses.replace(envelope, item=envelope_id)


def check_target(info: RepoInfo, goal: str) -> None:
    """``goal`` must be a branch of this repository (``unknown-target`` otherwise)."""
    if (
        goal.startswith("-")
        or git(["check-ref-format", "--branch", goal], cwd=info.root, check=False).returncode
        or git(
            ["rev-parse", "--verify", "-q", f"refs/heads/{goal}"], cwd=info.root, check=False
        ).returncode
    ):
        raise DagrunnerError(
            "unknown-target",
            f"{goal[:80]!r} is not a branch of this repository",
            hint="pass --target with an existing branch (or check out the branch to land on)",
        )


def same_repository(envelope: Envelope, info: RepoInfo) -> bool:
    """Whether ``envelope`` says it came from this repository (or a clone of it)."""
    return envelope.repo.same_as(repo_identity(info.root))


def provenance(info: RepoInfo, envelope: Envelope) -> str:
    """``ledger`` when the ledger records that the worktree the envelope names exported
    exactly it (id, tree and diff); otherwise ``unproven: <why>``."""
    from dagrunner.worktrees.ledger import Ledger

    state = Ledger(info.state_dir).state().get(f"{envelope.mission}/{envelope.worker}")
    if state is None:
        return f"unproven: no worktree {envelope.mission}/{envelope.worker} is recorded here"
    if state.exported(envelope.exported_id, envelope.tree, envelope.diff_sha256) is None:
        return "unproven: the ledger records no export of it from that worktree"
    return "ledger"


def _item_id(queue: Queue, envelope: Envelope, known: dict[str, QueueEntry]) -> str:
    """The queue item that is (or would be) ``envelope``: its id, unless an item of other
    content holds the id; then the id with its diff's hash."""
    for item in (envelope.id, f"{envelope.id}.{envelope.diff_sha256[:12]}"):
        if item not in known:
            return item
        try:
            held = queue.load(item)
        except DagrunnerError:
            continue  # an unreadable stored envelope answers for nothing
        if (held.exported_id, held.diff_sha256, held.tree) == (
            envelope.exported_id,
            envelope.diff_sha256,
            envelope.tree,
        ):
            return item
    raise DagrunnerError(
        "envelope-id-taken",
        f"two other envelopes already hold the id {envelope.id}",
        hint="export the worktree again (a new export has a new tree, so a new id)",
    )


def submit(
    info: RepoInfo,
    files: Iterable[Path],
    *,
    target: str | None = None,
    allow_protected: bool = False,
) -> list[Submitted]:
    """Put envelopes on the queue (durably) for ``target`` (default: the branch of the main
    checkout) and return each one's position.

    Every file is validated first; a bad one raises (exit 2) and nothing is queued.
    The same envelope (id, diff and tree) is not queued twice; another with its id is
    queued as its own item (module doc).
    """
    goal = target or checkout_branch(info)
    check_target(info, goal)
    envelopes: list[tuple[Path, Envelope, bytes]] = []
    for path in files:
        # Read once, validate those bytes, store those bytes: no second read can differ.
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DagrunnerError(
                "envelope-unreadable",
                exc.strerror or str(exc),
                where=str(path),
                hint="check the path",
            ) from None
        envelope = parse_envelope(raw, where=str(path))
        if not same_repository(envelope, info):
            raise DagrunnerError(
                "envelope-foreign-repo",
                "the envelope was exported from another repository",
                where=str(path),
                hint="submit it to the repository its worktree belongs to",
            )
        envelopes.append((path, envelope, raw))
    queue = Queue.of(info, target=goal)
    results: list[Submitted] = []
    with queue.lock():
        known = queue.entries()
        for path, envelope, raw in envelopes:
            order = list(known)
            item = _item_id(queue, envelope, known)
            proof = provenance(info, envelope)
            if item in known:
                results.append(
                    Submitted(
                        id=item,
                        envelope=envelope.id,
                        file=str(path),
                        duplicate=True,
                        position=order.index(item) + 1,
                        state=known[item].state,
                        target=known[item].target or goal,
                        provenance=known[item].provenance or proof,
                    )
                )
                continue
            origin: dict[str, Any] = {
                "mission": envelope.mission,
                "worker": envelope.worker,
                "source": str(path),
            }
            if allow_protected:
                origin["allow_protected"] = True
            if item != envelope.id:
                origin["envelope"] = envelope.id
            ahead = [
                i for i, e in known.items() if e.state not in FINAL and e.target in (None, goal)
            ]
            try:
                atomic_write(queue.envelope_path(item), raw)
                queue.record(item, EnvelopeState.QUEUED, NO_DETAILS, provenance=proof, **origin)
                overlaps = conflicts_ahead(info, envelope, loaded(queue.load, ahead))
                for seen in overlaps:
                    queue.record(item, EnvelopeState.QUEUED, seen.details(), event="overlap")
            except OSError as exc:
                # atomic_write leaves nothing behind; a file without its line is not queued
                queue.envelope_path(item).unlink(missing_ok=True)
                raise DagrunnerError(
                    "queue-write-failed",
                    f"could not store the envelope: {exc.strerror or exc}",
                    where=str(queue.dir),
                    exit_code=ExitCode.ENVIRONMENT,
                    details={"queued_before": [r.id for r in results]},
                    hint="free disk space (or fix permissions) under the queue folder, then "
                    "submit again; envelopes listed as queued_before are already queued",
                ) from None
            known[item] = QueueEntry(
                id=item, state=EnvelopeState.QUEUED, target=goal, provenance=proof
            )
            results.append(
                Submitted(
                    id=item,
                    envelope=envelope.id,
                    file=str(path),
                    duplicate=False,
                    position=len(known),
                    state=EnvelopeState.QUEUED,
                    target=goal,
                    provenance=proof,
                    overlaps=tuple(overlaps),
                )
            )
    return results


def submit_files(
    files: Iterable[Path],
    *,
    repo: Path | None = None,
    target: str | None = None,
    allow_protected: bool = False,
) -> list[dict[str, Any]]:
    """``submit`` for the repository at ``repo`` (default: the current directory), as the
    public API and ``integrate submit --json`` give it."""
    from dagrunner.git.repo import repo_info

    submitted = submit(repo_info(repo), files, target=target, allow_protected=allow_protected)
    return [s.to_json() for s in submitted]
