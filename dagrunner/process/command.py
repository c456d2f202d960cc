"""The one door for commands that are not gates: worker setup steps, tool fingerprints.

They run the way gates run (``sandbox.run_job``): their own session and
containment, closed stdin, a bounded log, a timeout that ends their whole
process tree, cancellable from trio (Ctrl-C ends the tree too) -- and with an
explicit environment: the caller's without the ``GIT_*`` variables that would
point git at another repository or index (pre-commit's ``no_git_env``).
"""

from __future__ import annotations

import hashlib
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from dagrunner.git.command import KEEP_GIT_ENV
from dagrunner.process.sandbox import GateJob, run_job

OUTPUT_LIMIT = 4 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Finished:
    """How a command ended, with its (bounded) combined output."""

    exit_code: int | None
    timed_out: bool
    error: str  # why it could not start
    output: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def why(self) -> str:
        """A short reason for a failure ('' when it passed)."""
        if self.error:
            return self.error
        if self.timed_out:
            return "timed out; its process tree was ended"
        return "" if self.ok else f"exit code {self.exit_code}"


def without_git(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less the GIT_* variables that redirect git (the harmless ones stay)."""
    return {k: v for k, v in environ.items() if not k.startswith("GIT_") or k in KEEP_GIT_ENV}


def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    own_home: bool = False,
    hide: Path | None = None,
    writable: tuple[str, ...] = (),
) -> Finished:
    """Run ``argv`` in ``cwd`` with exactly ``env`` and wait for it; never raises for its failure.

    ``own_home`` gives it a fresh HOME and TMPDIR as a gate gets; otherwise the
    ones in ``env`` are kept (setup steps may fill the user's package caches).
    ``hide`` is a folder it must not see (the cache store), where containment allows.
    """
    with tempfile.TemporaryDirectory(prefix="dagrunner-cmd-") as tmp:
        job = GateJob(
            gate="command",
            argv=tuple(argv),
            cwd=str(cwd),
            env=env,
            sandbox_dir=f"{tmp}/home",
            log_path=f"{tmp}/out.log",
            log_limit=OUTPUT_LIMIT,
            timeout=timeout,
            grace=1.0,
            hide=str(hide) if hide else None,
            writable=writable,
            keep_home=not own_home,
        )
        result = trio.run(run_job, job)
        output = Path(job.log_path).read_bytes()
    return Finished(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        error=result.error,
        output=output,
    )


TOOL_TIMEOUT = 30.0
TOOL_TEXT_KEPT = 64 * 1024  # of a tool's output, kept beside its hash: explain says what differs


def tool_fingerprint(
    command: str,
    env: Mapping[str, str],
    cwd: Path,
    *,
    hide: Path | None = None,
    writable: tuple[str, ...] = (),
) -> tuple[str, str]:
    """(sha256 of the command's output and exit code, its first line) in the gate's environment.

    The command is untrusted like a gate: it runs through the same door
    (``proc.py``: sandbox, containment, a timeout that ends its whole tree) and writes
    only where the gates may (``writable``: the manifest's ``[sandbox] writable``).
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        argv, output = [], f"unavailable: {exc}".encode()
    if argv:
        done = run_command(
            argv,
            cwd=cwd,
            env=env,
            timeout=TOOL_TIMEOUT,
            own_home=True,
            hide=hide,
            writable=writable,
        )
        status = "timed out" if done.timed_out else f"exit {done.exit_code}"
        output = done.output + f"\n{done.error or status}".encode()
    text = output.decode("utf-8", "replace").strip()
    return hashlib.sha256(output).hexdigest(), text[:TOOL_TEXT_KEPT]
