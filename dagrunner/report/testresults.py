"""Per-test results: the JUnit XML file a gate wrote (its ``junit`` key), read back.

The file is a gate's output, so untrusted: it is read only when this attempt wrote it
(modified after the attempt started -- a stale file from an earlier run says nothing),
only up to ``MAX_BYTES``, with Python's expat (no external entities; its billion-laughs
guard), and only the counts and the cases that did not pass are kept (at most
``MAX_CASES``, messages bounded).  A file that cannot be read is a ``problem`` on the
record, never a crash and never a changed verdict: the gate's exit code decides (a
differential baseline, ``integration/baseline``, compares the failed cases, and only where
the file lists every failure).
"""

from __future__ import annotations

import errno
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

from dagrunner.files import folder_beneath
from dagrunner.records.run import TestCase, TestRun
from dagrunner.report.logtail import strip_ansi

MAX_BYTES = 32 * 1024 * 1024
MAX_CASES = 200
MAX_FILES = 10000  # test files (or classes) whose seconds are kept
MESSAGE = 2000


def _open(path: Path, root: Path | None) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    if root is None:
        return os.open(path, flags)
    *folders, name = os.path.relpath(path, root).split("/")
    if ".." in folders or name in ("", ".", ".."):
        raise OSError(errno.ENOENT, "not in its tree")
    held = folder_beneath(root, folders)
    try:
        return os.open(name, flags, dir_fd=held)
    finally:
        os.close(held)


def read_junit(path: Path, *, since: float, tree: Path | None = None) -> TestRun:
    """The test results in ``path``, written after ``since`` (a ``time.time()``).  The gate
    wrote it: opened without following a link and without waiting (a FIFO there would
    block the run forever), and read only when it is a regular file, up to ``MAX_BYTES``.
    ``tree``: the tree it is in (trusted), each folder below it opened without following a
    link too (the gate may turn ``reports`` into a link to another gate's, or anywhere)."""
    try:
        fd = _open(path, tree)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return TestRun(problem=f"{path.name} is a link, or in a linked folder: not read")
        return TestRun(problem=f"no JUnit file at {path.name}: the gate did not write it")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return TestRun(problem=f"{path.name} is not a regular file: not read")
        if info.st_mtime < since - 1.0:  # a second of slack for coarse file times
            return TestRun(problem=f"{path.name} is older than this run: not its results")
        if info.st_size > MAX_BYTES:
            return TestRun(problem=f"{path.name} is larger than {MAX_BYTES >> 20} MiB: not read")
        chunks, left = [], MAX_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        return TestRun(problem=f"{path.name} could not be read: {exc.strerror}"[:300])
    finally:
        os.close(fd)
    if left <= 0:
        return TestRun(problem=f"{path.name} is larger than {MAX_BYTES >> 20} MiB: not read")
    try:
        root = ET.fromstring(b"".join(chunks))
    except (ET.ParseError, ValueError) as exc:
        return TestRun(problem=f"{path.name} is not JUnit XML: {exc}"[:300])
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    cases: list[TestCase] = []
    skipped: list[TestCase] = []  # kept only where failures leave room: they come first
    seconds: dict[str, float] = {}
    for case in root.iter("testcase"):
        counts["tests"] += 1
        where = strip_ansi(case.get("file") or case.get("classname") or "")[:300]
        if where and (where in seconds or len(seconds) < MAX_FILES):
            seconds[where] = seconds.get(where, 0.0) + _seconds(case.get("time"))
        outcome, message = _outcome(case)
        if outcome == "passed":
            continue
        counts[{"failed": "failures", "error": "errors", "skipped": "skipped"}[outcome]] += 1
        kept = skipped if outcome == "skipped" else cases
        if len(kept) < MAX_CASES:
            kept.append(
                TestCase(  # a gate's words: no escape sequence reaches a terminal
                    suite=strip_ansi(case.get("classname", ""))[:300],
                    name=strip_ansi(case.get("name", ""))[:300],
                    outcome=outcome,
                    message=strip_ansi(message)[:MESSAGE],
                )
            )
    return TestRun(
        tests=counts["tests"],
        failures=counts["failures"],
        errors=counts["errors"],
        skipped=counts["skipped"],
        cases=tuple(cases + skipped[: max(0, MAX_CASES - len(cases))]),
        seconds={k: round(v, 3) for k, v in seconds.items()},
    )


def _seconds(text: str | None) -> float:
    try:
        value = float(text or 0)
    except ValueError:
        return 0.0
    return value if 0 <= value < 1e7 else 0.0


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        found = case.find(tag)
        if found is not None:
            text = found.get("message") or (found.text or "").strip().splitlines()[:1]
            return outcome, text if isinstance(text, str) else "".join(text)
    return "passed", ""
