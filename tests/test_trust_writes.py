"""Trust boundary II, item 1: a gate writes only its own places, and no git that dagrunner
runs obeys configuration a gate or a worker could have written -- each tried as a hostile
gate would, on real repositories and processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import git
from test_integration import states, worker
from test_pipeline import run_cli

from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.process.contain import detect
from dagrunner.report.rundir import default_runs

confined = pytest.mark.skipif(
    not detect().views, reason="needs a mount namespace that allows the write allow-list"
)

TRIES = """
[sandbox]
writable = ["{shared}"]

[gates.probe]
writable = ["out"]
run = '''
for pair in "home={home}/planted" "outside={outside}/planted" "python={python}/planted" \\
    tmp=/tmp/planted "shared={shared}/ok" out=out/ok tree=./ok "HOME=$HOME/ok" "TMPDIR=$TMPDIR/ok"; do
  if touch "${{pair#*=}}" 2>/dev/null; then echo "${{pair%%=*}}:ok"; else echo "${{pair%%=*}}:no"; fi
done > ./said
ls -A "{home}" > ./home-listing 2>&1 || true
'''
"""


# Where bubblewrap is installed it applies the view; the mount(2) path stays the fallback.
WAYS = ["bubblewrap", "unshare"] if detect().bwrap else ["unshare"]


@confined
@pytest.mark.parametrize("way", WAYS)
def test_a_gate_writes_only_its_tree_home_tmpdir_and_what_the_manifest_names(
    repo: Path, tmp_path: Path, way: str
) -> None:
    home = Path(os.environ["HOME"])  # the invoking user's home (the test's own)
    (home / "secret.txt").write_text("the user's secret\n")
    outside, shared = tmp_path / "outside", tmp_path / "shared"
    outside.mkdir()
    shared.mkdir()
    (repo / "out").mkdir()
    manifest = repo / "probe.toml"
    python = sys.prefix
    manifest.write_text(TRIES.format(home=home, outside=outside, shared=shared, python=python))
    forced = {"DAGRUNNER_CONTAINMENT": way} if way == "unshare" else {}
    done = run_cli(repo, "release-check", str(manifest), "--no-cache", "--json", env=forced)
    assert done.returncode == 0, done.stderr
    containment = json.loads(done.stdout)["machine"]["containment"]
    assert containment["views_by"] == ("mount" if way == "unshare" else "bubblewrap")
    said = dict(line.split(":", 1) for line in (repo / "said").read_text().split("\n") if line)
    assert said == {
        "home": "no",  # the invoking user's home: not even visible
        "outside": "no",  # a folder beside the tree
        "python": "no",  # the interpreter's own installation: visible, never writable
        "tmp": "ok",  # the gate's private /tmp (checked below: nothing reached the real one)
        "shared": "ok",  # [sandbox] writable
        "out": "ok",  # the gate's own writable
        "tree": "ok",
        "HOME": "ok",
        "TMPDIR": "ok",
    }
    assert not Path(python, "planted").exists()
    assert not (home / "planted").exists() and not (outside / "planted").exists()
    assert not Path("/tmp/planted").exists()  # the gate's /tmp was its own
    assert (shared / "ok").exists() and (repo / "out" / "ok").exists()
    # the user's home is not visible at all: not even the names of its files
    assert "secret.txt" not in (repo / "home-listing").read_text()


@confined
def test_a_gate_whose_write_is_refused_fails_and_its_log_says_why(
    repo: Path, tmp_path: Path
) -> None:
    manifest = repo / "erofs.toml"
    elsewhere = Path(sys.prefix) / "elsewhere"  # visible (the gate's python), not writable
    manifest.write_text(f"[gates.w]\nrun = \"echo x > '{elsewhere}'\"\n")
    done = run_cli(repo, "release-check", str(manifest), "--no-cache")
    assert done.returncode == 1
    log = (default_runs(repo) / "latest" / "logs" / "w.log").read_text()
    assert "Read-only file system" in log
    assert "[sandbox] writable" in log  # what to do about it
    assert not elsewhere.exists()


ESCAPE = """
[gates.escape]
run = '''
grep ^CapEff /proc/self/status > ./caps
mount -o remount,rw,bind / 2>/dev/null
mount -o remount,rw,bind "{outside}" 2>/dev/null
umount -l "{store}" 2>/dev/null
for place in "{outside}" "{store}"; do
  if echo planted > "$place/planted" 2>/dev/null; then echo "$place:ok"; else echo "$place:no"; fi
done > ./said
'''
"""


def _outside_the_covers() -> Path | None:
    """A writable folder the gate's view shows read-only (not a home, not /tmp)."""
    places = [Path(p) for p in ("/var/cache", "/var/lib", "/srv", "/opt")]
    return next((p for p in places if p.is_dir() and os.access(p, os.W_OK)), None)


