"""Integration judges the integrated tree with that tree's own dependencies (issue 35): its
seeds, its venv first on PATH, and never the caller's checkout -- on a real venv whose
editable install (a ``.pth``, what ``pip install -e`` writes) names the checkout it was
built in, with the caller's own such venv on PATH, as a user's shell has it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import commit_release_manifest, git

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.process.contain import detect
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import seeds

PY = sys.executable
# A venv with an editable install of ``calc``: a .pth naming this checkout's src/.
EDITABLE = (
    f"{PY} -m venv --without-pip .venv && .venv/bin/python -c "
    '"import os, sysconfig; '
    "open(os.path.join(sysconfig.get_paths()['purelib'], 'calc.pth'), 'w')"
    ".write(os.path.join(os.getcwd(), 'src') + chr(10))\""
)
MANIFEST = f"""
[env]
pass = ["PATH", "VIRTUAL_ENV"]

[[worktrees.seed]]
path = ".venv"
key = ["requirements.txt"]
build = '''{EDITABLE}'''

[gates.unit]
run = ["python", "-m", "unittest", "discover", "-s", "tests", "-t", "."]
"""


NO_SEED = """
[env]
pass = ["PATH", "VIRTUAL_ENV"]

[gates.unit]
run = ["python", "-m", "unittest", "discover", "-s", "tests", "-t", "."]
"""


@pytest.fixture
def calc(repo: Path) -> Path:
    (repo / ".gitignore").write_text("reports/\n.venv/\n__pycache__/\n")
    (repo / "requirements.txt").write_text("# nothing yet\n")
    (repo / "src" / "calc").mkdir(parents=True)
    (repo / "src" / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_add.py").write_text(
        "import unittest\n\nimport calc\n\n\nclass Add(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n"
    )
    commit_release_manifest(repo, MANIFEST)
    return repo


def callers_env(checkout: Path) -> dict[str, str]:
    """The caller's shell: its own editable venv of the main checkout, activated."""
    subprocess.run(["sh", "-c", EDITABLE], cwd=checkout, check=True)
    venv = checkout / ".venv"
    return {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}


