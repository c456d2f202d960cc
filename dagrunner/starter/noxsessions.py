"""nox's sessions, read from ``noxfile.py`` with ``ast`` (never imported): each decorated
function, its ``name=``, whether ``default=False`` or ``nox.options.sessions`` leaves it out
of a bare ``nox``, and the commands its body passes to ``session.run``."""

from __future__ import annotations

import ast
import sys

from dagrunner.starter.checks import Check, Skipped
from dagrunner.starter.readers import Project
from dagrunner.starter.sessions import gate_id, session, task

RUNS = ("run", "run_always", "run_install")  # session.<this>(...) runs a command


def nox(
    project: Project, asked: frozenset[str], matrix: frozenset[str] = frozenset()
) -> tuple[list[Check], list[Skipped]]:
    """The checks among the sessions (``asked``: those CI runs by name; ``matrix``: those
    it runs for a value of its matrix), and the sessions left out with why."""
    tree = project.python("noxfile.py")
    if tree is None:
        return [], []
    chosen = _default_sessions(tree)
    found: list[Check] = []
    skipped: list[Skipped] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        decorator = next((d for d in node.decorator_list if _is_session(d)), None)
        if decorator is None:
            continue
        keywords = decorator.keywords if isinstance(decorator, ast.Call) else []
        options = {k.arg: k.value for k in keywords if k.arg}
        name = _constant(options.get("name")) or node.name
        commands = _commands(node)
        where = f"noxfile.py session {name}"
        default = options.get("default")
        off = isinstance(default, ast.Constant) and default.value is False
        if why := task(name, commands):
            skipped.append(Skipped(gate_id("nox", name), where, why))
        elif name in asked:
            found.append(_check(name, where, commands))
        elif off and (name in matrix or node.name in matrix):
            why = (
                "default=False, and CI runs it for a matrix value of its own (a job each): "
                "add a gate for each value you want checked before landing"
            )
            skipped.append(Skipped(gate_id("nox", name), where, why))
        elif off:
            why = "default=False: nox runs it only when asked by name, and CI does not"
            skipped.append(Skipped(gate_id("nox", name), where, why))
        elif chosen is not None and name not in chosen and node.name not in chosen:
            why = "not in nox.options.sessions: a bare nox does not run it, and CI does not"
            skipped.append(Skipped(gate_id("nox", name), where, why))
        else:
            found.append(_check(name, where, commands))
    return found, skipped


def _check(name: str, where: str, commands: tuple[tuple[str, ...], ...]) -> Check:
    # With the Python that runs init: a session pinned to another (python="3.10") was
    # "skipped" by nox, which still exited 0, and a matrix ran only what was installed.
    run = ("nox", "-s", name, "--force-python", THIS_PYTHON)
    return session(
        prefix="nox", name=name, run=run, source=where, commands=commands, tools=("nox --version",)
    )


THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def _is_session(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("nox.session", "session")


def _constant(node: ast.expr | None) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def _default_sessions(tree: ast.Module) -> set[str] | None:
    """``nox.options.sessions = [...]`` (what a bare ``nox`` runs), if the file sets it."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(ast.unparse(t) == "nox.options.sessions" for t in node.targets)
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            return {_constant(e) for e in node.value.elts} - {""}
    return None


def _commands(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, ...], ...]:
    """The commands of ``session.run("x", "y", ...)`` calls in the body: their leading string
    arguments (an argument built at run time ends what can be known)."""
    found: list[tuple[int, tuple[str, ...]]] = []
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RUNS
        ):
            words: list[str] = []
            for arg in node.args:
                if not (word := _constant(arg)):
                    break
                words.append(word)
            if words:
                found.append((node.lineno, tuple(words)))
    return tuple(words for _, words in sorted(found))
