"""Everything a run leaves behind: run.json, gates/<id>.json, junit.xml, index.html."""

from __future__ import annotations

from pathlib import Path

import orjson

from dagrunner.files import atomic_write
from dagrunner.records.integration import IntegrationResult
from dagrunner.records.run import RunRecord
from dagrunner.records.summary import RunIntegration
from dagrunner.report.html import write_html
from dagrunner.report.junit import write_junit

JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def write_run_dir(record: RunRecord, run_dir: Path) -> None:
    """Write the run's files into ``run_dir`` (which holds ``logs/`` already)."""
    (run_dir / "gates").mkdir(parents=True, exist_ok=True)
    gates = [gate.to_json() for gate in record.gates]
    for gate in gates:
        (run_dir / "gates" / f"{gate['id']}.json").write_bytes(
            orjson.dumps(gate, option=JSON_OPTIONS)
        )
    body = orjson.dumps(record.to_json(gates), option=JSON_OPTIONS)
    atomic_write(run_dir / "run.json", body, durable=False)
    write_junit(record, run_dir)
    write_html(record, run_dir)


def read_run_dir(run_dir: Path) -> RunRecord:
    return RunRecord.from_json(orjson.loads((run_dir / "run.json").read_bytes()))


def write_integration(result: IntegrationResult, reports: Path) -> None:
    """What ``integrate run`` leaves in ``reports``: ``integration.json``, and the newest gate
    run's record (a cancelled run wrote none) rewritten with the integration in it, so its
    page shows the whole pipeline."""
    reports.mkdir(parents=True, exist_ok=True)
    body = orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2)
    (reports / "integration.json").write_bytes(body)
    runs = sorted(
        (r for r in reports.glob("gates-*") if (r / "run.json").is_file()),
        key=lambda r: int(r.name.removeprefix("gates-")),
    )
    if runs:
        record = read_run_dir(runs[-1])
        record.integration = RunIntegration(((None, result),))
        write_run_dir(record, runs[-1])
