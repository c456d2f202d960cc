"""Keys from observed reads end to end (issue 46): real ``release-check`` runs on a real
repository, each gate's opens seen by the observer, its verdict keyed by what it read.

Gates whose inputs are the whole tree: ``build`` reads ``src/a.py`` and writes ``dist/``;
``test`` needs it and reads ``dist/``; ``deep`` reads ``data/deep.txt`` only through a
grandchild (``sh`` -> Python -> ``cat``); ``readme`` reads the README; ``vcs`` runs
``git status`` (git's database: an incomplete observation).  ``lint`` declares ``src/**``
and reads the README too (an undeclared read)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import CLI, PY, check, commit_release_manifest, git, skip_unless_reads_observed
from test_integration import worker

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit

MANIFEST = """
    [env]
    pass = ["PATH"]
    [gates.build]
    run = "mkdir -p dist; cat src/a.py > dist/out.txt"
    inputs = ["**"]
    observe = true
    [gates.test]
    run = "grep -q A dist/out.txt"
    inputs = ["**"]
    observe = true
    needs = ["build"]
    [gates.deep]
    run = "sh -c '{py} tools/outer.py'"
    inputs = ["**"]
    observe = true
    [gates.readme]
    run = "cat README > /dev/null"
    inputs = ["**"]
    observe = true
    [gates.vcs]
    run = "git status --short > /dev/null"
    inputs = ["**"]
    observe = true
    [gates.lint]
    run = "cat src/a.py README > /dev/null"
    inputs = ["src/**"]
    observe = true
"""
OUTER = """\
import subprocess, sys
out = subprocess.run(["cat", "data/deep.txt"], capture_output=True, text=True, check=True)
sys.exit(0 if "ok" in out.stdout else 1)
"""


@pytest.fixture
def tree(repo: Path) -> dict[str, Path]:
    skip_unless_reads_observed()
    for rel, text in {
        "src/a.py": "A = 1\n",
        "src/b.py": "B = 1\n",
        "data/deep.txt": "ok\n",
        "tools/outer.py": OUTER,
        ".gitignore": "reports/\ndist/\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    return {"repo": repo}


def run(
    capsys: pytest.CaptureFixture[str], t: dict[str, Path], *args: str
) -> tuple[set[str], dict[str, Any]]:
    code, body, _ = check(capsys, t["repo"], MANIFEST.format(py=PY), *args)
    assert code == 0, [(g["id"], g["reason"]) for g in body["gates"]]
    return {g["id"] for g in body["gates"] if g["status"] != "cached"}, body


def gate(body: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in body["gates"] if g["id"] == name)
    return found


def test_a_readme_edit_answers_every_gate_that_never_read_it(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    ran, first = run(capsys, tree)
    assert ran == {"build", "test", "deep", "readme", "vcs", "lint"}
    assert gate(first, "build")["cache"]["observed"]["keyed_by"] == "reads"
    (tree["repo"] / "README").write_text("an edit of the docs\n")
    ran, body = run(capsys, tree)
    # readme read it; vcs read git's database (keyed by the whole tree); lint declares src/**
    assert ran == {"readme", "vcs"}
    assert gate(body, "build")["status"] == "cached"
    assert "none of the" in gate(body, "build")["reason"]


def test_an_edit_of_a_file_a_grandchild_read_reruns_its_gate(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    run(capsys, tree)
    (tree["repo"] / "data" / "deep.txt").write_text("ok, edited\n")
    ran, _ = run(capsys, tree)
    assert ran == {"deep", "vcs"}


def test_an_edit_of_a_read_file_reruns_what_needs_its_gate(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    run(capsys, tree)
    (tree["repo"] / "src" / "a.py").write_text("A = 2\n")
    ran, _ = run(capsys, tree)
    # test reads only dist/ (not in the tree): build's verdict key changed, so test runs
    assert ran == {"build", "test", "vcs", "lint"}


def test_a_new_file_reruns_every_gate_keyed_by_reads(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    run(capsys, tree)
    (tree["repo"] / "src" / "new.py").write_text("N = 1\n")
    ran, _ = run(capsys, tree)
    assert ran == {"build", "test", "deep", "readme", "vcs", "lint"}


def test_an_undeclared_read_is_reported(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    _, body = run(capsys, tree)
    lint = gate(body, "lint")["cache"]["observed"]
    assert lint["undeclared"] == ["README"] and lint["keyed_by"] == "declared inputs"
    said = "gate 'lint' read files outside its inputs, which its cache key does not hold: README"
    assert any(said in w for w in body["warnings"])
    page = (Path(body["run_dir"]) / "index.html").read_text()
    assert "read files outside its inputs" in page and "README" in page
    (tree["repo"] / "src" / "a.py").write_text("A = 2\n")  # lint runs again, in a terminal
    shown = subprocess.run(
        [*CLI, "release-check", str(tree["repo"] / "m.toml"), "--repo", str(tree["repo"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"warning: {said}" in shown


def test_an_incomplete_observation_falls_back_to_the_whole_tree_key(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    _, body = run(capsys, tree)
    vcs = gate(body, "vcs")["cache"]["observed"]
    assert vcs["complete"] is False and vcs["keyed_by"] == "whole tree"
    assert "git" in vcs["why"]
    assert any("observation incomplete" in w and "vcs" in w for w in body["warnings"])
    ran, body = run(capsys, tree)
    assert gate(body, "vcs")["status"] == "cached"  # the same tree: its whole key answers
    (tree["repo"] / "src" / "b.py").write_text("B = 2\n")  # read by no gate
    ran, _ = run(capsys, tree)
    assert ran == {"vcs", "lint"}


def test_an_envelope_that_changes_nothing_a_gate_read_gets_its_verdict_from_its_base(
    project: Path,
) -> None:
    """In the queue: w1's tree runs ``heavy`` (it reads src/a.txt only); w2, built on w1
    landed, edits only a file heavy never read, and is answered from w1's tree's verdict."""
    skip_unless_reads_observed()
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(
        project,
        """
