"""Dependency seeds (``[[worktrees.seed]]``), on real venvs, real pip installs and real
processes: built once per key, each worktree's copy its own, what runs there that
worktree's code, a failed or unignored seed allocating nothing."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from conftest import CLI, can_mount, commit_release_manifest, git

from dagrunner.errors import DagrunnerError
from dagrunner.process import share
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import lifecycle, seeds, seedstores

PY = sys.executable


def tiny_wheel() -> bytes:
    """A real wheel of a one-module package, ``tinydep`` 1.0 (pip installs it offline)."""
    files = {
        "tinydep/__init__.py": b"VALUE = 'tiny'\n",
        "tinydep-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinydep\nVersion: 1.0\n",
        "tinydep-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinydep-1.0.dist-info/RECORD,,")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("tinydep-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return out.getvalue()


VENV_SEED = f"""
[env]
pass = ["PATH"]

[[worktrees.seed]]
path = ".venv"
key = ["requirements.txt", "pyproject.toml", "vendor/*.whl"]
build = "{PY} -m venv --system-site-packages .venv && .venv/bin/pip install -q --no-index --find-links vendor -r requirements.txt && .venv/bin/python setup.py -q develop --no-deps"
timeout = "5m"

[gates.ok]
run = "true"
"""


@pytest.fixture
def venv_project(repo: Path) -> Path:
    (repo / ".gitignore").write_text("reports/\n.venv/\n*.egg-info/\n")
    (repo / "pyproject.toml").write_text('[project]\nname = "proj"\nversion = "0.1"\n')
    (repo / "setup.py").write_text(
        'from setuptools import setup\nsetup(package_dir={"": "src"}, packages=["proj"])\n'
    )
    (repo / "src" / "proj").mkdir(parents=True)
    (repo / "src" / "proj" / "__init__.py").write_text('WHO = "base"\n')
    (repo / "requirements.txt").write_text("tinydep==1.0\n")
    (repo / "checks").mkdir()  # the project's own test: its code is the worktree's
    (repo / "checks" / "test_own.py").write_text(
        "import os\n\nimport proj\n\n\ndef test_own_code() -> None:\n"
        "    assert proj.__file__ == os.path.join(os.getcwd(), 'src', 'proj', '__init__.py')\n"
    )
    (repo / "vendor").mkdir()
    (repo / "vendor" / "tinydep-1.0-py3-none-any.whl").write_bytes(tiny_wheel())
    commit_release_manifest(repo, VENV_SEED)
    return repo


def run_in(path: Path, *argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(argv, cwd=path, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize("how", ["", "copy"])  # what this machine picks, and a plain copy
def test_a_venv_seed_is_built_once_and_runs_each_worktrees_own_code(
    venv_project: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how:
        monkeypatch.setenv("DAGRUNNER_SEED_SHARE", how)
    first = wt.allocate(mission="m", worker="a", repo=venv_project)
    second = wt.allocate(mission="m", worker="b", repo=venv_project)
    assert [s["built"] for s in first["seeds"]] == [True]
    assert [s["built"] for s in second["seeds"]] == [False]
    assert first["seeds"][0]["key"] == second["seeds"][0]["key"]
    assert first["seeds"][0]["how"] == how if how else first["seeds"][0]["how"] in share.HOW
    a, b = Path(first["path"]), Path(second["path"])
    (a / "src" / "proj" / "__init__.py").write_text('WHO = "a"\n')
    probe = "import proj, tinydep, sys; print(proj.WHO, proj.__file__, tinydep.VALUE, sys.prefix)"
    for path, who in ((a, "a"), (b, "base")):
        said = run_in(path, str(path / ".venv" / "bin" / "python"), "-c", probe).split()
        assert said == [
            who,
            str(path / "src" / "proj" / "__init__.py"),
            "tiny",
            str(path / ".venv"),
        ]
        # pytest (the system's: the venv sees it) runs this worktree's own code
        tested = run_in(
            path,
            str(path / ".venv/bin/python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "checks",
        )
        assert "1 passed" in tested
        # a script's #! line names this worktree's interpreter, not the build's checkout
        pip = run_in(path, str(path / ".venv" / "bin" / "pip"), "--version")
        assert f"from {path}/.venv/" in pip
        assert str(path) in (path / ".venv" / "pyvenv.cfg").read_text()
        # the seed is git-ignored: nothing to commit
        status = run_in(path, "git", "status", "--porcelain", "--untracked-files=all")
        assert ".venv" not in status and "egg" not in status
    # the checkout it was built in is gone; nothing in either worktree points there
    store = seeds.seeds_dir(Path(first["root"]))
    assert list((store / ".build").iterdir()) == []


def test_a_workers_write_into_its_seed_reaches_no_other_worktree_nor_the_store(
    venv_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cheap(venv_project)
    for how in share.HOW:
        store_dir = Path(wt.open_context(venv_project).root) / ".seeds"
        if how != "copy" and not share.can(how, store_dir):
            continue  # this machine cannot share that way (doctor says so)
        monkeypatch.setenv("DAGRUNNER_SEED_SHARE", how)
        one = wt.allocate(mission=how, worker="one", repo=venv_project)
        two = wt.allocate(mission=how, worker="two", repo=venv_project)
        assert one["seeds"][0]["how"] == how
        mine, theirs = Path(one["path"]) / "deps", Path(two["path"]) / "deps"
        with (mine / "lib.txt").open("r+b") as handle:  # in place, as a hostile worker would
            handle.write(b"EVIL")
        (mine / "planted").write_text("x")
        tree = store_dir / one["seeds"][0]["key"] / "tree"
        for other in (theirs, tree):
            assert (other / "lib.txt").read_bytes() == b"shared library\n"
            assert not (other / "planted").exists()
        assert (mine / "lib.txt").read_bytes().startswith(b"EVIL")


CHEAP_SEED = """
[env]
pass = ["PATH"]

