"""Python tool tables (``[tool.ruff]``, ``[tool.mypy]``, pytest, ...) as checks, with the
inputs, memory and JUnit file each tool's own configuration implies."""

from __future__ import annotations

import configparser
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dagrunner.starter.checks import WHOLE, Check
from dagrunner.starter.readers import Project

PY_CONFIG = ("pyproject.toml", "setup.cfg", "tox.ini", "ruff.toml", ".ruff.toml", "mypy.ini")
JUNIT_DIRS = ("build", "reports", "out")  # the first one git ignores holds the JUnit files
# ``python -m unittest`` as a CI line, a Makefile recipe or a tox TOML command list
UNITTEST = re.compile(r"""-m["',\s]+unittest\b""")
RUNNER_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "tox.ini", "noxfile.py", "Makefile")


@dataclass(frozen=True)
class Uses:
    """What else the project shows it runs: pre-commit hook ids, CI `run:` lines."""

    hooks: tuple[str, ...] = ()
    ci_lines: tuple[str, ...] = ()

    def runs(self, hook: str, command: str) -> bool:
        return hook in self.hooks or any(command in line for line in self.ci_lines)


def junit_file(project: Project, gate: str) -> tuple[str, str]:
    """Where gate ``gate`` writes its JUnit file, and a note when git would not ignore it
    there: the file is rewritten every run and must never be committed."""
    for folder in JUNIT_DIRS:
        path = f"{folder}/junit/{gate}.xml"
        if project.ignored(path):
            return path, ""
    path = f"{JUNIT_DIRS[0]}/junit/{gate}.xml"
    return path, f"add {JUNIT_DIRS[0]}/junit/ to .gitignore: {path} is rewritten every run"


def python(project: Project, pyproject: Mapping[str, Any], uses: Uses) -> list[Check]:
    """The checks of the tool tables in ``pyproject.toml`` and the tools' own files."""
    tool = pyproject.get("tool") or {}
    setup_cfg = project.ini("setup.cfg")
    configs = tuple(name for name in PY_CONFIG if project.is_file(name))
    stubs = ("**/*.pyi",) if project.files("*.pyi") else ()
    inputs = ("**/*.py", *stubs, *configs)
    found: list[Check] = []

    def where(table: str, *files: str) -> str | None:
        if table in tool:
            return f"pyproject.toml [tool.{table}]"
        return next((name for name in files if project.is_file(name)), None)

    formatter = "black" in tool or "black" in uses.hooks
    if source := where("ruff", "ruff.toml", ".ruff.toml"):
        ruff = tool.get("ruff") or project.toml("ruff.toml") or project.toml(".ruff.toml")
        # `fix = true` would make the gate rewrite the tree it checks, and pass.
        fix = ("--no-fix",) if ruff.get("fix") is True else ()
        run = ("ruff", "check", *fix, ".")  # its cache: RUFF_CACHE_DIR, the gate's own
        found.append(_py("lint", "ruff", run, source, inputs, "2s"))
        if ("format" in ruff or uses.runs("ruff-format", "ruff format")) and not formatter:
            run = ("ruff", "format", "--check", ".")
            found.append(_py("format", "ruff", run, f"{source} format", inputs, "1s"))
    elif (source := where("flake8", ".flake8")) or setup_cfg.has_section("flake8"):
        run = ("flake8",)
        found.append(_py("lint", "flake8", run, source or "setup.cfg [flake8]", inputs, "5s"))
    if "black" in tool:
        run = ("black", "--check", ".")
        found.append(_py("format", "black", run, "pyproject.toml [tool.black]", inputs, "2s"))
    if "isort" in tool:
        run = ("isort", "--check-only", ".")
        found.append(_py("imports", "isort", run, "pyproject.toml [tool.isort]", inputs, "2s"))
    mypy_ini = project.ini("mypy.ini")
    if (source := where("mypy", "mypy.ini")) or setup_cfg.has_section("mypy"):
        files = _mypy_files(tool.get("mypy") or {}, mypy_ini, setup_cfg)
        # no --cache-dir: a gate's MYPY_CACHE_DIR is its own, kept between runs, out of the tree
        run = ("mypy", *(() if files else (_packages(project) or ["."])))
        typed = _sources(files, stubs) + configs if files else inputs
        check = _py("types", "mypy", run, source or "setup.cfg [mypy]", typed, "30s", "2G")
        found.append(check)
    elif source := where("pyright", "pyrightconfig.json"):
        found.append(_py("types", "pyright", ("pyright",), source, inputs, "30s", "2G"))
    if "codespell" in tool:
        source = "pyproject.toml [tool.codespell]"
        found.append(_py("spelling", "codespell", ("codespell",), source, WHOLE))
    if source := _pytest_source(project, tool, setup_cfg):
        path, note = junit_file(project, "tests")
        if "coverage" in tool and not note:
            note = "coverage is configured ([tool.coverage]): add --cov to gate on it"
        run = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={path}")
        # A test may read any file (fixtures, docs): its inputs stay the whole tree.
        tests = _py("tests", "python -m pytest", run, source, WHOLE, "1m", "1G")
        if source.endswith("(test_*.py files)") and _unittest_only(project, uses):
            source = f"{source[:-1]}; the project runs them with python -m unittest)"
            run, path = ("python", "-m", "unittest"), ""  # its failures are read from its output
            note = "coverage is configured ([tool.coverage]): gate on it with coverage run" * (
                "coverage" in tool
            )
            tests = _py("tests", "python", run, source, WHOLE, "1m", "1G")
        found.append(replace(tests, note=note, junit=path))
    return found