[gates.heavy]
run = "! grep -q BAD src/a.txt"
inputs = ["**"]
observe = true
""",
    )
    states: dict[str, str] = {}
    reused: dict[str, int] = {}
    for name, change in [
        ("w1", lambda p: (p / "shared.txt").write_text("docs, once\n")),
        ("w2", lambda p: (p / "shared.txt").write_text("docs, twice\n")),
        ("w3", lambda p: (p / "src" / "a.txt").write_text("BAD\n")),
    ]:
        submit(repo_info(project), [worker(project, name, change)])
        result = integrate(repo=project, window=1, batch=1)
        states |= {str(o.worker): str(o.state) for o in result.envelopes}
        reused[name] = result.gates_reused
    assert states == {"w1": "landed", "w2": "landed", "w3": "gates-failed"}
    # w1's tree ran it; w2's was answered from w1's verdict (w1 landed: its tree is the base)
    assert reused["w1"] == 0 and reused["w2"] == 1


def test_a_warm_tool_cache_falls_back_to_the_whole_tree_key(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    """A gate whose tool cache folder holds something (its first run left it) may trust it
    for files it only stat-ed: its next runs are keyed by the whole tree, and say why."""
    text = """
        [env]
        pass = ["PATH"]
        [gates.lint]
        run = "cat src/a.py > /dev/null; mkdir -p \\"$XDG_CACHE_HOME/lint\\"; date > \\"$XDG_CACHE_HOME/lint/stamp\\""
        inputs = ["**"]
        observe = true
    """
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["cache"]["observed"]["keyed_by"] == "reads"  # cold: observed
    (tree["repo"] / "src" / "a.py").write_text("A = 2\n")
    _, body, _ = check(capsys, tree["repo"], text)
    observed = gate(body, "lint")["cache"]["observed"]
    assert observed["keyed_by"] == "whole tree" and "tool caches were warm" in observed["why"]
    (tree["repo"] / "README").write_text("docs\n")
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["status"] == "passed"


def test_a_folder_the_manifest_lets_a_gate_write_counts_as_a_cache(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path], tmp_path: Path
) -> None:
    """``writable`` outside the tree is kept between runs (``/var/cache/my-tool``): a gate
    with something there is keyed by the whole tree."""
    kept = tmp_path / "kept"
    kept.mkdir()
    text = f"""
        [sandbox]
        writable = ["{kept}"]
        [gates.lint]
        run = "cat src/a.py > /dev/null"
        inputs = ["**"]
        observe = true
    """
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["cache"]["observed"]["keyed_by"] == "reads"  # empty: cold
    (kept / "stamp").write_text("a cache\n")
    (tree["repo"] / "src" / "a.py").write_text("A = 2\n")
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["cache"]["observed"]["keyed_by"] == "whole tree"


def test_a_tool_cache_of_empty_folders_is_cold(
    capsys: pytest.CaptureFixture[str], tree: dict[str, Path]
) -> None:
    """yarn 1 makes ``$XDG_CACHE_HOME/yarn/v6/.tmp`` at every ``yarn run``, and leaves it
    empty: folders holding no file hold nothing a tool may trust, so the gate stays keyed by
    what it read (on a yarn workspace every gate fell back to the whole tree)."""
    text = """
        [env]
        pass = ["PATH"]
        [gates.lint]
        run = "cat src/a.py > /dev/null; mkdir -p \\"$XDG_CACHE_HOME/yarn/v6/.tmp\\""
        inputs = ["**"]
        observe = true
    """
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["cache"]["observed"]["keyed_by"] == "reads"
    (tree["repo"] / "src" / "a.py").write_text("A = 2\n")  # runs again, its folders there
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["status"] == "passed"
    assert gate(body, "lint")["cache"]["observed"]["keyed_by"] == "reads"
    (tree["repo"] / "src" / "b.py").write_text("B = 2\n")
    _, body, _ = check(capsys, tree["repo"], text)
    assert gate(body, "lint")["status"] == "cached"