[[worktrees.seed]]
path = "deps"
key = ["requirements.txt"]
build = "mkdir deps && printf 'shared library\\n' > deps/lib.txt && cp requirements.txt deps/ && sleep 1"

[gates.ok]
run = "true"
"""


def cheap(project: Path, body: str = CHEAP_SEED) -> None:
    (project / ".gitignore").write_text("deps/\n")
    commit_release_manifest(project, body)


def test_concurrent_allocations_of_one_key_build_it_once_and_a_new_key_builds_again(
    venv_project: Path,
) -> None:
    cheap(venv_project)
    procs = [
        subprocess.Popen(
            [*CLI, "worktree", "allocate", "--mission", "m", "--worker", f"w{i}", "--json"],
            cwd=venv_project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    bodies = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        bodies.append(orjson.loads(out))
    assert sorted(b["seeds"][0]["built"] for b in bodies) == [False, False, False, True]
    assert len({b["seeds"][0]["key"] for b in bodies}) == 1
    for body in bodies:
        assert (Path(body["path"]) / "deps" / "requirements.txt").read_text() == "tinydep==1.0\n"
    (venv_project / "requirements.txt").write_text("tinydep==1.1\n")
    git(venv_project, "commit", "-qam", "bump")
    bumped = wt.allocate(mission="m", worker="later", repo=venv_project)
    assert bumped["seeds"][0]["built"] and bumped["seeds"][0]["key"] != bodies[0]["seeds"][0]["key"]
    assert (Path(bumped["path"]) / "deps" / "requirements.txt").read_text() == "tinydep==1.1\n"


def test_a_failed_build_is_coded_with_its_output_and_allocates_nothing(
    venv_project: Path,
) -> None:
    cheap(
        venv_project,
        CHEAP_SEED.replace(
            'build = "mkdir deps', 'build = "echo the lockfile is broken; exit 3; mkdir deps'
        ),
    )
    done = subprocess.run(
        [*CLI, "worktree", "allocate", "--mission", "m", "--worker", "a", "--json"],
        cwd=venv_project,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    error = orjson.loads(done.stdout)["error"]
    assert error["code"] == "seed-build-failed"
    assert "the lockfile is broken" in " ".join(error["details"]["output_tail"])
    assert "Traceback" not in done.stderr
    root = wt.open_context(venv_project).root
    assert not (root / "m" / "a").exists()
    assert wt.open_context(venv_project).ledger.state() == {}
    assert "dagrunner/m/a" not in git(venv_project, "branch", "--list")
    assert [p.name for p in seeds.seeds_dir(root).iterdir() if len(p.name) == 32] == []


def test_a_seed_git_does_not_ignore_is_refused_and_allocates_nothing(venv_project: Path) -> None:
    (venv_project / ".gitignore").write_text("reports/\n")
    commit_release_manifest(venv_project, CHEAP_SEED)
    with pytest.raises(DagrunnerError) as caught:
        wt.allocate(mission="m", worker="a", repo=venv_project)
    assert caught.value.code == "seed-not-ignored"
    assert not (wt.open_context(venv_project).root / "m" / "a").exists()


def test_a_seed_ignored_by_its_own_gitignore_is_accepted(venv_project: Path) -> None:
    """``python -m venv`` and ``uv`` write ``.gitignore`` (``*``) into the venv they make: the
    folder is ignored without a line in the project's own ``.gitignore``."""
    (venv_project / ".gitignore").write_text("reports/\n")
    commit_release_manifest(
        venv_project,
        CHEAP_SEED.replace("cp requirements.txt deps/", "echo '*' > deps/.gitignore"),
    )
    path = Path(wt.allocate(mission="m", worker="a", repo=venv_project)["path"])
    assert (path / "deps" / "lib.txt").is_file()
    assert run_in(path, "git", "status", "--porcelain", "--untracked-files=all") == ""


