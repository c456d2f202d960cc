"""Reading a gate's bounded log back for reports: its tail, with ANSI escapes removed; the
lines that say what failed (``failure_excerpt``), and the files they name (``Mentions``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Every escape a terminal acts on, in its 7-bit and 8-bit forms: CSI (``ESC [``, 0x9b); the
# string controls OSC, DCS, SOS, PM and APC up to their terminator (BEL or ST); and the
# other two-byte escapes (RIS ``ESC c``, charsets ``ESC ( B``, ``ESC 7``).
ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[P\]X^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]"
)
# Lines that say what failed, in the common runners' words (pytest, unittest, node's TAP,
# jest/vitest, mocha, go, cargo, tsc, eslint, ruff, mypy, black): shown before the log's tail.
FAILING = re.compile(
    r"^(?:E |FAIL|FAILED|ERROR|not ok\b|Traceback|panic:|thread '.*' panicked|\s*[\u2717\u2716\u00d7]\s)"
    r"|(?:\berror(?:\[\w+\])?:|\bError:|AssertionError|\bfailed\b|: error |\bFAIL\b)"
    r"|^would reformat\b",  # black's and ruff format's --check: the file it names
    re.IGNORECASE,
)
EXCERPT_LINES = 40  # failing lines shown at most, with one line of context each side
TAIL_LINES = 25  # the log's last lines (a runner's summary), always shown
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0, DEL and C1 (8-bit CSI, OSC)


def read_log(run_dir: Path, rel: str, *, limit: int | None = None) -> str:
    """The log's text (its last ``limit`` bytes when given), or '' when there is none."""
    if not rel:
        return ""
    path = run_dir / rel
    try:
        with path.open("rb") as handle:
            if limit is not None:
                size = path.stat().st_size
                handle.seek(max(0, size - limit))
            data = handle.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def strip_ansi(text: str) -> str:
    return _CONTROL.sub("", ANSI.sub("", text))


def failure_excerpt(text: str) -> str:
    """What a reader of a failed gate wants first: the lines that say what failed (with a line
    of context each side), then the log's last lines (the runner's summary); the whole text
    when it is short.  '' when the log has no line matching and is all tail."""
    lines = text.splitlines()
    if len(lines) <= TAIL_LINES + EXCERPT_LINES:
        return text
    body = len(lines) - TAIL_LINES
    wanted: set[int] = set()
    for n, line in enumerate(lines[:body]):
        if FAILING.search(strip_ansi(line)) and not line.startswith("[dagrunner: "):
            wanted.update(i for i in (n - 1, n, n + 1) if 0 <= i < body)
            if len(wanted) >= EXCERPT_LINES * 3:
                break
    out: list[str] = []
    last = -2
    for n in sorted(wanted)[: EXCERPT_LINES * 3]:
        if n != last + 1:
            out.append("…")
        out.append(lines[n])
        last = n
    out.append(f"… (the last {TAIL_LINES} lines of {len(lines)})")
    return "\n".join(out + lines[body:])


# Where a runner says a failure is: ``path:12``, ``File "x.py", line 12``, ``x.ts(12,5)``.
LOCATION = re.compile(r"[\w.)-]:\d+|, line \d+|\(\d+,\d+\)")
_WORD = re.compile(r"[\w.+@/-]+")  # what a path or a dotted name is made of
DEPTH = 16  # the parts of a word looked up as a path: its last 16 (a dotted name: first 16)
# what a test is named after: test_utils, utils_test, TestUtils, UtilsTest(s), utils.test.ts
_SUBJECT = re.compile(r"^(?:test_|Test(?=[A-Z]))(\w+)$|^(\w+?)(?:_test|_spec|Tests?|Spec)$")


def failing_lines(text: str) -> str:
    """The lines of a log that say what failed or where (``FAILING``, ``LOCATION``), and each
    line before one (a linter's file heading), without the rest (a runner's progress lines
    name every file, failing or not)."""
    lines = strip_ansi(text).splitlines()
    said = [bool(FAILING.search(line) or LOCATION.search(line)) for line in lines] + [False]
    return "\n".join(line for n, line in enumerate(lines) if said[n] or said[n + 1])


@dataclass(frozen=True)
class Mentions:
    """The files a failure's words name: as paths (``/x/src/a.py`` names ``src/a.py`` and
    ``a.py`` too), as dotted modules (a JUnit classname ``tests.test_a.TestB`` names
    ``tests/test_a.py``), and as the subject of a failing test (``tests/test_utils.py``,
    ``utils_test.go`` and ``UtilsTest`` name a file ``utils.*``, ``Utils.*``)."""

    paths: frozenset[str]
    modules: frozenset[str]
    subjects: frozenset[str]

    @classmethod
    def of(cls, text: str) -> Mentions:
        paths: set[str] = set()
        modules: set[str] = set()
        subjects: set[str] = set()
        for word in _WORD.findall(text):
            parts = word.rstrip(".").split("/")  # a sentence's full stop is not the path's
            paths.update("/".join(parts[k:]) for k in range(max(0, len(parts) - DEPTH), len(parts)))
            dots = parts[-1].split(".")
            if len(parts) == 1:
                modules.update(".".join(dots[:k]) for k in range(2, min(len(dots), DEPTH) + 1))
            for n, name in enumerate(dots[:DEPTH]):
                if (found := _SUBJECT.match(name)) is not None:
                    subjects.add(found[1] or found[2])
                elif name in ("test", "spec") and n > 0 and dots[n - 1]:
                    subjects.add(dots[n - 1])
        return cls(frozenset(paths), frozenset(modules), frozenset(subjects))

    def name(self, path: str) -> bool:
        """``path`` (of the repository) is named."""
        dotted = path[:-3].replace("/", ".") if path.endswith(".py") and "/" in path else ""
        stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
        return path in self.paths or dotted in self.modules or stem in self.subjects
