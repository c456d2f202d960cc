"""What an agent can do, as plain library calls whose answers are the CLI's ``--json``
answers: allocate, submit (export and queue), wait (bounded, resumable), why, status,
overlaps, sync, cleanup, and a release check started in the background.

Every value that arrives here is a worker's: it is validated as the CLI validates it (the
same library calls), and a ``Binding`` to one worktree refuses every other worktree and
every queue item that is not that worktree's (``worker-bound``, exit 4).  No agent submits
as urgent (the queue's pre-emption, which resets what gates behind it) unless the caller
that started an unbound server said so (``urgent-refused``, exit 4).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.integration.queue import URGENT, Queue, QueueEntry
from dagrunner.names import is_safe_id
from dagrunner.records.integration import FINAL
from dagrunner.worktrees.allocate import check_slug, default_target, open_context, split_id

MAX_WAIT = 50.0  # seconds a wait may take: under every agent harness's tool-call limit
HANDLE_PREFIX = "run-"  # a release check started by release_check: its handle


@dataclass
class Binding:
    """The repository a server serves, and the one worktree (``M/W``) it is bound to."""

    repo: Path | None = None
    worker: str | None = None
    drive: bool = True  # start an integrator after a submit when none runs
    # urgency is the operator's: only an unbound server its caller started --allow-urgent
    urgent: bool = False
    runs: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)

    def own(self, wt_id: str) -> str:
        """``wt_id`` when this server may act on it; ``worker-bound`` otherwise."""
        split_id(wt_id)
        if self.worker is not None and wt_id != self.worker:
            raise DagrunnerError(
                "worker-bound",
                f"this server is bound to {self.worker}; {wt_id} is another worker's",
                exit_code=ExitCode.REFUSED,
                hint=f"act on {self.worker} only (the server was started with --worker)",
            )
        return wt_id

    def own_item(self, item: str) -> QueueEntry:
        """The queue entry ``item`` when this server may see it."""
        if not is_safe_id(item):
            raise DagrunnerError(
                "envelope-name",
                f"{item[:80]!r} is not a queue item id",
                hint="the id is the one dagrunner_submit answered",
            )
        entry = Queue.of(open_context(self.repo).info).entries().get(item)
        if entry is None:
            raise DagrunnerError(
                "envelope-unknown",
                f"no queue item {item!r}",
                hint="the id is the one dagrunner_submit answered",
            )
        if self.worker is not None and f"{entry.mission}/{entry.worker}" != self.worker:
            self.own(f"{entry.mission}/{entry.worker}")
        return entry


def allocate(
    b: Binding, mission: str, worker: str, base: str | None = None, session: str | None = None
) -> dict[str, Any]:
    from dagrunner.worktrees import allocate as wt

    check_slug("mission", mission)
    check_slug("worker", worker)
    b.own(f"{mission}/{worker}")
    return wt.allocate(mission=mission, worker=worker, repo=b.repo, base=base or "HEAD",
                       session=session)  # fmt: skip


def submit(
    b: Binding, worktree: str | None, priority: int = 0, envelope: str | None = None
) -> dict[str, Any]:
    """Export ``worktree`` and queue its envelope: ``{id, state, position, overlaps,
    provenance}`` and the rest of the submit answer, the export's summary under ``export``.
    Or queue ``envelope``, given inline (a worker on another machine): validated as
    ``integrate submit`` validates a file, and a bound server takes only its worker's."""
    from dagrunner.envelope import parse_envelope
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.submit import submit as queue_it
    from dagrunner.worktrees.export import export_summary

    if priority == URGENT and not (b.urgent and b.worker is None):
        raise DagrunnerError(
            "urgent-refused",
            "an agent's submit cannot be urgent: urgency pre-empts every item and resets what "
            "gates behind it, and is the operator's to give",
            key="priority",
            exit_code=ExitCode.REFUSED,
            hint="submit with a priority from -1000 to 1000; the operator can queue it "
            "urgent with `dagrunner integrate submit ENVELOPE --priority urgent`",
        )
    info = repo_info(b.repo)
    extra: dict[str, Any] = {}
    if envelope is not None:
        raw = envelope.encode("utf-8", "surrogateescape")
        parsed = parse_envelope(raw, where="the inline envelope")  # size, hashes, paths
        b.own(f"{parsed.mission}/{parsed.worker}")
        inbox = info.state_dir / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        file = inbox / f"{uuid.uuid4().hex}.json"
        file.write_bytes(raw)
    elif worktree is not None:
        exported = export_summary(b.own(worktree), repo=b.repo)
        file, extra = Path(exported.file), {"export": exported.to_json()}
    else:
        raise DagrunnerError(
            "bad-usage",
            "dagrunner_submit needs a worktree, or an envelope given inline",
            hint="pass worktree: M/W (the one dagrunner_allocate made)",
        )
    (queued,) = queue_it(info, [file], priority=priority)
    if b.drive and queued.state not in FINAL:
        _drive(b, queued.target)
    return {**queued.to_json(), **extra}


