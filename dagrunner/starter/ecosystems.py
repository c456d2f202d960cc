"""Checks outside Python's tool tables: pre-commit hooks, ``package.json`` scripts (with
the package manager its lockfile names), ``Makefile`` targets, Go and Rust."""

from __future__ import annotations

import os
import re
import shlex

from dagrunner.starter.checks import WHOLE, Check, Skipped
from dagrunner.starter.ci import every_workspace
from dagrunner.starter.jsrunners import runner_junit
from dagrunner.starter.nodeseeds import workspace_folders, workspace_scripts
from dagrunner.starter.readers import Project

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
    "docs": "docs",
}
# A script name's start that says its concern (``test:coverage``, ``format``, ``lint:fix``).
LOOKS = {**CHECK_SCRIPTS, "format": "format", "fmt": "format", "prettier": "format"}
# checkers CI may run as ``yarn X`` / ``pnpm X`` (a program of node_modules/.bin) -> concern
CI_PROGRAMS = {"tsc": "types", "vue-tsc": "types", "eslint": "lint", "knip": "check"}
CI_PROGRAMS |= {"biome": "lint", "oxlint": "lint", "prettier": "format", "publint": "check"}
# A script that writes what it checks is a fixer (``prettier --write``, ``eslint --fix``).
FIXES = re.compile(r"(^|\s)(--write|-w|--fix|--apply|fix)(\s|$)")
# A script's call of another: ``npm run X``, ``pnpm X``, ``yarn run X``, ``bun run X``
RUNS = re.compile(r"(?:^|[\s;&|(])(?:npm|pnpm|yarn|bun)\s+(?:run(?:-script)?\s+)?([^\s;&|()]+)")
LOCKFILES = (
    ("pnpm-lock.yaml", "pnpm"),
    ("yarn.lock", "yarn"),
    ("bun.lockb", "bun"),
    ("bun.lock", "bun"),
    ("package-lock.json", "npm"),
)
# What a workspace package's package.json names as its code, for the packages that import it
ENTRY_FIELDS = ("main", "module", "types", "typings", "exports")
MEMORY = {"tests": "1G", "types": "2G", "build": "1G"}  # a concern's memory (else 256M)
# The heaviest tools a script may call: its memory is theirs, whatever its name (tsc in
# `check` peaked at 1 GiB on a real project whose gate declared 256M).
TOOL_MEMORY = {
    **dict.fromkeys(("tsc", "vue-tsc", "svelte-check", "jest", "vitest", "webpack"), "2G"),
    **dict.fromkeys(("next", "nuxt", "mypy", "pyright", "playwright", "cypress"), "2G"),
    **dict.fromkeys(("eslint", "vite", "rollup", "esbuild", "biome", "mocha", "tsx"), "1G"),
}


def memory_of(
    concern: str,
    text: str,
    scripts: dict[str, object],
    workspaces: dict[str, tuple[str, ...]] | None = None,
) -> str:
    """A script's memory: its concern's, or the heaviest tool it calls, whichever is more
    -- through the scripts it runs (``npm run X``, ``pnpm X``, to any depth) and, where it
    runs a script in every workspace (``pnpm -r X``, ``yarn workspaces run X``, turbo),
    through each workspace's script of that name (``workspaces``: name -> their texts)."""
    words = _words_of(text)
    seen: set[str] = set()
    while fresh := (words & set(scripts)) - seen:  # each script once: a cycle ends
        seen |= fresh
        for other in fresh:
            words |= _words_of(str(scripts[other]))
    if workspaces and words & EVERY_WORKSPACE:
        for name in words & set(workspaces):
            for each in workspaces[name]:
                words |= _words_of(each)
    sizes = [MEMORY.get(concern, "256M"), *(TOOL_MEMORY[w] for w in words if w in TOOL_MEMORY)]
    return max(sizes, key=lambda m: float(m[:-1]) * (1024 if m.endswith("G") else 1))


def _words_of(text: str) -> set[str]:
    return set(re.findall(r"[\w@/.:-]+", text))


