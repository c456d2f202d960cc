"""index.html: one self-contained page (inline CSS, JS and SVG, no network) rendered with jinja2.

Failures come first; the essentials (verdict, failures with their logs, the
table, the pictures) need no JavaScript; JS adds sorting, filtering and log
search.  Logs are embedded as bounded views (failing gates get more room) so a
1,000-gate report stays small; each view links to the full bounded log file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from dagrunner.files import atomic_write
from dagrunner.git.repo import cache_root
from dagrunner.records.run import REPORT_ORDER, GateResult, RunRecord, Status, failures_first
from dagrunner.report.ansi import ansi_to_html
from dagrunner.report.diagnose import why_failed
from dagrunner.report.logtail import failure_excerpt
from dagrunner.report.svg import dag_layout, pipeline_layout, timeline
from dagrunner.units import format_duration, format_size
from dagrunner.version import VERSION

FAILING_VIEW = 64 * 1024
OTHER_VIEW = 4 * 1024
TOTAL_LOG_BUDGET = 5 * 1024 * 1024 // 2


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept under the cache root: compiling the report's template costs
    about 0.1 s, which a fully cached run would otherwise pay every time."""
    folder = cache_root() / "templates" / VERSION
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # an unwritable cache: compile each time
    return jinja2.FileSystemBytecodeCache(str(folder))


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("dagrunner", "report/templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    bytecode_cache=_bytecode_cache(),
)
_ENV.filters["dur"] = format_duration
_ENV.filters["size"] = format_size


def _log_view(run_dir: Path, gate: GateResult, limit: int) -> dict[str, Any]:
    rel = gate.log or f"logs/{gate.id}.log"
    path = run_dir / rel
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            if size > limit:
                head = handle.read(limit // 4)
                handle.seek(size - (limit - limit // 4))
                tail = handle.read()
                cut = size - len(head) - len(tail)
                data = (
                    head + f"\n[report: {cut} bytes not shown here; open {rel}]\n".encode() + tail
                )
            else:
                data = handle.read()
    except OSError:
        return {
            "path": rel,
            "html": Markup(""),
            "excerpt": Markup(""),
            "size": 0,
            "exists": False,
            "elided": 0,
        }
    elided = gate.attempts[-1].log_elided if gate.attempts else 0
    text = data.decode("utf-8", "replace")
    return {
        "path": rel,
        "html": ansi_to_html(text),
        "excerpt": ansi_to_html(failure_excerpt(text)),
        "size": size,
        "exists": True,
        "elided": elided,
    }


def _context(record: RunRecord, run_dir: Path) -> dict[str, Any]:
    gates = failures_first(record.gates)
    budget_left = TOTAL_LOG_BUDGET
    logs: dict[str, dict[str, Any]] = {}
    for gate in gates:
        failing = not gate.status.ok and gate.status is not Status.SKIPPED
        limit = min(FAILING_VIEW if failing else OTHER_VIEW, max(budget_left, 512))
        view = _log_view(run_dir, gate, limit)
        budget_left -= min(view["size"], limit)
        view["open"] = failing
        logs[gate.id] = view
    failures = [
        g for g in gates if g.status in (Status.FAILED, Status.TIMED_OUT, Status.INTERRUPTED)
    ]
    speed = record.speed
    splits: dict[str, list[Any]] = {}
    for gate in record.gates:
        if gate.shard_of:
            splits.setdefault(gate.shard_of, []).append(gate)
    return {
        "splits": splits,
        "record": record,
        "gates": gates,
        "failures": failures,
        "said": why_failed(record, run_dir),  # the terminal's line of why, on the page too
        "logs": logs,
        "speed": speed,
        "crit": speed.critical_path,
        "dag": dag_layout(record),
        "timeline": timeline(record),
        "pipeline": pipeline_layout(record.integration),
        "counts": sorted(record.counts().items(), key=lambda kv: REPORT_ORDER[Status(kv[0])]),
        "commit": (record.git.get("commit") or "")[:12],
    }


def render_html(record: RunRecord, run_dir: Path) -> str:
    return _ENV.get_template("report.html.j2").render(**_context(record, run_dir))


def write_html(record: RunRecord, run_dir: Path) -> None:
    atomic_write(run_dir / "index.html", render_html(record, run_dir).encode(), durable=False)
