"""The gate cache on real repositories: hits, exact misses, proof, explain, corruption, sharing."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import CLI, PY, check, git, run_json, write_manifest

from dagrunner.process.contain import detect

MANIFEST = """
    cache_salt = "{salt}"
    [env]
    pass = ["PATH"]
    [sandbox]
    writable = ["{outside}"]
    [gates.gen]
    run = "echo gen >> {ran}"
    inputs = ["src/gen/**"]
    [gates.lint]
    run = "echo lint >> {ran}"
    inputs = ["src/**/*.py"]
    tools = ["cat '{tool}'"]
    [gates.unit]
    run = "echo unit >> {ran}; echo MODE=$MODE"
    inputs = ["tests/**"]
    needs = ["gen"]
    env = {{ pass = ["MODE"] }}
    [gates.package]
    run = "echo package >> {ran}"
    inputs = ["pyproject.toml"]
    needs = ["unit"]
    timeout = "{timeout}"
    [gates.always]
    run = "echo always >> {ran}"
"""


@pytest.fixture
def project(repo: Path, tmp_path: Path) -> dict[str, Path]:
    for rel, text in {
        "src/gen/a.py": "A = 1\n",
        "src/app/b.py": "B = 2\n",
        "tests/test_x.py": "def test(): pass\n",
        "pyproject.toml": "[project]\nname='x'\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project")
    # A tool of the project's own (a gate's tools commands see what the gate sees: its tree)
    tool = repo / "tool-version"
    tool.write_text("tool 1.0\n")
    (repo / ".git" / "info" / "exclude").write_text("tool-version\n")
    return {"repo": repo, "ran": tmp_path / "ran.log", "tool": tool}


def run(
    capsys: pytest.CaptureFixture[str],
    p: dict[str, Path],
    *args: str,
    salt: str = "",
    timeout: str = "1m",
) -> tuple[int, dict[str, Any], set[str]]:
    p["ran"].write_text("")
    text = MANIFEST.format(
        ran=p["ran"], tool=p["tool"], salt=salt, timeout=timeout, outside=p["ran"].parent
    )
    code, body, _ = check(capsys, p["repo"], text, *args)
    ran = set(p["ran"].read_text().split())
    return code, body, ran


def statuses(body: dict[str, Any]) -> dict[str, str]:
    return {g["id"]: g["status"] for g in body["gates"]}


def explain(capsys: pytest.CaptureFixture[str], p: dict[str, Path], gate: str) -> list[str]:
    code, body = run_json(
        capsys, "cache", "explain", gate, str(p["repo"] / "m.toml"), "--repo", str(p["repo"])
    )
    assert code == 0
    changes: list[str] = body["changes"]
    return changes


def test_second_identical_run_hits_every_cacheable_gate(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    code, first, ran = run(capsys, project)
    assert code == 0 and ran == {"gen", "lint", "unit", "package", "always"}
    code, second, ran = run(capsys, project)
    assert code == 0
    assert ran == {"always"}, "only the gate without inputs may run again"
    assert statuses(second) == {
        "gen": "cached",
        "lint": "cached",
        "unit": "cached",
        "package": "cached",
        "always": "passed",
    }
    proof = next(g for g in second["gates"] if g["id"] == "unit")["cache"]
    assert proof["hit"] is True
    assert proof["stored_by_run"] == first["run_id"]
    assert proof["inputs"]["count"] == 1
    assert set(proof["needs"]) == {"gen"}
    assert second["cache"]["hits"] == 4
    assert second["speed"]["cache_hits"] == 4
    assert second["speed"]["cache_saved"] >= 0


def test_one_input_file_misses_exactly_its_dependents(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    run(capsys, project)
    (project["repo"] / "src/gen/a.py").write_text("A = 2\n")  # gen, lint read it; unit needs gen
    assert "input changed: src/gen/a.py" in explain(capsys, project, "gen")
    assert "upstream key changed: gen" in explain(capsys, project, "unit")
    code, _, ran = run(capsys, project)
    assert code == 0
    assert ran == {"gen", "lint", "unit", "package", "always"}


def test_untracked_input_file_counts(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    run(capsys, project)
    (project["repo"] / "src/app/new.py").write_text("N = 1\n")
    assert "input added: src/app/new.py" in explain(capsys, project, "lint")
    _, _, ran = run(capsys, project)
    assert ran == {"lint", "always"}


def test_ignored_files_only_when_named(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    repo = project["repo"]
    (repo / ".gitignore").write_text("reports/\nsrc/app/ignored.py\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "ignore")
    run(capsys, project)
    (repo / "src/app/ignored.py").write_text("I = 1\n")
    _, _, ran = run(capsys, project)
    assert ran == {"always"}, "a gitignored file matched only by a wildcard is not an input"


def test_env_value_misses_the_gate_that_passes_it(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODE", "one")
    run(capsys, project)
    monkeypatch.setenv("MODE", "two")
    assert "env: MODE has a different value" in explain(capsys, project, "unit")
    _, _, ran = run(capsys, project)
    assert ran == {"unit", "package", "always"}


def test_tool_version_misses_the_gate_that_declares_it(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    run(capsys, project)
    project["tool"].write_text("tool 2.0\n")
    changes = explain(capsys, project, "lint")
    _, _, ran = run(capsys, project)
    assert ran == {"lint", "always"}
    assert any(
        c.startswith(f"tool changed: cat '{project['tool']}'") and "tool 2.0" in c for c in changes
    )


def test_shorter_timeout_is_not_satisfied_by_a_longer_one(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    run(capsys, project, timeout="10m")
    write_manifest(
        project["repo"],
        MANIFEST.format(
            ran=project["ran"],
            tool=project["tool"],
            salt="",
            timeout="1m",
            outside=project["ran"].parent,
        ),
    )
    assert any("definition: timeout changed" in c for c in explain(capsys, project, "package"))
    _, _, ran = run(capsys, project, timeout="1m")
    assert ran == {"package", "always"}


def test_salt_disowns_every_entry(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    run(capsys, project)
    _, _, ran = run(capsys, project, salt="poisoned-2026-11")
    assert ran == {"gen", "lint", "unit", "package", "always"}


def test_no_cache_bypasses_reads(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    run(capsys, project)
    _, body, ran = run(capsys, project, "--no-cache")
    assert ran == {"gen", "lint", "unit", "package", "always"}
    proof = next(g for g in body["gates"] if g["id"] == "lint")["cache"]
    assert proof["hit"] is False and "--no-cache" in proof["reason"]


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "entries").glob("*/*.json"))


@pytest.mark.parametrize("damage", ["tamper", "truncate", "empty", "log"])
def test_damaged_entry_is_a_miss_with_a_warning(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path], isolated_home: Path, damage: str
) -> None:
    run(capsys, project)
    for entry in entries(isolated_home / "dagrunner-cache"):
        if damage == "tamper":
            body = orjson.loads(entry.read_bytes())
            body["body"]["result"]["status"] = "passed"
            body["body"]["duration"] = 999.0
            entry.write_bytes(orjson.dumps(body))
        elif damage == "truncate":
            entry.write_bytes(entry.read_bytes()[:40])
        elif damage == "empty":  # what a power loss can leave: entries are not fsynced
            entry.write_bytes(b"")
        else:
            entry.with_suffix(".log").write_bytes(b"forged log\n")
    code, body, ran = run(capsys, project)
    assert code == 0
    assert ran == {"gen", "lint", "unit", "package", "always"}
    assert any("corrupt" in w for w in body["warnings"])


def test_unmatched_glob_is_a_warning(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    code, body, _ = check(
        capsys,
        repo,
        """
        [gates.a]
        run = ["true"]
        inputs = ["README", "docs/**/*.md"]
    """,
    )
    assert code == 0
    assert "gate 'a': input glob 'docs/**/*.md' matched no file" in body["warnings"]
    proof = body["gates"][0]["cache"]
    assert proof["unmatched_globs"] == ["docs/**/*.md"]


def test_two_runs_sharing_a_cache_at_once(project: dict[str, Path], tmp_path: Path) -> None:
    repo = project["repo"]
    write_manifest(
        repo,
        MANIFEST.format(
            ran=project["ran"],
            tool=project["tool"],
            salt="",
            timeout="1m",
            outside=project["ran"].parent,
        ),
    )
    procs = [
        subprocess.Popen(
            [
                *CLI,
                "release-check",
                "m.toml",
                "--quiet",
                "--json",
                "--report-dir",
                str(tmp_path / f"run{i}"),
            ],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert orjson.loads(out)["status"] == "passed"


def test_prune_bounds_the_store(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path], isolated_home: Path
) -> None:
    run(capsys, project)
    assert len(entries(isolated_home / "dagrunner-cache")) == 4
    code, body = run_json(capsys, "cache", "prune", "--max-size", "0")
    assert code == 0 and len(body["removed"]) == 4
    assert entries(isolated_home / "dagrunner-cache") == []


def test_budget_miss_exits_1_and_names_the_budget(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    code, body, _ = check(
        capsys,
        repo,
        """
        [budget]
        max_wall = "50ms"
        [gates.slow]
        run = "sleep 0.3"
        max_duration = "100ms"
    """,
    )
    assert code == 1
    assert body["status"] == "failed"
    misses = {m["budget"]: m for m in body["budget"]["misses"]}
    assert set(misses) == {"max_wall", "gates.slow.max_duration"}
    assert "over max_wall" in misses["max_wall"]["message"]
    assert "critical path: slow" in misses["max_wall"]["message"]
    assert all(g["status"] == "passed" for g in body["gates"])


def test_min_speedup_budget(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    code, body, _ = check(
        capsys,
        repo,
        """
        [budget]
        min_speedup = 1.5
        [gates.a]
        run = "sleep 0.2"
        [gates.b]
        run = "sleep 0.2"
        needs = ["a"]
    """,
    )
    assert code == 1
    assert body["budget"]["misses"][0]["budget"] == "min_speedup"


def test_budget_table_of_per_gate_durations(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    code, body, _ = check(
        capsys,
        repo,
        '[budget]\nmax_duration = { slow = "50ms" }\n[gates.slow]\nrun = "sleep 0.2"\n',
    )
    assert code == 1
    assert body["budget"]["misses"][0]["budget"] == "gates.slow.max_duration"
    code, body, _ = check(
        capsys, repo, '[budget]\nmax_duration = { ghost = "1s" }\n[gates.a]\nrun = ["true"]\n'
    )
    assert code == 2 and body["error"]["key"] == "budget.max_duration.ghost"


def test_explain_shows_the_tool_lines_that_differ_and_a_revert_is_a_hit(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "tool.txt").write_text("toolkit\nplugin-a==1.0\nplugin-b==2.0\n")
    manifest = """
    [gates.g]
    run = ["true"]
    inputs = ["README"]
    tools = ["cat tool.txt"]
    """
    assert check(capsys, repo, manifest)[0] == 0
    (repo / "tool.txt").write_text("toolkit\nplugin-a==1.1\x1b]0;pwned\x07\nplugin-b==2.0\n")
    path = repo / "m.toml"
    _, body = run_json(capsys, "cache", "explain", "g", str(path), "--repo", str(repo))
    change = next(c for c in body["changes"] if c.startswith("tool changed: cat tool.txt"))
    assert "-plugin-a==1.0" in change and "+plugin-a==1.1" in change and "toolkit" not in change
    assert "\x1b" not in change and "\x07" not in change  # a tool cannot write to the terminal
    (repo / "tool.txt").write_text("toolkit\nplugin-a==1.0\nplugin-b==2.0\n")  # revert
    assert check(capsys, repo, manifest)[0] == 0  # a hit of the first entry
    (repo / "README").write_text("edited\n")
    assert check(capsys, repo, manifest)[0] == 0  # stores a newer entry
    (repo / "README").write_text("hello\n")  # revert: the first entry matches again
    _, body = run_json(capsys, "cache", "explain", "g", str(path), "--repo", str(repo))
    assert body["hit"] is True and body["changes"][0].startswith("hit: ")


def test_a_junit_report_written_into_the_tree_keys_no_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each run writes the report again (its times differ): were it an input of the ``**``
    gates, none of them would ever hit."""
    (repo / "stamp.py").write_text(
        "import pathlib, time\n"
        "pathlib.Path('out').mkdir(exist_ok=True)\n"
        "pathlib.Path('out/junit.xml').write_text(\n"
        '    f\'<testsuite tests="1" time="{time.time()}"><testcase name="t"/></testsuite>\'\n'
        ")\n"
    )
    git(repo, "add", "stamp.py")
    git(repo, "commit", "-qm", "stamp")
    body = f"""
[gates.tests]
run = ["{PY}", "stamp.py"]
junit = "out/junit.xml"
inputs = ["**"]

[gates.docs]
run = ["true"]
inputs = ["**"]
"""
    code, _, _ = check(capsys, repo, body)
    assert code == 0 and (repo / "out" / "junit.xml").exists()
    code, summary, _ = check(capsys, repo, body)
    assert code == 0
    assert {g["id"]: g["status"] for g in summary["gates"]} == {"tests": "cached", "docs": "cached"}
    # a real input still counts (a file it reads: keyed by its reads, a README edit is not)
    (repo / "stamp.py").write_text((repo / "stamp.py").read_text() + "# changed\n")
    code, summary, _ = check(capsys, repo, body)
    assert {g["id"]: g["status"] for g in summary["gates"]}["tests"] == "passed"


