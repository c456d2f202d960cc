"""CI integrations: a Markdown summary for GitHub's job page and ::error annotations."""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

from dagrunner.records.run import RunRecord
from dagrunner.report.logtail import read_log, strip_ansi
from dagrunner.units import format_duration

ANNOTATIONS_PER_GATE = 10  # GitHub shows 10 error annotations per step
GROUP_LINES = 200
_LOCATION = re.compile(
    r"^\s*(?P<file>[\w.][\w./+@-]*\.[A-Za-z0-9]+):(?P<line>\d+)(?::(?P<col>\d+))?:?\s*(?P<msg>.*)$"
)

_ICON = {"passed": "✅", "failed": "❌", "interrupted": "⏹️"}


# A gate's reason may name a tree's paths: a line break there would end the table's row
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: control characters as their escapes, ``|``
    escaped, so a worker's file name cannot end the row and write Markdown of its own."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text).replace("|", "\\|")


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def markdown_summary(record: RunRecord, run_dir: Path) -> str:
    speed = record.speed
    lines = [
        f"### {_ICON.get(str(record.status), '')} dagrunner {record.manifest.get('name', '')}: "
        f"{record.status}",
        "",
        f"wall {format_duration(speed.wall)} · serial sum "
        f"{format_duration(speed.serial_sum)} · speedup {speed.speedup or 0:.2f}x · "
        f"critical path {' → '.join(speed.critical_path.gates)} · "
        f"cache hits {speed.cache_hits}",
        "",
        "| gate | status | duration | note |",
        "| --- | --- | --- | --- |",
    ]
    for gate in sorted(record.gates, key=lambda g: (g.status.ok, g.id)):
        note = _cell(gate.reason)
        took = format_duration(gate.duration) if gate.attempts else "—"
        lines.append(f"| `{gate.id}` | {gate.status} | {took} | {note} |")
    for miss in record.budget.misses:
        lines.append(f"\n**Budget missed:** {miss.message}")
    lines.append(f"\nReport: `{run_dir / 'index.html'}`\n")
    return "\n".join(lines)


def on_github(env: Mapping[str, str]) -> bool:
    return env.get("GITHUB_ACTIONS") == "true"


@contextlib.contextmanager
def commands_off(env: Mapping[str, str], stream: TextIO) -> Iterator[None]:
    """On GitHub, what is written in the block is never read as a workflow command: a gate's
    output (untrusted) could otherwise print ``::add-mask::`` or ``::error`` of its own."""
    if not on_github(env):
        yield
        return
    token = secrets.token_hex(16)
    stream.write(f"::stop-commands::{token}\n")
    try:
        yield
    finally:
        stream.flush()
        stream.write(f"::{token}::\n")
        stream.flush()


def locations(text: str, most: int = ANNOTATIONS_PER_GATE) -> list[tuple[str, int, int, str]]:
    """``path:line[:col]: message`` places in a log (ruff, mypy, pytest, compilers print them):
    (path, line, column or 0, message), repository-relative paths only, at most ``most``."""
    found: list[tuple[str, int, int, str]] = []
    for line in text.splitlines():
        match = _LOCATION.match(line)
        if match is None or match["file"].startswith(("/", "..")) or "/../" in match["file"]:
            continue
        where = (match["file"], int(match["line"]), int(match["col"] or 0), match["msg"].strip())
        if where not in found:
            found.append(where)
        if len(found) >= most:
            break
    return found


def publish(record: RunRecord, run_dir: Path, env: Mapping[str, str], stream: TextIO) -> None:
    """On GitHub: append the summary to ``$GITHUB_STEP_SUMMARY``; annotate each failed gate
    (and every ``path:line:`` its log names); fold each failed gate's log tail in a group."""
    summary = env.get("GITHUB_STEP_SUMMARY")
    if not summary and not on_github(env):
        return
    if summary:
        with Path(summary).open("a", encoding="utf-8") as handle:
            handle.write(markdown_summary(record, run_dir))
    failed = [g for g in record.gates if g.status.failed]
    for gate in failed:
        title = _escape_property(f"gate {gate.id} {gate.status}")
        stream.write(f"::error title={title}::{_escape_data(gate.reason or str(gate.status))}\n")
        text = strip_ansi(read_log(run_dir, gate.log, limit=64 * 1024))
        for file, line, col, message in locations(text):
            place = f"file={_escape_property(file)},line={line}" + (f",col={col}" if col else "")
            stream.write(f"::error {place},title={title}::{_escape_data(message or file)}\n")
    for miss in record.budget.misses:
        stream.write(f"::error title=speed budget missed::{_escape_data(miss.message)}\n")
    for gate in failed:
        tail = strip_ansi(read_log(run_dir, gate.log, limit=64 * 1024)).splitlines()
        stream.write(f"::group::{_escape_data(f'log of gate {gate.id} ({gate.status})')}\n")
        with commands_off(env, stream):
            stream.write("".join(f"{line}\n" for line in tail[-GROUP_LINES:]))
        stream.write("::endgroup::\n")
    stream.flush()
