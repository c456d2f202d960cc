"""The one place that runs git.

Every call is an argument list, runs with an environment cleaned of the
``GIT_*`` variables that would point it at another repository or index, never
prompts, and fails with a :class:`DagrunnerError` carrying git's own first
line of stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode

# Inherited GIT_* variables that are safe (they do not redirect git to other data).
KEEP_GIT_ENV = frozenset({"GIT_EXEC_PATH", "GIT_TRACE", "GIT_TRACE2", "GIT_CONFIG_NOSYSTEM"})
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


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without redirecting GIT_* variables, with the pinned
    settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in KEEP_GIT_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    env["GIT_CONFIG_COUNT"] = str(len(PINNED_CONFIG))
    for i, (key, value) in enumerate(PINNED_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    if extra:
        env.update(extra)
    return env


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
        proc = subprocess.run(
            argv,
            cwd=cwd,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            env=git_env(env),
            check=False,
        )
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
