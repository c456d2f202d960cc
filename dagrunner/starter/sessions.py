"""What a runner's session (a tox env, a nox session, a script, a make target) is: which
concern it checks, whether it is a check at all, and whether it does more than a tool gate.

A session that tags, uploads, commits, clones, downloads or serves is a task, not a check:
a release gate must never run it.  One that runs several commands (pre-commit hooks, a
build, ``twine check``) or gates on coverage is the project's own check and is preferred
over a gate synthesized from a tool table.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import zlib
from collections.abc import Iterable
from pathlib import Path

from dagrunner.names import is_safe_id
from dagrunner.starter.checks import Check

# Words of a session name that say it is a task (a release step, a server, an update).
TASK_WORDS = frozenset(
    {"release", "publish", "upload", "deploy", "bump", "tag", "tags", "update", "upgrade"}
    | {"download", "serve", "server", "live", "livehtml", "autobuild", "watch", "clean"}
    | {"dev", "devenv", "develop", "prepare", "changelog", "version", "lock", "vendor"}
)
# What a task's commands do; the first match names why it is left out.
TASK_COMMANDS: tuple[tuple[str, str], ...] = (
    (r"\bgit\s+(tag|commit|push|clone|fetch|pull|checkout|reset)\b", "runs git {0}"),
    (r"\btwine\s+upload\b", "uploads with twine"),
    (r"\b(npm|pnpm|yarn|flit|poetry|hatch|uv|cargo)\s+publish\b", "publishes a package"),
    (r"\bgh\s+release\b", "makes a GitHub release"),
    (r"\b(curl|wget)\b", "downloads ({0})"),
    (r"\bpip\s+download\b", "downloads packages"),
    (r"\b(sphinx-autobuild|mkdocs\s+serve|http\.server)\b", "serves ({0}) and never ends"),
    (r"\bpre-commit\s+autoupdate\b", "updates the hooks"),
    (r"\b(bump2version|bumpversion|bump-my-version|towncrier\s+build)\b", "changes files ({0})"),
)
COVERAGE = re.compile(r"--cov\b|--cov=|\bcoverage\b|--fail-under|fail_under")
# The first program of a command -> the concern it checks.
PROGRAM_CONCERNS: tuple[tuple[str, str], ...] = (
    (r"(py\.)?test|pytest|-m pytest|unittest|coverage run", "tests"),
    (r"mypy|pyright|pytype|basedpyright|tsc", "types"),
    (r"ruff format|black|prettier", "format"),
    (r"ruff|flake8|pylint|pre-commit|eslint", "lint"),
    (r"sphinx-build|mkdocs", "docs"),
)
NAME_CONCERNS: tuple[tuple[str, str], ...] = (
    *(("lint", "lint"), ("flake8", "lint"), ("ruff", "lint"), ("type", "types")),
    *(("typing", "types"), ("mypy", "types"), ("doc", "docs"), ("format", "format")),
    *(("fmt", "format"),),
)


def concern(name: str, commands: Iterable[tuple[str, ...]] = ()) -> str:
    """The concern of a session: from its name, else from the first program it runs."""
    if re.fullmatch(r"py(py)?3?\.?\d*(-.*)?|tests?|unit(-?tests?)?", name):
        return "tests"
    if by_name := next((c for word, c in NAME_CONCERNS if word in name), None):
        return by_name
    for command in commands:
        line = " ".join(command)
        for pattern, found in PROGRAM_CONCERNS:
            if re.match(rf"(python3?\s+-m\s+)?({pattern})\b", line):
                return found
    return name


def task(name: str, commands: Iterable[tuple[str, ...]]) -> str:
    """Why a session is a task rather than a check, or "" when it looks like a check."""
    for command in commands:
        line = " ".join(command)
        for pattern, why in TASK_COMMANDS:
            if match := re.search(pattern, line):
                return f"it {why.format(match[1] if match.groups() else '')}: a task, not a check"
    words = set(re.split(r"[-_:.]", name.lower()))
    if word := next(iter(sorted(words & TASK_WORDS)), None):
        return f"its name says it is a task ({word!r}), not a check"
    return ""


def does_more(commands: tuple[tuple[str, ...], ...]) -> str:
    """What makes a session more than a single tool gate ("" when it is not)."""
    if any(COVERAGE.search(" ".join(c)) for c in commands):
        return "it gates on coverage"
    if len(commands) > 1:
        shown = ", ".join(" ".join(c[:3]) for c in commands[:4])
        return f"it runs {len(commands)} commands ({shown})"
    return ""


# Words of a session name that say it is a variant of the tests (pinned minimum versions,
# development versions of its dependencies), not the project's own test run.
VARIANT_WORDS = frozenset(
    {"min", "minimum", "mindeps", "lowest", "oldest", "dev", "devdeps", "pre", "prerelease"}
    | {"nightly", "latest", "upstream", "main", "master", "head", "future", "nogil", "ft"}
)


def variant(name: str) -> str:
    """The word that makes a session a variant (``tests-min``: "min"), or ""."""
    words = set(re.split(r"[-_:.]", name.lower())) - {""}
    return next(iter(sorted(words & VARIANT_WORDS)), "")


def interpreter(name: str, base_python: str = "") -> str:
    """The interpreter a tox env needs: its ``base_python``, else its name's factor
    (``py3.14``, ``py314``, ``3.14`` -> ``python3.14``; ``py314t`` -> ``python3.14t``;
    ``pypy3`` -> ``pypy3``); "" for any."""
    if base_python:
        text = base_python.strip().split()[0]
        found = re.fullmatch(r"(?:python|py)?3\.?(\d+)(?:\.\d+)*(t?)", text)  # 3.14.0 too
        return f"python3.{found[1]}{found[2]}" if found else text
    for factor in re.split(r"[-_]", name.lower()):
        if found := re.fullmatch(r"py(?:thon)?3\.?(\d+)(t?)", factor):  # py314t: free-threaded
            return f"python3.{found[1]}{found[2]}"
        if found := re.fullmatch(r"3\.(\d+)(t?)", factor):  # tox 4 reads a bare 3.13 so too
            return f"python3.{found[1]}{found[2]}"
        if re.fullmatch(r"pypy3(\.?\d+)?", factor):
            return factor if "." in factor or factor == "pypy3" else f"pypy3.{factor[5:]}"
    return ""


def has_interpreter(python: str) -> bool:
    """Whether ``python`` ("" is any) is the one running, or on PATH (a pyenv shim only
    for a version pyenv selects: a shim of another version runs nothing, and uv skips it)."""
    this = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not python or python == this:
        return True
    found = shutil.which(python)
    if found is None:
        return False
    shims = Path(found).parent
    if shims.name != "shims" or not (shims.parent / "versions").is_dir():
        return True
    for version in _pyenv_selected(shims.parent):
        if version == "system":
            rest = os.pathsep.join(
                p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != shims
            )
            if shutil.which(python, path=rest):
                return True
        elif (
            "/" not in version and (shims.parent / "versions" / version / "bin" / python).is_file()
        ):
            return True
    return False


def _pyenv_selected(root: Path) -> list[str]:
    """The versions pyenv selects, as it looks: ``PYENV_VERSION``, the nearest
    ``.python-version`` up from here, ``$PYENV_ROOT/version``; else "system"."""
    if given := os.environ.get("PYENV_VERSION", ""):
        return given.split(":")
    here = Path.cwd()
    for place in (folder / ".python-version" for folder in (here, *here.parents)):
        if place.is_file():
            return _versions(place) or ["system"]
    return _versions(root / "version") or ["system"]


def _versions(path: Path) -> list[str]:
    """The versions a pyenv version file names (its first 4 KiB: a real one is a line)."""
    if not path.is_file():  # never a FIFO's open, which would wait
        return []
    try:
        with path.open("rb") as file:
            words = file.read(4096).decode(errors="replace").split()
    except OSError:
        return []
    return [word for word in words if not word.startswith("#")]


def gate_id(prefix: str, name: str) -> str:
    """A safe gate id for a session name (characters a gate id may not hold become -)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "session"
    candidate = f"{prefix}-{cleaned}".replace("..", ".")
    return candidate if is_safe_id(candidate) else f"{prefix}-{zlib.crc32(name.encode()):08x}"


