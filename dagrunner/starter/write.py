"""The detected checks as a commented manifest: rendered, validated by the manifest loader
itself, and written only where no file is (``dagrunner init``)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write
from dagrunner.manifest.load import STARTER_MANIFEST, load_manifest
from dagrunner.starter.detect import WHOLE, Check, Found, detect


@dataclass(frozen=True)
class Started:
    """What ``init`` did: the manifest's text, where it went, what it found and skipped."""

    path: Path
    text: str
    written: bool
    found: Found
    missing: tuple[str, ...] = ()  # commands the gates run that this machine does not have

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "written": self.written,
            "languages": list(self.found.languages),
            "gates": [
                {
                    "id": c.id,
                    "run": list(c.run),
                    "source": c.source,
                    "inputs": list(c.inputs),
                    "tools": list(c.tools),
                    "needs": list(c.needs),
                    "estimate": c.estimate,
                }
                for c in self.found.checks
            ],
            "skipped": [{"id": s.id, "source": s.source, "why": s.why} for s in self.found.skipped],
            "missing_tools": list(self.missing),
        }


def init(root: Path, out: Path | None = None, *, dry_run: bool = False) -> Started:
    """Detect the checks of the project at ``root`` and write them to ``out`` (default
    ``dagrunner.toml`` at ``root``); ``dry_run`` writes nothing.  Raises ``init-exists``
    rather than overwrite a file, ``init-nothing-found`` when no check is configured."""
    path = out if out is not None else root / STARTER_MANIFEST
    if path.exists() or path.is_symlink():
        raise DagrunnerError(
            "init-exists",
            "a file is already there; dagrunner init never overwrites one",
            where=str(path),
            hint="remove or rename it, pass -o OTHER.toml, or --dry-run to see the manifest",
        )
    found = detect(root)
    if not found.checks:
        raise DagrunnerError(
            "init-nothing-found",
            f"no check configured in {root}: looked for pyproject.toml tool tables (ruff, "
            "black, isort, mypy, pyright, pytest, codespell), tox.ini, noxfile.py, "
            ".pre-commit-config.yaml, package.json scripts, Makefile targets, go.mod, Cargo.toml",
            hint="write a manifest by hand (docs/manifest.md), or configure a tool first",
        )
    missing = tuple(dict.fromkeys(c.run[0] for c in found.checks if not _runnable(c.run[0])))
    text = render(found, missing)
    _validate(text)
    if not dry_run:
        atomic_write(path, text.encode())
    return Started(path, text, not dry_run, found, missing)


def _runnable(program: str) -> bool:
    return program == "python" or shutil.which(program) is not None


def render(found: Found, missing: tuple[str, ...] = ()) -> str:
    """The manifest's text: a header, ``[env]``, ``[defaults]``, one table per check."""
    lines = [
        "# Written by `dagrunner init` from the checks this project already configures.",
        "# Edit freely: docs/manifest.md has every key.  Run it: dagrunner release-check",
        "schema = 1",
        'name = "release"',
        "",
        "[env]  # gates see only these variables of yours (and their own HOME and TMPDIR)",
        f"pass = {_array(found.env_pass)}",
        *(
            [f"set = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in found.env_set)} }}"]
            if found.env_set
            else []
        ),
        "",
        "[defaults]",
        'timeout = "15m"',
        "",
    ]
    for check in found.checks:
        lines += _gate(check, check.run[0] in missing)
    if found.skipped:
        lines.append("# Also found, and left out because another gate covers the same check:")
        lines += [f"#   {s.id} ({s.source}): {s.why}" for s in found.skipped]
    return "\n".join(lines).rstrip() + "\n"


def _gate(check: Check, missing: bool) -> list[str]:
    lines = [f"# from {check.source}"]
    if missing:
        lines.append(f"# `{check.run[0]}` is not on PATH here: install it, or drop this gate")
    if check.note:
        lines.append(f"# {check.note}")
    if check.inputs == WHOLE:
        lines.append("# it may read any file: any change in the tree runs it again")
    lines += [f"[gates.{check.id}]", f"run = {_array(check.run)}"]
    lines.append(f"inputs = {_array(check.inputs)}")
    lines.append(f"tools = {_array(check.tools)}")
    lines.append(f'estimate = "{check.estimate}"')
    if check.needs:
        lines.append(f"needs = {_array(check.needs)}")
    return [*lines, ""]


def _array(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _validate(text: str) -> None:
    """What we write must load: the manifest loader is the judge (a failure is our bug)."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-init-") as tmp:
        probe = Path(tmp) / STARTER_MANIFEST
        probe.write_text(text)
        load_manifest(probe)