SEEDED = """
    [env]
    pass = ["PATH"]
    [sandbox]
    writable = ["{outside}"]
    [[worktrees.seed]]
    path = ".venv"
    key = ["pyproject.toml"]
    build = "true"
    [gates.tests]
    run = "fake-pytest; echo tests >> {ran}"
    inputs = ["src/**"]
    tools = ["fake-pytest --version"]
"""


def test_a_tool_of_the_trees_own_venv_keys_the_gate_that_runs_it(
    capsys: pytest.CaptureFixture[str], project: dict[str, Path]
) -> None:
    """The gate runs the tree's venv's program (its seed's ``bin`` first on PATH), which the
    caller's PATH does not have: upgrading it there is a miss.  Found on pypa/packaging,
    where the key asked the caller's pytest and served a pass of the old one."""
    repo, ran = project["repo"], project["ran"]
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    tool = repo / ".venv" / "bin" / "fake-pytest"
    (repo / ".git" / "info" / "exclude").write_text("tool-version\n.venv/\n")
    text = SEEDED.format(ran=ran, outside=ran.parent)
    said = []
    for version in ("1.0", "1.0", "2.0"):
        tool.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo fake-pytest {version}\n')
        tool.chmod(0o755)
        ran.write_text("")
        code, body, _ = check(capsys, repo, text)
        assert code == 0, body
        said.append((statuses(body)["tests"], ran.read_text().split()))
    assert said == [("passed", ["tests"]), ("cached", []), ("passed", ["tests"])], said