def test_a_seed_build_may_fill_and_read_the_caches_the_manifest_names_writable(
    venv_project: Path, tmp_path: Path
) -> None:
    """An offline ``npm ci --offline`` or ``pip install --no-index`` needs its cache: the
    build writes where ``[sandbox] writable`` says, as a gate does."""
    cache = tmp_path / "package-cache"
    cache.mkdir()
    (cache / "pkg").write_text("a cached package\n")
    build = f"mkdir deps && cp {cache}/pkg deps/ && echo used >> {cache}/log"
    cheap(
        venv_project,
        CHEAP_SEED.replace(
            "[[worktrees.seed]]", f'[sandbox]\nwritable = ["{cache}"]\n\n[[worktrees.seed]]'
        ).replace(CHEAP_SEED.split("build = ")[1].split("\n")[0], repr(build).replace("'", '"')),
    )
    path = Path(wt.allocate(mission="m", worker="a", repo=venv_project)["path"])
    assert (path / "deps" / "pkg").read_text() == "a cached package\n"
    assert (cache / "log").read_text() == "used\n"


def test_the_pool_hands_out_a_fresh_seed_and_cleanup_leaves_no_mount(venv_project: Path) -> None:
    cheap(venv_project)
    first = wt.allocate(mission="m", worker="a", repo=venv_project)
    path = Path(first["path"])
    (path / "deps" / "lib.txt").write_text("changed by worker a\n")
    assert lifecycle.cleanup("m/a", repo=venv_project)["action"] == "pooled"
    assert str(path) not in Path("/proc/self/mountinfo").read_text()
    again = wt.allocate(mission="m", worker="b", repo=venv_project)
    assert again["pooled"] is True
    assert (Path(again["path"]) / "deps" / "lib.txt").read_text() == "shared library\n"
    assert [s["id"] for s in lifecycle.list_worktrees(repo=venv_project)] == ["m/b"]


