"""Node seeds (issue 44): a pnpm workspace's, npm's and yarn's ``node_modules`` -- every
workspace's -- built once per key with the package manager's store outside the tree, on real
package managers installing real (local, offline) packages: each worktree and integration
tree gets its own, gates run the tree's programs without installing anything, and a build
from a tree that is not trusted never writes the store trusted builds read."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from conftest import commit_release_manifest, git, run_json

from dagrunner.cli.main import run_cli
from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting
from dagrunner.worktrees import seeds, seedstores

MANAGERS = {m: shutil.which(m) for m in ("node", "npm", "pnpm", "yarn")}
pytestmark = pytest.mark.skipif(
    not all(MANAGERS.values()),
    reason="node, npm, pnpm and yarn are installed by .ci/run (apt-get, npm i -g)",
)


def tool_tarball(path: Path, name: str, said: str) -> None:
    """A real npm package tarball of a program ``name`` that prints ``said``."""
    files = {
        "package/package.json": json.dumps(
            {"name": name, "version": "1.0.0", "bin": {name: "bin.js"}}
        ).encode(),
        "package/bin.js": f"#!/usr/bin/env node\nconsole.log({said!r});\n".encode(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o755, 1700000000
            tar.addfile(info, io.BytesIO(data))


def quiet_env(home: Path) -> dict[str, str]:
    """A user's shell with nothing of CI about it (pnpm asks before it removes a folder
    when it has no terminal and is not in CI: exactly what must never happen in a gate)."""
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("npm_")}
    return {**env, "HOME": str(home), "npm_config_update_notifier": "false"}


def run(cwd: Path, *argv: str, home: Path) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=quiet_env(home), capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


PNPM_SEED = """
[env]
pass = ["PATH"]

[[worktrees.seed]]
path = "node_modules"
also = ["packages/*/node_modules"]
key = ["pnpm-lock.yaml", "package.json", "packages/*/package.json", "pnpm-workspace.yaml"]
build = 'pnpm install --frozen-lockfile --store-dir "$DAGRUNNER_SEED_STORE"'
store = "pnpm"

[gates.check]
run = ["pnpm", "run", "check"]
"""


@pytest.fixture
def workspace(repo: Path, tmp_path: Path) -> Path:
    pnpm_workspace(repo, tmp_path)
    commit_release_manifest(repo, PNPM_SEED)
    return repo


def pnpm_workspace(repo: Path, tmp_path: Path) -> None:
    """A pnpm workspace: the root and package ``a`` run ``faketool`` (a local tarball), ``a``
    depends on the workspace's ``b``; its lockfile written."""
    tool_tarball(repo / "vendor" / "faketool-1.0.0.tgz", "faketool", "faketool ran")
    tool_tarball(repo / "vendor" / "othertool-1.0.0.tgz", "othertool", "othertool ran")
    (repo / ".gitignore").write_text("reports/\nnode_modules/\n")
    (repo / "pnpm-workspace.yaml").write_text('packages:\n  - "packages/*"\n')
    root = {
        "name": "root",
        "private": True,
        "scripts": {"check": "faketool && pnpm -r run check"},
        "devDependencies": {"faketool": "file:vendor/faketool-1.0.0.tgz"},
    }
    (repo / "package.json").write_text(json.dumps(root, indent=2))
    packages: dict[str, dict[str, object]] = {
        "a": {
            "scripts": {"check": "faketool"},
            "dependencies": {
                "b": "workspace:*",
                "faketool": "file:../../vendor/faketool-1.0.0.tgz",
            },
        },
        "b": {"scripts": {"check": "node -e \"require('fs').statSync('index.js')\""}},
    }
    for name, body in packages.items():
        (repo / "packages" / name).mkdir(parents=True)
        (repo / "packages" / name / "index.js").write_text(f"module.exports = {name!r};\n")
        body = {"name": name, "version": "1.0.0", **body}
        (repo / "packages" / name / "package.json").write_text(json.dumps(body, indent=2))
    store = tmp_path / "lock-store"
    run(repo, "pnpm", "install", "--lockfile-only", "--store-dir", str(store), home=tmp_path)


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.is_dir() else set()


