"""Putting envelopes on the queue: every file validated first, the same envelope never
queued twice, each item's provenance from the ledger, its priority, and what the submit
foresees -- an envelope that conflicts, on its content, with one queued ahead of it for the
same target is journaled with an ``overlap`` event (both ids, the paths), so an
orchestrator can stop or re-plan that worker before its turn (``integrate watch`` streams
it).  Envelopes whose paths do not meet are never merged (``worktrees/overlaps``); those
that meet are merged once with the combined work of the queue, and pairwise only to name
the culprits of a conflict (``worktrees/foresight``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.envelope import Envelope, parse_envelope
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import atomic_write, crash_point
from dagrunner.git.repo import RepoInfo, check_branch, checkout_branch
from dagrunner.integration.queue import PRIORITIES, URGENT, Queue, QueueEntry, same_repository
from dagrunner.names import is_safe_id
from dagrunner.records.integration import FINAL, NO_DETAILS, Details, EnvelopeState
from dagrunner.worktrees.foresight import Foresight
from dagrunner.worktrees.overlaps import Side, envelope_side, merge, shared

MAX_PATHS = 50  # conflicting paths an overlap event names


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
    """The items ``ahead`` (id, envelope) whose tree conflicts with ``envelope``'s, merged
    pairwise: what ``Foresight.foresee`` finds, at a cost that grows with the queue (kept as
    its peer: ``submit(pairwise=True)``, the benchmark's)."""
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
                if conflict:  # bounded: the journal line is read by every watcher
                    found.append(Foreseen(other_id, paths[:MAX_PATHS]))
    return found


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
    again_of: str = ""  # --requeue: the item whose verdict this one asks again

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
            "again_of": self.again_of or None,
        }


def provenance(state_dir: Path, envelope: Envelope) -> str:
    """``ledger`` when the ledger (in ``state_dir``) records that the worktree the envelope
    names exported exactly it (id, tree and diff); otherwise ``unproven: <why>``."""
    from dagrunner.worktrees.ledger import Ledger

    state = Ledger(state_dir).state().get(f"{envelope.mission}/{envelope.worker}")
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
    priority: int = 0,
    requeue: bool = False,
    pairwise: bool = False,
) -> list[Submitted]:
    """Put envelopes on the queue (durably) for ``target`` (default: the branch of the main
    checkout) and return each one's position.

    Every file is validated first; a bad one raises (exit 2) and nothing is queued.
    The same envelope (id, diff and tree) is not queued twice; another with its id is
    queued as its own item (module doc).  ``requeue``: the same envelope whose item ended
    ``gates-failed`` or ``rejected`` (an environmental failure, the manifest fixed since) is
    queued again as a new item, ``<item>.rN``; the old one keeps its verdict.
    ``pairwise``: foresee overlaps the old way, every envelope ahead read and merged again
    (the benchmark's peer).
    """
    goal = target or checkout_branch(info)
    check_branch(info, goal)
    if priority != URGENT and priority not in PRIORITIES:
        raise DagrunnerError(
            "bad-priority",
            f"priority {priority} is out of range",
            key="--priority",
            hint=f"give a whole number from {PRIORITIES[0]} to {PRIORITIES[-1]}, or urgent",
        )
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
        seer = Foresight.open(
            repo=info.root,
            common=info.common_dir,
            queue_dir=queue.dir,
            target=goal,
            load=queue.load,
        )
        for path, envelope, raw in envelopes:
            order = list(known)
            item = _latest(_item_id(queue, envelope, known), known)
            proof = provenance(info.state_dir, envelope)
            again = ""
            if requeue and item in known and known[item].state in AGAIN:
                again, item = item, _next_try(item, known)
            if item in known and not unsubmitted(known[item]):  # (else: this submit says it)
                results.append(
                    Submitted(
                        id=item,
                        envelope=envelope.id,
                        file=str(path),
                        duplicate=True,
                        position=_position(order[: order.index(item) + 1], known, goal),
                        state=known[item].state,
                        target=known[item].target or goal,
                        provenance=known[item].provenance or proof,
                    )
                )
                continue
            origin = origin_of(envelope, item, path)
            if allow_protected:
                origin["allow_protected"] = True
            if priority:
                origin["priority"] = "urgent" if priority == URGENT else priority
            if again:
                origin["again_of"] = again
            ahead = [
                i
                for i, e in known.items()
                if e.state not in FINAL and e.target in (None, goal) and i != item
            ]
            try:
                atomic_write(queue.envelope_path(item), raw)
                crash_point("submitting")  # stored, not yet journaled: what a kill can leave
                queue.record(item, EnvelopeState.QUEUED, NO_DETAILS, provenance=proof, **origin)
                if pairwise:
                    overlaps = conflicts_ahead(info, envelope, loaded(queue.load, ahead))
                else:
                    overlaps = [  # bounded: the journal line is read by every watcher
                        Foreseen(other, paths[:MAX_PATHS])
                        for other, paths in seer.foresee(item, envelope, ahead)
                    ]
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
            known[item] = QueueEntry(  # as its line says (a mission: submitted)
                id=item, state=EnvelopeState.QUEUED, target=goal, provenance=proof,
                mission=envelope.mission, worker=envelope.worker,
            )  # fmt: skip
            if not pairwise:
                with contextlib.suppress(OSError, DagrunnerError):  # a cache: rebuilt
                    seer.save()
            results.append(
                Submitted(
                    id=item,
                    envelope=envelope.id,
                    file=str(path),
                    duplicate=False,
                    position=len(ahead) + 1,
                    state=EnvelopeState.QUEUED,
                    target=goal,
                    provenance=proof,
                    overlaps=tuple(overlaps),
                    again_of=again,
                )
            )
    return results


