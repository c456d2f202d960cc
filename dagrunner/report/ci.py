"""CI integrations: a Markdown summary for GitHub's job page and ::error annotations."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from dagrunner.records import RunRecord, Status
from dagrunner.units import format_duration

_ICON = {"passed": "✅", "failed": "❌", "interrupted": "⏹️"}


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
        note = gate.reason.replace("|", "\\|")
        took = format_duration(gate.duration) if gate.attempts else "—"
        lines.append(f"| `{gate.id}` | {gate.status} | {took} | {note} |")
    for miss in record.budget.misses:
        lines.append(f"\n**Budget missed:** {miss.message}")
    lines.append(f"\nReport: `{run_dir / 'index.html'}`\n")
    return "\n".join(lines)


def publish(record: RunRecord, run_dir: Path, env: Mapping[str, str], stream: TextIO) -> None:
    """Append the summary to ``$GITHUB_STEP_SUMMARY`` and annotate failed gates, when on GitHub."""
    summary = env.get("GITHUB_STEP_SUMMARY")
    if not summary and env.get("GITHUB_ACTIONS") != "true":
        return
    if summary:
        with Path(summary).open("a", encoding="utf-8") as handle:
            handle.write(markdown_summary(record, run_dir))
    for gate in record.gates:
        if gate.status in (Status.FAILED, Status.TIMED_OUT):
            title = _escape_property(f"gate {gate.id} {gate.status}")
            stream.write(
                f"::error title={title}::{_escape_data(gate.reason or str(gate.status))}\n"
            )
    for miss in record.budget.misses:
        stream.write(f"::error title=speed budget missed::{_escape_data(miss.message)}\n")
    stream.flush()
