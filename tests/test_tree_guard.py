"""A gate never passes by changing the tree it checks (issue 35): a fixing lint gate fails
with ``tree-modified`` naming the files, each file is put back byte for byte (the user's
own uncommitted edits included), the gate's version is kept, and ignored scratch is free."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check, gate_results, git

from dagrunner.cli.main import run_cli
from dagrunner.git.repo import repo_info
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting

FIXER = """
[gates.lint]
run = "sed -i 's/bad/good/' code.py clean.py && mkdir -p __pycache__ && echo x > __pycache__/c.pyc"
needs = ["scratch"]

[gates.scratch]
run = "mkdir -p .pytest_cache && echo x > .pytest_cache/v && echo y > notes.tmp"
"""


@pytest.fixture
def fixable(repo: Path) -> Path:
    (repo / ".gitignore").write_text("reports/\n__pycache__/\n.pytest_cache/\n*.tmp\n")
    (repo / "code.py").write_text("x = 'bad'\n")
    (repo / "clean.py").write_text("y = 'bad'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "code")
    return repo


def test_a_fixing_gate_fails_and_every_file_is_put_back_byte_for_byte(
    fixable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (fixable / "code.py").write_text("x = 'bad'  # the user's own edit, not committed\n")
    before = {n: (fixable / n).read_bytes() for n in ("code.py", "clean.py")}
    code, body, run_dir = check(capsys, fixable, FIXER)
    assert code == 1, body
    results = gate_results(run_dir)
    assert results["scratch"]["status"] == "passed"  # ignored scratch is the gates' own
    assert results["lint"]["status"] == "failed"
    reason = results["lint"]["reason"]
    assert reason.startswith("tree-modified:") and "clean.py, code.py" in reason, reason
    assert {n: (fixable / n).read_bytes() for n in before} == before
    kept = run_dir / "changed" / "lint"
    assert (kept / "code.py").read_text() == "x = 'good'  # the user's own edit, not committed\n"
    assert (kept / "clean.py").read_text() == "y = 'good'\n"
    assert git(fixable, "status", "--porcelain") == " M code.py\n?? m.toml\n"


def test_a_fixing_gate_in_the_queue_does_not_land_the_error_it_fixed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / ".gitignore").write_text("reports/\n")
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text(
        '[gates.lint]\nrun = "sed -i s/BROKEN/fixed/ *.txt && ! grep -q BROKEN *.txt"\n'
    )
    (repo / "a.txt").write_text("fine\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "lint")
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    (path / "a.txt").write_text("BROKEN\n")
    out = path.parent / "w.json"
    exporting.export("m/w", output=out, repo=repo)
    submit(repo_info(repo), [out])
    code = run_cli(["integrate", "run", "--repo", str(repo), "--window", "1"])
    said = capsys.readouterr().out
    assert code == 1 and "gates-failed" in said, said
    assert git(repo, "show", "main:a.txt") == "fine\n"
    # the terminal says why under the envelope's line: the gate's reason and its log's tail
    assert "--- lint (failed): tree-modified:" in said and "a.txt" in said, said
    # the run's folder opens with a page of its own, linking each gate run's page
    report = Path(said.split("report ")[-1].split()[0].rstrip(";"))
    page = (report / "index.html").read_text()
    assert "gates-failed" in page and 'href="gates-01/index.html"' in page, page


TWO_AT_ONCE = """
[governor]
cpu = 2

[gates.writer]
run = "sed -i 's/bad/good/' clean.py && touch a.tmp && while [ ! -e b.tmp ]; do sleep 0.02; done"
timeout = "20s"

[gates.bystander]
run = "while [ ! -e a.tmp ]; do sleep 0.02; done; touch b.tmp"
timeout = "20s"
"""


def test_the_gate_that_wrote_never_passes_even_when_another_one_sees_it_first(
    fixable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body, run_dir = check(capsys, fixable, TWO_AT_ONCE, "--jobs", "2")
    assert code == 1, body
    results = gate_results(run_dir)
    assert results["writer"]["status"] == "failed", results["writer"]
    assert "clean.py" in results["writer"]["reason"]
    assert results["bystander"]["reason"].startswith("tree-modified:")
    # whichever saw it first, both name both: the files say which one wrote
    for gate in ("writer", "bystander"):
        assert "gates running then: bystander, writer" in results[gate]["reason"]
    assert (fixable / "clean.py").read_text() == "y = 'bad'\n"


def test_a_gate_that_points_its_trees_git_elsewhere_neither_hides_a_change_nor_steers_put_back(
    repo: Path, tmp_path: Path
) -> None:
    """The tree is the gate's to write, its ``.git`` file included: after the gate, git must
    not read a repository the gate made (whose ``core.worktree`` names a folder outside, and
    whose HEAD already holds the gate's change)."""
    from dagrunner.git import guard

    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "a")
    slot = tmp_path / "slot"
    git(repo, "worktree", "add", "-q", "--detach", str(slot))
    shot = guard.snapshot(slot)
    assert shot is not None and shot.dirty == {}
    # the gate: a change, then a repository of its own that agrees with it
    (slot / "a.py").write_text("x = 2\n")
    victim = tmp_path / "victim"
    victim.mkdir()
    fake = slot / ".fake"
    git(slot, "init", "-q", str(fake))
    (fake / "a.py").write_text("x = 2\n")
    (fake / "pwned").write_text("planted\n")
    git(fake, "add", "a.py", "pwned")
    git(fake, "commit", "-q", "-m", "agrees")
    git(fake, "config", "core.worktree", str(victim))
    (slot / ".git").write_text(f"gitdir: {fake / '.git'}\n")
    changed = guard.changes(shot)
    assert changed == ["a.py"], changed
    assert guard.put_back(shot, changed, tmp_path / "kept") == []
    assert list(victim.iterdir()) == []
    assert (slot / "a.py").read_text() == "x = 1\n"
    assert (tmp_path / "kept" / "a.py").read_text() == "x = 2\n"
