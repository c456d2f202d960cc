"""The detected checks as a commented manifest: rendered, validated by the manifest loader
itself, and written only where no file is (``dagrunner init``)."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write
from dagrunner.manifest.load import STARTER_MANIFEST, load_manifest
from dagrunner.starter.checks import WHOLE, Check, Found, Seed
from dagrunner.starter.detect import detect, pip_words
from dagrunner.starter.sessions import has_interpreter, runnable

PIP = "python -m pip install {0}"
INSTALL = {  # a program -> how to get it (else: the project's own docs)
    **{p: PIP.format(p) for p in ("ruff", "mypy", "black", "isort", "flake8", "codespell")},
    **{p: PIP.format(p) for p in ("tox", "nox", "pre-commit", "pyright")},
    "pnpm": "corepack enable pnpm (or npm install -g pnpm)",
    "yarn": "corepack enable yarn (or npm install -g yarn)",
    "bun": "see https://bun.sh",
    "npm": "install Node.js (https://nodejs.org)",
    "node": "install Node.js (https://nodejs.org)",
    "go": "see https://go.dev/dl",
    "cargo": "rustup (https://rustup.rs)",
    "make": "your system's package manager (apt-get install make)",
}


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
                    "memory": c.memory,
                    "junit": c.junit or None,
                    "env": dict(c.env_set),
                    "network": c.network or None,
                    "commented_out": bool(lacks(c, self.missing))
                    and _commented(self.found, self.missing),
                }
                for c in self.found.checks
            ],
            "skipped": [{"id": s.id, "source": s.source, "why": s.why} for s in self.found.skipped],
            "missing_tools": list(self.missing),
            "env_pass": list(self.found.env_pass),
            "seeds": [
                {
                    "path": s.path,
                    "also": list(s.also),
                    "key": list(s.key),
                    "build": s.build,
                    "store": s.store or None,
                    "active": s.ignored and not s.why_off,
                }
                for s in self.found.seeds
            ],
        }


def init(root: Path, out: Path | None = None, *, dry_run: bool = False) -> Started:
    """Detect the checks of the project at ``root`` and write them to ``out`` (default
    ``dagrunner.toml`` at ``root``); ``dry_run`` writes nothing.  Raises ``init-exists``
    rather than overwrite a file, ``init-nothing-found`` when no check is configured, and
    the ``init-*`` errors of ``readers`` for a hostile file."""
    path = out if out is not None else root / STARTER_MANIFEST
    if not dry_run and (path.exists() or path.is_symlink()):
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
            "black, isort, mypy, pyright, pytest, codespell), tox.ini / tox.toml / [tool.tox], "
            "noxfile.py, .pre-commit-config.yaml, package.json scripts, Makefile targets, "
            "go.mod, Cargo.toml",
            hint="write a manifest by hand (docs/manifest.md), or configure a tool first",
        )
    missing = tuple(
        dict.fromkeys(
            [
                *(c.needs_program for c in found.checks if not runnable(c.needs_program)),
                *(c.python for c in found.checks if not has_interpreter(c.python)),
            ]
        )
    )
    text = render(found, missing)
    _validate(text)
    if not dry_run:
        atomic_write(path, text.encode())
    return Started(path, text, not dry_run, found, missing)


def lacks(check: Check, missing: tuple[str, ...]) -> str:
    """What of ``missing`` the gate needs: its program, else its interpreter (a tox env's
    ``python3.14``, which tox cannot run it without), "" when it lacks nothing."""
    for needed in (check.needs_program, check.python):
        if needed and needed in missing:
            return needed
    return ""


def _commented(found: Found, missing: tuple[str, ...]) -> bool:
    """Whether gates of missing programs are commented out: yes, unless none would be left."""
    return any(not lacks(c, missing) for c in found.checks)


def render(found: Found, missing: tuple[str, ...] = ()) -> str:
    """The manifest's text: a header, ``[env]``, ``[defaults]``, one table per check (those
    whose program this machine lacks commented out, unless no gate would be left)."""
    lines = [
        "# Written by `dagrunner init` from the checks this project already configures.",
        "# Edit freely: docs/manifest.md has every key.  Run it: dagrunner release-check",
        "schema = 1",
        'name = "release"',
        "",
        "[env]  # gates see only these variables of yours (and their own HOME and TMPDIR)",
        f"pass = {_array(found.env_pass)}",
        *([f"set = {_table(found.env_set)}"] if found.env_set else []),
        "",
        "[defaults]",
        'timeout = "15m"',
        "",
    ]
    if found.convention:  # a commit-message check would refuse "dagrunner: integrate m/w1"
        lines += [
            f"[integrate]  # commit messages follow Conventional Commits ({found.convention})",
            'message = "chore: integrate {mission}/{worker}"  # or "{subject}": the worker\'s own',
            "",
        ]
    off = {c.id for c in found.checks if lacks(c, missing)} if _commented(found, missing) else set()
    for check in found.checks:
        if check.id not in off:
            check = replace(check, needs=tuple(n for n in check.needs if n not in off))
        lines += _gate(check, lacking=lacks(check, missing), off=check.id in off)
    for seed in found.seeds:
        lines += _seed(seed)
    if found.skipped:
        lines.append("# Also found, and left out:")
        lines += [f"#   {s.id} ({s.source}): {s.why}" for s in found.skipped]
    return "\n".join(lines).rstrip() + "\n"


def _seed(seed: Seed) -> list[str]:
    """A seed: every worktree and integration tree gets its own (integration gates never see
    the checkout's); commented out, with what to do, where it cannot be used as it is."""
    off = "" if seed.ignored and not seed.why_off else "# "
    lines = [f"# {line}" for line in seed.said]
    if not seed.ignored:
        lines.append(
            f"# add {seed.path}/ to .gitignore (a seed's folder must be ignored by a committed "
            "rule), then uncomment"
        )
    if seed.why_off:
        lines.append(f"# {seed.why_off}")
    if seed.note:
        lines.append(f"# {seed.note}")
    table = [
        "[[worktrees.seed]]",
        f"path = {json.dumps(seed.path)}",
        *([f"also = {_array(seed.also)}"] if seed.also else []),
        f"key = {_array(seed.key)}",
        f"build = {_string(seed.build)}",
        *([f"store = {json.dumps(seed.store)}"] if seed.store else []),
        f"tools = {_array(seed.tools)}",
        'timeout = "15m"',
    ]
    return [*lines, *(f"{off}{line}" for line in table), ""]


def _gate(check: Check, *, lacking: str, off: bool) -> list[str]:
    lines = [f"# from {check.source}"]
    program = lacking or check.needs_program
    install = INSTALL.get(program, "see the project's docs")
    if check.install and install.startswith(PIP.format("")):
        install = PIP.format(pip_words(check.install))
    if lacking and lacking == check.python:
        install = f"tox runs this env with it: uv python install {lacking.removeprefix('python')}"
    if off:
        lines.append(f"# `{program}` is not on PATH here: install it ({install}), then uncomment")
    elif lacking:
        lines.append(
            f"# `{program}` is not on PATH here: install it ({install}), or drop this gate"
        )
    if check.note:
        lines.append(f"# {check.note}")
    if check.network:
        lines.append(f"# needs the network: {check.network}")
    if check.inputs == WHOLE and not off:
        lines.append("# it may read any file: any change in the tree runs it again")
    table = [f"[gates.{_key(check.id)}]", *f"run = {_array(check.run)}".splitlines()]
    table.append(f"inputs = {_array(check.inputs)}")
    table.append(f"tools = {_array(check.tools)}")
    table.append(f'estimate = "{check.estimate}"')
    table.append(f'memory = "{check.memory}"')
    if check.network:
        table.append('network = "host"  # it needs the network (above): offline it fails')
    if check.junit:
        table.append(f"junit = {json.dumps(check.junit)}")
    if check.env_set:
        table.append(f"env = {{ set = {_table(check.env_set)} }}")
    if check.needs:
        table.append(f"needs = {_array(check.needs)}")
    return [*lines, *(f"# {line}" if off else line for line in table), ""]


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _array(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(_string(item) for item in items) + "]"


def _string(item: str) -> str:
    """A TOML string: a program of several lines (a hook gate's selector) as a multi-line
    literal string, which reads as the program it is; anything else as a basic string."""
    lines = item.splitlines()
    plain = all(line.isprintable() for line in lines) and "\r" not in item
    if "\n" in item and item.endswith("\n") and "'''" not in item and plain:
        return "'''\n" + item + "'''"
    return json.dumps(item)


def _table(pairs: tuple[tuple[str, str], ...]) -> str:
    return "{ " + ", ".join(f"{_key(k)} = {json.dumps(v)}" for k, v in pairs) + " }"


def _validate(text: str) -> None:
    """What we write must load: the manifest loader is the judge (a failure is our bug, and
    is said so, without the name of a temporary file that is gone)."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-init-") as tmp:
        probe = Path(tmp) / STARTER_MANIFEST
        probe.write_text(text)
        try:
            load_manifest(probe)
        except DagrunnerError as error:
            raise DagrunnerError(
                "init-invalid",
                f"the manifest dagrunner init made does not load ({error.code}: "
                f"{error.message.replace(str(probe), STARTER_MANIFEST.name)})",
                key=error.key,
                hint="a bug in dagrunner init: report it with the project's tox, nox and CI "
                "files, and write the manifest by hand (docs/manifest.md)",
            ) from None
