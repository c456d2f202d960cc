"""The checks a project already configures, read from its files.

Nothing here runs or imports the project: ``pyproject.toml`` is read with ``tomllib``,
``tox.ini`` with ``configparser``, ``noxfile.py`` with ``ast`` (its decorated sessions),
``package.json`` as JSON, a ``Makefile`` by its target lines.  Each check has a *concern*
(lint, format, types, tests, ...) per language; the first source that covers a concern
wins, and a later one is listed as skipped with the reason (a ``Makefile`` ``test`` that
wraps pytest is not run a second time).
"""

from __future__ import annotations

import ast
import configparser
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dagrunner.git.command import git

WHOLE = ("**",)
PY_INPUTS = ("**/*.py", "**/*.pyi")
PY_CONFIG = ("pyproject.toml", "setup.cfg", "tox.ini", "ruff.toml", ".ruff.toml", "mypy.ini")
JS_INPUTS = ("**/*.js", "**/*.jsx", "**/*.ts", "**/*.tsx", "**/*.mjs", "**/*.cjs", "**/*.json")
CHECK_SCRIPTS = {  # package.json script / Makefile target -> its concern
    "lint": "lint",
    "eslint": "lint",
    "typecheck": "types",
    "type-check": "types",
    "types": "types",
    "tsc": "types",
    "test": "tests",
    "tests": "tests",
    "check": "check",
    "format:check": "format",
    "fmt:check": "format",
    "prettier:check": "format",
    "format-check": "format",
    "fmt-check": "format",
    "vet": "vet",
    "build": "build",
}
LOCKFILES = (
    ("pnpm-lock.yaml", "pnpm"),
    ("yarn.lock", "yarn"),
    ("bun.lockb", "bun"),
    ("bun.lock", "bun"),
    ("package-lock.json", "npm"),
)


@dataclass(frozen=True)
class Check:
    """One gate-to-be: what it runs, where it came from, what it reads."""

    id: str
    concern: str  # "python:lint", "js:tests", ... (one check per concern)
    run: tuple[str, ...]
    source: str  # where it was found, for the manifest's comment
    inputs: tuple[str, ...]  # WHOLE: any file it may read (any change runs it again)
    tools: tuple[str, ...]
    estimate: str
    needs: tuple[str, ...] = ()
    note: str = ""  # a line of advice in the comment


@dataclass(frozen=True)
class Skipped:
    id: str
    source: str
    why: str


@dataclass(frozen=True)
class Found:
    checks: tuple[Check, ...]
    skipped: tuple[Skipped, ...]
    languages: tuple[str, ...]
    env_pass: tuple[str, ...] = field(default=("PATH",))
    env_set: tuple[tuple[str, str], ...] = ()


def detect(root: Path) -> Found:
    """Every check the project at ``root`` configures, in a stable order."""
    pyproject = _toml(root / "pyproject.toml")
    candidates: list[Check] = [
        *_python(root, pyproject),
        *_tox(root, pyproject),
        *_nox(root),
        *_pre_commit(root),
        *_package_json(root),
        *_makefile(root),
        *_go(root),
        *_rust(root),
    ]
    checks: list[Check] = []
    skipped: list[Skipped] = []
    covered: dict[str, Check] = {}
    for check in candidates:
        language, _, concern = check.concern.partition(":")
        same = covered.get(check.concern) or (
            next((c for k, c in covered.items() if k.endswith(f":{concern}")), None)
            if language == "make"
            else None
        )
        if same is not None:
            skipped.append(Skipped(check.id, check.source, f"{concern} is run by {same.id!r}"))
            continue
        covered[check.concern] = check
        checks.append(check)
    ids = {c.id for c in checks}
    checks = [replace(c, needs=tuple(n for n in c.needs if n in ids)) for c in checks]
    languages = tuple(sorted({c.concern.partition(":")[0] for c in checks}))
    # Bytecode written beside the sources would change the tree the next gate is keyed by.
    env_set = (("PYTHONDONTWRITEBYTECODE", "1"),) if "python" in languages else ()
    return Found(tuple(checks), tuple(skipped), languages, _env_pass(languages), env_set)


def _env_pass(languages: Iterable[str]) -> tuple[str, ...]:
    names = ["PATH"]
    extra = {
        "python": ["VIRTUAL_ENV"],
        "go": ["GOPATH", "GOMODCACHE", "GOCACHE", "GOFLAGS"],
        "rust": ["CARGO_HOME", "RUSTUP_HOME"],
    }
    for language in languages:
        names += extra.get(language, [])
    return tuple(names)


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, configparser.Error):
        return configparser.ConfigParser(interpolation=None)
    return parser


def _ignored(root: Path, name: str) -> bool:
    """Whether git ignores ``name`` at the root: a tool's cache written there then leaves
    the tree (and the cache keys of later gates) alone; else the tool is told not to."""
    return git(["check-ignore", "-q", name], cwd=root, check=False).returncode == 0


def _configs(root: Path) -> tuple[str, ...]:
    return tuple(name for name in PY_CONFIG if (root / name).is_file())