def test_a_pnpm_workspace_seed_covers_every_node_modules_and_pnpm_runs_without_installing(
    workspace: Path, tmp_path: Path
) -> None:
    first = wt.allocate(mission="m", worker="a", repo=workspace)
    second = wt.allocate(mission="m", worker="b", repo=workspace)
    placed = [(s["path"], s["built"]) for s in first["seeds"]]
    assert placed == [("node_modules", True), ("packages/a/node_modules", True)]
    assert [s["built"] for s in second["seeds"]] == [False, False]
    root = Path(first["root"])
    store = seedstores.shared_store(seeds.seeds_dir(root), "pnpm")
    for allocated in (first, second):
        path = Path(allocated["path"])
        # pnpm recorded the store that outlives the build, not the build's temporary HOME
        modules = (path / "node_modules" / ".modules.yaml").read_text()
        assert f'"storeDir": "{store}' in modules or f"storeDir: {store}" in modules
        # a user's shell with no terminal and no CI: pnpm would ask to remove node_modules
        # (ERR_PNPM_ABORTED_REMOVE_MODULES_DIR_NO_TTY) or install, were the seed not whole
        said = run(path, "pnpm", "run", "check", home=tmp_path / f"home-{path.name}")
        assert said.count("faketool ran") == 2, said
        assert "Packages:" not in said and "recreated" not in said, said
        assert git(path, "status", "--porcelain") == ""
    assert files_under(store)  # it outlived the build


def test_an_untrusted_lockfile_change_builds_with_a_private_store_and_both_land(
    workspace: Path, tmp_path: Path
) -> None:
    """Integration trees get the seeds; an envelope that changes the lockfile has its seed
    built from its tree with a private copy of the store: the shared store is unchanged."""
    allocated = wt.allocate(mission="m", worker="good", repo=workspace)
    root, good = Path(allocated["root"]), Path(allocated["path"])
    store = seedstores.shared_store(seeds.seeds_dir(root), "pnpm")
    (good / "packages" / "b" / "index.js").write_text("module.exports = 'b, better';\n")
    dep = Path(wt.allocate(mission="m", worker="dep", repo=workspace)["path"])
    manifest = dep / "packages" / "b" / "package.json"
    body = json.loads(manifest.read_text())
    body["dependencies"] = {"othertool": "file:../../vendor/othertool-1.0.0.tgz"}
    body["scripts"]["check"] = "othertool"
    manifest.write_text(json.dumps(body, indent=2))
    lock_store = tmp_path / "worker-store"
    run(dep, "pnpm", "install", "--lockfile-only", "--store-dir", str(lock_store), home=tmp_path)
    before = files_under(store)
    envelopes = []
    for worker in ("good", "dep"):
        out = tmp_path / f"{worker}.json"
        exporting.export(f"m/{worker}", output=out, repo=workspace)
        envelopes.append(out)
    submit(repo_info(workspace), envelopes)
    result = integrate(repo=workspace, window=1)
    assert {o.worker: o.state for o in result.envelopes} == {"good": "landed", "dep": "landed"}
    assert not [w for w in result.warnings if "without its seeds" in w], result.warnings
    assert files_under(store) == before  # the untrusted build wrote its private copy only
    assert not files_under(seeds.seeds_dir(root) / "stores" / ".private")  # and it is gone


NPM_SEED = """
[env]
pass = ["PATH"]

[[worktrees.seed]]
path = "node_modules"
key = ["package-lock.json", "package.json"]
build = 'npm ci --no-audit --no-fund --cache "$DAGRUNNER_SEED_STORE"'
store = "npm"

[gates.check]
run = ["npm", "run", "check"]
"""

YARN_SEED = """
[env]
pass = ["PATH"]

[[worktrees.seed]]
path = "node_modules"
key = ["yarn.lock", "package.json"]
build = 'yarn install --frozen-lockfile --non-interactive --cache-folder "$DAGRUNNER_SEED_STORE"'
store = "yarn"

[gates.check]
run = ["yarn", "run", "check"]
"""


