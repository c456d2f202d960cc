"""init: which of a JavaScript workspace's gates wait for its build (issue 44).

Found on a real yarn workspace (manypkg): each package's ``exports`` names ``dist/``, which
only ``preconstruct build`` writes; init wrote ``js-tsc`` beside ``js-build`` with no
``needs``, so in a tree without ``dist/`` (every worktree and integration tree) tsc raced the
build that deletes and writes the declarations it reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import git, run_json

CI = "jobs:\n  t:\n    steps:\n    - run: yarn test\n    - run: yarn tsc\n    - run: yarn format\n"
SCRIPTS = {"build": "tsc -b", "test": "vitest", "lint": "eslint .", "format": "prettier -c ."}


def needs_of(
    capsys: pytest.CaptureFixture[str], repo: Path, entry: dict[str, Any]
) -> dict[str, list[str]]:
    """A yarn workspace of two packages whose package.json's entry points are ``entry``, with
    ``src/index.ts`` committed and ``dist/`` ignored: each gate init proposes -> its needs."""
    body = {"name": "root", "private": True, "workspaces": ["packages/*"], "scripts": SCRIPTS}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "yarn.lock").write_text("# yarn lockfile v1\n")
    (repo / ".gitignore").write_text("node_modules/\ndist/\n")
    for name in ("a", "b"):
        folder = repo / "packages" / name
        (folder / "src").mkdir(parents=True)
        (folder / "src" / "index.ts").write_text("export const x = 1;\n")
        (folder / "dist").mkdir()  # built in the checkout: still not the repository's
        (folder / "dist" / "index.d.ts").write_text("export declare const x = 1;\n")
        (folder / "package.json").write_text(json.dumps({"name": name, **entry}))
    (repo / "node_modules" / ".bin").mkdir(parents=True)
    (repo / "node_modules" / ".bin" / "tsc").write_text("#!/bin/sh\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(CI)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "workspace")
    code, said = run_json(capsys, "init", "--repo", str(repo))
    assert code == 0, said
    return {g["id"]: g.get("needs", []) for g in said["gates"]}


def test_checks_that_read_a_workspaces_built_entry_points_wait_for_the_build(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = {"exports": {".": {"types": "./dist/index.d.ts", "default": "./dist/index.js"}}}
    needs = needs_of(capsys, repo, built)
    assert needs["js-tsc"] == ["js-build"], needs  # tsc reads dist/index.d.ts
    assert needs["js-lint"] == ["js-build"], needs  # so do type-aware and import rules
    assert needs["js-test"] == ["js-build"], needs
    assert needs["js-format"] == [], needs  # prettier reads the files' text alone (CI runs it)
    assert needs["js-build"] == [], needs


def test_checks_of_a_workspace_whose_entry_points_are_its_sources_do_not_wait(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs = needs_of(capsys, repo, {"main": "src/index.ts", "types": "./src/index.ts"})
    assert needs["js-tsc"] == [] and needs["js-lint"] == [], needs
    assert needs["js-test"] == ["js-build"], needs  # tests run what the build makes, anyway


def init_with_ci(
    capsys: pytest.CaptureFixture[str], repo: Path, steps: list[str]
) -> dict[str, Any]:
    """``init --dry-run --json`` on ``repo`` with a workflow running ``steps``."""
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  t:\n    steps:\n" + "".join(f"    - run: {s}\n" for s in steps)
    )
    git(repo, "add", "-A")
    code, out = run_json(capsys, "init", "--repo", str(repo), "--dry-run", "--json")
    assert code == 0, out
    return out


@pytest.mark.parametrize(
    ("lock", "line", "run"),
    [
        ("pnpm-lock.yaml", "pnpm -r --no-bail test", ["pnpm", "-r", "--no-bail", "test"]),
        ("yarn.lock", "yarn workspaces run lint", ["yarn", "workspaces", "run", "lint"]),
        ("package-lock.json", "npm test --workspaces", ["npm", "test", "--workspaces"]),
    ],
    ids=["pnpm", "yarn", "npm"],
)
def test_what_ci_runs_in_every_workspace_is_a_gate_where_the_root_has_no_script(
    capsys: pytest.CaptureFixture[str], repo: Path, lock: str, line: str, run: list[str]
) -> None:
    """Found on a pnpm monorepo (zkochan/packages): its root has no scripts, CI runs ``pnpm
    -r --no-bail test`` and ``pnpm -r run prepublishOnly``: init found nothing to gate.  A
    script CI runs in every workspace is a gate with CI's words; one whose name says no
    check is listed with why; nothing with shell syntax is taken."""
    body = {"name": "root", "private": True, "workspaces": ["packages/*"]}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "pnpm-workspace.yaml").write_text("packages:\n  - packages/*\n")
    (repo / lock).write_text("")
    for name in ("a", "b"):
        (repo / "packages" / name).mkdir(parents=True)
        scripts = {"test": "node --test", "lint": "eslint .", "prepublishOnly": "tsc"}
        (repo / "packages" / name / "package.json").write_text(
            json.dumps({"name": name, "scripts": scripts})
        )
    manager = run[0]
    steps = [line, f"{manager} -r run prepublishOnly", f"{line} && echo done"]
    steps += [f"{manager} workspaces run prepublishOnly", "npm run prepublishOnly --workspaces"]
    out = init_with_ci(capsys, repo, steps)
    gates = {g["id"]: g for g in out["gates"]}
    script = run[-1] if run[-1] != "--workspaces" else "test"
    assert list(gates) == [f"js-{script}"], gates
    assert gates[f"js-{script}"]["run"] == run
    assert "in CI (each workspace's scripts." in gates[f"js-{script}"]["source"]
    left = {s["id"]: s["why"] for s in out["skipped"]}
    assert "its name says no check init knows" in left["js-prepublishOnly"], left


def test_a_step_ci_runs_in_every_workspace_before_its_tests_builds_what_they_import(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """zkochan/packages: CI runs ``pnpm -r run prepublishOnly`` (tsc, each package's
    ``lib/``) and then the tests, which import ``lib/index.js``: with the entry points
    missing from the repository, that step is the build the tests need."""
    body = {"name": "root", "private": True}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "pnpm-workspace.yaml").write_text("packages:\n  - '*'\n")
    (repo / "pnpm-lock.yaml").write_text("")
    (repo / ".gitignore").write_text("lib/\n")
    for name in ("a", "b"):
        (repo / name / "src").mkdir(parents=True)
        (repo / name / "src" / "index.ts").write_text("export const x = 1\n")
        scripts = {"test": "node --test", "prepublishOnly": "tsc"}
        package = {"name": name, "main": "lib/index.js", "scripts": scripts}
        (repo / name / "package.json").write_text(json.dumps(package))
    steps = ["pnpm install", "pnpm -r run prepublishOnly", "pnpm -r --no-bail test"]
    out = init_with_ci(capsys, repo, steps)
    gates = {g["id"]: g for g in out["gates"]}
    assert gates["js-build"]["run"] == ["pnpm", "-r", "run", "prepublishOnly"], gates
    assert gates["js-test"]["needs"] == ["js-build"], gates


@pytest.mark.parametrize(
    ("lock", "line", "run"),
    [
        ("yarn.lock", "yarn workspace lib test", ["yarn", "workspace", "lib", "test"]),
        ("pnpm-lock.yaml", "pnpm --filter lib test", ["pnpm", "--filter", "lib", "test"]),
        ("package-lock.json", "npm run test -w lib", ["npm", "run", "test", "-w", "lib"]),
    ],
    ids=["yarn", "pnpm", "npm"],
)
def test_what_ci_runs_in_one_workspace_is_a_gate_or_listed(
    capsys: pytest.CaptureFixture[str], repo: Path, lock: str, line: str, run: list[str]
) -> None:
    """Found on a real yarn 4 workspace (software-mansion/react-native-gesture-handler): CI
    runs the library's jest suite as ``yarn workspace react-native-gesture-handler test``
    and its ``circular-dependency-check`` so; the root has no ``test`` script, and init
    neither gated the tests nor listed either.  A script CI runs in one workspace is read
    as one it runs in every workspace: a gate with CI's words when its name says a check
    the root's scripts do not run, else listed with why (naming the workspace)."""
    scripts = {"build": "tsc -b", "test:scripts": "jest ./scripts"}
    body = {"name": "root", "private": True, "workspaces": ["packages/*"], "scripts": scripts}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "pnpm-workspace.yaml").write_text("packages:\n  - packages/*\n")
    (repo / lock).write_text("")
    (repo / "packages" / "lib").mkdir(parents=True)
    scripts = {"test": "jest", "circular-dependency-check": "madge --circular src"}
    (repo / "packages" / "lib" / "package.json").write_text(
        json.dumps({"name": "lib", "scripts": scripts})
    )
    steps = [line.replace(" test", f" {s}") for s in ("test", "circular-dependency-check")]
    steps.append(f"{run[0]} run test:scripts")  # another tests gate CI runs: not the same
    out = init_with_ci(capsys, repo, steps)
    gates = {g["id"]: g for g in out["gates"]}
    assert gates["js-test"]["run"] == run, gates
    assert gates["js-test"]["needs"] == ["js-build"], gates
    assert "in CI (" in gates["js-test"]["source"], gates
    assert "js-lib-test" not in gates and "js-test-scripts" in gates, gates
    left = {s["id"]: s["why"] for s in out["skipped"]}
    why = left["js-circular-dependency-check"]
    assert "CI runs it in workspace lib; its name says no check init knows" in why, left


def test_a_script_that_runs_the_gradle_wrapper_needs_the_network(
    capsys: pytest.CaptureFixture[str], repo: Path
) -> None:
    """react-native-gesture-handler's CI runs ``yarn workspace react-native-gesture-handler
    lint:android``: ``./android/gradlew -p android spotlessCheck -q``.  The Gradle wrapper
    downloads Gradle on first use, and Gradle the build's plugins: offline it fails.  init
    marks it, as it marks pre-commit and intersphinx."""
    body = {"name": "root", "private": True, "workspaces": ["packages/*"], "scripts": {}}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "yarn.lock").write_text("")
    (repo / "packages" / "lib").mkdir(parents=True)
    scripts = {"test": "jest", "lint:android": "./android/gradlew -p android spotlessCheck -q"}
    (repo / "packages" / "lib" / "package.json").write_text(
        json.dumps({"name": "lib", "scripts": scripts})
    )
    out = init_with_ci(capsys, repo, ["yarn workspace lib lint:android", "yarn workspace lib test"])
    gates = {g["id"]: g for g in out["gates"]}
    assert "Gradle wrapper" in (gates["js-lint-android"]["network"] or ""), gates
    assert gates["js-test"]["network"] is None, gates
