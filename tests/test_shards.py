"""``split``: a test gate's files shared out among shards, on real pytest runs -- every
file runs exactly once, the second run is balanced from the first run's JUnit, a file added
between runs is run, and a shard whose files did not change stays cached."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import check, gate_results, git, run_json

from dagrunner.engine.plan import RunOptions
from dagrunner.engine.steps import load_step
from dagrunner.report.rundir import default_runs

SECONDS = {"a": 0.2, "b": 1.2, "c": 0.2, "d": 0.4, "e": 0.2, "f": 0.2}

MANIFEST = f"""
[env]
set = {{ PYTHONDONTWRITEBYTECODE = "1" }}

[gates.tests]
run = ["{sys.executable}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "--junitxml=out/junit-{{shard}}.xml", "{{files}}"]
junit = "out/junit-{{shard}}.xml"
split = {{ files = ["tests/test_*.py"], shards = 2 }}
inputs = ["tests/test_*.py", "tests/conftest.py"]

[gates.after]
run = ["true"]
needs = ["tests"]
inputs = ["tests/conftest.py"]
"""


def write_tests(repo: Path, seconds: dict[str, float]) -> None:
    (repo / "tests").mkdir(exist_ok=True)
    (repo / "tests" / "conftest.py").write_text("")
    for name, took in seconds.items():
        (repo / "tests" / f"test_{name}.py").write_text(
            f"import time\n\n\ndef test_{name}() -> None:\n    time.sleep({took})\n"
        )
    (repo / ".gitignore").write_text("reports/\nout/\n")


def shard_files(gates: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Each shard's test files, as its own JUnit file says they ran."""
    return {
        gid: sorted(g["tests"]["seconds"]) for gid, g in gates.items() if gid.startswith("tests-")
    }


def loads(gates: dict[str, dict[str, Any]]) -> list[float]:
    return [sum(g["tests"]["seconds"].values()) for i, g in gates.items() if i.startswith("tests-")]


def test_every_file_runs_once_and_the_second_run_is_balanced_by_the_first(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tests(repo, SECONDS)
    code, body, run_dir = check(capsys, repo, MANIFEST, "--no-cache")
    assert code == 0, body
    first = gate_results(run_dir)
    assert set(first) == {"tests-1", "tests-2", "after"}
    ran = [f for files in shard_files(first).values() for f in files]
    assert sorted(ran) == sorted(f"tests.test_{n}" for n in SECONDS)  # each exactly once
    assert first["after"]["started"] >= max(first[s]["finished"] for s in ("tests-1", "tests-2"))
    # unknown durations: the files went round-robin by name, one shard got b (1.2 s) and d
    code, _, run_dir = check(capsys, repo, MANIFEST, "--no-cache")
    second = loads(gate_results(run_dir))
    assert max(second) <= 1.2 * min(second), second  # balanced from the first run's JUnit
    assert max(loads(first)) > max(second)


def test_a_new_file_is_run_and_unchanged_shards_stay_cached(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tests(repo, SECONDS)
    for _ in range(2):  # the second run is balanced by the first's durations: new shards
        code, _, _ = check(capsys, repo, MANIFEST)
        assert code == 0
    code, _, run_dir = check(capsys, repo, MANIFEST)  # nothing changed: all cached
    assert {g["status"] for g in gate_results(run_dir).values()} == {"cached"}
    _, plan, _ = check(capsys, repo, MANIFEST, "--dry-run")
    b_shard = next(g for g, v in plan["gates"].items() if "tests/test_b.py" in v.get("files", []))
    (repo / "tests" / "test_b.py").write_text(
        "import time\n\n\ndef test_b() -> None:\n    time.sleep(1.2)\n    assert True\n"
    )
    code, _, run_dir = check(capsys, repo, MANIFEST)
    statuses = {gid: g["status"] for gid, g in gate_results(run_dir).items()}
    other = "tests-2" if b_shard == "tests-1" else "tests-1"
    assert statuses[b_shard] == "passed" and statuses[other] == "cached", statuses
    write_tests(repo, {"g": 0.1})  # a file added between runs
    code, _, run_dir = check(capsys, repo, MANIFEST, "--no-cache")
    ran = [f for files in shard_files(gate_results(run_dir)).values() for f in files]
    assert "tests.test_g" in ran and len(ran) == len(SECONDS) + 1


def test_only_a_split_gate_runs_all_its_shards_and_dry_run_shows_them(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tests(repo, SECONDS)
    code, body, _ = check(capsys, repo, MANIFEST, "--only", "tests", "--dry-run")
    assert code == 0
    assert sorted(body["gates"]) == ["tests-1", "tests-2"]
    assert all(g["shard_of"] == "tests" and g["files"] for g in body["gates"].values())
    files = [f for g in body["gates"].values() for f in g["files"]]
    assert sorted(files) == sorted(f"tests/test_{n}.py" for n in SECONDS)


@pytest.mark.parametrize(
    ("split", "run", "code"),
    [
        ('{ files = ["tests/*.py"] }', '["pytest"]', "manifest-split"),
        ('{ files = ["nothing/*.py"] }', '["pytest", "{files}"]', "manifest-split-empty"),
        ('{ files = ["tests/*.py"], shards = 0 }', '["pytest", "{files}"]', "manifest-value"),
        ("{ files = [] }", '["pytest", "{files}"]', "manifest-value"),
    ],
)
def test_a_bad_split_is_a_coded_error_naming_the_key(
    repo: Path, capsys: pytest.CaptureFixture[str], split: str, run: str, code: str
) -> None:
    write_tests(repo, {"a": 0})
    git(repo, "add", "-A")
    (repo / "m.toml").write_text(f"[gates.t]\nrun = {run}\nsplit = {split}\n")
    exit_code, body = run_json(capsys, "release-check", str(repo / "m.toml"), "--repo", str(repo))
    assert exit_code == 2 and body["error"]["code"] == code, body
    assert "gates.t" in body["error"]["key"]
    assert not default_runs(repo).exists()


def test_a_file_named_like_an_option_is_passed_as_a_path(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree (an envelope's, when integrating) may name a file ``--co.py``: in ``{files}``
    it is ``./--co.py``, so pytest cannot read it as ``--collect-only`` and pass empty."""
    (repo / "--co.py").write_text("def test_x() -> None:\n    assert False\n")
    (repo / "m.toml").write_text(
        '[gates.t]\nrun = ["echo", "{files}"]\nsplit = { files = ["*.py"], shards = 1 }\n'
    )
    code, body = run_json(
        capsys, "release-check", str(repo / "m.toml"), "--repo", str(repo), "--dry-run"
    )
    assert code == 0
    (gate,) = body["gates"].values()
    assert gate["files"] == ["--co.py"]
    _, manifest = load_step(RunOptions(repo=repo, manifest=repo / "m.toml"))
    assert manifest.gates["t-1"].run == ("echo", "./--co.py")


def test_the_report_groups_a_split_gates_shards(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In headless Chromium: one line per split gate naming its shards, their verdicts and
    times and the tests they ran; each shard's row says whose shard it is."""
    from playwright.sync_api import sync_playwright
    from test_report import _chromium

    write_tests(repo, {"a": 0, "b": 0, "c": 0})
    code, _, run_dir = check(capsys, repo, MANIFEST, "--no-cache")
    assert code == 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        page.goto((run_dir / "index.html").as_uri())
        line = page.locator("#split-tests").inner_text()
        assert line.startswith("tests: split in 2 shards (tests-1 passed")
        assert "tests-2 passed" in line and line.endswith("); 3 tests")
        rows = page.locator("#gate-table tbody tr", has_text="shard of tests")
        assert rows.count() == 2
        browser.close()


def test_a_balanced_split_is_kept_while_times_wobble_and_redone_when_it_is_not() -> None:
    """Test times vary from run to run (this repository's by 10-40% under load): the last
    assignment stays while its slowest shard is within 1.5x of its fastest, so the
    shards' cache keys stay; past that the files are shared out again."""
    from dagrunner.engine.shards import plan_shards
    from dagrunner.manifest.fields import SplitSpec
    from dagrunner.manifest.load import GateSpec

    gate = GateSpec(id="t", run=("pytest", "{files}"), split=SplitSpec(("t/*.py",), 2))
    files = [f"t/test_{n}.py" for n in "abcd"]
    first = plan_shards(
        gate, files, 2, {"t.test_a": 4, "t.test_b": 3, "t.test_c": 2, "t.test_d": 1}, where="m"
    )
    last = {f: s.number for s in first for f in s.files}
    wobbled = {"t.test_a": 3.7, "t.test_b": 3.3, "t.test_c": 2.2, "t.test_d": 0.9}
    kept = plan_shards(gate, files, 2, wobbled, where="m", last=last)
    assert [s.files for s in kept] == [s.files for s in first]
    skewed = {"t.test_a": 9, "t.test_b": 3, "t.test_c": 2, "t.test_d": 1}
    again = plan_shards(gate, files, 2, skewed, where="m", last=last)
    assert [s.files for s in again] != [s.files for s in first]
    assert any(s.files == ("t/test_a.py",) for s in again)  # a alone: LPT's best


def test_a_shards_expected_time_counts_what_it_takes_beyond_its_tests(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shard's start-up (imports, collection: here a conftest that takes a second) is in
    no test case's time; planned on its files' times alone, a shard loses its turn to a
    shorter gate (docs/benchmarks.md, the public project)."""
    write_tests(repo, SECONDS)
    (repo / "tests" / "conftest.py").write_text("import time\n\ntime.sleep(1.0)\n")
    code, _, run_dir = check(capsys, repo, MANIFEST, "--no-cache")
    assert code == 0
    took = {g: r["duration"] for g, r in gate_results(run_dir).items() if g.startswith("tests-")}
    _, plan, _ = check(capsys, repo, MANIFEST, "--dry-run", "--no-cache")
    expected = {g: v["expected"] for g, v in plan["gates"].items() if g.startswith("tests-")}
    for gate, files in {g: v["files"] for g, v in plan["gates"].items() if g in expected}.items():
        tests = sum(SECONDS[Path(f).stem.removeprefix("test_")] for f in files)
        assert expected[gate] >= tests + 0.9, (expected, took)  # the second is counted
    assert max(expected.values()) <= 1.5 * max(took.values())


def test_a_file_named_like_a_response_file_is_passed_as_a_path(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pytest (8.2+) reads ``@FILE`` as more arguments: a tree's ``tests/@x/test_a.py``, in
    ``{files}`` relative to the gate's cwd ``tests``, read ``tests/x/test_a.py`` (``x`` a
    link to a folder outside the split's globs, so no shard runs it) saying ``--co``, and the
    shard only collected its tests: a failing test passed.  It is passed as ``./@x/...``."""
    (repo / "tests" / "@x").mkdir(parents=True)
    (repo / "tests" / "test_bad.py").write_text("def test_bad() -> None:\n    assert False\n")
    (repo / "tests" / "@x" / "test_a.py").write_text("def test_a() -> None:\n    pass\n")
    (repo / "notes" / "x").mkdir(parents=True)
    (repo / "notes" / "x" / "test_a.py").write_text("--co\n")
    (repo / "tests" / "x").symlink_to("../notes/x")
    manifest = f"""
[gates.tests]
run = ["{sys.executable}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "{{files}}"]
cwd = "tests"
split = {{ files = ["tests/**/test_*.py"], shards = 1 }}
"""
    code, body, run_dir = check(capsys, repo, manifest, "--no-cache")
    assert code == 1, body
    assert gate_results(run_dir)["tests-1"]["status"] == "failed"
