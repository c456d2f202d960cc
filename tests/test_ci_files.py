"""The GitHub Action and the pre-commit hook: what they run is a real dagrunner command line,
and the Action never pastes an input into a shell script (inputs travel as environment)."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

from dagrunner.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent


def _steps() -> list[dict[str, Any]]:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps: list[dict[str, Any]] = action["runs"]["steps"]
    return steps


def test_the_action_runs_release_check_with_its_cache_and_uploads_the_report() -> None:
    steps = _steps()
    for step in steps:
        assert "${{" not in step.get("run", ""), f"an input pasted into a script: {step}"
    cache = next(s for s in steps if s.get("uses", "").startswith("actions/cache@"))
    check = next(s for s in steps if s.get("id") == "check")
    assert check["env"]["DAGRUNNER_CACHE_DIR"] == cache["with"]["path"]
    line = next(ln for ln in check["run"].splitlines() if ln.startswith("dagrunner "))
    words = shlex.split(
        line.replace("$MANIFEST", "manifests/release.toml")
        .replace("$report", "/tmp/report")
        .replace("$ARGS", "--only lint --fail-fast")
        .replace('"${landed[@]}"', "--reuse-landed --target rel")
    )
    args = build_parser().parse_args(words[1:])
    assert args.command == "release-check" and args.only == ["lint"] and args.fail_fast
    assert args.reuse_landed and args.target == "rel"
    fetch = next(s for s in steps if "refs/notes/*:refs/notes/*" in s.get("run", ""))
    assert fetch["if"] == "inputs.reuse-landed == 'true'"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and upload["with"]["path"].endswith("dagrunner-report")


def test_the_pre_commit_hook_runs_a_real_command_of_the_installed_package() -> None:
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["language"] == "python" and hook["pass_filenames"] is False
    program, *words = shlex.split(hook["entry"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert program in scripts
    args = build_parser().parse_args([*words, "--only", "lint"])
    assert args.command == "release-check" and args.quiet and args.only == ["lint"]
