"""Failing tests named from a gate's output, for a gate without a JUnit file.

Each common runner names what failed in its own words: pytest's short summary (``FAILED
path::Class::test - why``), unittest (``FAIL: test_x (mod.Class.test_x)``), ``node --test``
as TAP (``not ok 2 - name``, nested subtests indented; a parent that failed only for its
subtests is left out) or with its spec reporter (the ``✖ failing tests:`` section, each in
its file: the ``test at FILE:LINE:COL`` line above it), vitest (``FAIL  file > suite >
test``) and jest (``● Suite \u203a test``, ``● test``), each behind turbo's or ``pnpm -r``'s
prefix too, mocha (the numbered list after ``N failing``), go
(``--- FAIL: TestX``) and cargo (``test x ... FAILED``).

The log is the gate's, so untrusted: it is read bounded, escape sequences are stripped,
at most ``MAX_CASES`` names of at most 300 characters are kept, and the names are for
people only -- never a complete list, so a baseline judges such a gate as a whole
(``TestRun.source`` "output", ``records/failures.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from dagrunner.records.run import TestCase, TestRun
from dagrunner.report.logtail import strip_ansi

MAX_CASES = 200
MAX_NAME = 300

# a node id, then its parameters' id whole: pytest writes that as given ("[1, 2 and 3]",
# "[a - b]"), spaces and " - " included, before the " - " of its message
_PYTEST = re.compile(r"^(?:FAILED|ERROR) (\S+?::[^\s\[]+)(\[.*?\])?(?: - .*)?$")
_UNITTEST = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)")
_TAP_SUBTEST = re.compile(r"^(\s*)# Subtest: (.+)$")
_TAP_NOT_OK = re.compile(r"^(\s*)not ok \d+ - (.+?)(?: # (?:TODO|SKIP)\b.*)?$")
_SPEC = re.compile(r"^\s*\u2716 (.+?) \([\d.]+m?s\)$")
_SPEC_AT = re.compile(r"^\s*test at (?:file://)?(.+?):\d+:\d+$")  # the file of the next
# vitest's line, maybe behind a workspace runner's prefix (turbo's ``pkg:task: ``, ``pnpm -r``'s
# ``dir script: ``), its file maybe behind a project's badge (``|server|``, or coloured)
_PREFIX = r"(?:\S+:\S+: |\S+ [\w:-]+: )?"
_VITEST = re.compile(
    rf"^{_PREFIX}\s*FAIL\s+(?:\|[^|]+\|\s+|\S+\s+(?=\S+ > ))?(\S+) > (.+?)(?: \[.*\])?$"
)
# jest's, behind the same prefixes (turbo: round 12's callstack/reassure)
_JEST = re.compile(rf"^{_PREFIX}\s*\u25cf (?!Test suite failed to run|Console$)(.+)$")
_MOCHA_HEAD = re.compile(r"^\s*\d+ failing\b")
_MOCHA = re.compile(r"^(\s*)\d+\) (.+)$")
_GO = re.compile(r"^\s*--- FAIL: (\S+) \(")
_CARGO = re.compile(r"^test (\S+) \.\.\. FAILED$")


def from_output(text: str) -> TestRun | None:
    """The failing tests ``text`` names, as a ``TestRun`` of source "output" (None: it
    names none in any runner's words)."""
    lines = strip_ansi(text).splitlines()
    seen: dict[tuple[str, str], None] = {}
    for suite, name in _names(lines):
        key = (suite[:MAX_NAME], name[:MAX_NAME])
        if key[1] and key not in seen:
            seen[key] = None
            if len(seen) == MAX_CASES:
                break
    # a go test that failed only for its subtest (TestX beside TestX/case) is not one itself
    names = {n for _, n in seen}
    kept = [(s, n) for s, n in seen if not any(m.startswith(f"{n}/") for m in names)]
    if not kept:
        return None
    cases = tuple(TestCase(suite=s, name=n, outcome="failed") for s, n in kept)
    return TestRun(failures=len(cases), cases=cases, source="output")


def _names(lines: list[str]) -> Iterator[tuple[str, str]]:
    yield from _tap(lines)
    yield from _mocha(lines)
    failing = False  # inside node's spec reporter's "failing tests" section
    where = ""  # its "test at FILE:LINE:COL" line, above the failed test's
    for line in lines:
        if line.strip() == "\u2716 failing tests:":
            failing = True
        elif failing and (found := _SPEC_AT.match(line)):
            where = found[1]
        elif failing and (found := _SPEC.match(line)):
            yield where, found[1]
            where = ""
        elif found := _PYTEST.match(line):
            suite, _, name = found[1].rpartition("::")
            yield suite, name + (found[2] or "")
        elif found := _UNITTEST.match(line):
            dotted = found[2].removesuffix(f".{found[1]}")  # 3.11+ repeats the method
            yield dotted, found[1]
        elif found := _VITEST.match(line):
            yield found[1], found[2]
        elif found := _GO.match(line) or _CARGO.match(line) or _JEST.match(line):
            yield "", found[1]


def _tap(lines: list[str]) -> Iterator[tuple[str, str]]:
    """TAP's ``not ok`` lines, a nested one named by its parents (``suite > test``); a
    parent that failed only because a subtest did (node: ``failureType: 'subtestsFailed'``)
    is not a test of its own."""
    path: list[str] = []
    pending: tuple[str, str] | None = None
    for line in lines:
        if pending is not None and "failureType: 'subtestsFailed'" in line:
            pending = None
            continue
        if found := _TAP_SUBTEST.match(line):
            depth = len(found[1]) // 4
            path = [*path[:depth], found[2]]
        elif found := _TAP_NOT_OK.match(line):
            if pending is not None:
                yield pending
            depth = len(found[1]) // 4
            pending = (" > ".join(path[:depth]), found[2])
        elif pending is not None and not line.startswith((" ", "\t")) and line.strip():
            yield pending  # its YAML block (indented) is over
            pending = None
    if pending is not None:
        yield pending


def _mocha(lines: list[str]) -> Iterator[tuple[str, str]]:
    """Mocha's list after ``N failing``: ``1) suite`` then deeper lines, the last ending
    in ``:``, name one failed test (``suite > test``)."""
    start = next((n for n, line in enumerate(lines) if _MOCHA_HEAD.match(line)), None)
    if start is None:
        return
    parts: list[str] = []
    for line in lines[start + 1 :]:
        if found := _MOCHA.match(line):
            parts = [found[2].strip()]
        elif parts and line.strip():
            parts.append(line.strip())
        else:
            continue
        if parts[-1].endswith(":"):
            parts[-1] = parts[-1][:-1]
            yield " > ".join(parts[:-1]), parts[-1]
            parts = []