def _py(
    name: str,
    tool: str,
    run: tuple[str, ...],
    source: str,
    inputs: tuple[str, ...],
    estimate: str = "5s",
    memory: str = "256M",
) -> Check:
    return Check(
        id=name,
        concern=f"python:{name}",
        run=run,
        source=source,
        inputs=inputs,
        tools=(f"{tool} --version",),
        estimate=estimate,
        memory=memory,
    )


def _mypy_files(table: Mapping[str, Any], *inis: configparser.ConfigParser) -> tuple[str, ...]:
    """mypy's own ``files`` (a list in ``[tool.mypy]``, comma-separated in an ini file)."""
    files: Any = table.get("files")
    for ini in inis:
        if not files and ini.has_option("mypy", "files"):
            files = ini.get("mypy", "files")
    if isinstance(files, str):
        files = files.split(",")
    if not isinstance(files, list):
        return ()
    return tuple(f.strip().rstrip("/") for f in files if isinstance(f, str) and f.strip())


def _sources(files: tuple[str, ...], stubs: tuple[str, ...]) -> tuple[str, ...]:
    found: list[str] = []
    for entry in files:
        if entry in (".", "./"):
            found += ["**/*.py", *stubs]
        elif entry.endswith((".py", ".pyi")):
            found.append(entry.removeprefix("./"))
        elif "*" not in entry and ".." not in entry and not entry.startswith("/"):
            found += [f"{entry.removeprefix('./')}/**/*.py", *(f"{entry}/{s}" for s in stubs)]
        else:
            return ("**/*.py", *stubs)  # a pattern mypy reads its own way: every source
    return tuple(dict.fromkeys(found))


def _pytest_source(
    project: Project, tool: Mapping[str, Any], setup_cfg: configparser.ConfigParser
) -> str | None:
    if isinstance(table := tool.get("pytest"), Mapping):  # pytest 9 reads [tool.pytest] too
        return f"pyproject.toml [tool.pytest{'.ini_options' if 'ini_options' in table else ''}]"
    if project.is_file("pytest.ini"):
        return "pytest.ini"
    if setup_cfg.has_section("tool:pytest"):
        return "setup.cfg [tool:pytest]"
    if project.ini("tox.ini").has_section("pytest"):
        return "tox.ini [pytest]"
    for folder in ("tests", "test"):
        if any(p.startswith(f"{folder}/") for p in project.files("test_*.py")):
            return f"{folder}/ (test_*.py files)"
    return None


def _unittest_only(project: Project, uses: Uses) -> bool:
    """Whether the project runs its tests with ``python -m unittest`` (CI, tox, nox, make)
    and names pytest nowhere: a pytest gate would need what the project never installs (a
    venv seed of the project has no pytest), and its tests may rely on unittest alone."""
    names = [*RUNNER_FILES, *project.files("requirements*.txt", "*/requirements*.txt")]
    said = "\n".join([*uses.ci_lines, *(project.text(n, errors="replace") or "" for n in names)])
    return "pytest" not in said and UNITTEST.search(said) is not None


def _packages(project: Project) -> list[str]:
    """The project's top-level packages (``src/`` layout included), for mypy."""
    if (project.root / "src").is_dir():
        return ["src"]
    skip = {"tests", "test", "docs", "build", "dist", "scripts", "examples"}
    return sorted(
        {
            p.split("/")[0]
            for p in project.files("__init__.py")
            if p.count("/") == 1 and p.split("/")[0] not in skip
        }
    )
