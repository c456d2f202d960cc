"""A hostile envelope's gates against their layers (``process/layers.py``): what a gate
writes reaches no gate that does not need it, by any path the view gives it, and nothing
the runner does with a layer (mounting, reading, removing it) follows what a gate left."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from conftest import CLI, commit_release_manifest, envelope, git
from test_gate_layers import assert_landed_in_one_run, integrate_notes

from dagrunner.git.repo import repo_info
from dagrunner.integration.submit import submit
from dagrunner.process import layers

pytestmark = pytest.mark.skipif(
    not layers.in_force(),
    reason="this machine gives gates no view, or this process cannot mount an overlay",
)


def _wait(said: str, tenths: int = 600) -> str:
    return f"i=0; while [ ! -e {said} ] && [ $i -lt {tenths} ]; do sleep 0.1; i=$((i+1)); done; "


def test_a_writable_place_inside_the_tree_is_the_gates_layer_not_the_tree(
    repo: Path, tmp_path: Path
) -> None:
    """The manifest lets gates write ``build`` (relative: inside the tree).  That place was
    bound from the tree itself over the gate's layer (bubblewrap binds from the host's
    path; so does the mount path under a cover, as a worktree under HOME is): ``writer``'s
    file there reached ``reader``, which does not need it, and stayed in the slot."""
    shared = tmp_path / "shared"
    shared.mkdir()
    said = shlex.quote(str(shared / "written"))
    (repo / "build").mkdir()
    (repo / "build" / ".keep").write_text("")
    git(repo, "add", "-A")
    commit_release_manifest(
        repo,
        f"""
[sandbox]
writable = [{str(shared)!r}, "build"]
[gates.writer]
run = "echo x > build/poison && touch {said}"
[gates.reader]
run = '''{_wait(said)}test -e {said} || exit 2; test ! -e build/poison || {{ echo saw; exit 1; }}'''
""",
    )
    assert_landed_in_one_run(integrate_notes(repo), "poison")


def test_a_gate_runs_what_its_need_built_in_a_folder_its_need_made(repo: Path) -> None:
    """``build`` makes ``out/`` and an executable ``out/tool`` in its layer; ``use`` needs it
    and runs ``./out/tool`` by path, ``inside`` needs it and runs in ``out``.  The runner
    looked for both in the tree (where the need's writes no longer are): neither started."""
    commit_release_manifest(
        repo,
        """
[gates.build]
run = "mkdir -p out && printf '#!/bin/sh\\necho built\\n' > out/tool && chmod +x out/tool"
[gates.use]
needs = ["build"]
run = ["./out/tool"]
[gates.inside]
needs = ["build"]
cwd = "out"
run = "test -x tool"
""",
    )
    result = integrate_notes(repo)
    assert [o.state for o in result.envelopes] == ["landed"], result.envelopes


def _layer_mounts(tree_part: str) -> list[str]:
    """The mount points of gate layers over a tree whose path holds ``tree_part``."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [
        line.split(" ")[4]
        for line in lines
        if "/dagrunner-sandbox-" in line.split(" ")[4] and tree_part in line
    ]


def test_the_layers_of_a_killed_run_are_unmounted_and_removed_by_the_next_run(
    repo: Path, tmp_path: Path
) -> None:
    """The runner is SIGKILLed while a gate runs on its layer: no ``finally`` runs, and its
    overlays stayed mounted (over the slot) in /tmp for as long as the machine ran.  The
    next layered run sweeps the layers no live run holds."""
    shared = tmp_path / "shared"
    shared.mkdir()
    said = shlex.quote(str(shared / "started"))
    commit_release_manifest(
        repo,
        f"""
[sandbox]
writable = [{str(shared)!r}]
[gates.slow]
run = "test -e {said} && exit 0; echo x > scratch; touch {said}; sleep 60"
""",
    )
    submit(repo_info(repo), [envelope(repo, "notes")])
    runner = subprocess.Popen(
        [*CLI, "integrate", "run", "--repo", str(repo), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if (shared / "started").exists() or runner.poll() is not None:
                break
            time.sleep(0.1)
        assert (shared / "started").exists(), "the gate never started"
    finally:
        runner.kill()
        runner.wait()
    part = os.environ["DAGRUNNER_WORKTREE_ROOT"]  # the slots of this test
    left = _layer_mounts(part)
    assert left, "the killed run left no layer mounted: nothing to sweep"
    try:
        done = subprocess.run(
            [*CLI, "integrate", "run", "--repo", str(repo), "--json"], capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert _layer_mounts(part) == []
        sandbox = Path(left[0]).parents[2]
        assert not sandbox.exists(), list(sandbox.rglob("*"))[:10]
    finally:
        for point in sorted(_layer_mounts(part), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)


def test_the_junit_file_is_read_from_the_gates_layer_never_through_a_link(
    repo: Path, tmp_path: Path
) -> None:
    """The gate turns ``reports`` (the folder of its JUnit file) into a link to a folder
    outside its tree that holds a JUnit file of someone else's (the runner's namespace: every
    other gate's layer is there, at a path its HOME names).  The runner, root, followed it:
    that file's tests became the gate's."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "junit.xml").write_text(
        '<testsuite name="s"><testcase classname="elsewhere_class" name="t"/></testsuite>'
    )
    later = time.time() + 3600  # fresh for the run, whenever it reads it
    os.utime(elsewhere / "junit.xml", (later, later))
    commit_release_manifest(
        repo,
        f"""
[gates.spy]
run = "rm -rf reports && ln -s {shlex.quote(str(elsewhere))} reports"
junit = "reports/junit.xml"
""",
    )
    result = integrate_notes(repo)
    assert [o.state for o in result.envelopes] == ["landed"], result.envelopes
    said = b"".join(p.read_bytes() for p in Path(result.report_dir).rglob("*.json"))
    assert b"elsewhere_class" not in said