@confined
@pytest.mark.parametrize("way", WAYS)
def test_a_gate_cannot_remount_its_view_or_uncover_the_store(
    repo: Path, tmp_path: Path, way: str
) -> None:
    """A gate that runs as root (CI, a container) keeps only the capabilities a build needs
    for its own files: it cannot remount the read-only view writable or unmount the cover
    of the cache store, and with them write outside its own places.  Without a user
    namespace of its own, bubblewrap keeps root's capabilities for the gate unless told
    otherwise; the mount(2) path's gate is root of its namespaces either way."""
    place = _outside_the_covers()
    if place is None:
        pytest.skip("needs a writable folder outside the view's covers (CI runs as root)")
    outside = Path(tempfile.mkdtemp(prefix="dagrunner-test-outside-", dir=place))
    store = Path(tempfile.mkdtemp(prefix="dagrunner-test-store-", dir=place))
    try:
        manifest = repo / "escape.toml"
        manifest.write_text(ESCAPE.format(outside=outside, store=store))
        forced = {"DAGRUNNER_CONTAINMENT": way} if way == "unshare" else {}
        forced["DAGRUNNER_CACHE_DIR"] = str(store)
        done = run_cli(repo, "release-check", str(manifest), "--no-cache", env=forced)
        assert done.returncode == 0, done.stdout + done.stderr
        said = dict(line.rsplit(":", 1) for line in (repo / "said").read_text().split("\n") if line)
        assert said == {str(outside): "no", str(store): "no"}, said
        assert not (outside / "planted").exists() and not (store / "planted").exists()
        held = int((repo / "caps").read_text().split()[1], 16)
        kept = 0x5FB  # chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service
        assert held & ~kept == 0, f"{held:#x}"  # no sys_admin, dac_read_search, mknod, ...
    finally:
        shutil.rmtree(outside)
        shutil.rmtree(store)


@pytest.mark.skipif(not detect().bwrap, reason="needs bubblewrap")
def test_when_bubblewrap_cannot_set_up_the_view_the_log_does_not_blame_the_gate(
    repo: Path, tmp_path: Path
) -> None:
    """bubblewrap's own failure (here a store to hide that went away after the view was
    planned, so bwrap cannot make its mount point in the read-only root) is a line starting
    'bwrap: ' that tells of a read-only file system -- the gate never wrote anything.  Such
    a line gets the set-up note, not "a write outside the gate's own places was refused"."""
    from dagrunner.process.contain import jail
    from dagrunner.process.logs import BWRAP_NOTE, EROFS_NOTE
    from dagrunner.process.view import View

    place = _outside_the_covers()  # the root there is a read-only bind
    if place is None:
        pytest.skip("needs a writable folder outside the view's covers (CI runs as root)")
    store = place / f"dagrunner-test-store-{os.getpid()}"
    store.mkdir()
    try:
        home = tmp_path / "home"
        view = View.for_gate(writable=[repo], home=home, visible=[], hide=store)
        box = jail(["true"], token="t", work=tmp_path, hide=store, cwd=repo, memory=None,
                   max_pids=None, view=view)  # fmt: skip
    finally:
        store.rmdir()
    home.mkdir()
    view.stage.mkdir()
    done = subprocess.run(box.argv, cwd=repo, capture_output=True, check=False)
    said = done.stderr.decode().strip()
    assert box.bwrap and done.returncode != 0
    assert said.startswith("bwrap: ") and "Read-only file system" in said, said

    manifest = repo / "setup.toml"  # the same line, as the gate's log would carry it
    argv = ["sh", "-c", 'echo "$0" >&2; exit 1', said]
    manifest.write_text(f"[gates.w]\nrun = {json.dumps(argv)}\n")
    assert run_cli(repo, "release-check", str(manifest), "--no-cache").returncode == 1
    log = (default_runs(repo) / "latest" / "logs" / "w.log").read_text()
    assert BWRAP_NOTE in log and EROFS_NOTE not in log


PAYLOAD = """[core]
\tfsmonitor = "sh -c 'git --git-dir={common} update-ref refs/heads/escaped HEAD; date >> {common}/dagrunner/queue/ESCAPED'"
[alias]
\tstatus = "!touch {common}/ESCAPED-ALIAS"
"""