def _position(ids: list[str], known: dict[str, QueueEntry], goal: str) -> int:
    """The place of ``ids``' last among its target's pending items (``integrate status``'s
    ``position``): the finished ones ahead of it do not count."""
    pending = [
        i for i in ids[:-1] if known[i].state not in FINAL and known[i].target in (None, goal)
    ]
    return len(pending) + 1


def origin_of(envelope: Envelope, item: str, source: Path) -> dict[str, Any]:
    """What item ``item``'s submission line says of where it comes from."""
    said: dict[str, Any] = {
        "mission": envelope.mission,
        "worker": envelope.worker,
        "source": str(source),
    }
    if item != envelope.exported_id:
        said["envelope"] = envelope.exported_id
    return said


# A submit stores the envelope, then journals its line.  A kill between the two (an MCP
# submit inside a killed ``integrate serve``) leaves an envelope the queue still reads as
# queued; so does a line lost to a fragment a killed writer left before it.  Such an item
# landed naming no mission or worker: ``status`` showed it as nobody's (the soak's lost item
# of issue 48), a worker-bound server hid it from its own worker, and that worker's worktree
# was never cleaned.  So a submit of the same envelope journals it (not a duplicate), and
# the integrator journals its submission from the stored bytes when it admits it.

RESTORED = "journaled by the integrator: the submit that stored it was killed before its line"


def unsubmitted(entry: QueueEntry) -> bool:
    """Whether ``entry`` is queued with no line of its submission in the journal (every
    submission line names the mission; the comment above says how one goes missing)."""
    return entry.mission is None and entry.state is EnvelopeState.QUEUED


def journal_submission(queue: Queue, item: str, envelope: Envelope) -> None:
    """Journal the submission of ``item`` (``unsubmitted``), whose stored envelope the
    integrator admits (``envelope``, the bytes its submit validated), as that submit would
    have: its mission, worker and provenance.  Under the queue lock, read again there: a
    submit of it that came first has said it, and one that comes after finds it said."""
    with queue.lock():
        entry = queue.entries().get(item)
        if entry is None or not unsubmitted(entry):
            return
        said = origin_of(envelope, item, queue.envelope_path(item))
        said["provenance"] = provenance(queue.dir.parent, envelope)
        queue.record(item, EnvelopeState.QUEUED, Details(note=RESTORED), **said)


AGAIN = (EnvelopeState.GATES_FAILED, EnvelopeState.REJECTED, EnvelopeState.WITHDRAWN)  # --requeue


def _latest(item: str, known: dict[str, QueueEntry]) -> str:
    """The newest try of ``item`` on the queue (``item``, ``item.r1``, ``item.r2`` ...)."""
    n = 1
    while f"{item}.r{n}" in known:
        n += 1
    return item if n == 1 else f"{item}.r{n - 1}"


def _next_try(item: str, known: dict[str, QueueEntry]) -> str:
    base, dot, number = item.rpartition(".r")
    first = base if dot and number.isdigit() else item
    n = int(number) + 1 if dot and number.isdigit() else 1
    while f"{first}.r{n}" in known:
        n += 1
    again = f"{first}.r{n}"
    if not is_safe_id(again):
        raise DagrunnerError(
            "envelope-id-taken",
            f"{item} cannot be queued again under a safe id",
            hint="export the worktree again (a new export has a new id)",
        )
    return again


def submit_files(
    files: Iterable[Path],
    *,
    repo: Path | None = None,
    target: str | None = None,
    allow_protected: bool = False,
    priority: int = 0,
) -> list[dict[str, Any]]:
    """``submit`` for the repository at ``repo`` (default: the current directory), as the
    public API and ``integrate submit --json`` give it."""
    from dagrunner.git.repo import repo_info

    submitted = submit(
        repo_info(repo), files, target=target, allow_protected=allow_protected, priority=priority
    )
    return [s.to_json() for s in submitted]


WITHDRAWABLE = (EnvelopeState.QUEUED, EnvelopeState.APPLYING, EnvelopeState.APPLIED,
                EnvelopeState.GATING)  # fmt: skip


def withdraw(info: RepoInfo, item: str, *, by: str = "the operator") -> dict[str, Any]:
    """Take queue item ``item`` back before it lands: journaled final ``withdrawn`` under
    the queue's lock, which the integrator takes to journal ``landing`` (``landing.land``):
    an item withdrawn while it gates never lands, and one already landing cannot be
    withdrawn.  Withdrawing a withdrawn item again answers the same."""
    queue = Queue.of(info)
    queue.envelope_path(item)  # a safe id, or envelope-name
    with queue.lock():
        entry = queue.entries().get(item)
        if entry is None:
            raise DagrunnerError(
                "envelope-unknown",
                f"no queue item {item!r}",
                hint="the id is the one submit answered (integrate status lists them)",
            )
        if entry.state not in WITHDRAWABLE and entry.state is not EnvelopeState.WITHDRAWN:
            raise DagrunnerError(
                "withdraw-too-late",
                f"{item} is {entry.state}: only an item that has not started landing can be "
                "withdrawn",
                exit_code=ExitCode.REFUSED,
                hint="a landed change is undone by a new change that reverts it; a final "
                "item needs no withdrawing",
            )
        already = entry.state is EnvelopeState.WITHDRAWN
        if not already:
            queue.record(item, EnvelopeState.WITHDRAWN, Details(reason=f"withdrawn by {by}"))
    return {"id": item, "state": str(EnvelopeState.WITHDRAWN), "final": True,
            "was": str(entry.state), "already": already}  # fmt: skip
