"""One drain of ``integrate serve`` in a child process (issue 48: serve's memory).

A drain -- the integrator's run: gates, the networkx DAG, the trio scheduler, the report's
templates -- imports about 25 MiB that a long-lived service would otherwise hold for its
whole life, and leaves its allocator's fragments behind it.  So serve keeps only the HTTP
and MCP faces, the journal's index and the integrator lock, and runs each drain as a child
(``python -c ... main``) whose memory goes back to the kernel when it ends.

What the child keeps of serve's guarantees:

- the lock: it inherits serve's open lock file (a ``flock`` belongs to the open file, so it
  holds while either process lives): a serve killed alone leaves no gap in which a second
  integrator could start beside a child still landing;
- signals: it is in serve's process group, so a group SIGTERM/SIGINT reaches it and the
  pipeline's own handler queues its items again; serve passes on a signal sent to its pid
  alone (again each second until the child ends: one that came before the pipeline listened
  is only noted), and the child asks the kernel for SIGTERM when serve dies
  (``PR_SET_PDEATHSIG``);
- waiters: serve watches the journal while the child appends (inotify) and wakes them.

The child's stdout is the result channel (one JSON line); its own prints go to stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError, ExitCode

IN_MODIFY, IN_CREATE, IN_MOVED_TO, IN_NONBLOCK, IN_CLOEXEC = 0x2, 0x100, 0x80, 0x800, 0x80000
PR_SET_PDEATHSIG = 1
TICK = 0.5  # seconds between looks at a stop request while the child runs
FORWARD_EVERY = 1.0  # seconds between signals passed on to a child that has not ended
# the child runs the very code serve runs: its package's folder first on the path
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from dagrunner.agents.drain import main; raise SystemExit(main(sys.argv[2:]))"
)


@dataclass(frozen=True)
class Drained:
    """What one child drain said: its run's ``integrate run --json`` body (None when it had
    nothing to run), or the coded error that kept the run from starting or ending."""

    body: dict[str, Any] | None = None
    error: DagrunnerError | None = None

    @property
    def interrupted(self) -> bool:
        return bool(self.body and self.body.get("interrupted"))

    @property
    def land_blocked(self) -> bool:
        return bool(self.body and self.body.get("land_blocked"))


def watch(folder: Path) -> int | None:
    """An inotify descriptor on ``folder`` (writes, creations, renames), None where the
    kernel has none."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, str(folder).encode(), IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0:
        os.close(fd)
        return None
    return fd


def drain_in_child(
    *,
    repo: Path | None,
    target: str,
    executor: str,
    env: Mapping[str, str],
    lock_fd: int,
    stop: list[str],
    journal: Path,
    on_change: Callable[[], None],
    cleanups: bool = False,
) -> Drained:
    """Run one drain in a child and wait for it, waking ``on_change`` whenever the journal
    changes meanwhile; ``cleanups``: first finish what a killed predecessor left."""
    command = [sys.executable, "-c", BOOT, str(Path(__file__).resolve().parents[2]),
               "--target", target, "--executor", executor, "--parent", str(os.getpid()),
               "--lock-fd", str(lock_fd)]  # fmt: skip
    if repo is not None:
        command += ["--repo", str(repo)]
    if cleanups:
        command.append("--cleanups")
    journal.parent.mkdir(parents=True, exist_ok=True)
    watcher = watch(journal.parent)
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(lock_fd,)
    )
    assert child.stdin is not None and child.stdout is not None
    said = b""
    try:
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write(orjson.dumps(dict(env)))
            child.stdin.close()
        said = _follow(child, stop, watcher, on_change)
    finally:
        if watcher is not None:
            os.close(watcher)
        if child.poll() is None:  # serve itself is failing: the child must not outlive it
            child.send_signal(signal.SIGTERM)
            child.wait()
    on_change()
    return _said(said, child.returncode)


