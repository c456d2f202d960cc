"""The one user-facing error type and the exit codes of the CLI contract.

Every mistake a user can make is raised as :class:`DagrunnerError` with a
stable kebab-case ``code`` (documented in ``docs/errors.md``), a message that
names the file and key or path at fault, and a hint saying what to do.  The
CLI turns it into a message (or a JSON object) and an exit code; it never
shows a traceback for one.
"""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """Exit codes promised to CI scripts and orchestrators (DESIGN.md)."""

    OK = 0
    FAILED = 1  # gates failed, budget missed or land blocked
    BAD_INPUT = 2  # bad usage or bad input (manifest, envelope, name)
    ENVIRONMENT = 3  # environment unfit (no git, worktrees unsupported, unsafe root)
    REFUSED = 4  # refused to protect work (dirty, unlanded, claimed, files held open)
    TIMED_OUT = 124  # a wait ran out of time (integrate submit --wait --timeout)
    INTERRUPTED = 130


class DagrunnerError(Exception):
    """An error a user can act on.

    ``where`` names the file, and ``key`` the key path inside it (for example
    ``gates.lint.timeout``), when the error is about one.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        hint: str = "",
        exit_code: ExitCode = ExitCode.BAD_INPUT,
        where: str | None = None,
        key: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        self.where = where
        self.key = key
        self.details = details or {}

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.where is not None:
            body["file"] = self.where
        if self.key is not None:
            body["key"] = self.key
        if self.details:
            body["details"] = self.details
        return body

    def render(self, *, verbose: bool = False) -> str:
        """Human form: ``error[code]: file: key: message``, a hint line, and with ``verbose``
        the details (``key: value`` lines)."""
        place = ": ".join(p for p in (self.where, self.key) if p)
        head = f"error[{self.code}]: {place + ': ' if place else ''}{self.message}"
        lines = [head] + ([f"  hint: {self.hint}"] if self.hint else [])
        if verbose:
            lines += [f"  {k}: {v}" for k, v in (self.details or {}).items()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()