def breaks_add(path: Path) -> None:
    (path / "src" / "calc" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")


def adds_mul(path: Path) -> None:
    (path / "src" / "calc" / "mul.py").write_text("def mul(a, b):\n    return a * b\n")
    (path / "tests" / "test_mul.py").write_text(
        "import unittest\n\nfrom calc.mul import mul\n\n\nclass Mul(unittest.TestCase):\n"
        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    )


def test_the_integrated_tree_is_judged_with_its_own_venv_not_the_callers_checkout(
    calc: Path,
) -> None:
    env = callers_env(calc)
    envelopes = []
    for name, change in (("breaks", breaks_add), ("good", adds_mul)):
        path = Path(wt.allocate(mission="m", worker=name, repo=calc, env=env)["path"])
        change(path)
        out = path.parent / f"{name}.json"
        exporting.export(f"m/{name}", output=out, repo=calc)
        envelopes.append(out)
    submit(repo_info(calc), envelopes)
    result = integrate(repo=calc, env=env, window=1)
    states = {o.worker: o.state for o in result.envelopes}
    assert states == {"breaks": "gates-failed", "good": "landed"}, result
    shown = git(calc, "show", "main:src/calc/__init__.py")
    assert "a + b" in shown and git(calc, "cat-file", "-e", "main:src/calc/mul.py") == ""
    # the integration worktree holds its own seed, and its copy names that tree's src/
    integration = Path(result.report_dir).parent.parent
    slot = integration / "main"
    pth = next((slot / ".venv").rglob("calc.pth"))
    assert pth.read_text().strip() == str(slot / "src")


def test_a_seed_an_envelope_changes_is_built_from_that_tree_and_never_serves_main(
    calc: Path,
) -> None:
    env = callers_env(calc)
    allocated = wt.allocate(mission="m", worker="dep", repo=calc, env=env)
    path, store = Path(allocated["path"]), seeds.seeds_dir(Path(allocated["root"]))
    (path / "requirements.txt").write_text("# a new pin\n")
    out = path.parent / "dep.json"
    exporting.export("m/dep", output=out, repo=calc)
    stored_before = {p.name for p in store.iterdir()}
    submit(repo_info(calc), [out])
    result = integrate(repo=calc, env=env, window=1)
    assert [o.state for o in result.envelopes] == ["landed"], result
    stored = {p.name for p in store.iterdir()}
    made = stored - stored_before
    # one seed was built for the integrated tree; main's key (the landed requirements)
    # does not name it: a trusted allocation builds its own
    assert made, stored
    fresh = wt.allocate(mission="m", worker="after", repo=calc, env=env)
    assert [s["built"] for s in fresh["seeds"]] == [True]
    assert fresh["seeds"][0]["key"] not in made


@pytest.mark.skipif(not detect().views, reason="this machine cannot give a gate its own view")
def test_an_integration_gate_never_sees_the_callers_checkout_but_its_git_works(
    calc: Path,
) -> None:
    readme = shlex.quote(str(calc / "README"))
    commit_release_manifest(
        calc,
        MANIFEST
        + f"""
[gates.peek]
run = "test ! -e {readme} && git rev-parse --verify -q HEAD && python -c 'import calc'"
""",
    )
    env = callers_env(calc)
    path = Path(wt.allocate(mission="m", worker="docs", repo=calc, env=env)["path"])
    (path / "NOTES").write_text("a note\n")
    out = path.parent / "docs.json"
    exporting.export("m/docs", output=out, repo=calc)
    submit(repo_info(calc), [out])
    result = integrate(repo=calc, env=env, window=1)
    assert [o.state for o in result.envelopes] == ["landed"], result


def test_without_a_seed_the_callers_in_place_install_is_named_not_left_to_guess(
    calc: Path,
) -> None:
    """The caller's venv imports the main checkout in place; the target declares no seed:
    every integration gate would fail to import calc, so the run says why."""
    commit_release_manifest(calc, NO_SEED)
    env = callers_env(calc)
    path = Path(wt.allocate(mission="m", worker="good", repo=calc, env=env)["path"])
    adds_mul(path)
    out = path.parent / "good.json"
    exporting.export("m/good", output=out, repo=calc)
    submit(repo_info(calc), [out])
    result = integrate(repo=calc, env=env, window=1)
    said = [w for w in result.warnings if "[[worktrees.seed]]" in w]
    assert said and str(calc.resolve() / "src") in said[0], result.warnings


REFUSING = """
[env]
pass = ["PATH"]

[[worktrees.seed]]
path = ".venv"
key = ["lock"]
build = "grep -qx good lock && mkdir .venv"

[gates.check]
run = ["true"]
"""


def test_a_tree_whose_own_seed_does_not_build_does_not_land(repo: Path) -> None:
    """Round 16b (pallets/werkzeug): a worker's ``pyproject.toml`` change without its lock made
    ``uv sync --locked`` refuse the tree's seed, as the project's CI would; the gates then ran
    without it (on the caller's PATH), and a tree whose gates did not need it landed (here:
    ``true``).  A seed built from the tree's own key files that fails fails the tree; the
    worker beside it lands."""
    (repo / ".gitignore").write_text("reports/\n.venv/\n")
    (repo / "lock").write_text("good\n")
    commit_release_manifest(repo, REFUSING)
    envelopes = []
    for name, change in (("bad", "lock"), ("fine", "README")):
        path = Path(wt.allocate(mission="m", worker=name, repo=repo)["path"])
        (path / change).write_text("bad\n" if change == "lock" else "more words\n")
        out = path.parent / f"{name}.json"
        exporting.export(f"m/{name}", output=out, repo=repo)
        envelopes.append(out)
    submit(repo_info(repo), envelopes)
    result = integrate(repo=repo, window=1)
    states = {o.worker: o.state for o in result.envelopes}
    assert states == {"bad": "gates-failed", "fine": "landed"}, result
    assert git(repo, "show", "main:lock") == "good\n"
    (bad,) = [o for o in result.envelopes if o.worker == "bad"]
    assert bad.details.failed_gates == ("check",), bad.details
    assert any("seed-build-failed" in w for w in result.warnings), result.warnings