@pytest.mark.parametrize(
    ("manager", "manifest", "lock"),
    [
        ("npm", NPM_SEED, ["npm", "install", "--package-lock-only", "--no-audit"]),
        ("yarn", YARN_SEED, ["yarn", "install", "--non-interactive"]),
    ],
)
def test_npm_and_yarn_seeds_give_each_worktree_and_gate_the_projects_programs(
    repo: Path, tmp_path: Path, manager: str, manifest: str, lock: list[str]
) -> None:
    tool_tarball(repo / "vendor" / "faketool-1.0.0.tgz", "faketool", "faketool ran")
    (repo / ".gitignore").write_text("reports/\nnode_modules/\n")
    body = {
        "name": "proj",
        "version": "1.0.0",
        "scripts": {"check": "faketool"},
        "devDependencies": {"faketool": "file:vendor/faketool-1.0.0.tgz"},
    }
    (repo / "package.json").write_text(json.dumps(body, indent=2))
    run(repo, *lock, home=tmp_path)
    shutil.rmtree(repo / "node_modules", ignore_errors=True)
    commit_release_manifest(repo, manifest)
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    assert "faketool ran" in run(path, manager, "run", "check", home=tmp_path / "home")
    store = seedstores.shared_store(seeds.seeds_dir(Path(wt.open_context(repo).root)), manager)
    assert files_under(store)  # the package manager's cache outlived the build
    (path / "index.js").write_text("// a change\n")
    out = tmp_path / "w.json"
    exporting.export("m/w", output=out, repo=repo)
    submit(repo_info(repo), [out])
    result = integrate(repo=repo, window=1)
    assert [o.state for o in result.envelopes] == ["landed"], result


def test_init_proposes_the_workspaces_seed_from_its_lockfile_and_the_gate_passes_in_a_worktree(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a pnpm monorepo init proposed no seed: every integration gate failed ``command not
    found`` or pnpm installed everything in every gate.  Now the seed is init's, whole."""
    pnpm_workspace(repo, tmp_path)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a workspace")
    out = repo / "dagrunner.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    (seed,) = body["seeds"]
    assert seed["path"] == "node_modules" and seed["also"] == ["packages/*/node_modules"]
    assert seed["store"] == "pnpm" and seed["active"] is True
    assert seed["build"] == (
        'pnpm_config_store_dir="$DAGRUNNER_SEED_STORE" '
        'pnpm_config_cache_dir="$DAGRUNNER_SEED_STORE/cache" pnpm install --frozen-lockfile'
    )
    for name in ("pnpm-lock.yaml", "package.json", "packages/*/package.json"):
        assert name in seed["key"]
    assert "pnpm-workspace.yaml" in seed["key"]
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-qm", "init's manifest, as written")
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    assert (path / "packages" / "a" / "node_modules" / ".bin" / "faketool").exists()
    code, body = run_json(capsys, "release-check", "--repo", str(path), "--no-cache")
    assert code == 0, body


def test_init_s_pnpm_seed_build_keeps_pnpm_s_cache_in_the_store_that_outlives_it(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a pnpm 11 monorepo with ``minimumReleaseAge`` (tinyhttp) each seed build spent 6 s
    of its 7.6 s checking the lockfile against the registry (every entry's metadata
    fetched): pnpm keeps that verification and the metadata in its cache, which was in the
    build's temporary HOME, so no build found it and none could run offline.  init's build
    now keeps pnpm's cache beside its store, which outlives the build."""
    pnpm_workspace(repo, tmp_path)
    with (repo / "pnpm-workspace.yaml").open("a") as workspace_file:
        workspace_file.write("minimumReleaseAge: 1440\n")  # the supply-chain check is on
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a workspace")
    out = repo / "dagrunner.toml"
    code, body = run_json(capsys, "init", "--repo", str(repo), "-o", str(out))
    assert code == 0, body
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-qm", "init's manifest, as written")
    allocated = wt.allocate(mission="m", worker="w", repo=repo)
    assert [s["built"] for s in allocated["seeds"]] == [True, True]
    store = seedstores.shared_store(seeds.seeds_dir(Path(allocated["root"])), "pnpm")
    # what lets the next build skip the check (and its registry): kept, not thrown away
    assert [p.name for p in store.rglob("lockfile-verified.jsonl")] == ["lockfile-verified.jsonl"]


@pytest.mark.parametrize(
    ("files", "build", "active"),
    [
        ({"package-lock.json": "{}"}, "npm ci --no-audit --no-fund --cache", True),
        ({"yarn.lock": "# yarn lockfile v1\n"}, "yarn install --frozen-lockfile", True),
        (
            {
                "yarn.lock": "__metadata:\n  version: 8\n",
                ".yarnrc.yml": "nodeLinker: node-modules\n",
            },
            "yarn install --immutable",
            True,
        ),
        ({"yarn.lock": "__metadata:\n  version: 8\n"}, "yarn install --immutable", False),
    ],
)
def test_init_reads_the_package_manager_from_the_lockfile(
    repo: Path,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, str],
    build: str,
    active: bool,
) -> None:
    body = {"name": "p", "scripts": {"test": "node --test"}, "workspaces": ["libs/*", "!libs/x"]}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / ".gitignore").write_text("node_modules\n")
    for name, text in files.items():
        (repo / name).write_text(text)
    code, said = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0, said
    (seed,) = said["seeds"]
    assert build in seed["build"] and seed["active"] is active, seed
    assert seed["also"] == ["libs/*/node_modules"] and "libs/*/package.json" in seed["key"]
    if not active:  # Plug'n'Play: no node_modules to seed, and what to set is said
        code, said = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "m.toml"))
        assert "set `nodeLinker: node-modules`" in (repo / "m.toml").read_text()
    (repo / ".gitignore").write_text("reports/\n")
    code, said = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert said["seeds"][0]["active"] is False  # git would see node_modules: said, not used