# Words that run a script in every workspace: pnpm -r / --filter, yarn workspaces (foreach),
# npm --workspaces / -ws, turbo, lerna, nx, wireit's and ultra's runners.
EVERY_WORKSPACE = frozenset(
    {"-r", "--recursive", "--filter", "-F", "workspaces", "--workspaces", "-ws", "--ws"}
    | {"turbo", "lerna", "nx", "ultra", "wsrun"}
)


def package_json(
    project: Project,
    by_ci: frozenset[str] = frozenset(),
    ci_lines: tuple[str, ...] = (),
    tasks: frozenset[str] = frozenset(),
) -> tuple[list[Check], list[Skipped]]:
    """A gate for each script that is a check: by its name, or because CI runs it (its
    concern then read from the name's start: ``test-ci`` tests, ``lint:md`` lint); and the
    scripts that look like checks by their name's start but are not taken, with why."""
    body = project.json("package.json")
    if not isinstance(body, dict):
        return [], []
    given = body.get("scripts")
    scripts: dict[str, object] = given if isinstance(given, dict) else {}
    manager = next((pm for lock, pm in LOCKFILES if project.is_file(lock)), "npm")
    built = "build" in scripts and reads_build(project)
    found = []
    skipped: list[Skipped] = []
    taken = {CHECK_SCRIPTS[s] for s in scripts if s in CHECK_SCRIPTS}
    callers = _callers(scripts, [s for s in scripts if s in CHECK_SCRIPTS or s in by_ci - tasks])
    packages = workspace_scripts(project, body, manager)
    for script, text in scripts.items():
        concern = CHECK_SCRIPTS.get(str(script))
        head = LOOKS.get(re.split(r"[-:_.]", str(script))[0])
        if concern is None and script in by_ci - tasks:  # not ``pnpm changeset version``
            concern = head or "check"
        if not isinstance(text, str):
            continue
        if concern is None and head is not None:
            where = f"package.json scripts.{script}"
            skipped.append(
                Skipped(
                    f"js-{script.replace(':', '-')}",
                    where,
                    _why_not(text, head, taken, callers.get(script)),
                )
            )
        if concern is None:
            continue
        gate = f"js-{script.replace(':', '-')}"
        check = Check(
            id=gate,
            concern=f"js:{concern}",
            run=(manager, "run", script),
            source=f"package.json scripts.{script} ({manager}: {_lock_for(project, manager)})",
            # a script's tools read what their own configs say (eslint plugins lint markdown,
            # .eslintrc*, ignore files): only the whole tree keys it safely
            inputs=WHOLE,
            tools=("node --version", f"{manager} --version"),
            memory=memory_of(concern, text, scripts, packages),
            needs=_build_first(concern, built),
            commands=(_words(text),),
            runner=True,
        )
        found.append(runner_junit(project, check, text, manager))
    programs, left = _ci_programs(project, manager, by_ci - set(scripts), ci_lines, built)
    every, others = _ci_every_workspace(project, manager, ci_lines, scripts, packages)
    return found + programs + every, skipped + left + others


def _ci_every_workspace(
    project: Project,
    manager: str,
    ci_lines: tuple[str, ...],
    scripts: dict[str, object],
    packages: dict[str, tuple[str, ...]],
) -> tuple[list[Check], list[Skipped]]:
    """What CI runs in every workspace (``pnpm -r --no-bail test``, ``yarn workspaces run
    lint``, ``npm test --workspaces``) where the root has no script of that name: a gate
    with CI's words when the name says a check; a step CI runs before its tests whose name
    says none is the build when the packages' entry points are what a build writes
    (``reads_build``: ``pnpm -r run prepublishOnly`` compiling each ``lib/``); else listed.
    Found on a pnpm monorepo whose root has no scripts at all: init found nothing to gate."""
    found: list[Check] = []
    skipped: list[Skipped] = []
    steps = every_workspace(manager, ci_lines)
    tests = next((i for i, (s, _, _) in enumerate(steps) if CHECK_SCRIPTS.get(s) == "tests"), -1)
    taken: set[str] = set()
    for index, (script, where, words) in enumerate(steps):
        if script in scripts or script not in packages:
            continue
        gate, said = f"js-{script.replace(':', '-')}", f"`{' '.join(words)}` in CI"
        if gate in taken:  # the same script in another workspace
            gate = f"js-{re.sub(r'[^A-Za-z0-9]+', '-', where).strip('-')}-{gate[3:]}"
        taken.add(gate)
        concern = CHECK_SCRIPTS.get(script) or LOOKS.get(re.split(r"[-:_.]", script)[0])
        if concern is None and index < tests and "build" not in scripts and reads_build(project):
            gate, concern = "js-build", "build"
        if concern is None:
            place = f"workspace {where}" if where else "every workspace"
            why = f"CI runs it in {place}; its name says no check init knows"
            skipped.append(Skipped(gate, said, why))
            continue
        source = f"{said} (each workspace's scripts.{script}; {_lock_for(project, manager)})"
        found.append(
            Check(
                id=gate,
                concern=f"js:{concern}",
                run=words,
                source=source,
                inputs=WHOLE,
                tools=("node --version", f"{manager} --version"),
                memory=memory_of(concern, " ".join(words), scripts, packages),
                needs=("js-build",) if concern == "tests" else (),
                commands=(words, *(_words(text) for text in packages[script])),
                runner=True,
            )
        )
    return found, skipped


