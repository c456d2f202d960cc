"""The checks a project already configures, read from its files.

Nothing here runs or imports the project: its files are read through ``readers`` (regular
files inside the repository, bounded), ``pyproject.toml`` with ``tomllib``, tox and nox by
``toxenvs`` and ``noxsessions``, CI by ``ci``.  Each check has a *concern* (lint, format,
types, tests, ...) per language, and one check per concern becomes a gate: what CI runs by
name first, then a session of the project's that does more than one tool (several commands,
a coverage gate), then a gate made from a tool table, then any other session.  Every check
left out is listed as skipped with the reason.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dagrunner.starter import network
from dagrunner.starter.checks import HOOK_RUNNERS, WHOLE, Check, Found, Skipped
from dagrunner.starter.ci import Ci, ci
from dagrunner.starter.ecosystems import go, makefile, package_json, rust
from dagrunner.starter.hookgates import config, hook_needs, hooks, pre_commit, replay
from dagrunner.starter.nodeseeds import node_seed
from dagrunner.starter.noxsessions import nox
from dagrunner.starter.python import Uses, python
from dagrunner.starter.readers import Project
from dagrunner.starter.sessions import (
    does_more,
    has_interpreter,
    runnable,
    type_check_holder,
    type_checks,
    type_checks_hold,
    variant,
)
from dagrunner.starter.toxenvs import tox
from dagrunner.starter.venvs import venv_seed

# Certificates and proxies: a gate that installs or downloads anything behind a corporate
# proxy or TLS inspection fails without them (they are passed, so never redacted from logs).
NETWORK_ENV = (
    *("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
    *("NODE_EXTRA_CA_CERTS", "PIP_CERT", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"),
    *("http_proxy", "https_proxy", "no_proxy"),
)
# A matrix's env of the Python running init ("py312", "py3.12") is the one that can run here.
THIS_PYTHON = re.compile(rf"(^|[-_])py3\.?{sys.version_info.minor}($|[-_])")
PRE_COMMIT = ".pre-commit-config.yaml"
# A pre-commit hook id -> the program and concern of the tool gate that runs the same check.
HOOK_TOOLS = {
    "ruff": ("ruff", "lint"),
    "ruff-check": ("ruff", "lint"),
    "ruff-format": ("ruff", "format"),
    "codespell": ("codespell", "spelling"),
    "mypy": ("mypy", "types"),
    "black": ("black", "format"),
    "isort": ("isort", "imports"),
    "flake8": ("flake8", "lint"),
    "pyright": ("pyright", "types"),
}


def detect(root: Path) -> Found:
    """Every check the project at ``root`` configures, in a stable order.  Raises the
    ``init-*`` errors of ``readers`` for a file that is no file, too large or too deep."""
    project = Project(root)
    pyproject = project.toml("pyproject.toml")
    runs = ci(project)
    listed = hooks(project)
    tox_checks, tox_skipped = tox(project, pyproject, runs.tox)
    nox_checks, nox_skipped = nox(project, runs.nox, runs.nox_matrix)
    js_checks, js_skipped = package_json(project, runs.scripts, runs.lines, runs.tasks)
    candidates = [
        *python(project, pyproject, Uses(listed, runs.lines)),
        *tox_checks,
        *nox_checks,
        *pre_commit(project),
        *js_checks,
        *makefile(project),
        *go(project),
        *rust(project),
    ]
    checks, skipped = _one_per_concern(candidates, runs.gate_ids())
    checks, twice = _hooks_once(checks, listed)
    skipped += twice
    checks, overlaps, extra = _pre_commit_overlap(checks, listed, project)
    ids = {c.id for c in checks}
    checks = [replace(c, needs=tuple(n for n in c.needs if n in ids)) for c in checks]
    checks = network.mark(project, checks)
    languages = tuple(sorted({c.concern.partition(":")[0] for c in checks}))
    # Bytecode written beside the sources would change the tree the next gate is keyed by.
    env_set = (("PYTHONDONTWRITEBYTECODE", "1"),) if "python" in languages else ()
    left_out = (*project.refused, *tox_skipped, *nox_skipped, *js_skipped, *skipped, *overlaps)
    left_out += tuple(_coverage_left_out(runs, checks))
    venv = venv_seed(root, extra=extra) if "python" in languages else None
    node = node_seed(project) if "js" in languages else None
    seeds = tuple(s for s in (venv, node) if s is not None)
    convention = _commit_convention(project, listed, pyproject)
    return Found(
        tuple(checks), left_out, languages, _env_pass(languages), env_set, seeds, convention
    )


# Where a project says its commit messages follow Conventional Commits (commitlint,
# commitizen, the conventional-pre-commit hook): the file, or the hook id.
COMMITLINT = tuple(
    f"{stem}{ext}"
    for stem, exts in (
        ("commitlint.config", (".js", ".cjs", ".mjs", ".ts", ".cts", ".mts")),
        (".commitlintrc", ("", ".json", ".yaml", ".yml", ".js", ".cjs", ".mjs", ".ts", ".cts")),
        (".cz", (".toml", ".json", ".yaml")),
        ("cz", (".json", ".yaml")),
    )
    for ext in exts
)
MESSAGE_HOOKS = ("conventional-pre-commit", "commitizen", "commitlint")


def _commit_convention(project: Project, hooks: tuple[str, ...], pyproject: Any) -> str:
    """What says the project's commit messages follow Conventional Commits ("" nothing)."""
    for name in COMMITLINT:
        if project.text(name, errors="replace") is not None:
            return name
    package = project.json("package.json")
    if isinstance(package, dict) and isinstance(package.get("commitlint"), dict):
        return "package.json's commitlint"
    tool = pyproject.get("tool") if isinstance(pyproject, dict) else None
    if isinstance(tool, dict) and isinstance(tool.get("commitizen"), dict):
        return "pyproject.toml's [tool.commitizen]"
    hook = next((h for h in hooks if h in MESSAGE_HOOKS), "")
    return f"the pre-commit hook {hook}" if hook else ""