def test_cache_prune_drops_least_recently_used_seeds_and_keeps_mounted_ones(
    venv_project: Path,
) -> None:
    cheap(venv_project)
    old = wt.allocate(mission="m", worker="a", repo=venv_project)
    lifecycle.cleanup("m/a", repo=venv_project)
    (venv_project / "requirements.txt").write_text("tinydep==2\n")
    git(venv_project, "commit", "-qam", "bump")
    new = wt.allocate(mission="m", worker="b", repo=venv_project)
    root = Path(new["root"])
    done = subprocess.run(
        [*CLI, "cache", "prune", "--max-size", "1", "--json"],
        cwd=venv_project,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    pruned = orjson.loads(done.stdout)["seeds"]
    assert old["seeds"][0]["key"] in pruned["removed"]
    assert not (seeds.seeds_dir(root) / old["seeds"][0]["key"]).exists()
    if new["seeds"][0]["how"] == "overlay":  # the live worktree stands on it: kept
        assert pruned["in_use_kept"] == 1
        assert (Path(new["path"]) / "deps" / "lib.txt").read_text() == "shared library\n"


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("../outside", "climbs out"),
        (".git/x", "git's own"),
        ("/abs", "absolute"),
        (".", "not a folder"),
    ],
)
def test_a_bad_seed_path_is_a_coded_manifest_error(repo: Path, path: str, says: str) -> None:
    body = CHEAP_SEED.replace('path = "deps"', f'path = "{path}"')
    (repo / "m.toml").write_text(body)
    done = subprocess.run([*CLI, "graph", "m.toml"], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 2
    assert "manifest-value" in done.stderr and "worktrees.seed" in done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_forged_ledger_line_mounts_no_seed_outside_its_worktree(
    venv_project: Path, tmp_path: Path
) -> None:
    cheap(venv_project)
    first = wt.allocate(mission="m", worker="a", repo=venv_project)
    victim = tmp_path / "victim"
    victim.mkdir()
    ledger = wt.open_context(venv_project).ledger
    line = next(e for e in ledger.events() if e["event"] == "allocated")
    forged = {
        **line,
        "seeds": [{**first["seeds"][0], "path": os.path.relpath(victim, first["path"])}],
    }
    with ledger.path.open("ab") as handle:  # what a worker could write into the common git dir
        handle.write(orjson.dumps(forged) + b"\n")
    again = wt.allocate(mission="m", worker="a", repo=venv_project)
    assert again["reused"] is True and again["seeds"] == []
    assert not os.path.ismount(victim) and list(victim.iterdir()) == []


@pytest.mark.skipif(not can_mount(), reason="overlay seeds need a process that may mount")
def test_a_seed_is_never_mounted_through_a_link_the_worker_planted(
    venv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart ``allocate`` mounts a worktree's overlay seed again.  A worker that
    replaced its (unmounted, empty) seed folder with a link must not get the seed -- and its
    writable layer -- mounted wherever the link points (another worktree's venv, any empty
    folder): the mount point is opened component by component, never followed."""
    monkeypatch.setenv("DAGRUNNER_SEED_SHARE", "overlay")
    cheap(venv_project)
    first = wt.allocate(mission="m", worker="a", repo=venv_project)
    deps = Path(first["path"]) / "deps"
    subprocess.run(["umount", str(deps)], check=True)  # what a restart leaves: an empty folder
    victim = tmp_path / "victim"
    victim.mkdir()
    deps.rmdir()
    deps.symlink_to(victim)  # the worker's link
    with pytest.raises(DagrunnerError) as caught:
        wt.allocate(mission="m", worker="a", repo=venv_project)
    assert caught.value.code == "path-occupied"
    assert not os.path.ismount(victim) and list(victim.iterdir()) == []
    assert deps.is_symlink()  # left as the worker made it


@pytest.mark.skipif(not can_mount(), reason="overlay seeds need a process that may mount")
def test_an_overlay_seed_under_a_root_whose_path_holds_option_separators(
    venv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worktree root whose path holds ``,`` ``:`` ``\\`` (an overlay's option separators,
    escaped when mounted): the seed is mounted, a prune of the store keeps it while a
    worktree has it as its lower layer (the mount table shows it escaped), and removing the
    worktree releases its mount."""
    monkeypatch.setenv("DAGRUNNER_SEED_SHARE", "overlay")
    monkeypatch.setenv("DAGRUNNER_WORKTREE_ROOT", str(tmp_path / "trees, a:b\\c"))
    cheap(venv_project)
    first = wt.allocate(mission="m", worker="a", repo=venv_project)
    deps = Path(first["path"]) / "deps"
    assert os.path.ismount(deps) and (deps / "lib.txt").read_text() == "shared library\n"
    root = Path(wt.open_context(venv_project).root)
    assert seedstores.prune(root, 0).in_use_kept == 1  # a worktree stands on it: kept
    assert lifecycle.cleanup("m/a", repo=venv_project)["action"] == "pooled"
    assert not os.path.ismount(deps)
    assert seedstores.prune(root, 0).in_use_kept == 0


def test_a_seed_built_from_a_workers_base_never_serves_the_targets_allocations(
    venv_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``allocate --base <a worker's branch>`` built the seed with the worker's edited build
    script, keyed by the key files alone; later allocations from main were handed it."""
    monkeypatch.setenv("DAGRUNNER_SEED_SHARE", "copy")  # no mount keeps a seed in the store
    (venv_project / "make-deps.sh").write_text(
        "mkdir deps && echo 'shared library' > deps/lib.txt\n"
    )
    cheap(venv_project, CHEAP_SEED.replace(
        CHEAP_SEED.split("build = ")[1].split("\n")[0], '"sh make-deps.sh"'
    ))  # fmt: skip
    worker = Path(wt.allocate(mission="m", worker="evil", repo=venv_project)["path"])
    script = worker / "make-deps.sh"  # not a key file: the seed's key does not change
    script.write_text(script.read_text().replace("shared library", "POISONED"))
    git(worker, "commit", "-qam", "a build that poisons")
    branch = git(worker, "rev-parse", "--abbrev-ref", "HEAD").strip()
    seedstores.prune(Path(wt.open_context(venv_project).root), 0)  # the store has no seed yet
    poisoned = wt.allocate(mission="m", worker="on-evil", repo=venv_project, base=branch)
    assert (Path(poisoned["path"]) / "deps" / "lib.txt").read_text() == "POISONED\n"
    clean = wt.allocate(mission="m", worker="from-main", repo=venv_project)
    assert (Path(clean["path"]) / "deps" / "lib.txt").read_text() == "shared library\n"
    assert clean["seeds"][0]["key"] != poisoned["seeds"][0]["key"]


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted XFS (reflinks), where this machine lets root make one."""
    mkfs = shutil.which("mkfs.xfs")
    if mkfs is None or not can_mount():
        pytest.skip("a loop-mounted XFS needs mkfs.xfs (xfsprogs) and root")
    image = tmp_path / "xfs.img"
    with image.open("wb") as handle:
        handle.truncate(320 << 20)  # sparse; XFS wants 300 MiB at least
    subprocess.run([mkfs, "-q", "-f", str(image)], check=True, capture_output=True)
    point = tmp_path / "xfs"
    point.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no loop mount here: {mounted.stderr.decode().strip()}")
    try:
        yield point
    finally:
        share.release(point, point)
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def test_on_a_reflink_filesystem_seeds_share_their_blocks_until_written(
    venv_project: Path, xfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGRUNNER_WORKTREE_ROOT", str(xfs / "worktrees"))
    monkeypatch.setenv("DAGRUNNER_SEED_SHARE", "reflink")
    cheap(
        venv_project,
        CHEAP_SEED.replace(
            "cp requirements.txt deps/",
            "cp requirements.txt deps/ && head -c 20000000 /dev/urandom > deps/blob.bin",
        ),
    )
    first = wt.allocate(mission="m", worker="a", repo=venv_project)
    assert first["seeds"][0]["how"] == "reflink"

    def used() -> int:
        st = os.statvfs(xfs)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    before = used()
    second = wt.allocate(mission="m", worker="b", repo=venv_project)
    grown = used() - before
    assert grown < 5_000_000, grown  # a copy would take 20 MB: the extents are shared
    mine, theirs = Path(first["path"]) / "deps", Path(second["path"]) / "deps"
    original = (theirs / "blob.bin").read_bytes()[:4]
    with (mine / "blob.bin").open("r+b") as handle:
        handle.write(b"EVIL")
    tree = seeds.seeds_dir(Path(first["root"])) / first["seeds"][0]["key"] / "tree"
    assert (theirs / "blob.bin").read_bytes()[:4] == original
    assert (tree / "blob.bin").read_bytes()[:4] == original