@pytest.mark.skipif(not detect().views, reason="needs a mount namespace for the gate's view")
def test_a_hostile_tool_in_the_trees_venv_is_contained_like_a_gate(
    capsys: pytest.CaptureFixture[str],
    project: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tree's own ``.venv/bin`` program answers the key's tool command (a worker's, in a
    worker or integration tree): it runs as a gate does -- it cannot write outside the tree
    and the writable folders, and it never sees a caller's secret the manifest does not pass
    (none reaches the cache)."""
    secret = "s3cret-token-of-the-caller-0042"
    monkeypatch.setenv("GITHUB_TOKEN", secret)
    repo, ran = project["repo"], project["ran"]
    elsewhere = Path(sys.prefix) / f"elsewhere-{uuid.uuid4().hex}"  # visible, not writable
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    tool = repo / ".venv" / "bin" / "fake-pytest"
    tool.write_text(
        f'#!/bin/sh\necho "token=$GITHUB_TOKEN" > "{elsewhere}" 2>/dev/null\n'
        'echo "fake-pytest 1.0 token=$GITHUB_TOKEN"\n'
    )
    tool.chmod(0o755)
    (repo / ".git" / "info" / "exclude").write_text("tool-version\n.venv/\n")
    code, body, _ = check(capsys, repo, SEEDED.format(ran=ran, outside=ran.parent))
    assert code == 0, body
    written = elsewhere.exists()
    elsewhere.unlink(missing_ok=True)
    assert not written
    cache = Path(os.environ["DAGRUNNER_CACHE_DIR"])
    stored = [p for p in cache.rglob("*") if p.is_file()]
    assert stored and not any(secret.encode() in p.read_bytes() for p in stored)
