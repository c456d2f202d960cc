"""Everything a run leaves behind: run.json, gates/<id>.json, junit.xml, index.html."""

from __future__ import annotations

import contextlib
from html import escape
from pathlib import Path

import orjson

from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write, mark_own_output
from dagrunner.git.repo import repo_info
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
    atomic_write(reports / "index.html", _integration_page(result, runs).encode(), durable=False)


def _integration_page(result: IntegrationResult, runs: list[Path]) -> str:
    """The integration run's own page: where each envelope ended, and each gate run's page
    (the newest, which shows the whole pipeline, first)."""
    rows = []
    for outcome in result.envelopes:
        said = outcome.details
        detail = said.commit or ", ".join(said.conflicts or said.failed_gates or ()) or said.reason
        page = ""
        if said.report and (Path(said.report) / "index.html").is_file():
            page = f' <a href="{escape(Path(said.report).name)}/index.html">gate run</a>'
        rows.append(
            f"<tr><td>{escape(outcome.id)}</td><td class='{escape(str(outcome.state))}'>"
            f"{escape(str(outcome.state))}</td><td>{escape(detail or '')}{page}</td></tr>"
        )
    links = "".join(
        f'<li><a href="{escape(r.name)}/index.html">{escape(r.name)}</a></li>'
        for r in reversed(runs)
    )
    title = f"dagrunner integration onto {result.target}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}td{{padding:2px 10px}}
.landed{{color:#1a7f37}}.conflict,.gates-failed,.rejected{{color:#cf222e;font-weight:bold}}</style>
</head><body><h1>{escape(title)}</h1>
<p>{escape(result.start[:12])} &rarr; {escape(result.end[:12])}; {result.gate_runs} gate run(s)</p>
<table><tr><th>envelope</th><th>state</th><th>detail</th></tr>{"".join(rows)}</table>
<h2>Gate runs</h2><ul>{links or "<li>none: nothing was gated</li>"}</ul>
</body></html>
"""


def default_runs(repo: Path) -> Path:
    """Where a repository's runs go by default: ``<git common dir>/dagrunner/reports``, out of
    the tree under test (tools that walk a tree skip ``.git``); ``repo/reports`` outside git."""
    try:
        return repo_info(repo).state_dir / "reports"
    except DagrunnerError:
        return repo / "reports"


def prepare_run_dir(repo: Path, report_dir: Path | None, run_id: str, runs_in: str = "") -> Path:
    """The run directory: ``report_dir`` itself, else ``<runs>/<run_id>`` with ``runs`` the
    manifest's ``[report] dir`` (``runs_in``, relative to ``repo``) or, by default, outside the
    tree under test (``default_runs``).  A non-empty folder that is not a run's is refused."""
    if report_dir:
        run_dir = report_dir.resolve()
    else:
        run_dir = (repo / runs_in if runs_in else default_runs(repo)) / run_id
    if run_dir.exists() and any(run_dir.iterdir()) and not (run_dir / "run.json").exists():
        raise DagrunnerError(
            "report-dir-not-empty",
            "the report directory holds files that are not a dagrunner run",
            where=str(run_dir),
            hint="pass an empty or new directory, or an earlier run's directory to replace it",
        )
    for sub in ("gates", "logs"):
        folder = run_dir / sub
        if folder.is_dir():
            for old in folder.iterdir():
                old.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    if report_dir is None:
        mark_own_output(run_dir.parent)
        _point_latest(run_dir)
    return run_dir


def _point_latest(run_dir: Path) -> None:
    """``reports/latest`` -> this run, so CI can publish a fixed path (replaced atomically)."""
    latest = run_dir.parent / "latest"
    if latest.exists() and not latest.is_symlink():
        return  # a user's own file or folder of that name is left alone
    temp = run_dir.parent / f".latest-{run_dir.name}"
    with contextlib.suppress(OSError):
        temp.unlink(missing_ok=True)
        temp.symlink_to(run_dir.name)
        temp.replace(latest)
