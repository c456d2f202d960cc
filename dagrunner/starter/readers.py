"""The project's files, read as hostile input: only regular files inside the repository,
never more than ``MAX_BYTES`` of one, and parsers whose depth limits become coded errors.

A ``package.json`` that is a FIFO would block an ``open`` forever, a symlinked
``pyproject.toml`` could make ``init`` read (and print) a file outside the project, and a
file nested ten thousand levels deep overflows a recursive parser: each is refused here,
before any reader of a tool's configuration sees it.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dagrunner.errors import DagrunnerError
from dagrunner.git.command import git
from dagrunner.starter.checks import Skipped

T = TypeVar("T")
MAX_BYTES = 4 * 1024 * 1024  # a configuration file larger than this is not one


class Project:
    """The files of the project at ``root``; ``refused`` collects what was not read, and why."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real = Path(os.path.realpath(root))
        self.refused: list[Skipped] = []
        self._listed: tuple[str, ...] | None = None

    def text(self, name: str, *, errors: str = "strict") -> str | None:
        """The text of ``name`` (relative to the root), or None when there is no such file or
        it is not text.  A symlink out of the repository is not followed (noted in
        ``refused``); raises ``init-not-a-file`` for a FIFO, socket or device, and
        ``init-config-too-large`` past ``MAX_BYTES``."""
        path = self.root / name
        try:
            os.lstat(path)
        except OSError:
            return None
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(self.real):
            why = f"a symlink to {real}, outside the repository: not followed"
            self.refused.append(Skipped(name, name, why))
            return None
        try:
            mode = os.stat(real).st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode):
            return None
        if not stat.S_ISREG(mode):
            raise _not_a_file(path)
        try:
            # O_NONBLOCK: were it swapped for a FIFO since the stat, open must not wait.
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _not_a_file(path)
            data = file.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise DagrunnerError(
                "init-config-too-large",
                f"{name} is over {MAX_BYTES // (1024 * 1024)} MiB: not a configuration file "
                "dagrunner init reads",
                where=str(path),
                hint="move it aside, or write the manifest by hand (docs/manifest.md)",
            )
        try:
            return data.decode("utf-8", errors)
        except UnicodeDecodeError:
            return None

    def is_file(self, name: str) -> bool:
        """Whether ``name`` is a regular file inside the repository (symlinks out: no)."""
        path = self.root / name
        real = Path(os.path.realpath(path))
        return real.is_relative_to(self.real) and real.is_file()

    def toml(self, name: str) -> dict[str, Any]:
        text = self.text(name)
        if text is None:
            return {}
        return deep(name, lambda: _toml(text))

    def json(self, name: str) -> Any:
        text = self.text(name)
        if text is None:
            return None
        return deep(name, lambda: _json(text))

    def ini(self, name: str) -> configparser.ConfigParser:
        return ini_text(self.text(name) or "")

    def python(self, name: str) -> ast.Module | None:
        text = self.text(name)
        if text is None:
            return None
        return deep(name, lambda: _python(text))

    def files(self, *patterns: str) -> tuple[str, ...]:
        """The repository's files (tracked and untracked, not ignored) matching ``patterns``
        (git pathspecs); git lists them, so a symlink loop cannot make this walk forever."""
        if self._listed is None:
            listed = git(
                ["ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=self.root,
                check=False,
            )
            self._listed = tuple(p for p in listed.stdout.decode(errors="replace").split("\0") if p)
        return tuple(p for p in self._listed if any(Path(p).match(g) for g in patterns))

    def ignored(self, name: str) -> bool:
        """Whether git ignores ``name`` (a path that need not exist yet)."""
        return (
            git(["check-ignore", "-q", "--no-index", name], cwd=self.root, check=False).returncode
            == 0
        )


def ini_text(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return configparser.ConfigParser(interpolation=None)
    return parser


def deep(name: str, parse: Callable[[], T]) -> T:
    """``parse()``; a nesting too deep for the parser is ``init-config-too-deep``."""
    try:
        result = parse()
    except (RecursionError, MemoryError) as error:
        raise DagrunnerError(
            "init-config-too-deep",
            f"{name} is nested too deeply to read ({type(error).__name__})",
            where=name,
            hint="flatten it, move it aside, or write the manifest by hand (docs/manifest.md)",
        ) from None
    return result


def _toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _python(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _not_a_file(path: Path) -> DagrunnerError:
    return DagrunnerError(
        "init-not-a-file",
        f"{path.name} is not a regular file (a FIFO, socket or device): dagrunner init reads "
        "only files",
        where=str(path),
        hint="remove it or make it a file; init never opens anything else",
    )
