"""Read a ``git diff --binary --full-index`` by its structure: which files it touches, how.

An envelope's diff is untrusted, so what it touches is learned from the diff
itself, never from the envelope's own summary of it.  The parser walks git's
format as a state machine -- a ``diff --git`` header, its extended header
lines, ``---``/``+++``, then hunks whose line counts come from their ``@@``
header, or a ``GIT binary patch`` block -- so a removed line that happens to
start with ``--`` is content, not a header.  Anything that is not git's format
raises ``PatchFormatError`` naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HUNK = re.compile(rb"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_EXTENDED = (
    b"old mode ",
    b"new mode ",
    b"deleted file mode ",
    b"new file mode ",
    b"similarity index ",
    b"dissimilarity index ",
    b"index ",
    b"copy from ",
    b"copy to ",
    b"rename from ",
    b"rename to ",
)
SYMLINK_MODE = "120000"


class PatchFormatError(ValueError):
    """The diff is not in git's format; the message names the line."""


@dataclass(frozen=True, kw_only=True)
class FilePatch:
    """One ``diff --git`` section: the paths it names and the mode it leaves."""

    path: str  # the path after the change (the old one for a deletion)
    old_path: str | None  # renames and copies
    new_mode: str | None  # None for a deletion, or when the mode is unchanged and unnamed
    deleted: bool
    binary: bool

    @property
    def symlink(self) -> bool:
        return self.new_mode == SYMLINK_MODE

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path,) if self.old_path is None else (self.old_path, self.path)


def unquote(text: str) -> str:
    """A path as git prints it: C-quoted (octal escapes for bytes) or plain."""
    text = text.strip()
    match = _QUOTED.fullmatch(text)
    if not match:
        return text
    raw = match.group(1).encode("latin-1", "backslashreplace")
    return raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def _strip_prefix(name: str, prefix: str) -> str:
    """``name`` without its ``a/`` or ``b/``.  git apply strips a name's first component,
    whatever it is (``-p1``): a name without the prefix export writes would be read here
    as one path (``x/.gitattributes``) and applied by git as another (``.gitattributes``)."""
    if not name.startswith(prefix):
        raise PatchFormatError(f"the name {name[:80]!r} does not start with {prefix!r}")
    return name[len(prefix) :]


def _header_names(rest: str) -> tuple[str, str] | None:
    """The two names of ``diff --git A B``, or None when unquoted names are ambiguous."""
    quoted = _QUOTED.findall(rest)
    if len(quoted) == 2:
        a, b = (unquote(f'"{q}"') for q in quoted)
        return _strip_prefix(a, "a/"), _strip_prefix(b, "b/")
    # Unquoted "a/X b/X": only the same path twice splits unambiguously; a rename's
    # names are read from its "rename from/to" lines instead.
    half = len(rest) // 2
    a, b = rest[:half], rest[half + 1 :]
    if rest[half : half + 1] != " " or a[2:] != b[2:]:
        return None
    return _strip_prefix(a, "a/"), _strip_prefix(b, "b/")


def _text(line: bytes) -> str:
    return line.decode("utf-8", "surrogateescape")


def parse_patch(diff: bytes) -> list[FilePatch]:
    """Every file section of ``diff``, in order; raises PatchFormatError on anything else."""
    lines = diff.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"diff --git "):
            raise PatchFormatError(f"line {i + 1}: expected 'diff --git', got {_text(line)[:80]!r}")
        i = _section(lines, i, files)
    return files