def test_a_gate_that_changes_a_tracked_file_fails_alone_and_the_tree_stays(
    repo: Path, tmp_path: Path
) -> None:
    """``mod`` rewrites one tracked file, deletes another and rewrites the tree's ``.git``
    file, in its layer; ``peer``, where it runs beside it, looks once it wrote.  ``mod``
    fails ``tree-modified`` naming both files, ``peer`` is never blamed, and the slot's files
    are as checked out."""
    shared = tmp_path / "shared"
    shared.mkdir()
    mark = shlex.quote(str(shared / "written"))
    done = shlex.quote(str(shared / "peer-done"))  # ``mod`` ends after it (fail-fast)
    (repo / "keep.txt").write_text("kept\n")
    git(repo, "add", "-A")
    commit_release_manifest(
        repo,
        f"""
[sandbox]
writable = [{str(shared)!r}]
[gates.mod]
run = "echo changed > README && rm keep.txt && echo 'gitdir: /x' > .git; touch {mark}; {_wait(done, 30)}"
[gates.peer]
run = '''{_wait(mark)}grep -qx hello README && test -e keep.txt && grep -q worktrees .git \\
  && touch {done}'''
""",
    )
    result = integrate_notes(repo)
    assert result.envelopes[0].state == "gates-failed", result
    seen: dict[str, list[str]] = {}
    for found in Path(result.report_dir).rglob("gates/*.json"):
        said = orjson.loads(found.read_bytes())
        seen.setdefault(found.stem, []).append(f"{said['status']}: {said['reason']}")
    assert any("tree-modified" in s and "README, keep.txt" in s for s in seen["mod"]), seen
    assert not any(s.startswith("failed") for s in seen["peer"]), seen
    slot = Path(result.report_dir).parents[1]
    for tree in (t.parent for t in slot.rglob(".git") if (t.parent / "keep.txt").exists()):
        assert (tree / "README").read_text() == "hello\n"
        assert "worktrees" in (tree / ".git").read_text()