# -- Python ---------------------------------------------------------------------------------


def _python(root: Path, pyproject: Mapping[str, Any]) -> list[Check]:
    tool = pyproject.get("tool") or {}
    setup_cfg = _ini(root / "setup.cfg")
    configs = _configs(root)
    inputs = (*PY_INPUTS, *configs)
    found: list[Check] = []
    run: tuple[str, ...]

    def where(table: str, *files: str) -> str | None:
        if table in tool:
            return f"pyproject.toml [tool.{table}]"
        return next((name for name in files if (root / name).is_file()), None)

    if source := where("ruff", "ruff.toml", ".ruff.toml"):
        quiet = () if _ignored(root, ".ruff_cache") else ("--no-cache",)
        run = ("ruff", "check", *quiet, ".")
        found.append(_py("lint", "ruff", run, source, inputs, "2s"))
        ruff = tool.get("ruff") or _toml(root / "ruff.toml") or _toml(root / ".ruff.toml")
        if "format" in ruff and "black" not in tool:
            run = ("ruff", "format", "--check", *quiet, ".")
            found.append(_py("format", "ruff", run, f"{source} format", inputs, "1s"))
    elif (source := where("flake8", ".flake8")) or setup_cfg.has_section("flake8"):
        found.append(_py("lint", "flake8", ("flake8",), source or "setup.cfg [flake8]", inputs))
    if "black" in tool:
        run = ("black", "--check", ".")
        found.append(_py("format", "black", run, "pyproject.toml [tool.black]", inputs, "2s"))
    if "isort" in tool:
        run = ("isort", "--check-only", ".")
        found.append(_py("imports", "isort", run, "pyproject.toml [tool.isort]", inputs, "2s"))
    if (source := where("mypy", "mypy.ini")) or setup_cfg.has_section("mypy"):
        mypy = tool.get("mypy") or {}
        run = ("mypy",) if _ignored(root, ".mypy_cache") else ("mypy", "--cache-dir=/dev/null")
        run += () if mypy.get("files") else tuple(_packages(root) or ["."])
        check = _py("types", "mypy", run, source or "setup.cfg [mypy]", inputs, "30s")
        found.append(check)
    elif source := where("pyright", "pyrightconfig.json"):
        found.append(_py("types", "pyright", ("pyright",), source, inputs, "30s"))
    if "codespell" in tool:
        found.append(
            _py("spelling", "codespell", ("codespell",), "pyproject.toml [tool.codespell]", WHOLE)
        )
    if source := _pytest_source(root, tool, setup_cfg):
        note = (
            "coverage is configured ([tool.coverage]): add --cov to gate on it"
            if "coverage" in tool
            else ""
        )
        run = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider")
        tests = _py("tests", "python -m pytest", run, source, WHOLE, "1m")
        found.append(replace(tests, note=note))
    return found


def _py(
    name: str,
    tool: str,
    run: tuple[str, ...],
    source: str,
    inputs: tuple[str, ...],
    estimate: str = "5s",
) -> Check:
    fingerprint = f"{tool} --version"
    return Check(name, f"python:{name}", run, source, inputs, (fingerprint,), estimate)


def _pytest_source(
    root: Path, tool: Mapping[str, Any], setup_cfg: configparser.ConfigParser
) -> str | None:
    if "pytest" in tool:
        return "pyproject.toml [tool.pytest.ini_options]"
    if (root / "pytest.ini").is_file():
        return "pytest.ini"
    if setup_cfg.has_section("tool:pytest"):
        return "setup.cfg [tool:pytest]"
    if _ini(root / "tox.ini").has_section("pytest"):
        return "tox.ini [pytest]"
    for folder in ("tests", "test"):
        if any((root / folder).glob("**/test_*.py")):
            return f"{folder}/ (test_*.py files)"
    return None


def _packages(root: Path) -> list[str]:
    """The project's top-level packages (``src/`` layout included), for mypy."""
    if (root / "src").is_dir():
        return ["src"]
    skip = {"tests", "test", "docs", "build", "dist", "scripts", "examples"}
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() and p.name not in skip
    )


# -- tox, nox, pre-commit -------------------------------------------------------------------

_CONCERN_WORDS: tuple[tuple[str, str], ...] = (
    *(("lint", "lint"), ("flake8", "lint"), ("ruff", "lint"), ("type", "types")),
    *(("typing", "types"), ("mypy", "types"), ("doc", "docs"), ("format", "format")),
    *(("fmt", "format"),),
)


def _concern(name: str) -> str:
    if re.fullmatch(r"py(py)?3?\d*(-.*)?|tests?|unit", name):
        return "tests"
    return next((c for word, c in _CONCERN_WORDS if word in name), name)


def _expand(envlist: str) -> list[str]:
    """``py{310,311}-x, lint`` -> py310-x, py311-x, lint (one level of braces)."""
    names: list[str] = []
    for part in re.split(r"[,\s]+(?![^{]*\})", envlist.strip()):
        match = re.search(r"\{([^}]*)\}", part)
        if match:
            names += [part[: match.start()] + v + part[match.end() :] for v in match[1].split(",")]
        elif part:
            names.append(part)
    return names


