"""tox's envs, from every place tox 4 reads them: ``tox.ini``, ``[tool.tox]`` in
``pyproject.toml`` (native TOML, or ``legacy_tox_ini``) and ``tox.toml``.

Only the envs of ``env_list`` (what a bare ``tox`` runs) and those CI runs by name are
candidates; every other env, and every env that is a task, is listed as skipped with why.
"""

from __future__ import annotations

import configparser
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagrunner.starter.checks import Check, Skipped
from dagrunner.starter.readers import Project, ini_text
from dagrunner.starter.sessions import gate_id, interpreter, session, task

MAX_ENVS = 256  # a brace product larger than this is cut (and said so)


@dataclass(frozen=True)
class Envs:
    source: str
    env_list: tuple[str, ...]
    commands: Mapping[str, tuple[tuple[str, ...], ...]]  # every env defined, and its commands
    pythons: Mapping[str, str] = field(default_factory=dict)  # an env's own base_python
    # an env's base_python_file: the files (first found wins) whose version line tox uses
    # when neither base_python nor a factor of its name names one
    python_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def expand(envlist: str | Iterable[str]) -> list[str]:
    """``py{38,39}-django{32,40}, lint`` -> py38-django32, py38-django40, py39-django32,
    py39-django40, lint: every brace group, as tox does (a cartesian product; ``{10-12}``
    is a range)."""
    parts = (
        re.split(r"[,\s]+(?![^{]*\})", envlist.strip())
        if isinstance(envlist, str)
        else [str(e) for e in envlist]
    )
    names: list[str] = []
    for part in parts:
        names += _product(part.strip())
        if len(names) > MAX_ENVS:
            return names[:MAX_ENVS]
    return [n for n in dict.fromkeys(names) if n]


