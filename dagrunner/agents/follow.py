"""Following a queue item, as an agent does: ``wait`` (bounded, resumable, cancellable),
``why`` (what ended it, or what holds it) and ``status`` (the queue and the integrator's
health).

Every answer says what to do next (``next``).  An item the queue cannot move -- an
integrator that cannot start, a landing refused, a target that cannot be gated -- carries a
``stuck`` event in the journal (``Queue.stuck``); ``wait`` and ``why`` answer it as ``stuck:
{code, message, hint}`` at once, so an agent never waits on a queue that is not moving
without knowing why.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from dagrunner.agents.tools import HANDLE_PREFIX, MAX_WAIT, Binding
from dagrunner.errors import DagrunnerError
from dagrunner.integration.queue import Queue, QueueEntry
from dagrunner.records.integration import FINAL, EnvelopeState
from dagrunner.worktrees.allocate import open_context, split_id

MARGIN = 1.5  # seconds a wait keeps for answering: the whole call stays within its bound
TICK = 0.5  # seconds between looks at the queue

NEXT = {
    EnvelopeState.LANDED: "nothing: it landed (commit); dagrunner_cleanup your worktree",
    EnvelopeState.GATES_FAILED: "dagrunner_why names the failed gates and tests: fix them in "
    "your worktree and dagrunner_submit again (requeue=true when the failure was the "
    "machine's, not your change's)",
    EnvelopeState.CONFLICT: "dagrunner_sync your worktree: it merges what landed in and "
    "leaves conflict markers (landed / yours) in the files it lists; resolve them, then "
    "dagrunner_submit again",
    EnvelopeState.REJECTED: "dagrunner_why says why it was refused (reason): fix that, "
    "then dagrunner_submit again",
    EnvelopeState.WITHDRAWN: "nothing: it was withdrawn and never lands; dagrunner_submit "
    "with requeue=true queues the same work again",
}
WAITING = "not final yet: dagrunner_wait again with the cursor"


def cause(entry: QueueEntry) -> dict[str, Any] | None:
    """What holds ``entry`` (its last line's ``stuck``), as an agent reads it."""
    said = entry.details
    if entry.state in FINAL or said.stuck is None:
        return None
    return {"code": said.stuck, "message": said.note or "", "hint": said.hint or "",
            "since": entry.updated}  # fmt: skip


def _next(entry: QueueEntry, stuck: dict[str, Any] | None) -> str:
    if stuck is not None:
        return f"the queue cannot move it now ({stuck['code']}): {stuck['hint']}; dagrunner_wait again (or dagrunner_withdraw it)"
    return NEXT.get(entry.state, WAITING)


def wait(
    b: Binding,
    item: str,
    timeout_seconds: float,
    cursor: int = 0,
    progress: Callable[[float, str], None] | None = None,
    *,
    began: float | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Within ``timeout_seconds`` (at most ``MAX_WAIT``, counted from ``began``, all
    included): ``{id, state, final, cursor, events, eta_seconds, next}``, with ``stuck``
    when the queue cannot move it and ``commit`` once it landed.  It answers early when it
    is final, or when a ``stuck`` event is news since ``cursor``; ``stop`` ends it at once
    (its caller went)."""
    began = time.monotonic() if began is None else began
    stop = stop or threading.Event()
    if item.startswith(HANDLE_PREFIX):
        return _wait_run(b, item, timeout_seconds, progress, began, stop)
    from dagrunner.integration.events import JournalReader

    entry = b.own_item(item)
    bound = max(0.0, min(float(timeout_seconds), MAX_WAIT) - MARGIN)
    deadline = began + bound
    seen: list[dict[str, Any]] = []
    # One shared index of the journal per process and a reader that starts at the cursor:
    # a look costs what was appended since, and waiters sleep until this process appends
    # (or a cheap stat shows another did) -- no parse of the whole journal, no git.
    queue = Queue.of(open_context(b.repo).info)
    index = queue.index()
    reader = JournalReader(queue.journal, since=cursor, index=index, only=item)
    generation = index.generation
    while True:
        news = False
        for event in reader.read():  # the events, then the state they lead to: a final
            cursor = event.cursor  # answer carries its landed event, with the commit
            seen.append(event.to_json())
            news = news or event.event == "stuck"
        entry = index.entries.get(item, entry)
        left = deadline - time.monotonic()
        if entry.state in FINAL or (news and cause(entry)) or left <= 0 or stop.is_set():
            break
        if progress is not None:
            progress(time.monotonic() - began, f"{item}: {entry.state}")
        generation = index.wait_change(generation, min(TICK, left))
    stuck = cause(entry)
    body: dict[str, Any] = {
        "id": item,
        "state": str(entry.state),
        "final": entry.state in FINAL,
        "cursor": cursor,
        "events": seen,
        "eta_seconds": 0 if entry.state in FINAL else _eta(b, item, deadline + MARGIN),
        "next": _next(entry, stuck),
    }
    if entry.details.commit and entry.state is EnvelopeState.LANDED:
        body["commit"] = entry.details.commit
    if stuck is not None:
        body["stuck"] = stuck
    return body


def _eta(b: Binding, item: str, by: float) -> float | None:
    """``integrate status``'s ``eta_seconds`` of one item, from the shared index (the whole
    status is not built: waiters ask this every time they time out); none when there is no
    time left to compute it."""
    import math

    from dagrunner.integration.run import window_of
    from dagrunner.worktrees.allocate import default_target

    if by - time.monotonic() < MARGIN / 2:
        return None
    ctx = open_context(b.repo)
    queue = Queue.of(ctx.info)
    entries = queue.entries()
    entry = entries.get(item)
    run_seconds = queue.index().median_gate_run()
    if entry is None or entry.state in FINAL or run_seconds is None:
        return None
    default = default_target(ctx)
    goal = entry.target or default
    ahead = [e for e in entries.values() if e.state not in FINAL and (e.target or default) == goal]
    ahead.sort(key=lambda e: -e.priority)  # stable: as the queue takes them
    position = next(n for n, e in enumerate(ahead, 1) if e.id == item)
    return round(math.ceil(position / window_of(ctx.info.root, goal)) * run_seconds, 1)


LABELS = (  # the conflict hunks as git apply --3way writes them, named for the agent
    (re.compile(r"^([ +-]{0,2})<<<<<<< ours$", re.M), r"\1<<<<<<< landed"),
    (re.compile(r"^([ +-]{0,2})>>>>>>> theirs$", re.M), r"\1>>>>>>> yours"),
)


def why(b: Binding, item: str) -> dict[str, Any]:
    """Why ``item`` did not land, or what holds it: its failed gates with their reasons,
    failed tests and log tails; its conflicting paths and hunks; the cause that holds it;
    and what to do next."""
    entry = b.own_item(item)
    said = entry.details
    stuck = cause(entry)
    body: dict[str, Any] = {"id": item, "state": str(entry.state),
                            "final": entry.state in FINAL, "next": _next(entry, stuck)}  # fmt: skip
    if stuck is not None:
        body["stuck"] = stuck
    if said.failed_gates and entry.state is EnvelopeState.GATES_FAILED:
        body["failed_gates"] = _failures(Path(said.report)) if said.report else []
    elif said.conflicts and entry.state is EnvelopeState.CONFLICT:
        hunks = said.hunks or ""
        for pattern, label in LABELS:
            hunks = pattern.sub(label, hunks)
        body |= {"conflicts": list(said.conflicts), "hunks": hunks, "reason": said.reason or ""}
        body["hunk_labels"] = {"landed": "what the target has now", "yours": "your change"}
    elif entry.state in FINAL:
        body["reason"] = said.reason or ("landed" if said.commit else "")
    if said.commit and entry.state is EnvelopeState.LANDED:
        body["commit"] = said.commit
    return body


def _failures(run_dir: Path) -> list[dict[str, Any]]:
    from dagrunner.records.failures import case_name
    from dagrunner.report.logtail import failure_excerpt, read_log, strip_ansi
    from dagrunner.report.rundir import read_run_dir

    try:
        record = read_run_dir(run_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    found = []
    for gate in record.gates:
        if not gate.status.failed or not gate.attempts:
            continue
        log = strip_ansi(read_log(run_dir, gate.attempts[-1].log, limit=64 * 1024))
        tests = [
            {"test": case_name(c), "message": c.message}
            for c in (gate.tests.failed if gate.tests else ())
        ]
        found.append(
            {
                "gate": gate.id,
                "reason": gate.reason,
                "failed_tests": tests,
                "log_excerpt": failure_excerpt(log).splitlines()[-60:],
                "log": str(run_dir / gate.attempts[-1].log),
            }
        )
    return found


def status(b: Binding) -> dict[str, Any]:
    """The queue (``integrate status --json``), and the integrator's health: the items it
    cannot move and why, and the integrators this server started (running, or how each
    ended)."""
    from dagrunner.integration.run import queue_status

    body = queue_status(repo=b.repo)
    entries = Queue.of(open_context(b.repo).info).entries()
    if b.worker is not None:
        mission, worker = split_id(b.worker)
        body["envelopes"] = [
            e
            for e in body.get("envelopes", [])
            if (e.get("mission"), e.get("worker")) == (mission, worker)
        ]
    shown = {e.get("id") for e in body["envelopes"]}
    stuck = [{"id": i, **c} for i, e in entries.items() if i in shown and (c := cause(e))]
    body["integrator"] = {
        "healthy": not stuck,
        "stuck": stuck,
        "driven": b.drive,  # this server starts one after a submit (else: integrate serve)
        "runs": {target: dict(run) for target, run in b.driven.items()},
    }
    return body


def _wait_run(
    b: Binding,
    handle: str,
    timeout_seconds: float,
    progress: Callable[[float, str], None] | None,
    began: float,
    stop: threading.Event,
) -> dict[str, Any]:
    if handle not in b.runs:
        raise DagrunnerError(
            "envelope-unknown",
            f"no release check {handle[:80]!r} of this server",
            hint="the handle is the one dagrunner_release_check answered, to this server",
        )
    process, out = b.runs[handle]
    deadline = began + max(0.0, min(float(timeout_seconds), MAX_WAIT) - MARGIN)
    while process.poll() is None and time.monotonic() < deadline and not stop.is_set():
        if progress is not None:
            progress(time.monotonic() - began, f"{handle}: running")
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=min(TICK, max(0.0, deadline - time.monotonic())))
    if process.poll() is None:
        return {"id": handle, "state": "running", "final": False, "cursor": 0, "events": [],
                "next": "dagrunner_wait again"}  # fmt: skip
    try:
        summary = orjson.loads(out.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        summary = {"error": {"code": "internal-error", "message": "no summary was written"}}
    state = str(summary.get("status", "failed")) if isinstance(summary, dict) else "failed"
    return {"id": handle, "state": state, "final": True, "cursor": 0, "events": [],
            "summary": summary, "exit_code": process.returncode,
            "next": "read the summary"}  # fmt: skip
