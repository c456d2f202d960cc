"""The plain part of YAML that ``.pre-commit-config.yaml`` files are written in: block
mappings and lists (a mapping's list may sit at its key's indent), scalars plain or quoted,
one-line or multi-line flow lists of scalars, literal and folded block scalars (a verbose
regex), anchors.  Anything else (an alias, a tag, a flow mapping, a plain scalar over
several lines, a tab) raises ``NotPlain``: a value init would have to guess is never read
as another.  No YAML library is needed at run time, and a hostile file costs at most its
lines (its size is bounded by ``readers``; nesting by ``MAX_DEPTH``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
ESCAPES = {"\\": "\\", '"': '"', "/": "/", "n": "\n", "t": "\t", "r": "\r", "0": "\0", " ": " "}


class NotPlain(ValueError):
    """A construct this reader does not read: the caller treats the file as unreadable."""


@dataclass(frozen=True)
class _Line:
    number: int
    indent: int
    text: str  # without indent and comment


def read(text: str) -> Any:
    """The value of the one YAML document in ``text``; raises ``NotPlain``."""
    raw = text.splitlines()
    lines = []
    for number, line in enumerate(raw):
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise NotPlain(f"line {number + 1}: a tab in the indent")
        body = _uncomment(line).rstrip()
        if body.strip() in ("", "---"):
            continue
        lines.append(_Line(number, len(body) - len(body.lstrip()), body.strip()))
    if not lines:
        return None
    reader = _Reader(raw, lines)
    value = reader.block(0, lines[0].indent, 0)
    if reader.at < len(lines):
        raise NotPlain(f"line {lines[reader.at].number + 1}: not where the document's shape goes")
    return value


def _uncomment(line: str) -> str:
    """``line`` without its comment (a ``#`` at the start or after a space, outside quotes)."""
    quote = ""
    for n, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"" and (n == 0 or line[n - 1] in " \t[,:-"):
            quote = char
        elif char == "#" and (n == 0 or line[n - 1] in " \t"):
            return line[:n]
    return line


class _Reader:
    def __init__(self, raw: list[str], lines: list[_Line]) -> None:
        self.raw = raw
        self.lines = lines
        self.at = 0
        self.anchors: dict[str, Any] = {}

    def block(self, first: int, indent: int, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise NotPlain("nested too deeply")
        line = self.lines[first]
        if line.text == "-" or line.text.startswith("- "):
            return self._list(indent, depth)
        return self._mapping(indent, depth)

    def _list(self, indent: int, depth: int) -> list[Any]:
        items: list[Any] = []
        while self.at < len(self.lines):
            line = self.lines[self.at]
            if line.indent != indent or not (line.text == "-" or line.text.startswith("- ")):
                break
            rest = line.text[1:].lstrip()
            if not rest:  # the item's value on the lines below
                self.at += 1
                items.append(self._below(indent, depth, same_indent_list=False))
                continue
            column = indent + len(line.text) - len(rest)
            if _key(rest) is not None:  # a mapping starting on the dash's line
                self.lines[self.at] = _Line(line.number, column, rest)
                items.append(self._mapping(column, depth + 1))
            else:
                self.at += 1
                items.append(self._value(rest, line, indent, depth))
        return items

    def _mapping(self, indent: int, depth: int) -> dict[str, Any]:
        found: dict[str, Any] = {}
        while self.at < len(self.lines):
            line = self.lines[self.at]
            if line.indent != indent:
                if line.indent > indent:
                    raise NotPlain(f"line {line.number + 1}: indented where no value goes")
                break
            said = _key(line.text)
            if said is None:
                break
            key, rest = said
            if key in found:
                raise NotPlain(f"line {line.number + 1}: {key!r} twice")
            self.at += 1
            found[key] = (
                self._value(rest, line, indent, depth)
                if rest
                else self._below(indent, depth, same_indent_list=True)
            )
        return found

    def _below(self, indent: int, depth: int, *, same_indent_list: bool) -> Any:
        if self.at >= len(self.lines):
            return None
        nxt = self.lines[self.at]
        list_here = nxt.text == "-" or nxt.text.startswith("- ")
        if nxt.indent > indent or (same_indent_list and nxt.indent == indent and list_here):
            return self.block(self.at, nxt.indent, depth + 1)
        return None

    def _value(self, rest: str, line: _Line, indent: int, depth: int) -> Any:
        anchor = re.match(r"&([\w.-]+)\s*", rest)
        if anchor:
            rest = rest[anchor.end() :]
            value = (
                self._value(rest, line, indent, depth)
                if rest
                else self._below(indent, depth, same_indent_list=True)
            )
            self.anchors[anchor[1]] = value
            return value
        if rest[0] in "*!{?@`%":
            raise NotPlain(f"line {line.number + 1}: {rest[0]!r} (an alias, a tag or a mapping)")
        if rest[0] in "|>":
            return self._block_scalar(rest, indent)
        if rest[0] == "[":
            return self._flow(rest, line)
        value = _scalar(rest, line.number)
        if self.at < len(self.lines) and self.lines[self.at].indent > indent:
            nxt = self.lines[self.at]
            raise NotPlain(f"line {nxt.number + 1}: a plain scalar over several lines")
        return value

    def _block_scalar(self, header: str, indent: int) -> str:
        style = re.fullmatch(r"([|>])([+-]?)", header)
        if style is None:
            raise NotPlain(f"block scalar header {header!r}")
        start = self.lines[self.at - 1].number + 1
        while self.at < len(self.lines) and self.lines[self.at].indent > indent:
            self.at += 1
        end = self.lines[self.at].number if self.at < len(self.lines) else len(self.raw)
        body = self.raw[start:end]
        while body and not body[-1].strip():
            body.pop()
        margin = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=0)
        kept = [b[margin:] for b in body]
        if style[1] == "|":
            text = "\n".join(kept)
        else:  # folded: lines joined by a space, an empty line is a newline
            text = re.sub(r"(?<!\n)\n(?!\n)", " ", "\n".join(kept)).replace("\n\n", "\n")
            if any(b.startswith((" ", "\t")) for b in kept if b):
                raise NotPlain("a folded scalar with more-indented lines")
        return text if style[2] == "-" else text + "\n"

    def _flow(self, rest: str, line: _Line) -> list[str]:
        text = rest
        while "]" not in _unquoted(text) and self.at < len(self.lines):
            text += " " + self.lines[self.at].text
            self.at += 1
        body = _unquoted(text)
        close = body.find("]")
        if close < 0 or body[close + 1 :].strip() or "[" in body[1:close] or "{" in body:
            raise NotPlain(f"line {line.number + 1}: a flow list init does not read")
        items, item, quote = [], "", ""
        for char in text[1:close]:
            if quote:
                quote = "" if char == quote else quote
            elif char in "'\"" and not item.strip():
                quote = char
            elif char == ",":
                items.append(item)
                item = ""
                continue
            item += char
        items.append(item)
        return [_scalar(i.strip(), line.number) for i in items if i.strip()]


def _unquoted(text: str) -> str:
    """``text`` with the inside of its quoted scalars blanked (so ``]`` there is no end)."""
    out, quote = [], ""
    for char in text:
        if quote:
            out.append(" " if char != quote else char)
            quote = "" if char == quote else quote
        else:
            quote = char if char in "'\"" else ""
            out.append(char)
    return "".join(out)


def _key(text: str) -> tuple[str, str] | None:
    """``(key, rest)`` of a ``key: rest`` line (a quoted key too), else None."""
    quoted = re.match(r"""(['"])(.*?)\1:(?:\s+|$)""", text)
    if quoted:
        return quoted[2], text[quoted.end() :].strip()
    plain = re.match(r"([^\s'\"\[\]{}#&*!|>,-][^:#]*?|-[^\s:#][^:#]*?):(?:\s+|$)", text)
    if plain:
        return plain[1].strip(), text[plain.end() :].strip()
    return None


def _scalar(text: str, number: int) -> Any:
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise NotPlain(f"line {number + 1}: an unclosed quote")
        return text[1:-1].replace("''", "'")
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise NotPlain(f"line {number + 1}: an unclosed quote")
        out, escaped = [], False
        for char in text[1:-1]:
            if escaped:
                if char not in ESCAPES:
                    raise NotPlain(f"line {number + 1}: the escape \\{char}")
                out.append(ESCAPES[char])
                escaped = False
            elif char == "\\":
                escaped = True
            else:
                out.append(char)
        return "".join(out)
    if text[0] in "*!&{@`%" or text.startswith("? "):
        raise NotPlain(f"line {number + 1}: {text[0]!r} (an alias, a tag or a mapping)")
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if text in ("~", "null", "Null", "NULL"):
        return None
    return text