def runnable(program: str) -> bool:
    """Whether this machine has ``program`` on its PATH (``python`` is the one running)."""
    return program == "python" or shutil.which(program) is not None


def session(
    *,
    prefix: str,
    name: str,
    run: tuple[str, ...],
    source: str,
    commands: tuple[tuple[str, ...], ...],
    tools: tuple[str, ...],
    estimate: str = "2m",
    memory: str = "1G",
    python: str = "",
) -> Check:
    """A tox env's or nox session's check (it makes its own virtualenv: minutes, 1G)."""
    return Check(
        id=gate_id(prefix, name),
        concern=f"python:{concern(name, commands)}",
        run=run,
        source=source,
        tools=tools,
        estimate=estimate,
        memory=memory,
        commands=commands,
        runner=True,
        python=python,
    )


TYPE_CHECKERS = frozenset({"mypy", "pyright", "basedpyright", "ty", "pyrefly", "pytype"})


def type_checks(commands: tuple[tuple[str, ...], ...]) -> frozenset[str] | None:
    """What the commands type-check, one "checker targets" each (``mypy tests/typing``,
    ``ty check``): the checker and the words after it that are not options; None when no
    command runs a checker by name (a shell script, a hook runner: unknown)."""
    found = set()
    for words in commands:
        names = [w.rsplit("/", 1)[-1] for w in words]
        at = next((n for n, w in enumerate(names) if w in TYPE_CHECKERS), None)
        if at is None:
            continue
        rest = [w for w in words[at + 1 :] if not w.startswith("-")]
        found.add(" ".join([names[at], *rest]))
    return frozenset(found) if found else None


