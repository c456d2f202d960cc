"""junit.xml in the form GitHub, GitLab and Jenkins read: one test case per gate."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from dagrunner.records.run import RunRecord, Status, TestRun
from dagrunner.report.logtail import read_log, strip_ansi

TAIL_BYTES = 16 * 1024


def render_junit(record: RunRecord, run_dir: Path) -> bytes:
    name = str(record.manifest.get("name", "dagrunner"))
    counts = record.counts()
    failures = counts.get("failed", 0) + counts.get("timed-out", 0)
    errors = counts.get("interrupted", 0) + counts.get("cancelled", 0)
    skipped = counts.get("skipped", 0)
    suites = ET.Element(
        "testsuites",
        name=f"dagrunner {name}",
        tests=str(len(record.gates)),
        failures=str(failures),
        errors=str(errors),
        time=f"{record.wall:.3f}",
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=name,
        tests=str(len(record.gates)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{record.wall:.3f}",
        timestamp=record.started_at.replace("+00:00", ""),
        hostname=str(record.machine.get("hostname", "")),
    )
    for gate in record.gates:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"dagrunner.{name}",
            name=gate.id,
            time=f"{gate.duration:.3f}",
        )
        if gate.status is Status.PASSED:
            continue  # a plain pass carries no text: do not read its log
        tail = "" if gate.status is Status.SKIPPED else _tail(run_dir, gate.log)
        if gate.status.failed:
            element = ET.SubElement(
                case, "failure", message=gate.reason or str(gate.status), type=str(gate.status)
            )
            element.text = tail
        elif gate.status in (Status.INTERRUPTED, Status.CANCELLED):
            element = ET.SubElement(
                case, "error", message=gate.reason or str(gate.status), type=str(gate.status)
            )
            element.text = tail
        elif gate.status is Status.SKIPPED:
            ET.SubElement(case, "skipped", message=gate.reason or "skipped")
        elif gate.status is Status.FLAKY:
            # Surefire's form, which Jenkins and GitLab read: the case passed, after these failures.
            for attempt in gate.attempts[:-1]:
                flaky = ET.SubElement(
                    case,
                    "flakyFailure",
                    message=f"attempt {attempt.number}: exit code {attempt.exit_code}",
                    type="flaky",
                )
                flaky.text = _tail(run_dir, attempt.log)
            out = ET.SubElement(case, "system-out")
            out.text = f"[dagrunner] flaky: {gate.reason}\n{tail}"
        elif gate.status is Status.CACHED:
            out = ET.SubElement(case, "system-out")
            out.text = f"[dagrunner] {gate.reason}\n{tail}"
    for gate in record.gates:
        if gate.tests is not None and gate.tests.cases:
            _gate_tests(suites, name, gate.id, gate.tests)
    ET.indent(suites)
    body: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return body


def _tail(run_dir: Path, log: str) -> str:
    return _clean(strip_ansi(read_log(run_dir, log, limit=TAIL_BYTES)))


def _clean(text: str) -> str:
    # XML 1.0 cannot carry most control characters even escaped.
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def write_junit(record: RunRecord, run_dir: Path) -> None:
    from dagrunner.files import atomic_write

    atomic_write(run_dir / "junit.xml", render_junit(record, run_dir), durable=False)


def _gate_tests(suites: ET.Element, name: str, gate: str, tests: TestRun) -> None:
    """The gate's own test cases that did not pass (its JUnit file), as a suite of their own."""
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"{name}.{gate}",
        tests=str(len(tests.cases)),
        failures=str(sum(1 for c in tests.cases if c.outcome == "failed")),
        errors=str(sum(1 for c in tests.cases if c.outcome == "error")),
        skipped=str(sum(1 for c in tests.cases if c.outcome == "skipped")),
    )
    for case in tests.cases:
        element = ET.SubElement(suite, "testcase", classname=case.suite or gate, name=case.name)
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}[case.outcome]
        ET.SubElement(element, tag, message=case.message)
