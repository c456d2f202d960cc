"""Each gate of an envelope's tree writes a layer of its own (``process/layers.py``): what
it writes and git does not track -- a generated module, a config file, a ``.pth`` in the
tree's venv seed -- is seen by the gates that need it and by no other, so no verdict hangs on
which gate ran first, and a gate running an envelope's code cannot make a later check pass."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import commit_release_manifest, envelope, run_json

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.process import layers
from dagrunner.process.contain import detect
from dagrunner.records.integration import IntegrationResult

pytestmark = pytest.mark.skipif(
    not layers.in_force(),
    reason="this machine gives gates no view, or this process cannot mount an overlay",
)

PY = sys.executable


def manifest(shared: Path) -> str:
    """``writer`` writes an untracked file into the tree and one into its venv seed, then
    says so in ``shared`` (the one folder both may write); ``reader`` runs beside it, needs
    nothing, and waits for that word before it looks; ``user`` needs ``writer``."""
    said = shlex.quote(str(shared / "written"))
    wait = f"i=0; while [ ! -e {said} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
    return f"""
[sandbox]
writable = [{str(shared)!r}]

[[worktrees.seed]]
path = ".venv"
key = ["requirements.txt"]
build = "{PY} -m venv --without-pip .venv"

[gates.writer]
run = "echo '[mypy]' > mypy.ini && echo import-me > .venv/poison.pth && touch {said}"

[gates.reader]
run = '''{wait}test -e {said} || {{ echo 'writer never ran'; exit 2; }}; \
test ! -e mypy.ini || {{ echo 'saw mypy.ini'; exit 1; }}; \
test ! -e .venv/poison.pth || {{ echo 'saw the .pth'; exit 1; }}'''

[gates.user]
needs = ["writer"]
run = "test -e mypy.ini && test -e .venv/poison.pth && test -x .venv/bin/python"
"""


@pytest.fixture(params=["bubblewrap", "unshare"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The view applied by bubblewrap (where it is here) and by the init's own mounts."""
    if request.param == "bubblewrap" and not detect().bwrap:
        pytest.skip("no bubblewrap here")
    if request.param == "unshare":
        monkeypatch.setenv("DAGRUNNER_CONTAINMENT", "unshare")
    detect.cache_clear()
    yield request.param
    monkeypatch.undo()
    detect.cache_clear()


def integrate_notes(repo: Path) -> IntegrationResult:
    """One envelope (``notes``, adding ``notes.txt``) submitted and integrated, window 1."""
    submit(repo_info(repo), [envelope(repo, "notes")])
    return integrate(repo=repo, env=dict(os.environ), window=1)


def assert_landed_in_one_run(result: IntegrationResult, *left: str) -> None:
    """The envelope landed from its first gate run, nothing flaky, and none of the files
    named ``left`` is in the integration trees for the next envelope there."""
    assert [o.state for o in result.envelopes] == ["landed"], result
    assert result.gate_runs == 1 and result.envelopes[0].details.flaky_gates is None, result
    integration = Path(result.report_dir).parents[1]
    for name in left:
        assert not list(integration.rglob(name)), list(integration.rglob(name))


def test_what_a_gate_writes_is_seen_by_the_gates_that_need_it_and_no_other(
    repo: Path, tmp_path: Path, way: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (repo / ".gitignore").write_text("reports/\n.venv/\n")
    (repo / "requirements.txt").write_text("# nothing\n")
    commit_release_manifest(repo, manifest(shared))
    # one run, nothing flaky: before layers, ``reader`` failed on what ``writer`` wrote,
    # and passed its confirmation (``writer`` had not written yet): "flaky", and landed;
    # nothing of what the gates wrote is left in the trees for the next envelope there
    assert_landed_in_one_run(integrate_notes(repo), "mypy.ini", "poison.pth")


LEFTOVER = """
[gates.build]
inputs = ["**"]
run = "mkdir -p out && echo lib > out/lib.txt"

[gates.use]
inputs = ["**"]
run = "test -f out/lib.txt || { echo 'no out/lib.txt: build it first (needs)'; exit 1; }"
"""


@pytest.mark.parametrize("inputs", ["**", "src/**"])
def test_a_pass_that_read_what_another_gate_left_answers_no_envelopes_tree(
    repo: Path, capsys: pytest.CaptureFixture[str], inputs: str
) -> None:
    """Round 9 of docs/real-projects.md: in the checkout, where gates share the tree,
    ``use`` (no needs) passed on ``out/`` an earlier run of ``build`` left there, and that
    pass was cached.  In an envelope's tree ``use`` never sees ``build``'s layer and fails
    -- rightly: a fresh checkout fails too.  The target's head fails it as well, so the item
    is held.  The cached pass must not clear the head for a blame (``**``: the item was
    made the culprit), nor answer the item's own gate (``src/**``, inputs the envelope does
    not touch: it landed).  A run on layers takes only layered passes (``Store.layered``)."""
    manifest = LEFTOVER.replace('inputs = ["**"]', f"inputs = [{inputs!r}]")
    (repo / ".gitignore").write_text("reports/\nout/\n")
    (repo / "src").mkdir()
    (repo / "src" / "lib.py").write_text("x = 1\n")
    commit_release_manifest(repo, manifest)
    outside = repo.parent / "leftover.toml"  # nothing untracked in the checkout's key
    outside.write_text(manifest)
    for only in ("build", "use"):
        code, body = run_json(
            capsys, "release-check", str(outside), "--repo", str(repo), "--only", only
        )
        assert code == 0, body
    result = integrate_notes(repo)
    assert [o.state for o in result.envelopes] == [], result.to_json()
    assert result.target_red == ("use",) and len(result.held) == 1, result.to_json()


def test_a_tree_whose_path_holds_what_mount_options_separate_is_layered_all_the_same(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noticed by the gate layers' hostile review: a worktree root whose path holds ``,`` ``:`` or
    ``\\`` (the separators of an overlay's mount options) failed every gate of every
    envelope.  They are escaped as the kernel reads them; the gates pass and see no layer
    but their own."""
    monkeypatch.setenv("DAGRUNNER_WORKTREE_ROOT", str(tmp_path / "trees, a:b\\c"))
    shared = tmp_path / "shared"
    shared.mkdir()
    plain = manifest(shared).replace(" && echo import-me > .venv/poison.pth", "")
    plain = plain.replace(" && test -e .venv/poison.pth && test -x .venv/bin/python", "")
    seed = plain.index("[[worktrees.seed]]")  # a venv refuses a path holding ``:``
    commit_release_manifest(repo, plain[:seed] + plain[plain.index("[gates.writer]") :])
    assert_landed_in_one_run(integrate_notes(repo), "mypy.ini")
