"""init on a pnpm workspace whose CI and install say more than its scripts (issue 44).

Found on preconstruct/preconstruct (round 10): its CI type-checks with ``pnpm exec tsc``,
which init neither gated nor listed; its snapshot workflow runs ``pnpm changeset version
--snapshot``, which init took for the script ``changeset`` and gated as ``pnpm run
changeset`` (the interactive ``changeset add``, waiting for a terminal); and its root
``postinstall`` installs a second folder (``pnpm --dir build install --ignore-workspace``),
whose ``node_modules`` the build script runs, but the seed carried only the workspaces'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import git, run_json

WORKFLOW = """jobs:
  t:
    steps:
      - run: pnpm install --frozen-lockfile
      - run: pnpm exec cross-env CI=true jest --coverage
      - run: pnpm exec tsc
      - run: pnpm lint
  snapshot:
    steps:
      - run: pnpm changeset version --snapshot ${{ inputs.tag }}
      - run: pnpm changeset publish --tag next
"""
SCRIPTS = {
    "build": "pnpm preconstruct build",
    "test": "jest",
    "lint": "eslint .",
    "changeset": "changeset",
    "preconstruct": "node ./build/node_modules/@preconstruct/cli/bin.js",
    "postinstall": "manypkg check && pnpm --dir build install --ignore-workspace && pnpm x",
}


def workspace(
    capsys: pytest.CaptureFixture[str], repo: Path, scripts: dict[str, str]
) -> dict[str, Any]:
    """A pnpm workspace of one package with ``scripts`` at its root, a ``build/`` folder
    of its own lockfile, tsc installed; what ``init --dry-run`` proposes."""
    body = {"name": "root", "private": True, "scripts": scripts}
    (repo / "package.json").write_text(json.dumps(body))
    (repo / "pnpm-lock.yaml").write_text("lockfileVersion: '9.0'\n")
    (repo / "pnpm-workspace.yaml").write_text("packages:\n  - packages/*\n")
    (repo / ".gitignore").write_text("node_modules\n")
    (repo / "packages" / "a").mkdir(parents=True)
    (repo / "packages" / "a" / "package.json").write_text('{"name": "a"}')
    (repo / "build").mkdir()
    (repo / "build" / "package.json").write_text('{"name": "b", "private": true}')
    (repo / "build" / "pnpm-lock.yaml").write_text("lockfileVersion: '9.0'\n")
    (repo / "node_modules" / ".bin").mkdir(parents=True)
    for program in ("tsc", "changeset", "jest", "eslint"):
        (repo / "node_modules" / ".bin" / program).write_text("#!/bin/sh\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(WORKFLOW)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a pnpm workspace")
    code, said = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0, said
    return said


def test_a_program_ci_runs_through_pnpm_exec_gets_its_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gates = {g["id"]: g for g in workspace(capsys, repo, SCRIPTS)["gates"]}
    assert gates["js-tsc"]["run"] == ["pnpm", "exec", "tsc"], gates
    assert gates["js-tsc"]["needs"] == [], gates  # the package's entry points are sources
    assert "js-exec" not in gates, gates


def test_a_script_ci_runs_with_a_subcommand_is_no_gate_of_the_script_alone(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = workspace(capsys, repo, SCRIPTS)
    gates = {g["id"] for g in said["gates"]}
    assert "js-changeset" not in gates, gates  # `pnpm run changeset` is `changeset add`
    assert {"js-build", "js-test", "js-lint", "js-tsc"} <= gates, gates


def test_a_folder_the_root_install_installs_too_is_in_the_seed(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (seed,) = workspace(capsys, repo, SCRIPTS)["seeds"]
    assert seed["also"] == ["packages/*/node_modules", "build/node_modules"], seed
    assert {"build/package.json", "build/pnpm-lock.yaml"} <= set(seed["key"]), seed
    others = {"postinstall": "cd build && pnpm install", "prepare": "npm --prefix ../x ci"}
    (seed,) = workspace_again(capsys, repo, others)["seeds"]
    assert seed["also"] == ["packages/*/node_modules", "build/node_modules"], seed


def workspace_again(
    capsys: pytest.CaptureFixture[str], repo: Path, scripts: dict[str, str]
) -> dict[str, Any]:
    """The same workspace with other root scripts, committed; ``init --dry-run``."""
    body = {"name": "root", "private": True, "scripts": {"test": "jest", **scripts}}
    (repo / "package.json").write_text(json.dumps(body))
    git(repo, "commit", "-qam", "other scripts")
    code, said = run_json(capsys, "init", "--repo", str(repo), "--dry-run")
    assert code == 0, said
    return said