def type_checks_hold(wide: frozenset[str], narrow: frozenset[str]) -> str | None:
    """The targets of ``wide`` that hold everything ``narrow`` type-checks (``mypy .``
    holds ``mypy src``: the same checker, each target of ``narrow`` in one of its), as
    words ("."; "" when each check is one of ``wide``'s); None when it does not, or when a
    check of ``narrow`` names no target it lacks (the checker's config then says what)."""
    split = [(c.split()[0], tuple(_parts(t) for t in c.split()[1:])) for c in wide]
    used: set[str] = set()
    for check in narrow - wide:
        checker, *targets = check.split()
        if not targets:
            return None
        for target in map(_parts, targets):
            holder = next(
                (w for c, ws in split if c == checker for w in ws if target[: len(w)] == w), None
            )
            if holder is None:
                return None
            used.add("/".join(holder) or ".")
    return ", ".join(sorted(used))


def _parts(target: str) -> tuple[str, ...]:
    """A target path's parts, "." and "./" dropped (``.`` is the whole tree: ``()``)."""
    return tuple(p for p in target.split("/") if p not in ("", "."))


def type_check_holder(
    chosen: Check, group: list[Check], winners: set[int], known: frozenset[str]
) -> tuple[Check, str] | None:
    """A gate of the group, run by the project's runner here, whose type checks hold all of
    ``chosen``'s (``type_checks_hold``), and the targets that do; None."""
    for check in group:
        if check is chosen or id(check) not in winners or not check.runner:
            continue
        if not (runnable(check.needs_program) and has_interpreter(check.python)):
            continue
        if holds := type_checks_hold(type_checks(check.commands) or frozenset(), known):
            return check, holds  # "": the same checks, no wider: the chosen one stays
    return None