def _one_per_concern(
    candidates: list[Check], by_ci: frozenset[str]
) -> tuple[list[Check], list[Skipped]]:
    """One check per concern (a ``make`` target's concern is any language's): the best
    ranked, the first among equals."""

    def rank(check: Check) -> tuple[int, str]:
        if check.id in by_ci:
            return 0, "CI runs it"
        if check.runner and (more := does_more(check.commands)):
            return 1, more
        return (3, "") if check.runner else (2, "")

    groups: dict[str, list[Check]] = {}
    for check in candidates:
        language, _, concern = check.concern.partition(":")
        key = check.concern
        if language == "make":
            key = next((k for k in groups if k.endswith(f":{concern}")), key)
        groups.setdefault(key, []).append(check)

    def order(check: Check) -> tuple[bool, bool, int, bool]:
        # an interpreter this machine has, then no variant (tests-min), then the rank; an
        # env of this Python first among equals
        name = check.id.partition("-")[2]
        this = check.runner and THIS_PYTHON.search(name)
        return not has_interpreter(check.python), bool(variant(name)), rank(check)[0], not this

    best = {key: min(group, key=order) for key, group in groups.items()}
    winners = {id(c) for c in best.values()}
    for group in groups.values():  # each session CI runs by name is a check of its own
        winners |= {id(c) for c in group if c.id in by_ci and has_interpreter(c.python)}
    notes: dict[int, str] = {}
    for key, group in groups.items():  # what the chosen one deselects is run by another
        left = _deselected(best[key].commands)
        for check in group if left else ():
            same = set(_deselected(check.commands)) & set(left)  # a twin leaves them out too
            own = check.runner and not same and not variant(check.id.partition("-")[2])
            if own and has_interpreter(check.python) and id(check) not in winners:
                winners.add(id(check))
                notes[id(check)] = (
                    f"runs tests {best[key].id} deselects ({', '.join(left)}): a gate of its own"
                )
    chosen_for: dict[int, Check] = {}
    held: dict[int, str] = {}  # a chosen check that another one holds: why
    for key, group in groups.items():  # a checker run on what the chosen one does not check
        known = type_checks(best[key].commands or (best[key].run,))
        covered = known or frozenset()
        for check in sorted(group, key=order) if key.endswith(":types") and known else ():
            mine = type_checks(check.commands) or frozenset()
            new = sorted(m for m in mine if type_checks_hold(covered, frozenset({m})) is None)
            if check.runner and not variant(check.id.partition("-")[2]) and new:
                if id(check) not in winners:
                    winners.add(id(check))
                    notes[id(check)] = (
                        f"runs {', '.join(new)}, which {best[key].id} does not: a gate of its own"
                    )
                covered |= mine
                chosen_for |= {
                    id(c): check
                    for c in group
                    if (theirs := type_checks(c.commands or (c.run,)))
                    and type_checks_hold(mine, theirs) is not None
                }
        if (
            known
            and rank(best[key])[0]
            and (holder := type_check_holder(best[key], group, winners, known))
        ):
            # the chosen one checks part of what a gate of the project's own env checks (mypy
            # src beside tox's mypy .): that gate runs it, with the project's pinned checker
            stand, holds = holder
            winners.discard(id(best[key]))
            notes.pop(id(stand), None)
            targets = " ".join(sorted(w for c in known for w in c.split()[1:]))
            held[id(best[key])] = f"it checks {holds}, which holds {targets}"
            for c in group:
                if id(c) not in winners and chosen_for.get(id(c), best[key]) is best[key]:
                    chosen_for[id(c)] = stand
    stand_ins: dict[str, Check] = {}
    for key, group in groups.items():  # the tests' gate is written commented out (its runner
        # is missing here): the best one this machine can run checks them meanwhile
        program = best[key].needs_program
        here = [c for c in group if runnable(c.needs_program)]
        if key.endswith(":tests") and not runnable(program) and here:
            stand_in = stand_ins[key] = min(here, key=order)
            winners.add(id(stand_in))
            notes[id(stand_in)] = (
                f"runs the tests here while `{program}` is missing ({best[key].id} is the "
                "project's way): without it no gate would run them"
            )
    checks: list[Check] = []
    skipped: list[Skipped] = []
    for key, group in groups.items():
        chosen = best[key]
        _, why = rank(chosen)
        for check in group:
            if id(check) in winners:
                continue
            by = chosen_for.get(id(check), chosen)
            said = held.get(id(check), why if by is chosen else "")
            if by is chosen and key in stand_ins:  # the chosen one is off: the stand-in runs it
                by, program = stand_ins[key], chosen.needs_program
                said = f"{chosen.id!r} is written commented out: `{program}` is missing"
            skipped.append(Skipped(check.id, check.source, _why_not(check, by, key, said, chosen)))
    seen: set[str] = set()
    for check in candidates:
        if id(check) in winners:
            if check.id in seen:
                skipped.append(Skipped(check.id, check.source, "another gate has this id"))
                continue
            seen.add(check.id)
            checks.append(replace(check, note=notes[id(check)]) if id(check) in notes else check)
    return checks, skipped