def test_a_retry_does_not_report_the_junit_file_of_the_attempt_before_it(repo: Path) -> None:
    """An observed gate's JUnit file is removed before each attempt (``clear_junit``) -- in
    the tree, where the attempt before it no longer wrote it: the second attempt, which
    wrote none, was reported with the first one's failed test."""
    commit_release_manifest(
        repo,
        """
[gates.flaky]
inputs = ["**"]
observe = true
retries = 1
junit = "out/junit.xml"
run = '''test -e .tried && exit 0; touch .tried; mkdir -p out; printf '%s' \
'<testsuite><testcase classname="c" name="first_attempt"><failure/></testcase></testsuite>' \
> out/junit.xml; exit 1'''
""",
    )
    result = integrate_notes(repo)
    assert [o.state for o in result.envelopes] == ["landed"], result.envelopes
    runs = [orjson.loads(p.read_bytes()) for p in Path(result.report_dir).rglob("flaky.json")]
    flaky = [r for r in runs if r["status"] == "flaky"]
    assert flaky, [r["status"] for r in runs]
    assert all(r["tests"]["failures"] == 0 and not r["tests"]["seconds"] for r in flaky), flaky


def test_the_sweep_leaves_a_folder_of_anyone_elses_in_tmp_alone(tmp_path: Path) -> None:
    """/tmp is anyone's: another user may make a folder named like a run's, with a free
    lock in it, for the runner (root) to remove what it holds."""
    theirs = tmp_path / "dagrunner-sandbox-theirs"
    (theirs / "layers").mkdir(parents=True)
    (theirs / "layers" / layers.LOCK).write_text("")
    (theirs / "kept").write_text("theirs\n")
    for path in (theirs, theirs / "layers", theirs / "layers" / layers.LOCK, theirs / "kept"):
        os.chown(path, 65534, 65534)
    linked = tmp_path / "dagrunner-sandbox-linked"
    linked.symlink_to(theirs)
    layers.sweep([theirs, linked], "layers")
    assert (theirs / "kept").read_text() == "theirs\n"


def test_no_scratch_place_of_a_gate_reaches_a_gate_beside_it(repo: Path, tmp_path: Path) -> None:
    """Besides the tree: ``writer`` writes into its HOME, TMPDIR, ``/tmp``, ``/var/tmp``,
    ``/dev/shm`` and its tool caches, and tries ``reader``'s HOME and tool cache folder by
    their names beside its own; ``reader``, beside it, finds none of it in its own."""
    shared = tmp_path / "shared"
    shared.mkdir()
    said = shlex.quote(str(shared / "written"))
    places = '"$HOME" "$TMPDIR" /tmp /var/tmp /dev/shm "$XDG_CACHE_HOME" "$MYPY_CACHE_DIR"'
    theirs = '"$(dirname "$HOME")/reader.1" "$(dirname "$XDG_CACHE_HOME")/reader"'
    commit_release_manifest(
        repo,
        f"""
[sandbox]
writable = [{str(shared)!r}]
[gates.writer]
run = '''for d in {places} {theirs}; do mkdir -p "$d" && echo x > "$d/poison"; done 2>/dev/null; \
touch {said}'''
[gates.reader]
run = '''{_wait(said)}test -e {said} || exit 2; for d in {places}; do \
test ! -e "$d/poison" || {{ echo "saw $d/poison"; exit 1; }}; done'''
""",
    )
    assert_landed_in_one_run(integrate_notes(repo))


def test_a_link_a_need_left_where_a_mount_of_the_tree_goes_is_never_mounted_on(
    tmp_path: Path,
) -> None:
    """A need's layer holds a link where a mount of the tree (a seed) goes in its
    dependent's merged view, pointing outside: the dependent's layer is refused
    (``LayerError``), nothing is mounted on the link's target, and nothing is left mounted."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "seed").mkdir(parents=True)
    outside.mkdir()
    (outside / "mine").write_text("untouched\n")
    subprocess.run(["mount", "--bind", str(tree / "seed"), str(tree / "seed")], check=True)
    try:
        need = layers.Layer(tree=tree, folder=tmp_path / "need", parts=("", "seed"))
        for part in need.parts:
            need.upper(part).mkdir(parents=True)
        (need.upper("") / "seed").symlink_to(outside)
        with pytest.raises(layers.LayerError):
            layers.mount(tree, tmp_path / "gate", [need])
        assert (outside / "mine").read_text() == "untouched\n"
        left = Path("/proc/self/mountinfo").read_text()
        assert str(outside) not in left and str(tmp_path / "gate") not in left
        assert not (tmp_path / "gate").exists()
    finally:
        subprocess.run(["umount", "-l", str(tree / "seed")], check=False)
