"""Every manifest mistake: a stable code, the file and key at fault, a hint, exit 2, nothing run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_json, write_manifest

from dagrunner.cli.main import run_cli
from dagrunner.errors import DagrunnerError
from dagrunner.manifest.load import load_manifest
from dagrunner.report.rundir import default_runs

# Each case: manifest text, expected code, a fragment the key path must contain.
# Every gate would leave a marker file if it ran, so "nothing run" is checked too.
CASES = {
    "unknown-key": (
        '[gates.a]\nrun = ["touch", "ran"]\ntimeot = "5s"\n',
        "manifest-unknown-key",
        "gates.a.timeot",
    ),
    "unknown-top": (
        'colour = 1\n[gates.a]\nrun = ["touch", "ran"]\n',
        "manifest-unknown-key",
        "colour",
    ),
    "wrong-type": (
        '[gates.a]\nrun = ["touch", "ran"]\ncpu = "two"\n',
        "manifest-type",
        "gates.a.cpu",
    ),
    "needs-type": (
        '[gates.a]\nrun = ["touch", "ran"]\nneeds = "b"\n',
        "manifest-type",
        "gates.a.needs",
    ),
    "bad-duration": (
        '[gates.a]\nrun = ["touch", "ran"]\ntimeout = "5 minutes"\n',
        "manifest-value",
        "gates.a.timeout",
    ),
    "bad-size": (
        '[gates.a]\nrun = ["touch", "ran"]\nmemory = "lots"\n',
        "manifest-value",
        "gates.a.memory",
    ),
    "unknown-dep": (
        '[gates.a]\nrun = ["touch", "ran"]\nneeds = ["ghost"]\n',
        "manifest-unknown-dependency",
        "gates.a.needs",
    ),
    "cycle": (
        '[gates.a]\nrun = ["touch", "ran"]\nneeds = ["c"]\n[gates.b]\nrun = ["true"]\nneeds = ["a"]\n'
        '[gates.c]\nrun = ["true"]\nneeds = ["b"]\n',
        "manifest-cycle",
        "needs",
    ),
    "duplicate": (
        '[gates.a]\nrun = ["touch", "ran"]\n[gates.a]\nrun = ["true"]\n',
        "manifest-duplicate-id",
        "",
    ),
    "empty-run-list": (
        '[gates.a]\nrun = []\n[gates.b]\nrun = ["touch", "ran"]\n',
        "manifest-empty-run",
        "gates.a.run",
    ),
    "empty-run-str": (
        '[gates.a]\nrun = "  "\n[gates.b]\nrun = ["touch", "ran"]\n',
        "manifest-empty-run",
        "gates.a.run",
    ),
    "missing-run": (
        '[gates.a]\nneeds = []\n[gates.b]\nrun = ["touch", "ran"]\n',
        "manifest-empty-run",
        "gates.a.run",
    ),
    "bad-id": ('[gates."a/b"]\nrun = ["touch", "ran"]\n', "manifest-bad-id", "gates.a/b"),
    "syntax": ('[gates.a\nrun = ["touch", "ran"]\n', "manifest-parse", ""),
    "schema": ('schema = 9\n[gates.a]\nrun = ["touch", "ran"]\n', "manifest-schema", "schema"),
    "no-gates": ('name = "x"\n', "manifest-no-gates", "gates"),
    "env-name": (
        '[env]\npass = ["NOT A NAME"]\n[gates.a]\nrun = ["touch", "ran"]\n',
        "manifest-value",
        "env.pass",
    ),
    "never-fits": (
        '[governor]\ncpu = 2\n[gates.a]\nrun = ["touch", "ran"]\ncpu = 3\n',
        "gate-never-fits",
        "gates.a",
    ),
    "abs-cwd": (
        '[gates.a]\nrun = ["touch", "ran"]\ncwd = "/etc"\n',
        "manifest-value",
        "gates.a.cwd",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifest_mistake_json(case: str, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, code, key = CASES[case]
    path = write_manifest(repo, text)
    exit_code, body = run_json(capsys, "release-check", str(path), "--repo", str(repo))
    assert exit_code == 2
    error = body["error"]
    assert error["code"] == code
    assert error["file"] == str(path)
    assert key in error.get("key", "")
    assert error["hint"]
    assert not (repo / "ran").exists(), "a gate ran although the manifest was bad"
    assert not default_runs(repo).exists(), "a bad manifest still wrote a report"


def test_text_error_has_no_traceback(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_manifest(repo, CASES["unknown-key"][0])
    assert run_cli(["release-check", str(path), "--repo", str(repo)]) == 2
    err = capsys.readouterr().err
    assert "error[manifest-unknown-key]" in err
    assert "did you mean 'timeout'" in err
    assert "Traceback" not in err


def test_unknown_dependency_names_both_ends(repo: Path) -> None:
    from dagrunner.engine.graph import build_graph

    path = write_manifest(repo, CASES["unknown-dep"][0])
    with pytest.raises(DagrunnerError) as info:
        build_graph(load_manifest(path))
    assert "'a' needs 'ghost'" in info.value.message


def test_cycle_is_printed(repo: Path) -> None:
    from dagrunner.engine.graph import build_graph

    path = write_manifest(repo, CASES["cycle"][0])
    with pytest.raises(DagrunnerError) as info:
        build_graph(load_manifest(path))
    message = info.value.message
    assert all(name in message for name in ("a", "b", "c"))
    assert message.count("->") == 3


def test_json_manifest_same_shape(repo: Path) -> None:
    path = repo / "m.json"
    path.write_text(
        json.dumps(
            {
                "name": "j",
                "env": {"pass": ["PATH"], "set": {"X": "1"}},
                "defaults": {"timeout": "30s"},
                "gates": {
                    "a": {"run": ["true"], "memory": "64M"},
                    "b": {"run": "echo hi", "needs": ["a"]},
                },
            }
        )
    )
    manifest = load_manifest(path)
    assert manifest.name == "j"
    assert manifest.gates["a"].memory == 64 << 20
    assert manifest.gates["a"].timeout == 30.0
    assert manifest.gates["b"].run == "echo hi"
    assert manifest.env.values == {"X": "1"}


def test_json_duplicate_gate(repo: Path) -> None:
    path = repo / "m.json"
    path.write_text('{"gates": {"a": {"run": ["true"]}, "a": {"run": ["false"]}}}')
    with pytest.raises(DagrunnerError) as info:
        load_manifest(path)
    assert info.value.code == "manifest-duplicate-id"


def test_missing_manifest(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body = run_json(capsys, "release-check", "--repo", str(repo))
    assert code == 2
    assert body["error"]["code"] == "manifest-not-found"
    assert body["error"]["file"].endswith("manifests/release.toml")


def test_defaults_apply_and_gate_overrides(repo: Path) -> None:
    path = write_manifest(
        repo,
        """
        [defaults]
        cpu = 0.5
        retries = 2
        [gates.a]
        run = ["true"]
        [gates.b]
        run = ["true"]
        retries = 0
    """,
    )
    manifest = load_manifest(path)
    assert manifest.gates["a"].cpu == 0.5
    assert manifest.gates["a"].retries == 2
    assert manifest.gates["b"].retries == 0


def test_project_release_manifest_is_valid() -> None:
    from dagrunner.engine.graph import build_graph

    manifest = load_manifest(Path(__file__).parent.parent / "manifests" / "release.toml")
    graph = build_graph(manifest)
    assert {"lint", "types"} <= set(graph.nodes)