def _deselected(commands: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    """What a test command leaves out of the tests (pytest's ``-m "not x"``, ``-k "not x"``,
    ``--ignore``, ``--deselect``): the words that say it."""
    found: list[str] = []
    for words in commands:
        for n, word in enumerate(words):
            after = words[n + 1] if n + 1 < len(words) else ""
            if word in ("-m", "-k") and after.startswith("not "):
                found.append(after)
            elif word in ("--ignore", "--deselect", "--ignore-glob") and after:
                found.append(f"{word}={after}")
            elif word.startswith(("--ignore=", "--deselect=", "--ignore-glob=")):
                found.append(word)
    return tuple(dict.fromkeys(found))


def _why_not(check: Check, chosen: Check, key: str, why: str, own: Check) -> str:
    """The true reason ``check`` is left out for ``chosen`` (``own``: the project's own run
    of the concern, which a variant is not, though a stand-in may run it here)."""
    concern = key.partition(":")[2]
    name = check.id.partition("-")[2]
    if not has_interpreter(check.python):
        return f"it needs {check.python}, which is not installed here; {chosen.id!r} runs the {concern}"
    if word := variant(name):
        return (
            f"a variant ({word!r}: other versions of its dependencies or Python), not the "
            f"project's own {concern} run; {own.id!r} is"
        )
    return f"{concern} is run by {chosen.id!r}" + (f" ({why})" if why else "")


def _all_hooks(check: Check) -> str:
    """The hook runner with which a session runs every hook (``pre-commit run`` or ``prek
    run`` naming none), '' when it does not."""
    for command in check.commands:
        words = list(command)
        for runner in HOOK_RUNNERS:
            if runner in words and words[words.index(runner) + 1 :][:1] == ["run"]:
                rest = words[words.index(runner) + 2 :]
                if not [w for w in rest if not w.startswith("-")]:
                    return runner
    return ""


def _hooks_once(checks: list[Check], listed: tuple[str, ...]) -> tuple[list[Check], list[Skipped]]:
    """No hook run twice: where a session runs every pre-commit hook (``nox -s lint``), the
    pre-commit gate and each tool gate that runs a listed hook's tool are left out, with
    why; while the session's runner is missing here they stay (they run the hooks
    meanwhile) and the session says which to drop once it is uncommented."""
    runner = next((c for c in checks if c.runner and _all_hooks(c)), None)
    if runner is None:
        return checks, []
    same = {HOOK_TOOLS[h] for h in listed if h in HOOK_TOOLS}
    twice = [
        c
        for c in checks
        if c is not runner
        and (
            c.id == "pre-commit"
            or (not c.runner and (c.run[0], c.concern.partition(":")[2]) in same)
        )
    ]
    if not twice:
        return checks, []
    if not runnable(runner.needs_program):
        drop = ", ".join(c.id for c in twice)
        note = (
            f"it runs every pre-commit hook: once uncommented, remove gates {drop} (the same hooks)"
        )
        return [replace(c, note=note) if c is runner else c for c in checks], []
    why = f"its hooks are run by {runner.id!r} ({_all_hooks(runner)} run, every hook): not twice"
    return [c for c in checks if all(c is not t for t in twice)], [
        Skipped(c.id, c.source, why) for c in twice
    ]


def _pre_commit_overlap(
    checks: list[Check], listed: tuple[str, ...], project: Project
) -> tuple[list[Check], list[Skipped], tuple[str, ...]]:
    """A tool both a gate and a pre-commit hook runs once: in its own gate (the pre-commit
    gate gets ``SKIP=hook``), or, where only pre-commit brings the tool, in the hook.  What
    the skipped hook installs beside its tool (mypy's ``additional_dependencies``) the gate
    needs too: those go into a venv seed's build (the third value), and the gate says so."""
    if not any(c.id == "pre-commit" for c in checks):
        return checks, [], ()
    settings = config(project)
    kept: list[Check] = []
    notes: list[Skipped] = []
    skip: list[str] = []
    extra: list[str] = []
    for check in checks:
        same = (check.run[0], check.concern.partition(":")[2])
        hook = next((h for h in listed if HOOK_TOOLS.get(h) == same), None)
        if hook is None or check.runner:
            kept.append(check)
        elif not runnable(check.run[0]) and runnable("pre-commit"):
            why = f"`{check.run[0]}` is not on PATH here: the pre-commit gate runs it (hook {hook})"
            notes.append(Skipped(check.id, check.source, why))
        else:
            needs = hook_needs(project, hook, check.run[0])
            notes_here: list[str] = []
            if len(needs) > 1:  # the hook installs packages beside its tool
                extra += needs
                said = f"pre-commit's {hook} hook gives {check.run[0]} {', '.join(needs[1:])}"
                notes_here.append(f"{said}: a venv seed's build installs them too")
            if needs and "==" in needs[0]:  # another version finds other faults (or misses)
                extra += needs[:1] if len(needs) == 1 else []
                notes_here.append(
                    f"the hook runs {needs[0]}: install it (pip install {pip_words(needs)}, "
                    "in your checkout's venv if it has one; a venv seed's build installs it "
                    "for worktrees), or this gate and the hook may disagree"
                )
            if needs:  # what to install, as the seed does: else red here, green in the queue
                check = replace(check, install=needs)
            same_hooks = [h for h in listed if HOOK_TOOLS.get(h) == same]
            found = replay(settings, hook) if len(same_hooks) == 1 else None
            if found is None or not found.run:
                why = found.why_not if found else f"hooks {', '.join(same_hooks)} run {same[0]}"
                for each in same_hooks:
                    said = f"gate {check.id!r} does not replace it, the pre-commit gate keeps it"
                    notes.append(Skipped(f"pre-commit:{each}", PRE_COMMIT, f"{said}: {why}"))
            else:
                notes_here.append(
                    f"runs what pre-commit's {hook} hook checks: the tracked files it selects, "
                    "with its args (the pre-commit gate skips it)"
                )
                check = replace(
                    check,
                    run=found.run,
                    program=check.run[0],
                    inputs=WHOLE,  # it may select a script by its shebang, whatever its name
                    source=f"{PRE_COMMIT} hook {hook}, in the stead of {check.source}",
                )
                skip.append(hook)
                why = f"run by gate {check.id!r}; the pre-commit gate skips it (SKIP={hook})"
                notes.append(Skipped(f"pre-commit:{hook}", PRE_COMMIT, why))
            if notes_here:
                check = replace(check, note="; ".join(notes_here))
            kept.append(check)
    if not skip:
        return kept, notes, tuple(extra)
    if not set(listed) - set(skip):
        why = "every hook it lists is run by its own gate"
        notes.append(Skipped("pre-commit", ".pre-commit-config.yaml", why))
        return [c for c in kept if c.id != "pre-commit"], notes, tuple(extra)
    env = (("SKIP", ",".join(skip)),)
    kept = [replace(c, env_set=env) if c.id == "pre-commit" else c for c in kept]
    return kept, notes, tuple(extra)


def pip_words(requirements: Iterable[str]) -> str:
    """``requirements`` as pip's words for a shell, each quoted (``'attrs>=23'``)."""
    return " ".join(f"'{r}'" if "'" not in r else shlex.quote(r) for r in requirements)


def _coverage_left_out(runs: Ci, checks: list[Check]) -> Iterable[Skipped]:
    """CI's coverage gates no gate runs: listed, never dropped unsaid (a gate of its own
    would report data no gate here collects, or test twice)."""
    said = {" ".join(c.run) for c in checks} | {" ".join(w) for c in checks for w in c.commands}
    tests = next((c for c in checks if c.concern.endswith(":tests")), None)
    for what, where in runs.thresholds():
        flag = what.removeprefix("coverage report ")
        if any(flag in line.split() for line in said):
            continue
        if what.startswith("coverage report"):
            why = (
                "CI's coverage gate: it reports the coverage data earlier CI steps collected "
                "(coverage run, combine), which no gate here collects; to keep it, make the "
                f"tests' gate run them under coverage and end with `{what}`"
            )
        elif tests is not None and "pytest" in " ".join(tests.run):
            why = (
                f"CI's coverage threshold: gate {tests.id!r} runs pytest without it; add "
                f"`--cov {flag}` to its run (pytest-cov installed) to keep it"
            )
        elif tests is not None:
            why = f"CI's coverage threshold: gate {tests.id!r} runs the tests without pytest's"
        else:
            why = "CI's coverage threshold: no gate here runs the tests"
        yield Skipped(f"ci: {what}", where, why)


def _env_pass(languages: Iterable[str]) -> tuple[str, ...]:
    names = ["PATH"]
    extra = {
        "python": ["VIRTUAL_ENV"],
        "go": ["GOPATH", "GOMODCACHE", "GOCACHE", "GOFLAGS"],
        "rust": ["CARGO_HOME", "RUSTUP_HOME"],
    }
    for language in languages:
        names += extra.get(language, [])
    return (*names, *NETWORK_ENV)
