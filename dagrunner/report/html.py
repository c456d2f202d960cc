"""index.html: one self-contained page rendered from run.json with jinja2."""

from __future__ import annotations

from pathlib import Path

import jinja2

from dagrunner.fsutil import atomic_write
from dagrunner.records import RunRecord

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("dagrunner", "report/templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)


def render_html(record: RunRecord, run_dir: Path) -> str:
    return _ENV.get_template("report.html.j2").render(record=record)


def write_html(record: RunRecord, run_dir: Path) -> None:
    atomic_write(run_dir / "index.html", render_html(record, run_dir).encode(), durable=False)