def _follow(
    child: subprocess.Popen[bytes], stop: list[str], watcher: int | None,
    on_change: Callable[[], None],
) -> bytes:  # fmt: skip
    """The child's stdout until it ends; the signals serve was sent passed on meanwhile."""
    assert child.stdout is not None
    out, said, forwarded = child.stdout.fileno(), bytearray(), -FORWARD_EVERY
    open_fds = [out] + ([watcher] if watcher is not None else [])
    while out in open_fds:
        if stop and time.monotonic() - forwarded >= FORWARD_EVERY:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.Signals.__members__.get(stop[0], signal.SIGTERM))
            forwarded = time.monotonic()
        try:
            ready, _, _ = select.select(open_fds, [], [], TICK)
        except InterruptedError:
            continue
        if watcher is not None and watcher in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(watcher, 64 * 1024)
            on_change()  # the child appended: the waiters read it now, not at their next look
        if out in ready:
            chunk = os.read(out, 64 * 1024)
            if chunk:
                said += chunk
            else:
                open_fds.remove(out)
    child.wait()
    return bytes(said)


def _said(said: bytes, code: int) -> Drained:
    line = said.strip().splitlines()[-1] if said.strip() else b""
    try:
        body = orjson.loads(line) if line else None
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise DagrunnerError(
            "drain-crashed",
            f"serve's drain ended without a result (exit {code})",
            exit_code=ExitCode.ENVIRONMENT,
            hint="its error is on serve's stderr; the items it had in flight are recovered "
            "by the next integrator (integrate serve or integrate run)",
        )
    if "error" in body:
        e = body["error"]
        return Drained(error=DagrunnerError(
            e["code"], e["message"], hint=e["hint"], exit_code=ExitCode(e["exit_code"]),
            where=e.get("file"), key=e.get("key"), details=e.get("details"),
        ))  # fmt: skip
    return Drained(body=body.get("result"))


# -- the child ------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """The child: one drain, its result as a JSON line on the stdout it was given."""
    import argparse

    out = os.fdopen(os.dup(1), "wb")  # the result channel; anything printed goes to stderr
    os.dup2(2, 1)
    parser = argparse.ArgumentParser(prog="dagrunner-drain")
    parser.add_argument("--repo", type=Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--executor", default="local")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--cleanups", action="store_true")
    parser.add_argument("--lock-fd", type=int)
    args = parser.parse_args(argv)
    if args.lock_fd is not None:  # held by this process; never by a gate or git it starts
        with contextlib.suppress(OSError):
            os.set_inheritable(args.lock_fd, False)
    stop: list[str] = []

    def note(number: int, _frame: object) -> None:
        # the pipeline listens for itself while it runs; outside it a signal is noted (never
        # the default: a second one during the requeue must not end the child half-way)
        stop.append(signal.Signals(number).name)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, note)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != args.parent:  # serve died before the kernel could be asked
        stop.append("SIGTERM")
    env = orjson.loads(sys.stdin.buffer.read() or b"{}")
    try:
        body: dict[str, Any] = {"result": _drain(args, env, stop)}
    except DagrunnerError as exc:
        body = {"error": {**exc.to_json(), "exit_code": int(exc.exit_code)}}
    out.write(orjson.dumps(body) + b"\n")
    out.flush()
    return 0


def _drain(args: Any, env: dict[str, str], stop: list[str]) -> dict[str, Any] | None:
    from dagrunner.engine.steps import new_run_id
    from dagrunner.integration.queue import Queue, stuck_on_error
    from dagrunner.integration.recovery import finish_cleanups
    from dagrunner.integration.steps import Integrator
    from dagrunner.worktrees.allocate import open_context

    ctx = open_context(args.repo, env)
    queue = Queue.of(ctx.info, target=args.target)

    def integrator() -> Integrator:
        return Integrator(
            ctx, target=args.target, manifest=None, batch=None, env=env, run_id=new_run_id(),
            executor=args.executor,
        )  # fmt: skip

    if args.cleanups:
        # what a killed predecessor left: landed workers' worktrees it had not cleaned (each
        # run's preflight does it too, but the queue may well be empty now)
        finish_cleanups(integrator())
    if stop or not queue.pending():
        return None
    with stuck_on_error(queue):  # its items say why, to every waiter
        return integrator().run().to_json()