def _callers(scripts: dict[str, object], gated: list[str]) -> dict[str, str]:
    """Each script a gated one runs (``npm run check:lint`` in ``check``, or through a script
    it runs in turn) -> the first gated script, in the file's order, that runs it."""
    callers: dict[str, str] = {}
    for gate in gated:
        todo = [gate]
        while todo:
            text = scripts.get(todo.pop())
            for called in RUNS.findall(text if isinstance(text, str) else ""):
                if called in scripts and called != gate and called not in callers:
                    callers[called] = gate
                    todo.append(called)
    return callers


def _why_not(text: str, concern: str, taken: set[str], caller: str | None = None) -> str:
    """Why a script whose name says ``concern`` (``test:coverage``, ``format``) is no gate:
    a fixer; run by a gated script (``caller``); or its concern gated by another script."""
    if FIXES.search(text):
        return "it changes files (a fixer): a gate checks, never writes"
    if caller is not None:
        return f"scripts.{caller} runs it: the js-{caller.replace(':', '-')} gate runs it"
    if concern in taken:
        return (
            f"its name is no check of its own and CI does not run it; the {concern} gate "
            f"runs the {concern}"
        )
    return (
        "its name is no check init knows and CI does not run it: add it as a gate if it "
        f"checks the {concern}"
    )


def reads_build(project: Project) -> bool:
    """Whether a workspace package's entry points (``main``, ``types``, ``exports`` ...) name
    a file the repository does not have: one its build writes (``dist/``).  Each check that
    resolves one package's import of another then reads the build's output -- tests run it,
    tsc reads its declarations, type-aware and import lint rules resolve through it -- and
    in a tree without it (every worktree and integration tree) it races the build that
    deletes and writes it.  A single package's checks read its own sources, never its entry
    points; a pattern (``./*``) is not looked at."""
    have = set(project.files("*"))
    for folder in workspace_folders(project):
        body = project.json(f"{folder}/package.json")
        if not isinstance(body, dict):
            continue
        for field in ENTRY_FIELDS:
            for entry in _strings(body.get(field)):
                path = os.path.normpath(f"{folder}/{entry}")
                if "*" not in entry and not path.startswith("..") and path not in have:
                    return True
    return False


def _strings(value: object) -> list[str]:
    """Every string in ``value``: an ``exports`` map is nested by subpath and condition."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _build_first(concern: str, built: bool) -> tuple[str, ...]:
    """A script's ``needs``: tests run what the build makes; with entry points that only the
    build writes (``reads_build``), every check that reads code does -- a format check reads
    the files' text alone.  ``detect`` drops the need when there is no build gate."""
    if concern == "tests" or (built and concern not in ("format", "build")):
        return ("js-build",)
    return ()


