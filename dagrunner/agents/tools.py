"""What an agent can do, as plain library calls whose answers are the CLI's ``--json``
answers: allocate, submit (export and queue; requeue), withdraw, overlaps, sync (conflicts
left as markers), cleanup, and a release check started in the background; following an
item (wait, why, status) is ``follow``'s.

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
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.integration.queue import URGENT, Queue, QueueEntry
from dagrunner.names import is_safe_id
from dagrunner.records.integration import FINAL, EnvelopeState
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
    driven: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> its last run

    def drive_integrator(self, target: str) -> None:
        """An integrator for ``target`` in the background (the queue drains without anyone
        running ``integrate run``; ``integrate serve`` does it for good): one per target at
        a time, which waits for the lock when another integrator holds it, and is started
        again when it ends with items still pending (they arrived as it finished).  Its
        answer is read when it ends: a coded error it could not journal itself is journaled
        as ``stuck`` on the target's items; ``status`` reports it."""
        if self.driven.get(target, {}).get("running"):
            return
        state_dir = open_context(self.repo).info.state_dir
        out = state_dir / "agent-runs" / f"integrator-{target.replace('/', '--')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "dagrunner", "integrate", "run", "--target", target]
        command += ["--json", *(["--repo", str(self.repo)] if self.repo else [])]
        with out.open("wb") as sink:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink,
                                       stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        run = {"pid": process.pid, "running": True, "exit_code": None, "error": None}
        self.driven[target] = run
        threading.Thread(target=self._reap, args=(target, process, out, run), daemon=True).start()

    def _reap(
        self, target: str, process: subprocess.Popen[bytes], out: Path, run: dict[str, Any]
    ) -> None:
        code = process.wait()
        try:
            said = orjson.loads(out.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            said = {}
        error = said.get("error") if isinstance(said, dict) else None
        run.update(running=False, exit_code=code, error=error)
        queue = Queue.of(open_context(self.repo).info, target=target)
        with contextlib.suppress(OSError, DagrunnerError):
            if isinstance(error, dict):  # journaled once per cause: never started again here
                queue.stuck(str(error.get("code")), str(error.get("message", "")),
                            str(error.get("hint", "")))  # fmt: skip
            elif any(
                e.state not in FINAL and e.target in (None, target) and not e.details.stuck
                for e in queue.entries().values()
            ):
                self.drive_integrator(target)

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
    b: Binding,
    worktree: str | None,
    priority: int | str = 0,
    envelope: str | None = None,
    requeue: bool = False,
) -> dict[str, Any]:
    """Export ``worktree`` and queue its envelope: ``{id, state, position, overlaps,
    provenance}`` and the rest of the submit answer, the export's summary under ``export``.
    Or queue ``envelope``, given inline (a worker on another machine): validated as
    ``integrate submit`` validates a file, and a bound server takes only its worker's.
    ``requeue``: the same work whose item ended gates-failed, rejected or withdrawn is
    queued again as a new item.  Work that changes nothing is refused (``envelope-empty``):
    the queue would only reject it, after everything queued ahead of it."""
    from dagrunner.envelope import parse_envelope
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.submit import submit as queue_it
    from dagrunner.worktrees.export import export_summary

    level = URGENT if priority == "urgent" else priority
    if not isinstance(level, int) or isinstance(level, bool):
        raise DagrunnerError("bad-priority", "priority is a number or urgent", key="priority",
                             hint="give a whole number from -1000 to 1000")  # fmt: skip
    if level == URGENT and not (b.urgent and b.worker is None):
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
        _refuse_empty(parsed.empty, f"{parsed.mission}/{parsed.worker}")
        inbox = info.state_dir / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        file = inbox / f"{uuid.uuid4().hex}.json"
        file.write_bytes(raw)
    elif worktree is not None:
        exported = export_summary(b.own(worktree), repo=b.repo)
        _refuse_empty(exported.empty, worktree)
        file, extra = Path(exported.file), {"export": exported.to_json()}
    else:
        raise DagrunnerError(
            "bad-usage",
            "dagrunner_submit needs a worktree, or an envelope given inline",
            hint="pass worktree: M/W (the one dagrunner_allocate made)",
        )
    (queued,) = queue_it(info, [file], priority=level, requeue=requeue)
    if b.drive and queued.state not in FINAL:
        b.drive_integrator(queued.target)
    return {**queued.to_json(), **extra}


