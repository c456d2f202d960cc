"""What CI runs, read from ``.github/workflows/*.yml``: the truth where present.

PyYAML is no dependency of dagrunner (only of its tests), so the ``run:`` values are read
by lines: a plain ``run: cmd``, or a ``|`` / ``>`` block (the lines indented deeper than the
key).  Only the commands that name a runner's session count -- ``tox -e X``, ``nox -s X``,
``npm run X`` / ``npm test``, ``pre-commit run``, ``make X`` -- and a ``${{ ... }}``
expression (a matrix value) names nothing that can be known here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from dagrunner.starter.readers import Project

MAX_FILES = 64


@dataclass(frozen=True)
class Ci:
    """The sessions CI runs by name, and its ``run:`` lines."""

    tox: frozenset[str] = frozenset()
    nox: frozenset[str] = frozenset()
    # sessions CI runs for a value of its own (``"downstream(project='$MATRIX_PROJECT')"``):
    # which ones is CI's matrix, not known here; their names, before the variable
    nox_matrix: frozenset[str] = frozenset()
    scripts: frozenset[str] = frozenset()  # package.json scripts (or programs: ``pnpm tsc``)
    # what CI runs only with a subcommand (``pnpm changeset version``): a script of that name
    # alone (``changeset``: its interactive ``add``) is not what CI checks
    tasks: frozenset[str] = frozenset()
    make: frozenset[str] = frozenset()
    pre_commit: bool = False
    lines: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # the workflow each line is from

    def thresholds(self) -> list[tuple[str, str]]:
        """CI's coverage gates, as (what, workflow): ``coverage report --fail-under=N`` or
        a ``--cov-fail-under=N`` (``what`` is the words that say it)."""
        found: dict[str, str] = {}
        for line, where in zip(self.lines, self.files, strict=True):
            for command in re.split(r"&&|\|\||;|\|", line):
                words = command.split()
                under = next((w for w in words if re.match(r"--(cov-)?fail-under\b", w)), "")
                at = words.index(under) if under else -1
                if under and "=" not in under and at + 1 < len(words):
                    under = f"{under}={words[at + 1]}"
                if under.startswith("--cov-"):
                    found.setdefault(under, where)
                elif under and "coverage" in words[:3] and "report" in words:
                    found.setdefault(f"coverage report {under}", where)
        return list(found.items())

    def gate_ids(self) -> frozenset[str]:
        """The ids of the gates ``detect`` makes for what CI runs."""
        return frozenset(
            {f"tox-{n}" for n in self.tox}
            | {f"nox-{n}" for n in self.nox}
            | {f"js-{n.replace(':', '-')}" for n in self.scripts}
            | {  # a script CI runs in one workspace or each (``yarn workspace lib test``)
                f"js-{step[0].replace(':', '-')}"
                for manager in ("npm", "pnpm", "yarn")
                for step in every_workspace(manager, self.lines)
            }
            | {f"make-{n}" for n in self.make}
            | ({"pre-commit"} if self.pre_commit else set())
        )


def ci(project: Project) -> Ci:
    """The sessions the project's GitHub workflows run."""
    workflows = [
        p for p in project.files("*.yml", "*.yaml") if re.fullmatch(r"\.github/workflows/[^/]+", p)
    ]
    lines: list[str] = []
    files: list[str] = []
    for name in sorted(workflows)[:MAX_FILES]:
        lines += run_lines(project.text(name, errors="replace") or "")
        files += [name] * (len(lines) - len(files))
    kinds = ("tox", "nox", "nox_matrix", "scripts", "bare", "tasks", "make")
    found: dict[str, set[str]] = {k: set() for k in kinds}
    pre_commit = False
    for line in lines:
        for command in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(command)
            except ValueError:
                words = command.split()
            pre_commit |= _named(words, found)
    return Ci(
        tox=frozenset(found["tox"]),
        nox=frozenset(found["nox"]),
        nox_matrix=frozenset(found["nox_matrix"]),
        scripts=frozenset(found["scripts"]),
        tasks=frozenset(found["tasks"] - found["bare"]),
        make=frozenset(found["make"]),
        pre_commit=pre_commit,
        lines=tuple(lines),
        files=tuple(files),
    )


def run_lines(text: str) -> list[str]:
    """The commands of every ``run:`` key of a workflow, one line each."""
    found: list[str] = []
    block: int | None = None  # the key's indentation while reading a block
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if block is not None:
            if not line.strip() or indent > block:
                if line.strip() and not line.strip().startswith("#"):
                    found.append(line.strip())
                continue
            block = None
        match = re.match(r"^(\s*)(?:-\s+)?run:\s*(.*?)\s*$", line)
        if match is None:
            continue
        value = match[2]
        if re.fullmatch(r"[|>][-+]?\d*(\s+#.*)?", value):
            block = len(match[1])
        elif value and not value.startswith("#"):
            quoted = len(value) > 1 and value[0] == value[-1] and value[0] in "'\""
            found.append(value[1:-1] if quoted else value)  # a quoted scalar, not a last word's
    return found