def _section(lines: list[bytes], i: int, files: list[FilePatch]) -> int:
    """Parse the section starting at ``lines[i]``; the index after it."""
    start = i
    try:
        names = _header_names(_text(lines[i])[len("diff --git ") :])
    except PatchFormatError as exc:
        raise PatchFormatError(f"line {i + 1}: {exc}") from None
    old_name = new_name = None
    old_path = None
    new_mode: str | None = None
    deleted = binary = False
    i += 1
    while i < len(lines) and lines[i].startswith(_EXTENDED):
        text = _text(lines[i])
        if text.startswith(("rename from ", "copy from ")):
            old_path = unquote(text.split(" ", 2)[2])
        elif text.startswith(("rename to ", "copy to ")):
            new_name = unquote(text.split(" ", 2)[2])
        elif text.startswith(("new file mode ", "new mode ")):
            new_mode = text.rsplit(" ", 1)[1]
        elif text.startswith("deleted file mode "):
            deleted = True
        elif text.startswith("index ") and len(text.split(" ")) == 3 and new_mode is None:
            new_mode = text.split(" ")[2]
        i += 1
    if i < len(lines) and lines[i].startswith(b"--- "):
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise PatchFormatError(f"line {i + 2}: '---' is not followed by '+++'")
        minus = unquote(_text(lines[i][4:]).split("\t")[0])
        plus = unquote(_text(lines[i + 1][4:]).split("\t")[0])
        try:
            old_name = None if minus == "/dev/null" else _strip_prefix(minus, "a/")
            new_name = None if plus == "/dev/null" else _strip_prefix(plus, "b/")
        except PatchFormatError as exc:
            raise PatchFormatError(f"line {i + 1}: {exc}") from None
        i = _hunks(lines, i + 2)
    elif i < len(lines) and lines[i] == b"GIT binary patch":
        binary = True
        i = _binary(lines, i + 1)
    elif i < len(lines) and lines[i].startswith(b"Binary files "):
        raise PatchFormatError(f"line {i + 1}: a binary change without its data (not --binary)")
    path = new_name or old_name
    if path is None and names is not None:
        path = names[0] if deleted else names[1]
        old_name = names[0]
    if path is None:
        raise PatchFormatError(f"line {start + 1}: cannot tell which file this section changes")
    if old_path is None and old_name is not None and old_name != path and not deleted:
        old_path = old_name
    files.append(
        FilePatch(
            path=path,
            old_path=old_path,
            new_mode=None if deleted else new_mode,
            deleted=deleted,
            binary=binary,
        )
    )
    return i


def _hunks(lines: list[bytes], i: int) -> int:
    """Skip the hunks starting at ``lines[i]``, counting lines as their headers say."""
    if i >= len(lines) or not lines[i].startswith(b"@@ "):
        raise PatchFormatError(f"line {i + 1}: expected a hunk header '@@'")
    while i < len(lines) and lines[i].startswith(b"@@ "):
        match = _HUNK.match(lines[i])
        if match is None:
            raise PatchFormatError(f"line {i + 1}: malformed hunk header")
        old = int(match.group(1)) if match.group(1) is not None else 1
        new = int(match.group(2)) if match.group(2) is not None else 1
        i += 1
        while old > 0 or new > 0:
            if i >= len(lines):
                raise PatchFormatError("the diff ends inside a hunk")
            kind = lines[i][:1]
            if kind == b" ":
                old, new = old - 1, new - 1
            elif kind == b"-":
                old -= 1
            elif kind == b"+":
                new -= 1
            elif kind != b"\\":
                raise PatchFormatError(f"line {i + 1}: not a hunk line")
            if old < 0 or new < 0:
                raise PatchFormatError(f"line {i + 1}: more lines than the hunk header says")
            i += 1
        while i < len(lines) and lines[i].startswith(b"\\"):
            i += 1  # "\ No newline at end of file" after the last line
    return i


def _binary(lines: list[bytes], i: int) -> int:
    """Skip the forward and reverse blocks of a ``GIT binary patch``."""
    for _ in range(2):
        if i >= len(lines) or not lines[i].startswith((b"literal ", b"delta ")):
            raise PatchFormatError(f"line {i + 1}: expected 'literal' or 'delta'")
        i += 1
        while i < len(lines) and lines[i] != b"":
            i += 1
        i += 1  # the blank line that ends the block
    return i