def _refuse_empty(empty: bool, who: str) -> None:
    if empty:
        raise DagrunnerError(
            "envelope-empty",
            f"{who} changes nothing: its worktree is its base",
            exit_code=ExitCode.REFUSED,
            hint="edit files in the worktree first (dagrunner_allocate answered its path), "
            "then submit",
        )


def withdraw(b: Binding, item: str) -> dict[str, Any]:
    """Take queue item ``item`` back while it is queued or gating (``submit.withdraw``)."""
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.submit import withdraw as take_back

    entry = b.own_item(item)
    who = f"{entry.mission}/{entry.worker}" if b.worker else "an agent"
    return take_back(repo_info(b.repo), item, by=who)


def overlaps(b: Binding, target: str | None = None) -> dict[str, Any]:
    from dagrunner.integration.run import overlaps as find

    found = find(repo=b.repo, target=target, only=b.worker)
    return found.to_json()


def sync(b: Binding, worktree: str, target: str | None = None) -> dict[str, Any]:
    """The worktree onto the target's tip; a conflict leaves markers (``sync.marked``)."""
    from dagrunner.worktrees.sync import sync as move

    said = move(b.own(worktree), repo=b.repo, target=target, markers=True)
    return {"conflicts": [], **said}


def cleanup(b: Binding, worktree: str) -> dict[str, Any]:
    """The worktree removed once its work landed; success when it is gone already because
    the integrator removed it after its work landed (the integrator cleans landed workers)."""
    from dagrunner.worktrees.lifecycle import cleanup as clean

    try:
        return clean(b.own(worktree), repo=b.repo)
    except DagrunnerError as exc:
        if exc.code != "unknown-worktree" or not _landed_and_gone(b, worktree):
            raise
    return {"id": worktree, "action": "already-removed",
            "reason": "its work landed and the integrator removed it"}  # fmt: skip


def _landed_and_gone(b: Binding, worktree: str) -> bool:
    mission, worker = split_id(worktree)
    entries = Queue.of(open_context(b.repo).info).entries().values()
    mine = [e for e in entries if (e.mission, e.worker) == (mission, worker)]
    return bool(mine) and mine[-1].state is EnvelopeState.LANDED


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


ECHO = 300  # characters of any text an error gives back: it may quote the caller's input


def error_body(exc: DagrunnerError) -> dict[str, Any]:
    """The coded error object, as the CLI's ``--json`` prints it, with every text bounded
    (a 100,000-character mission is not sent back whole)."""
    body = exc.to_json()
    for key in ("message", "hint", "file", "key"):
        value = body.get(key)
        if isinstance(value, str) and len(value) > ECHO:
            body[key] = f"{value[:ECHO]}... ({len(value)} characters)"
    if len(orjson.dumps(body.get("details", {}))) > 8 * ECHO:
        body["details"] = {"truncated": True}
    return {"error": body}


def bad_arguments(tool: str, exc: ValidationError) -> DagrunnerError:
    """Arguments the schema refuses, as one coded error naming each argument and its rule
    (never its value)."""
    said = []
    for error in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in error["loc"] if not isinstance(p, int)) or "arguments"
        rule = (
            "not an argument of this tool" if error["type"] == "extra_forbidden" else error["msg"]
        )
        said.append(f"{where}: {rule}"[:ECHO])
    code = "bad-priority" if any(s.startswith("priority") for s in said) else "bad-argument"
    return DagrunnerError(code, f"{tool}: " + "; ".join(dict.fromkeys(said)), key=None,
                          hint="see the tool's input schema (tools/list)")  # fmt: skip


def env_repo() -> Path | None:
    """The repository a server serves: ``--repo``, else the current directory's."""
    value = os.environ.get("DAGRUNNER_REPO")
    return Path(value) if value else None