def _product(part: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", part)
    if match is None:
        return [part] if part else []
    values: list[str] = []
    for value in match[1].split(","):
        bounds = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
        if bounds and int(bounds[2]) - int(bounds[1]) < MAX_ENVS:
            values += [str(n) for n in range(int(bounds[1]), int(bounds[2]) + 1)]
        else:
            values.append(value.strip())
    found: list[str] = []
    for value in values:
        found += _product(part[: match.start()] + value + part[match.end() :])
        if len(found) > MAX_ENVS:
            break
    return found


def read(project: Project, pyproject: Mapping[str, Any]) -> Envs | None:
    """The project's tox configuration, from the first file tox itself would read."""
    if project.is_file("tox.ini"):
        return _from_ini(project.ini("tox.ini"), "tox.ini")
    table = (pyproject.get("tool") or {}).get("tox") or {}
    if isinstance(table.get("legacy_tox_ini"), str):
        return _from_ini(ini_text(table["legacy_tox_ini"]), "pyproject.toml [tool.tox]")
    if table:
        return _from_toml(table, "pyproject.toml [tool.tox]")
    if project.is_file("tox.toml"):
        return _from_toml(project.toml("tox.toml"), "tox.toml")
    return None


def _from_ini(ini: configparser.ConfigParser, source: str) -> Envs:
    envlist = ini.get("tox", "envlist", fallback="") or ini.get("tox", "env_list", fallback="")
    base = ini.get("testenv", "commands", fallback="")
    texts: dict[str, str] = {}
    pythons = {}
    base_files = ini.get("testenv", "base_python_file", fallback="").split()
    files = {}
    for section in ini.sections():
        if section.startswith("testenv:"):
            text = ini.get(section, "commands", fallback=None)
            python = ini.get(section, "base_python", fallback="") or ini.get(
                section, "basepython", fallback=""
            )
            own = ini.get(section, "base_python_file", fallback="").split() or base_files
            for name in expand(section.removeprefix("testenv:")):
                texts[name] = base if text is None else text
                if python and "{" not in python:
                    pythons[name] = python
                if own and not python:
                    files[name] = tuple(own)
    names = expand(envlist)
    every = {n: _ini_commands(texts.get(n, base), n) for n in [*names, *texts]}
    files |= {n: tuple(base_files) for n in every if base_files and n not in files}
    return Envs(source, tuple(names), every, pythons, files)


FACTOR_LINE = re.compile(r"^\s*([\w.{},!-]+):\s+(?=\S)")


def factors_match(condition: str, env: str) -> bool:
    """Whether a factor-conditional line (``condition: command``) is the env's, as tox
    reads it: a comma between alternatives (any), a dash between factors (all), ``!`` a
    factor the env must not have, braces expanded; the env's factors are its name's parts
    between dashes."""
    have = set(env.split("-"))
    for alternative in expand(condition):
        factors = [f for f in alternative.split("-") if f]
        if factors and all((f[1:] not in have) if f[0] == "!" else (f in have) for f in factors):
            return True
    return False


def _ini_commands(text: str, env: str) -> tuple[tuple[str, ...], ...]:
    """The commands of ``env``: a line conditional on factors is kept only when the env's
    name has them (``coverage: coverage report`` is not ``py311``'s)."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        if condition := FACTOR_LINE.match(line):
            if not factors_match(condition[1], env):
                continue
            line = line[condition.end() :]
        line = line.strip()
        if line and not line.startswith("#"):
            try:
                words = shlex.split(line)
            except ValueError:
                words = line.split()
            found.append(tuple(w for w in words if not w.startswith("{posargs")))
    return tuple(c for c in found if c)


def _from_toml(table: Mapping[str, Any], source: str) -> Envs:
    names = expand(_strings(table.get("env_list")))
    base_table = table.get("env_run_base")
    base = _toml_commands(base_table.get("commands") if isinstance(base_table, dict) else None)
    envs = table.get("env")
    commands, pythons, files = {}, {}, {}
    base_files = _files(
        base_table.get("base_python_file") if isinstance(base_table, dict) else None
    )
    if isinstance(envs, dict):
        for name, env in envs.items():
            given = env.get("commands") if isinstance(env, dict) else None
            commands[str(name)] = base if given is None else _toml_commands(given)
            python = env.get("base_python") if isinstance(env, dict) else None
            python = python[0] if isinstance(python, list) and python else python
            if isinstance(python, str) and "{" not in python:
                pythons[str(name)] = python
            elif own := _files(env.get("base_python_file") if isinstance(env, dict) else None):
                files[str(name)] = own
    every = {n: commands.get(n, base) for n in [*names, *commands]}
    files |= {n: base_files for n in every if base_files and n not in files and n not in pythons}
    return Envs(source, tuple(names), every, pythons, files)


def _files(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(_strings(value))


def version_in(project: Project, names: Iterable[str]) -> str:
    """The Python version ``base_python_file`` names: the first version line of the first
    of ``names`` the project has, as tox reads it; "" when none has one."""
    for name in names:
        text = project.text(name, errors="replace")
        for line in (text or "").splitlines():
            if (line := line.strip()) and not line.startswith("#"):
                return line
    return ""


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _toml_commands(value: Any) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list):
        return ()
    found = []
    for command in value:
        words = _strings(command) if isinstance(command, list) else []
        found.append(tuple(w for w in words if not w.startswith("{posargs")))
    return tuple(c for c in found if c)


def tox(
    project: Project, pyproject: Mapping[str, Any], asked: frozenset[str]
) -> tuple[list[Check], list[Skipped]]:
    """The checks among the envs (``asked``: the envs CI runs by name), and the envs left
    out with why."""
    envs = read(project, pyproject)
    if envs is None:
        return [], []
    found: list[Check] = []
    skipped: list[Skipped] = []
    for name, commands in envs.commands.items():
        where = f"{envs.source} env {name}"
        if why := task(name, commands):
            skipped.append(Skipped(gate_id("tox", name), where, why))
        elif name in envs.env_list or name in asked:
            run = ("tox", "-e", name)
            tools = ("tox --version",)
            python = interpreter(name, envs.pythons.get(name, ""))
            if not python and name in envs.python_files:
                python = interpreter(name, version_in(project, envs.python_files[name]))
            found.append(
                session(
                    prefix="tox",
                    name=name,
                    run=run,
                    source=where,
                    commands=commands,
                    tools=tools,
                    python=python,
                )
            )
        else:
            why = "not in env_list: tox runs it only when asked by name, and CI does not"
            skipped.append(Skipped(gate_id("tox", name), where, why))
    return found, skipped
