"""A JavaScript project's ``node_modules`` as a seed, proposed from its lockfile: without one,
worktrees have no ``node_modules`` and every integration gate fails ``command not found``
(``tsc``, exit 127), or the package manager installs everything inside every gate.

The lockfile names the package manager (``pnpm-lock.yaml``, ``yarn.lock`` -- berry when
``.yarnrc.yml`` is there or the lockfile has ``__metadata`` -- and ``package-lock.json``);
the workspaces (``pnpm-workspace.yaml``'s ``packages``, ``package.json``'s ``workspaces``)
name every other ``node_modules`` the one install makes (``also``), and so do the root's
install hooks that install another folder (``postinstall: pnpm --dir build install``).  The build installs
exactly the lockfile, with the package manager's store (and pnpm's cache) in
``$DAGRUNNER_SEED_STORE``, a folder that outlives the build (docs/worktrees.md, "Node seeds").  Yarn berry's Plug'n'Play makes
no ``node_modules``: its seed is written commented out, with what to set.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import yaml

from dagrunner.starter.checks import Seed
from dagrunner.starter.readers import Project
from dagrunner.starter.venvs import ignored_by_rules

STORE = '"$DAGRUNNER_SEED_STORE"'
BUILDS = {
    # pnpm's cache (each package's metadata, and the lockfile's verification against
    # minimumReleaseAge and trust policies, which fetches every entry's metadata) beside its
    # store: in the build's temporary HOME it was lost, and every build asked the registry.
    # Both in the environment, not flags: a pnpm the install's scripts run (preconstruct's
    # ``postinstall: pnpm --dir build install``) gets them too
    "pnpm": f"pnpm_config_store_dir={STORE} "
    'pnpm_config_cache_dir="$DAGRUNNER_SEED_STORE/cache" pnpm install --frozen-lockfile',
    "npm": f"npm ci --no-audit --no-fund --cache {STORE}",
    "yarn": f"yarn install --frozen-lockfile --non-interactive --cache-folder {STORE}",
    # no lockfile (``package-lock=false``): what package.json allows, resolved at the build
    "npm-unlocked": f"npm install --no-audit --no-fund --no-package-lock --cache {STORE}",
    # berry: its global cache is the store (enableGlobalCache is its default since 4)
    "yarn-berry": f"YARN_GLOBAL_FOLDER={STORE} YARN_ENABLE_GLOBAL_CACHE=true "
    "yarn install --immutable",
}
LOCKS = (("pnpm-lock.yaml", "pnpm"), ("yarn.lock", "yarn"), ("package-lock.json", "npm"))
CONFIGS = (".npmrc", ".pnpmfile.cjs", ".yarnrc", ".yarnrc.yml", "pnpm-workspace.yaml")
MAX_WORKSPACES = 64
INSTALL_HOOKS = ("preinstall", "install", "postinstall", "prepare")  # run by the install


def node_seed(project: Project) -> Seed | None:
    """The ``node_modules`` seed of the project's lockfile, if it has ``package.json`` and
    one.  An npm project without one (``package-lock=false``) cannot install the same twice:
    its seed is written commented out, with why; None otherwise."""
    body = project.json("package.json")
    if not isinstance(body, dict):
        return None
    lock, manager = next(((f, m) for f, m in LOCKS if project.is_file(f)), ("", ""))
    why_off = ""
    if not lock:
        if not _npm_unlocked(project, body):
            return None
        lock, manager = "package.json", "npm-unlocked"
        why_off = (
            "no lockfile (npm, package-lock=false): each build installs what package.json "
            "allows on that day, so a tree may get other versions than your checkout; "
            "uncomment to use it, or commit a lockfile"
        )
    if manager == "yarn" and _berry(project, lock):
        manager = "yarn-berry"
        linker = re.search(
            r"^nodeLinker:\s*['\"]?([\w-]+)", project.text(".yarnrc.yml") or "", re.M
        )
        if linker is None or linker[1] != "node-modules":
            why_off = (
                "yarn berry's Plug'n'Play makes no node_modules: set `nodeLinker: node-modules` "
                "in .yarnrc.yml to use this seed"
            )
    workspaces = _workspaces(project, body, manager)
    nested = [d for d in installed_too(project, body) if d not in workspaces]
    also = tuple(f"{w.rstrip('/')}/node_modules" for w in [*workspaces, *nested])
    key = (
        lock,
        "package.json",
        *(f"{w.rstrip('/')}/package.json" for w in workspaces),
        *(
            f"{d}/{f}"
            for d in nested
            for f in ("package.json", *dict(LOCKS))
            if project.is_file(f"{d}/{f}")
        ),
        *(c for c in CONFIGS if project.is_file(c)),
        *(f"{d}/**" for d in ("patches", ".yarn/patches") if project.files(f"{d}/*")),
    )
    program = manager.partition("-")[0]
    ignored = all(
        ignored_by_rules(project.root, f"{d}/node_modules")
        for d in [".", *_folders(project, workspaces)]
    )
    said = (
        f"from {lock}: each worktree and integration tree gets its own node_modules"
        + (" (every workspace's)" if also else ""),
        f"installed once per {'lockfile' if lock != 'package.json' else 'package.json set'} by "
        f"{program}, its store kept outside the tree, so gates",
        f"run the tree's programs and {program} installs nothing in them (docs/worktrees.md)",
    )
    return Seed(
        path="node_modules",
        key=tuple(dict.fromkeys(key)),
        build=BUILDS[manager],
        ignored=ignored,
        tools=("node --version", f"{program} --version"),
        also=also,
        store=program,
        why_off=why_off,
        said=said,
    )


def installed_too(project: Project, body: dict[str, Any]) -> list[str]:
    """The folders the root's install hooks install as well (``postinstall: pnpm --dir build
    install``, ``cd tools && yarn``, ``npm --prefix x ci``): their ``node_modules`` is the
    install's as much as the workspaces', and a tree without it fails where the checkout
    passes (preconstruct's build runs ``build/node_modules/@preconstruct/cli``)."""
    scripts = body.get("scripts")
    found: list[str] = []
    for hook in INSTALL_HOOKS:
        text = scripts.get(hook) if isinstance(scripts, dict) else None
        here = "."
        for command in re.split(r"&&|\|\||;", text if isinstance(text, str) else ""):
            words = command.split()
            if words[:1] == ["cd"] and len(words) == 2:
                here = os.path.normpath(os.path.join(here, words[1]))
                continue
            folder = _install_folder(words)
            if folder is None:
                continue
            folder = os.path.normpath(os.path.join(here, folder))
            if (
                folder != "."
                and not folder.startswith(("..", "/"))
                and project.is_file(f"{folder}/package.json")
            ):
                found.append(folder)
    return list(dict.fromkeys(found))


def _install_folder(words: list[str]) -> str | None:
    """The folder ``words`` install in (``.``: where they run), None for no install."""
    if not words or words[0] not in ("pnpm", "npm", "yarn"):
        return None
    folder, rest, options = ".", words[1:], {"--dir", "-C", "--prefix", "--cwd"}
    commands = []
    for i, word in enumerate(rest):
        flag, eq, value = word.partition("=")
        if flag in options:
            folder = value if eq else (rest[i + 1] if i + 1 < len(rest) else folder)
        elif not word.startswith("-") and (i == 0 or rest[i - 1] not in options):
            commands.append(word)
    if commands[:1] in (["install"], ["i"], ["ci"]) or (words[0] == "yarn" and not commands):
        return folder
    return None


def workspace_folders(project: Project) -> list[str]:
    """The project's workspace folders there are now ([] for a single package)."""
    body = project.json("package.json")
    if not isinstance(body, dict):
        return []
    manager = "pnpm" if project.is_file("pnpm-workspace.yaml") else "npm"
    return _folders(project, _workspaces(project, body, manager))


def _npm_unlocked(project: Project, body: dict[str, Any]) -> bool:
    """An npm project that installs dependencies but keeps no lockfile (another package
    manager always writes one, and committing it is its projects' habit)."""
    wanted = any(body.get(k) for k in ("dependencies", "devDependencies", "optionalDependencies"))
    other = str(body.get("packageManager") or "npm").partition("@")[0]
    return wanted and other == "npm"


def _berry(project: Project, lock: str) -> bool:
    head = (project.text(lock, errors="replace") or "")[:4096]
    return project.is_file(".yarnrc.yml") or "__metadata:" in head


def _workspaces(project: Project, body: dict[str, Any], manager: str) -> list[str]:
    """The workspace globs, negations left out (``!**/test/**``)."""
    found: Any = None
    if manager == "pnpm":
        try:
            said = yaml.safe_load(project.text("pnpm-workspace.yaml") or "") or {}
        except yaml.YAMLError:
            said = {}
        found = said.get("packages") if isinstance(said, dict) else None
    else:
        found = body.get("workspaces")
        if isinstance(found, dict):
            found = found.get("packages")
    if not isinstance(found, list):
        return []
    kept = [w.removeprefix("./") for w in found if isinstance(w, str) and w.strip()]
    kept = [w for w in kept if not w.startswith(("!", "/")) and ".." not in w and w != "."]
    return list(dict.fromkeys(kept))[:MAX_WORKSPACES]


def workspace_scripts(
    project: Project, body: dict[str, Any], manager: str
) -> dict[str, tuple[str, ...]]:
    """Each script name of the workspaces' ``package.json`` files -> their texts."""
    found: dict[str, list[str]] = {}
    for folder in _folders(project, _workspaces(project, body, manager)):
        package = project.json(f"{folder}/package.json")
        scripts = package.get("scripts") if isinstance(package, dict) else None
        for name, text in scripts.items() if isinstance(scripts, dict) else ():
            if isinstance(text, str):
                found.setdefault(str(name), []).append(text)
    return {name: tuple(texts) for name, texts in found.items()}


def _folders(project: Project, workspaces: list[str]) -> list[str]:
    """The workspace folders there are now (each one's ``node_modules`` must be ignored)."""
    found: list[str] = []
    for pattern in workspaces:
        found += sorted(glob.glob(pattern, root_dir=project.root))[:MAX_WORKSPACES]
    return [f for f in found if (project.root / f).is_dir()]