def _tox(root: Path, pyproject: Mapping[str, Any]) -> list[Check]:
    ini = _ini(root / "tox.ini")
    envlist = ini.get("tox", "envlist", fallback="") or ini.get("tox", "env_list", fallback="")
    source = "tox.ini envlist"
    if not envlist:
        legacy = ((pyproject.get("tool") or {}).get("tox") or {}).get("legacy_tox_ini", "")
        if legacy:
            parsed = configparser.ConfigParser(interpolation=None)
            parsed.read_string(legacy)
            envlist, source = parsed.get("tox", "envlist", fallback=""), "[tool.tox] envlist"
    found = []
    for env in dict.fromkeys(_expand(envlist)):
        found.append(
            Check(
                f"tox-{env}",
                f"python:{_concern(env)}",
                ("tox", "-e", env),
                source,
                WHOLE,
                ("tox --version",),
                "1m",
            )
        )
    return found


def _nox(root: Path) -> list[Check]:
    try:
        tree = ast.parse((root / "noxfile.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = ast.unparse(target)
            if name in ("nox.session", "session"):
                found.append(
                    Check(
                        f"nox-{node.name}",
                        f"python:{_concern(node.name)}",
                        ("nox", "-s", node.name),
                        "noxfile.py",
                        WHOLE,
                        ("nox --version",),
                        "1m",
                    )
                )
    return found


def _pre_commit(root: Path) -> list[Check]:
    path = root / ".pre-commit-config.yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    hooks = list(dict.fromkeys(re.findall(r"^\s*-?\s*id:\s*([\w.-]+)", text, re.MULTILINE)))
    note = "pre-commit installs its hook environments on first use (that needs the network)"
    return [
        Check(
            "pre-commit",
            "any:hooks",
            ("pre-commit", "run", "--all-files", "--show-diff-on-failure"),
            f".pre-commit-config.yaml (hooks: {', '.join(hooks[:12]) or 'none listed'})",
            WHOLE,
            ("pre-commit --version",),
            "30s",
            note=note,
        )
    ]


# -- JavaScript, make, Go, Rust -------------------------------------------------------------


def _package_json(root: Path) -> list[Check]:
    try:
        scripts = json.loads((root / "package.json").read_text(encoding="utf-8")).get("scripts")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return []
    if not isinstance(scripts, dict):
        return []
    manager = next((pm for lock, pm in LOCKFILES if (root / lock).is_file()), "npm")
    found = []
    for script in scripts:
        concern = CHECK_SCRIPTS.get(str(script))
        if concern is None:
            continue
        found.append(
            Check(
                f"js-{script.replace(':', '-')}",
                f"js:{concern}",
                (manager, "run", script),
                f"package.json scripts.{script} ({manager}: {_lock_for(manager)})",
                (*JS_INPUTS, "package.json") if concern in ("lint", "format") else WHOLE,
                ("node --version", f"{manager} --version"),
                "30s",
                needs=("js-build",) if concern == "tests" else (),
            )
        )
    return found


def _lock_for(manager: str) -> str:
    return next((lock for lock, pm in LOCKFILES if pm == manager), "no lockfile")


def _makefile(root: Path) -> list[Check]:
    path = next((root / n for n in ("Makefile", "makefile", "GNUmakefile") if (root / n).is_file()), None)  # fmt: skip
    if path is None:
        return []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    targets = dict.fromkeys(re.findall(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", text, re.MULTILINE))
    found = []
    for target in targets:
        concern = CHECK_SCRIPTS.get(target)
        if concern is None:
            continue
        found.append(
            Check(
                f"make-{target}",
                f"make:{concern}",
                ("make", target),
                f"{path.name} target {target}",
                WHOLE,
                ("make --version",),
                "30s",
                needs=("make-build",) if concern == "tests" else (),
            )
        )
    return found


def _go(root: Path) -> list[Check]:
    if not (root / "go.mod").is_file():
        return []
    inputs = ("**/*.go", "go.mod", "go.sum")
    tools = ("go version",)
    return [
        Check("go-vet", "go:vet", ("go", "vet", "./..."), "go.mod", inputs, tools, "20s"),
        Check("go-test", "go:tests", ("go", "test", "./..."), "go.mod", WHOLE, tools, "1m"),
    ]


def _rust(root: Path) -> list[Check]:
    if not (root / "Cargo.toml").is_file():
        return []
    tools = ("cargo --version", "rustc --version")
    clippy = ("cargo", "clippy", "--all-targets", "--", "-D", "warnings")
    inputs = ("**/*.rs", "**/Cargo.toml", "Cargo.lock")
    return [
        Check("clippy", "rust:lint", clippy, "Cargo.toml", inputs, tools, "1m"),
        Check("cargo-test", "rust:tests", ("cargo", "test"), "Cargo.toml", WHOLE, tools, "1m"),
    ]