def _named(words: list[str], found: dict[str, set[str]]) -> bool:
    """Add the sessions ``words`` runs to ``found``; whether it is ``pre-commit run``."""
    while words and re.fullmatch(r"\w+=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    if words[:1] == ["uvx"]:
        words = words[1:]
    elif words[:1] in (["uv"], ["pipx"]) and words[1:2] == ["run"]:
        words = words[2:]
    if len(words) >= 3 and words[0].startswith("python") and words[1] == "-m":
        words = words[2:]
    if not words:
        return False
    program, rest = words[0], words[1:]
    if program == "pre-commit":
        return bool(rest) and rest[0] == "run"
    if program == "tox":
        found["tox"] |= _after(rest, ("-e", "--env"), split=",")
    elif program == "nox":
        sessions = _after(rest, ("-s", "--session", "--sessions"), split=None, variables=True)
        found["nox"] |= {n for n in sessions if "$" not in n}
        found["nox_matrix"] |= {re.split(r"[($]", n)[0] for n in sessions if "$" in n} - {""}
    elif program in ("npm", "pnpm", "yarn", "bun"):
        if program != "npm" and rest[:1] == ["exec"]:  # a program: ``pnpm exec tsc``
            rest = rest[1:]
        if rest[:1] in (["test"], ["t"]):
            rest = ["test"]
        elif rest[:1] in (["run"], ["run-script"]):
            rest = rest[1:]
        elif program == "npm" or (rest[:1] and rest[0].startswith("-")):
            rest = []
        if rest:
            found["scripts"].add(rest[0])
            bare = rest[0] == "test" or not _subcommand(rest[1:])
            found["bare" if bare else "tasks"].add(rest[0])
    elif program == "make":
        found["make"] |= {w for w in rest if re.fullmatch(r"[A-Za-z0-9][\w.-]*", w)}
    return False


def _subcommand(words: list[str]) -> bool:
    """Whether a script's arguments start with a subcommand (``pnpm changeset version``)."""
    return bool(words) and re.fullmatch(r"[a-z][a-z-]*", words[0]) is not None


def _after(
    words: list[str], flags: tuple[str, ...], *, split: str | None, variables: bool = False
) -> set[str]:
    """The values of ``flags`` (``-e a,b``, ``-e=a``, ``-s a b``), expressions left out
    (``variables``: kept, for the caller to tell)."""
    values: list[str] = []
    for i, word in enumerate(words):
        flag, _, inline = word.partition("=")
        if flag not in flags:
            continue
        if inline:
            values.append(inline)
        elif split is None:  # nox: every word up to the next option
            for value in words[i + 1 :]:
                if value.startswith("-"):
                    break
                values.append(value)
        elif i + 1 < len(words):
            values.append(words[i + 1])
    names = [v for value in values for v in (value.split(split) if split else [value])]
    return {n.strip() for n in names if n.strip() and (variables or "$" not in n)}


def every_workspace(manager: str, lines: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(script, workspace, CI's words) for each command of ``lines`` that runs a script in
    every workspace with ``manager`` (``pnpm -r --no-bail test``; workspace "") or in one
    (``yarn workspace lib test``, ``pnpm --filter lib test``, ``npm run test -w lib``; its
    name), once per script and workspace; a command with shell syntax in it is no gate's
    words."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    for line in lines:
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        script, where = _workspace_script(manager, words)
        if script and not any(re.search(r"[;&|<>$`]", w) for w in words):
            found.setdefault((script, where), tuple(words))
    return [(script, where, words) for (script, where), words in found.items()]


# each manager's flags naming the workspaces a command runs in (their value follows)
_ONE_WORKSPACE = {"pnpm": ("--filter", "-F"), "npm": ("--workspace", "-w"), "yarn": ()}


def _workspace_script(manager: str, words: list[str]) -> tuple[str, str]:
    """The script ``words`` run with ``manager`` in every workspace (``(script, "")``) or in
    one (``(script, name)``); ``("", "")`` when neither."""
    if not words or words[0] != manager:
        return "", ""
    rest, where = words[1:], ""
    for i, word in enumerate(rest):  # ``--filter lib``, ``--workspace=lib``
        flag, _, inline = word.partition("=")
        if flag in _ONE_WORKSPACE[manager] and (inline or i + 1 < len(rest)):
            where = inline or rest[i + 1]
            rest = rest[:i] + rest[i + (1 if inline else 2) :]
            break
    if manager == "pnpm" and {"-r", "--recursive"} & set(rest):
        where, names = "", [w for w in rest if not w.startswith("-")]
    elif manager == "yarn" and rest[:1] == ["workspaces"] and "run" in rest:
        names = [w for w in rest[rest.index("run") + 1 :] if not w.startswith("-")]
    elif manager == "yarn" and rest[:1] == ["workspace"] and len(rest) > 2:
        where, names = rest[1], [w for w in rest[2:] if not w.startswith("-")]
    elif manager == "npm" and {"--workspaces", "-ws"} & set(rest):
        where, names = "", [w for w in rest if not w.startswith("-")]
    elif where:
        names = [w for w in rest if not w.startswith("-")]
    else:
        return "", ""
    names = names[1:] if names[:1] in (["run"], ["run-script"]) else names
    names = ["test"] if names[:1] == ["t"] else names
    if names and re.fullmatch(r"[\w:.-]+", names[0]):
        return names[0], where
    return "", ""