def test_an_npm_project_without_a_lockfile_gets_its_seed_commented_out_with_why(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on a real npm workspace (``package-lock=false`` in ``.npmrc``): init proposed no
    seed and said nothing, every integration gate failed ``command not found: tsc``, and the
    hint said "``init --dry-run`` proposes it" while it did not.  Now the seed is written
    commented out, with why and the edit, and uncommented it gives a worktree the programs."""
    tool_tarball(repo / "vendor" / "faketool-1.0.0.tgz", "faketool", "faketool ran")
    (repo / ".gitignore").write_text("reports/\nnode_modules/\n")
    (repo / ".npmrc").write_text("package-lock=false\n")
    body = {
        "name": "proj",
        "version": "1.0.0",
        "private": True,
        "workspaces": ["packages/a"],
        "scripts": {"check": "faketool"},
        "devDependencies": {"faketool": "file:vendor/faketool-1.0.0.tgz"},
    }
    (repo / "package.json").write_text(json.dumps(body, indent=2))
    (repo / "packages" / "a").mkdir(parents=True)
    (repo / "packages" / "a" / "package.json").write_text('{"name": "a", "version": "1.0.0"}')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "an npm workspace without a lockfile")
    out = repo / "dagrunner.toml"
    code, said = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0, said
    (seed,) = said["seeds"]
    assert seed["active"] is False and "--no-package-lock" in seed["build"], seed
    assert ".npmrc" in seed["key"] and "packages/a/package.json" in seed["key"]
    assert run_cli(["init", "--repo", str(repo)]) == 0
    assert "seed node_modules written commented out" in capsys.readouterr().out
    text = out.read_text()
    assert "# no lockfile (npm, package-lock=false)" in text
    lines = text.split("\n")  # uncommented: the seed's lines, up to the next blank one
    start = lines.index("# [[worktrees.seed]]")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("# "))
    lines[start:end] = [line.removeprefix("# ") for line in lines[start:end]]
    out.write_text("\n".join(lines))
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-qm", "init's manifest, its seed uncommented as it says")
    path = Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])
    assert (path / "node_modules" / ".bin" / "faketool").exists()


def test_pnpm_runs_in_a_seeded_tree_made_after_the_build_without_installing(
    repo: Path, tmp_path: Path
) -> None:
    """Found on preconstruct (round 10): pnpm 10+ checks, before ``pnpm run``, every
    manifest and the lockfile newer than its workspace state's ``lastValidatedTimestamp``;
    when the lockfile then differs from the one under ``node_modules/.pnpm`` (which leaves
    out what this platform skips) it installs, with the gate's store, not the seed's: it
    wants to remove ``node_modules`` and fails without a terminal
    (ERR_PNPM_ABORTED_REMOVE_MODULES_DIR_NO_TTY).  A tree made after the seed's build has
    every such file newer; the seed is keyed on them, so they are the ones validated."""
    pnpm_workspace(repo, tmp_path)
    tool_tarball(repo / "vendor" / "wintool-1.0.0.tgz", "wintool", "never here")
    body = json.loads((repo / "package.json").read_text())
    body["optionalDependencies"] = {"wintool": "file:vendor/wintool-1.0.0.tgz"}
    (repo / "package.json").write_text(json.dumps(body, indent=2))
    with tarfile.open(repo / "vendor" / "wintool-1.0.0.tgz", "w:gz") as tar:
        data = json.dumps({"name": "wintool", "version": "1.0.0", "os": ["win32"]}).encode()
        info = tarfile.TarInfo("package/package.json")
        info.size, info.mtime = len(data), 1700000000
        tar.addfile(info, io.BytesIO(data))
    run(
        repo,
        "pnpm",
        "install",
        "--lockfile-only",
        "--store-dir",
        str(tmp_path / "s"),
        home=tmp_path,
    )
    commit_release_manifest(repo, PNPM_SEED)
    time.sleep(1.1)  # the tree's files are written after the build
    path = Path(wt.allocate(mission="m", worker="a", repo=repo)["path"])
    path = Path(wt.allocate(mission="m", worker="b", repo=repo)["path"])
    state = json.loads((path / "node_modules" / ".pnpm-workspace-state-v1.json").read_text())
    newest = max((path / f).stat().st_mtime for f in ("pnpm-lock.yaml", "package.json"))
    assert state["lastValidatedTimestamp"] >= newest * 1000, state
    env = {"pnpm_config_verify_deps_before_run": "prompt"}  # says why instead of installing
    done = subprocess.run(
        ["pnpm", "run", "check"],
        cwd=path,
        env={**quiet_env(tmp_path / "home"), **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0 and done.stdout.count("faketool ran") == 2, done


def test_a_pnpm_install_the_root_s_postinstall_runs_uses_the_seed_s_store_too(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """preconstruct's ``postinstall`` runs ``pnpm --dir build install --ignore-workspace``:
    the build's ``--store-dir`` flag does not reach a pnpm its scripts run, so that install
    recorded a store in the build's temporary HOME (gone after it) and downloaded everything
    at every build.  init's build gives pnpm its store in the environment, which they get."""
    pnpm_workspace(repo, tmp_path)
    (repo / "build").mkdir()
    body = {"name": "b", "private": True}
    body["devDependencies"] = {"faketool": "file:../vendor/faketool-1.0.0.tgz"}
    (repo / "build" / "package.json").write_text(json.dumps(body))
    flags = ("--lockfile-only", "--ignore-workspace", "--store-dir", str(tmp_path / "s"))
    run(repo / "build", "pnpm", "install", *flags, home=tmp_path)
    root = json.loads((repo / "package.json").read_text())
    root["scripts"]["postinstall"] = "pnpm --dir build install --ignore-workspace"
    (repo / "package.json").write_text(json.dumps(root, indent=2))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a workspace whose postinstall installs build/")
    code, said = run_json(capsys, "init", "--repo", str(repo), "-o", str(repo / "dagrunner.toml"))
    assert code == 0, said
    git(repo, "add", "dagrunner.toml")
    git(repo, "commit", "-qm", "init's manifest, as written")
    allocated = wt.allocate(mission="m", worker="w", repo=repo)
    store = seedstores.shared_store(seeds.seeds_dir(Path(allocated["root"])), "pnpm")
    path = Path(allocated["path"])
    for modules in ("node_modules", "build/node_modules"):
        recorded = (path / modules / ".modules.yaml").read_text()
        assert str(store) in recorded, (modules, recorded[-600:])
