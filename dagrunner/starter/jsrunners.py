"""A ``package.json`` test script that calls a test runner gets the runner's own JUnit
reporter: ``node --test`` run directly; vitest, jest and mocha through the package manager
(``yarn run test --reporter=junit ...``), each only with what the project installs (vitest's
reporter is built in; jest needs ``jest-junit``, mocha ``mocha-junit-reporter``).  Where no
reporter can be wired, the failing tests are named from the output (``report/testnames``)."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace

from dagrunner.starter.checks import Check
from dagrunner.starter.python import junit_file
from dagrunner.starter.readers import Project

SHELL = re.compile(r"[;&|<>$`()]")  # words a shell reads: flags appended would go elsewhere
# How each manager passes words after the script's name on to the script: npm needs ``--``
# (else it takes ``--x`` as its own config); yarn (classic and berry) and pnpm pass them on.
PASS_ON = {"npm": ("--",), "yarn": (), "pnpm": ()}
JEST_NAMES = (
    ("JEST_JUNIT_CLASSNAME", "{classname}"),
    ("JEST_JUNIT_TITLE", "{title}"),
    ("JEST_JUNIT_ANCESTOR_SEPARATOR", " \u203a "),  # jest's own separator
)
MOCHA_NAMES = "jenkinsMode=true,testCaseSwitchClassnameAndName=true,suiteTitleSeparatedBy= > "
# The runner's reporter package, where it has none of its own.
PACKAGE = {"jest": "jest-junit", "mocha": "mocha-junit-reporter"}


def runner_junit(project: Project, check: Check, script: str, manager: str) -> Check:
    """``check`` (a script's gate) with the JUnit file of the test runner its script is, or
    as it is: a script that does more than call the runner (``a && b``), a runner whose
    reporter package is not installed, a manager that may not pass the words on."""
    words = _words(script)
    if not words or any(SHELL.search(w) for w in words):
        return check
    if words[:2] == ("node", "--test"):
        return _node_test(project, check, words)
    runner = _runner(words)
    if runner is None or manager not in PASS_ON:
        return check
    if runner in PACKAGE and not installed(project, PACKAGE[runner]):
        note = (
            f"failing tests are named from {runner}'s output: add {PACKAGE[runner]} to "
            "devDependencies and dagrunner init writes its JUnit file"
        )
        return replace(check, note=note)
    if runner == "vitest" and words[1:2] in (("watch",), ("dev",)):
        return check  # a watcher, not a test run
    path, note = junit_file(project, check.id)
    env: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...]
    if runner == "vitest":
        flags = ("--reporter=default", "--reporter=junit", f"--outputFile.junit={path}")
    elif runner == "jest":
        flags = ("--reporters=default", "--reporters=jest-junit")
        # suite::case as the other runners name them ("sum \u203a nested::adds"), not jest-junit's
        # default of the whole title twice ("sum adds::sum adds")
        env = (("JEST_JUNIT_OUTPUT_FILE", path), *JEST_NAMES)
    else:  # mocha runs one reporter: its spec output gives way to the JUnit file
        # suite::case (``outer > inner::deep``), not its default of title::full title
        said = f"mochaFile={path},{MOCHA_NAMES}"
        flags = ("--reporter", "mocha-junit-reporter", "--reporter-options", said)
    run = (*check.run, *PASS_ON[manager], *flags)
    source = re.sub(r"\)?$", f"; {runner}'s JUnit reporter added)", check.source, count=1)
    env_set = check.env_set + env
    return replace(check, run=run, junit=path, note=note, env_set=env_set, source=source)


def _runner(words: tuple[str, ...]) -> str | None:
    """The test runner a script's command is (after ``VAR=x`` words and ``cross-env``),
    or None."""
    rest = list(words)
    while rest and (rest[0] == "cross-env" or re.fullmatch(r"[A-Za-z_]\w*=.*", rest[0])):
        rest.pop(0)
    program = rest[0].rsplit("/", 1)[-1] if rest else ""
    return program if program in ("vitest", "jest", "mocha") else None


def installed(project: Project, package: str) -> bool:
    """Whether the project installs ``package``: named in the root ``package.json``'s
    (dev)dependencies, or in its ``node_modules``."""
    body = project.json("package.json")
    for key in ("devDependencies", "dependencies"):
        listed = body.get(key) if isinstance(body, dict) else None
        if isinstance(listed, dict) and package in listed:
            return True
    return project.is_file(f"node_modules/{package}/package.json")


def _node_test(project: Project, check: Check, words: tuple[str, ...]) -> Check:
    """A script that is node's own test runner runs it directly, with a JUnit report beside
    the spec output on stdout (appending to ``npm run`` would put options after files)."""
    path, note = junit_file(project, check.id)
    reporters = (
        *("--test-reporter=spec", "--test-reporter-destination=stdout"),
        *("--test-reporter=junit", f"--test-reporter-destination={path}"),
    )
    # node does not make the report's folder (ENOENT), so a shell makes it first.
    node = shlex.join(("node", "--test", *reporters, *words[2:]))
    run = ("sh", "-c", f"mkdir -p {shlex.quote(path.rpartition('/')[0])} && exec {node}")
    source = f"{check.source.partition(' (')[0]} (node --test, run directly for its JUnit file)"
    return replace(check, run=run, source=source, junit=path, note=note, program="node")


def _words(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return ()
