"""The one place that runs git.

Every call is an argument list, runs with an environment cleaned of the
``GIT_*`` variables that would point it at another repository or index, never
prompts, and fails with a :class:`DagrunnerError` carrying git's own first
line of stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.drivers import neutral_drivers, with_overrides

# Inherited GIT_* variables that are safe (they do not redirect git to other data).
KEEP_GIT_ENV = frozenset({"GIT_EXEC_PATH", "GIT_TRACE", "GIT_TRACE2"})
IDENTITY = {
    "GIT_AUTHOR_NAME": "dagrunner",
    "GIT_AUTHOR_EMAIL": "dagrunner@localhost",
    "GIT_COMMITTER_NAME": "dagrunner",
    "GIT_COMMITTER_EMAIL": "dagrunner@localhost",
}


@dataclass(frozen=True)
class GitResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape").strip()

    @property
    def message(self) -> str:
        """git's first line of stderr (what it said went wrong), or its exit code."""
        lines = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return lines[0] if lines else f"git exited with {self.returncode}"


# Settings of the user's git config that would change the formats dagrunner reads and
# writes (an envelope's diff must be git's plain format to validate and to apply),
# pinned to git's defaults for every call (through GIT_CONFIG_COUNT: argv stays readable).
PINNED_CONFIG = {
    "diff.noprefix": "false",
    "diff.mnemonicPrefix": "false",
    "diff.srcPrefix": "a/",
    "diff.dstPrefix": "b/",
    "diff.relative": "false",
    "diff.renames": "true",
    "diff.suppressBlankEmpty": "false",
    "core.quotePath": "true",
    "color.ui": "false",
}
# Keys that make git run a program or read a file a worker or a gate could have written:
# turned off for every git dagrunner runs, in integration and worker worktrees alike.
# The global and system config files are not read at all (git_env): a gate that wrote the
# integrator's ~/.gitconfig (core.fsmonitor = "sh -c ...") would otherwise run code in
# dagrunner's next git call, outside every sandbox.
UNOBEYED_CONFIG = {
    "core.fsmonitor": "false",
    "core.hooksPath": os.devnull,
    "core.sshCommand": "false",
    "core.askPass": "false",
    "core.pager": "cat",
    "credential.helper": "",
    "gpg.program": "false",
    "commit.gpgSign": "false",
    "tag.gpgSign": "false",
}
FORCED_CONFIG = {**PINNED_CONFIG, **UNOBEYED_CONFIG}


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without redirecting GIT_* variables, without the global
    and system config files, with the pinned and unobeyed settings, without optional locks,
    plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in KEEP_GIT_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"
    # No optional lock: reading a checkout (``status`` of the user's, at every allocate)
    # never takes its index.lock, which a killed dagrunner would leave behind (issue 36).
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_SYSTEM"] = os.devnull
    env["LC_ALL"] = "C"
    env["GIT_CONFIG_COUNT"] = str(len(FORCED_CONFIG))
    for i, (key, value) in enumerate(FORCED_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    if extra:
        env.update(extra)
    return env


def driverless_env(
    cwd: Path, args: Sequence[str], extra: Mapping[str, str] | None
) -> dict[str, str]:
    """``git_env(extra)`` with every merge driver and filter the config defines turned off
    (``drivers.py``)."""
    env = git_env(extra)
    return with_overrides(env, neutral_drivers(cwd, args, env))


SHIELDED = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread while a child starts: the child inherits
    the blocked mask across ``exec``, so a signal to our whole process group (systemd's stop,
    a terminal's Ctrl-C) is ours to handle -- git must not die first and read as a failure
    (a killed ``git apply`` read as a conflict).  A SIGKILL still takes it with us: it stays
    in our group, so no orphaned git writes into a worktree the next integrator resets.
    Here the signal stays pending only until the mask is restored, right after the fork."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def git(
    args: Sequence[str],
    *,
    cwd: Path,
    check: bool = True,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    code: str = "git-failed",
) -> GitResult:
    """Run ``git args`` in ``cwd``; raise DagrunnerError(code) on failure when ``check``."""
    argv = ["git", *args]
    try:
        with shielded():
            child = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=driverless_env(cwd, args, env),
            )
        with child:
            try:
                out, err = child.communicate(input)
            except BaseException:  # an interrupt: git does not outlive the wait for it
                child.kill()
                child.wait()
                raise
        proc = subprocess.CompletedProcess(argv, child.returncode, out, err)
    except FileNotFoundError:
        raise DagrunnerError(
            "git-missing",
            "git is not installed or not on PATH",
            exit_code=ExitCode.ENVIRONMENT,
            hint="install git (apt-get install git)",
        ) from None
    result = GitResult(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        first = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise DagrunnerError(
            code,
            f"`{' '.join(argv)}` failed ({proc.returncode}): {first[0] if first else 'no message'}",
            where=str(cwd),
            hint="see git's message; run the command by hand in that directory to investigate",
            exit_code=ExitCode.ENVIRONMENT,
        )
    return result


def git_output(
    args: Sequence[str], *, cwd: Path, limit: int, env: Mapping[str, str] | None = None
) -> bytes | None:
    """What ``git args`` prints, read whole -- or None once it passes ``limit`` bytes (git is
    then stopped: nothing over the limit is ever held).  Raises like :func:`git` on failure."""
    argv = ["git", *args]
    # stderr to a file: a pipe git fills with warnings while we read stdout would stall both
    with tempfile.TemporaryFile() as errors:
        with shielded():
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=driverless_env(cwd, args, env),
            )
        with proc:
            assert proc.stdout is not None
            chunks: list[bytes] = []
            size = 0
            while chunk := proc.stdout.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    proc.kill()
                    proc.wait()
                    return None
                chunks.append(chunk)
            code = proc.wait()
        errors.seek(0)
        stderr = errors.read()
    if code != 0:
        first = stderr.decode("utf-8", "replace").strip().splitlines()
        raise DagrunnerError(
            "git-failed",
            f"`{' '.join(argv)}` failed ({code}): {first[0] if first else 'no message'}",
            where=str(cwd),
            hint="see git's message; run the command by hand in that directory to investigate",
            exit_code=ExitCode.ENVIRONMENT,
        )
    return b"".join(chunks)