def _drive(b: Binding, target: str) -> None:
    """An integrator for ``target`` in the background, when none holds its lock (the queue
    drains without anyone running ``integrate run``; ``integrate serve`` does it for good)."""
    command = [sys.executable, "-m", "dagrunner", "integrate", "run", "--target", target]
    command += ["--no-wait", "--quiet", *(["--repo", str(b.repo)] if b.repo else [])]
    subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait(
    b: Binding,
    item: str,
    timeout_seconds: float,
    cursor: int = 0,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """Within ``timeout_seconds`` (at most ``MAX_WAIT``): ``{id, state, final, cursor,
    events, eta_seconds}``; call again with the answer's ``cursor`` until ``final``."""
    if item.startswith(HANDLE_PREFIX):
        return _wait_run(b, item, timeout_seconds, progress)
    entry = b.own_item(item)
    from dagrunner.integration.events import JournalReader

    # One shared index of the journal per process and a reader that starts at the cursor:
    # a look costs what was appended since, and the waiters sleep until this process
    # appends (or a cheap stat shows another did) -- no parse of the whole journal, no git.
    queue = Queue.of(open_context(b.repo).info)
    index = queue.index()
    reader = JournalReader(queue.journal, since=cursor, index=index, only=item)
    bound = max(0.0, min(float(timeout_seconds), MAX_WAIT))
    deadline = time.monotonic() + bound
    seen: list[dict[str, Any]] = []
    generation = index.generation
    while True:
        for event in reader.read():
            cursor = event.cursor
            if event.id == item:
                seen.append(event.to_json())
        entry = index.entries.get(item, entry)
        left = deadline - time.monotonic()
        if entry.state in FINAL or left <= 0:
            break
        if progress is not None:
            progress(bound - left, f"{item}: {entry.state}")
        generation = index.wait_change(generation, left)
    return {
        "id": item,
        "state": str(entry.state),
        "final": entry.state in FINAL,
        "cursor": cursor,
        "events": seen,
        "eta_seconds": _eta(b, item) if entry.state not in FINAL else 0,
    }


def _eta(b: Binding, item: str) -> float | None:
    """``integrate status``'s ``eta_seconds`` of one item, from the shared index (the whole
    status answer is not built for it: waiters ask this every time they time out)."""
    import math

    from dagrunner.integration.run import window_of

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


def why(b: Binding, item: str) -> dict[str, Any]:
    """Why ``item`` did not land: its failed gates with their reasons, failed tests and log
    tails, or its conflicting paths and hunks; and what to do next."""
    entry = b.own_item(item)
    said = entry.details
    body: dict[str, Any] = {"id": item, "state": str(entry.state)}
    if said.failed_gates:
        body["failed_gates"] = _failures(Path(said.report)) if said.report else []
        body["next"] = (
            "fix what the failed gates say in your worktree, export and submit again; if the "
            "failure is the machine's, not your change's, submit again with requeue"
        )
    elif said.conflicts:
        body |= {"conflicts": list(said.conflicts), "hunks": said.hunks, "reason": said.reason}
        body["next"] = "dagrunner_sync your worktree onto the target, resolve, then submit again"
    elif entry.state in FINAL:
        body["reason"] = said.reason or ("landed" if said.commit else "")
        body["next"] = "nothing: it landed" if said.commit else "read reason"
    else:
        body["next"] = "it is not final yet: dagrunner_wait"
    return body


def _failures(run_dir: Path) -> list[dict[str, Any]]:
    from dagrunner.records.run import Status
    from dagrunner.report.logtail import failure_excerpt, read_log, strip_ansi
    from dagrunner.report.rundir import read_run_dir

    try:
        record = read_run_dir(run_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    found = []
    for gate in record.gates:
        if gate.status not in (Status.FAILED, Status.TIMED_OUT) or not gate.attempts:
            continue
        log = strip_ansi(read_log(run_dir, gate.attempts[-1].log, limit=64 * 1024))
        tests = [
            {"test": f"{c.suite}::{c.name}" if c.suite else c.name, "message": c.message}
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
    from dagrunner.integration.run import queue_status

    body = queue_status(repo=b.repo)
    if b.worker is not None:
        mission, worker = split_id(b.worker)
        body["envelopes"] = [
            e
            for e in body.get("envelopes", [])
            if (e.get("mission"), e.get("worker")) == (mission, worker)
        ]
    return body


def overlaps(b: Binding, target: str | None = None) -> dict[str, Any]:
    from dagrunner.integration.run import overlaps as find

    found = find(repo=b.repo, target=target, only=b.worker)
    return found.to_json()


def sync(b: Binding, worktree: str, target: str | None = None) -> dict[str, Any]:
    from dagrunner.worktrees.sync import sync as move

    return move(b.own(worktree), repo=b.repo, target=target)


def cleanup(b: Binding, worktree: str) -> dict[str, Any]:
    from dagrunner.worktrees.lifecycle import cleanup as clean

    return clean(b.own(worktree), repo=b.repo)


def release_check(b: Binding) -> dict[str, Any]:
    """A release check of the repository started in the background: its handle, for
    ``wait`` (which answers its summary once it ends)."""
    if b.worker is not None:
        raise DagrunnerError(
            "worker-bound",
            "a worker-bound server does not run the repository's release check",
            exit_code=ExitCode.REFUSED,
            hint="submit your work: the queue's gates judge it",
        )
    ctx = open_context(b.repo)
    handle = f"{HANDLE_PREFIX}{uuid.uuid4().hex[:12]}"
    out = ctx.info.state_dir / "agent-runs" / f"{handle}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "dagrunner", "release-check", "--json", "--quiet",
             "--repo", str(ctx.info.root)],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    b.runs[handle] = (process, out)
    return {"id": handle, "state": "running", "final": False, "target": default_target(ctx)}


def _wait_run(
    b: Binding, handle: str, timeout_seconds: float, progress: Callable[[float, str], None] | None
) -> dict[str, Any]:
    if handle not in b.runs:
        raise DagrunnerError(
            "envelope-unknown",
            f"no release check {handle!r} of this server",
            hint="the handle is the one dagrunner_release_check answered, to this server",
        )
    process, out = b.runs[handle]
    bound = max(0.0, min(float(timeout_seconds), MAX_WAIT))
    began = time.monotonic()
    while process.poll() is None and time.monotonic() - began < bound:
        if progress is not None:
            progress(time.monotonic() - began, f"{handle}: running")
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=min(1.0, max(0.0, bound - (time.monotonic() - began))))
    if process.poll() is None:
        return {"id": handle, "state": "running", "final": False, "cursor": 0, "events": []}
    try:
        summary = orjson.loads(out.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        summary = {"error": {"code": "internal-error", "message": "no summary was written"}}
    state = str(summary.get("status", "failed")) if isinstance(summary, dict) else "failed"
    return {"id": handle, "state": state, "final": True, "cursor": 0, "events": [],
            "summary": summary, "exit_code": process.returncode}  # fmt: skip


def error_json(exc: DagrunnerError) -> str:
    """The coded error object, as the CLI's ``--json`` prints it."""
    return orjson.dumps({"error": exc.to_json()}).decode()


def env_repo() -> Path | None:
    """The repository a server serves: ``--repo``, else the current directory's."""
    value = os.environ.get("DAGRUNNER_REPO")
    return Path(value) if value else None
