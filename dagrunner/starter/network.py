"""Which checks need the network, and why: ``init`` marks them (``network = "host"`` and a
comment), so a release check run offline names them rather than leaving pages of log.

pre-commit clones each hook's repository and installs its environment on first use; a
session that runs pre-commit (or prek, which reads the same config) does the same; a Sphinx build with ``intersphinx`` fetches the
inventories of other projects' documentation.  (Installing a session's own environment from
the package index is not counted: every tox and nox session does that.)
"""

from __future__ import annotations

import re
from dataclasses import replace

from dagrunner.starter.checks import HOOK_RUNNERS, Check
from dagrunner.starter.readers import Project

CONF_PY = ("docs/conf.py", "doc/conf.py", "docs/source/conf.py", "doc/source/conf.py")
HOOKS = "{} clones its hooks' repositories and installs their environments"
WRAPPERS = {  # a build tool's wrapper script, which downloads the tool on first use
    "gradlew": "the Gradle wrapper downloads Gradle on first use, and Gradle the build's plugins",
    "mvnw": "the Maven wrapper downloads Maven on first use, and Maven the build's plugins",
}


def intersphinx(project: Project) -> str:
    """The conf.py that loads ``sphinx.ext.intersphinx`` ('' when none does)."""
    for name in CONF_PY:
        if "sphinx.ext.intersphinx" in (project.text(name, errors="replace") or ""):
            return name
    return ""


def runs_pre_commit(command: tuple[str, ...]) -> str:
    """Which hook runner ``command`` starts ('' when none): a word of it (a shell line's
    words too) is the program (pre-commit or prek).  An inline script (after ``-c``) is
    program text, not a command: the gate written in a hook's stead carries one that says
    "as pre-commit would pass them", and runs the tool alone, offline."""
    for i, arg in enumerate(command):
        if i and command[i - 1] == "-c":
            continue
        for word in re.split(r"[\s;&|()]+", arg):
            if word == "pre_commit":
                return "pre-commit"
            if (name := word.rpartition("/")[2]) in HOOK_RUNNERS:
                return name
    return ""


def mark(project: Project, checks: list[Check]) -> list[Check]:
    """``checks``, each that needs the network with why."""
    docs = intersphinx(project)
    marked = []
    for check in checks:
        words = [" ".join(c) for c in (check.run, *check.commands)]
        why = ""
        runner = next(filter(None, map(runs_pre_commit, (check.run, *check.commands))), "")
        if check.id == "pre-commit" or runner:
            said = HOOKS.format(runner or "pre-commit")
            why = said if check.id == "pre-commit" else f"it runs {runner}: {said}"
        elif docs and (check.concern.endswith(":docs") or any("sphinx-build" in w for w in words)):
            why = f"sphinx's intersphinx ({docs}) fetches other projects' inventories"
        elif wrapper := next((w for w in _programs(words) if w in WRAPPERS), ""):
            why = WRAPPERS[wrapper]
        marked.append(replace(check, network=why) if why else check)
    return marked


def _programs(lines: list[str]) -> list[str]:
    """The file names of the words of ``lines`` (``./android/gradlew`` -> ``gradlew``)."""
    return [w.rpartition("/")[2] for line in lines for w in re.split(r"[\s;&|()]+", line)]