def test_dagrunners_git_obeys_no_global_config_a_gate_could_have_written(project: Path) -> None:
    """The issue's payload, written straight into the integrator's ~/.gitconfig (as a gate
    without the allow-list could): dagrunner's own git calls never run it."""
    common = project / ".git"
    home = Path(os.environ["HOME"])
    (home / ".gitconfig").write_text(PAYLOAD.format(common=common))
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "config").write_text(PAYLOAD.format(common=common))
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    submit(repo_info(project), [envelope])
    result = integrate(repo=project, window=1)
    assert result.ok and set(states(project).values()) == {"landed"}
    assert git(project, "branch", "--list", "escaped") == ""
    assert not (common / "dagrunner" / "queue" / "ESCAPED").exists()
    assert not (common / "ESCAPED-ALIAS").exists()


def envelope_id(path: Path) -> str:
    import orjson

    return str(orjson.loads(path.read_bytes())["id"])


@confined
def test_an_envelopes_gate_cannot_plant_a_gitconfig_in_the_integrators_home(
    project: Path, tmp_path: Path
) -> None:
    """The issue's reproduction: the envelope's test script copies its payload into the
    integrator's home; the write is refused, and nothing of the payload ever runs."""
    common = project / ".git"
    home = Path(os.environ["HOME"])

    def hostile(p: Path) -> None:
        (p / "ci").mkdir()
        (p / "ci" / "payload.gitconfig").write_text(PAYLOAD.format(common=common))

    envelope = worker(project, "w1", hostile)
    manifest = tmp_path / "copying.toml"
    manifest.write_text(
        f"[gates.test]\nrun = \"cp ci/payload.gitconfig '{home}/.gitconfig' || true\"\n"
    )
    submit(repo_info(project), [envelope])
    result = integrate(repo=project, manifest=manifest, window=1)
    assert result.ok
    assert not (home / ".gitconfig").exists()
    assert git(project, "branch", "--list", "escaped") == ""
    queue = Queue.of(repo_info(project)).dir
    assert not (queue / "ESCAPED").exists()


@confined
def test_an_envelope_cannot_point_a_relative_writable_place_at_the_users_files(
    project: Path, tmp_path: Path
) -> None:
    """The target's manifest lets gates write ``build/cache`` (relative: inside the tree).
    The envelope's tree makes build/cache a symlink to a folder of the user's; the gate's
    write there is refused, and the folder is untouched."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "key").write_text("the user's\n")

    def hostile(p: Path) -> None:
        (p / "build").mkdir()
        (p / "build" / "cache").symlink_to(precious)

    envelope = worker(project, "w1", hostile)
    manifest = tmp_path / "cache.toml"
    manifest.write_text(
        '[sandbox]\nwritable = ["build/cache"]\n'
        '[gates.t]\nrun = "echo owned > build/cache/key; echo planted > build/cache/new; true"\n'
    )
    submit(repo_info(project), [envelope])
    assert integrate(repo=project, manifest=manifest, window=1).ok
    assert (precious / "key").read_text() == "the user's\n"
    assert not (precious / "new").exists()


@confined
def test_the_users_checkout_stays_concealed_beside_a_tool_on_path(
    project: Path, tmp_path: Path
) -> None:
    """A program on PATH under a cover (``/tmp``, a home) keeps the top folder holding it
    visible; when that folder holds the user's checkout too (``/tmp/x/node/bin`` beside
    ``/tmp/x/project``, ``~/go/bin`` beside ``~/go/src/...``), the checkout must stay
    concealed all the same.  Round 9 of docs/real-projects.md: turbo in the integration
    tree read the checkout's ``.turbo/cache``, and an envelope was blamed for what it
    replayed."""
    tools = tmp_path / "tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "probe-tool").write_text("#!/bin/sh\necho tool ran\n")
    (tools / "probe-tool").chmod(0o755)
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    manifest = tmp_path / "sees.toml"
    manifest.write_text(
        '[env]\npass = ["PATH"]\n[gates.sees]\n'
        f"run = \"probe-tool && if test -e '{project}/shared.txt'; then echo sees; exit 1; fi\"\n"
    )
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}")
    submit(repo_info(project), [envelope])
    result = integrate(repo=project, manifest=manifest, window=1, env=env)
    assert [o.state for o in result.envelopes] == ["landed"], result.to_json()