def is_dirty(path: Path, *, untracked: bool = False) -> bool:
    """Whether the checkout at ``path`` has uncommitted changes: staged or unstaged ones to
    tracked files, and -- with ``untracked`` -- files git does not track and does not ignore."""
    mode = "--untracked-files=normal" if untracked else "--untracked-files=no"
    status = git(["status", "--porcelain=v1", "-z", mode], cwd=path, check=False)
    return bool(status.stdout)


def split_z(data: bytes) -> list[str]:
    """The fields of git's ``-z`` output (NUL-separated, empty ones dropped), as text."""
    return [p.decode("utf-8", "surrogateescape") for p in data.split(b"\0") if p]


def toplevel(path: Path) -> Path | None:
    """The work tree root containing ``path``, or None outside a git work tree."""
    try:
        result = git(["rev-parse", "--show-toplevel"], cwd=path, check=False)
    except DagrunnerError:
        return None
    return Path(result.text) if result.returncode == 0 else None


def head_info(repo: Path) -> dict[str, object]:
    """Commit, commit time and dirtiness of ``repo``; empty values outside git."""
    info: dict[str, object] = {"commit": None, "commit_time": None, "dirty": None, "branch": None}
    try:
        head = git(["log", "-1", "--format=%H %ct"], cwd=repo, check=False)
        if head.returncode != 0 or not head.text:
            return info
        commit, when = head.text.split()
        info["commit"], info["commit_time"] = commit, int(when)
        info["dirty"] = is_dirty(repo)
        branch = git(["symbolic-ref", "--short", "-q", "HEAD"], cwd=repo, check=False)
        info["branch"] = branch.text or None
    except DagrunnerError:
        pass
    return info