def _ci_programs(
    project: Project,
    manager: str,
    names: frozenset[str],
    ci_lines: tuple[str, ...],
    built: bool,
) -> tuple[list[Check], list[Skipped]]:
    """What CI runs as ``yarn X`` / ``pnpm X`` where ``X`` is no script but a check program
    of ``node_modules/.bin`` (``yarn tsc``): a gate of its own, with CI's words, or the check
    is lost unsaid.  Only known checkers: ``yarn changeset publish`` is a task."""
    found = []
    skipped = []
    for name in sorted(names & set(CI_PROGRAMS)) if manager in ("yarn", "pnpm") else ():
        said = map(_words, ci_lines)
        words = next(
            (w for w in said if w[:2] == (manager, name) or w[:3] == (manager, "exec", name)), ()
        )
        if not words or any(re.search(r"[;&|<>$`]", w) for w in words):
            continue
        if not project.is_file(f"node_modules/.bin/{name}"):
            why = (
                f"node_modules/.bin/{name} is not here: install the project ({manager} "
                "install), then run dagrunner init again"
            )
            skipped.append(Skipped(f"js-{name}", f"`{' '.join(words)}` in CI", why))
            continue
        concern = CI_PROGRAMS[name]
        found.append(
            Check(
                id=f"js-{name}",
                concern=f"js:{concern}",
                run=words,
                source=f"`{' '.join(words)}` in CI (node_modules/.bin/{name}; {manager}: "
                f"{_lock_for(project, manager)})",
                inputs=WHOLE,
                tools=("node --version", f"{manager} --version"),
                memory=memory_of(concern, name, {}),
                needs=_build_first(concern, built),
            )
        )
    return found, skipped


def _words(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return tuple(text.split())


def _lock_for(project: Project, manager: str) -> str:
    """The lockfile ``manager`` reads, when the project has one."""
    found = (lock for lock, pm in LOCKFILES if pm == manager and project.is_file(lock))
    return next(found, "no lockfile")


def makefile(project: Project) -> list[Check]:
    name = next((n for n in ("GNUmakefile", "makefile", "Makefile") if project.is_file(n)), None)
    if name is None:
        return []
    text = project.text(name, errors="replace") or ""
    recipes: dict[str, list[tuple[str, ...]]] = {}
    current: list[tuple[str, ...]] | None = None
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            if line.strip():
                current.append(_words(line.strip().lstrip("@-+")))
            continue
        rule = re.match(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", line)
        current = recipes.setdefault(rule[1], []) if rule else None
    found = []
    for target, commands in recipes.items():
        concern = CHECK_SCRIPTS.get(target)
        if concern is None:
            continue
        found.append(
            Check(
                id=f"make-{target}",
                concern=f"make:{concern}",
                run=("make", target),
                source=f"{name} target {target}",
                tools=("make --version",),
                memory=MEMORY.get(concern, "256M"),
                needs=("make-build",) if concern == "tests" else (),
                commands=tuple(commands),
                runner=True,
            )
        )
    return found


def go(project: Project) -> list[Check]:
    if not project.is_file("go.mod"):
        return []
    inputs = ("**/*.go", "go.mod", "go.sum")
    tools = ("go version",)
    vet = ("go", "vet", "./...")
    return [
        Check(
            id="go-vet",
            concern="go:vet",
            run=vet,
            source="go.mod",
            inputs=inputs,
            tools=tools,
            estimate="20s",
            memory="1G",
        ),
        Check(
            id="go-test",
            concern="go:tests",
            run=("go", "test", "./..."),
            source="go.mod",
            tools=tools,
            estimate="1m",
            memory="1G",
        ),
    ]


def rust(project: Project) -> list[Check]:
    if not project.is_file("Cargo.toml"):
        return []
    tools = ("cargo --version", "rustc --version")
    clippy = ("cargo", "clippy", "--all-targets", "--", "-D", "warnings")
    inputs = ("**/*.rs", "**/Cargo.toml", "Cargo.lock")
    return [
        Check(
            id="clippy",
            concern="rust:lint",
            run=clippy,
            source="Cargo.toml",
            inputs=inputs,
            tools=tools,
            estimate="1m",
            memory="2G",
        ),
        Check(
            id="cargo-test",
            concern="rust:tests",
            run=("cargo", "test"),
            source="Cargo.toml",
            tools=tools,
            estimate="1m",
            memory="2G",
        ),
    ]
