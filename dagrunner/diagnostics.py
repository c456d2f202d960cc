"""Every mistake of one input file, reported together and in the file's order.

A loader records each :class:`DagrunnerError` it finds and goes on reading;
at the end :meth:`Problems.raise_if_any` raises one :class:`ManyErrors` whose
``code`` (and key, hint) are the first mistake's -- so scripts that read one
code keep working -- while the message, ``render()`` and ``to_json()`` carry
all of them.  Positions are found in the file's text by key path, which is
good enough to sort by and to point a person at the right line.
"""

from __future__ import annotations

import re
from typing import Any

from dagrunner.errors import DagrunnerError


class ManyErrors(DagrunnerError):
    """Several mistakes in one file: the first one's code, all of them in ``errors``."""

    def __init__(self, errors: list[tuple[int, DagrunnerError]]) -> None:
        first = errors[0][1]
        super().__init__(
            first.code,
            first.message if len(errors) == 1 else f"{first.message} (and {len(errors) - 1} more)",
            hint=first.hint,
            exit_code=first.exit_code,
            where=first.where,
            key=first.key,
            details=first.details,
        )
        self.errors = errors

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        if len(self.errors) > 1:
            body["errors"] = [dict(e.to_json(), line=line) for line, e in self.errors]
        return body

    def render(self, *, verbose: bool = False) -> str:
        if len(self.errors) == 1:
            return self.errors[0][1].render()
        lines = [f"{len(self.errors)} mistakes in {self.where}:"]
        for line, error in self.errors:
            lines.append(("" if line <= 0 else f"line {line}: ") + error.render())
        return "\n".join(lines)


class Problems:
    """The mistakes found so far in one file's ``text``."""

    def __init__(self, text: str, *, json: bool = False) -> None:
        self.text = text
        self.json = json
        self.found: list[tuple[int, int, DagrunnerError]] = []

    def add(self, error: DagrunnerError) -> None:
        if any(e.code == error.code and e.key == error.key for _, _, e in self.found):
            return  # the same mistake reached twice (a key read by two readers)
        self.found.append((self.line_of(error.key or ""), len(self.found), error))

    def has(self, key: str) -> bool:
        """Whether a mistake was already recorded at ``key``."""
        return any(e.key == key for _, _, e in self.found)

    def __bool__(self) -> bool:
        return bool(self.found)

    def raise_if_any(self) -> None:
        if self.found:
            ordered = sorted(self.found, key=lambda item: (item[0], item[1]))
            raise ManyErrors([(line, error) for line, _, error in ordered])

    def line_of(self, key: str) -> int:
        """The 1-based line where ``key`` (``gates.lint.timeout``) is written; 0 if not found."""
        parts = [p for p in key.split(".") if p]
        if not parts:
            return 0
        pos, found = 0, False
        for depth, part in enumerate(parts):
            name = re.escape(part)
            if self.json:
                pattern = rf'"{name}"\s*:'
            elif depth < len(parts) - 1:
                # a table header [a.b], [a."b"], or a dotted/inline key a.b = / b = {
                pattern = rf'^[ \t]*\[+[^\]\n]*?(?<![\w-])"?{name}"?[ \t]*[.\]]|^[ \t]*"?{name}"?[ \t]*[.=]'
            else:
                pattern = (
                    rf'^[ \t]*"?{name}"?[ \t]*=|[{{,][ \t]*"?{name}"?[ \t]*='
                    rf'|^[ \t]*\[+[^\]\n]*?(?<![\w-])"?{name}"?[ \t]*\]'
                )
            match = re.compile(pattern, re.MULTILINE).search(self.text, pos)
            if match is None:
                break
            pos, found = match.start(), True
        return self.text.count("\n", 0, pos) + 1 if found else 0
