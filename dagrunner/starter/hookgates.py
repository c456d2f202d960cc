"""A gate in a pre-commit hook's stead, which checks exactly what the hook checks.

``pre-commit run --all-files`` passes a hook every tracked file its ``files`` and
``exclude`` regexes (``re.search``; the config's top-level ones too) and its ``types``,
``types_or`` and ``exclude_types`` tags select, and runs its ``entry`` with its ``args``
(which replace the hook repository's default ``args``).  A gate that ran the tool on roots
init guessed (``mypy src``) would check less: a type error in ``tests/`` landed that way.
So the gate runs ``SELECT`` (a standard-library script, inline in the manifest): it lists
the tree's files, keeps those pre-commit would pass, and runs the hook's command on them.
The list is the one dagrunner gives (``$DAGRUNNER_PATHS``, ``process/view``: the tree's
snapshot, the tracked files and those not yet added that git does not ignore), else, run
by hand, ``git ls-files``: a gate that reads git's database cannot be keyed by what it
read (docs/cache.md), and the snapshot's paths are in its key.  A hook whose definition init does not know (another repository),
whose config it cannot read, or whose selection it cannot compute (a tag read from file
contents, such as ``text``) is not replaced: it stays in the pre-commit gate, and why is
said in the manifest.  Formatters are asked to check (``--check``) rather than rewrite: in
pre-commit they fail when they would change a file, and a gate never rewrites a tracked file.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from dagrunner.starter.checks import Check
from dagrunner.starter.readers import Project

# The definitions of the hooks init replaces, from each repository's .pre-commit-hooks.yaml
# (newest): entry, types, types_or, args (the defaults a config's `args` replace).
KNOWN: dict[tuple[str, str], dict[str, Any]] = {
    ("pre-commit/mirrors-mypy", "mypy"): {
        "entry": "mypy",
        "types_or": ["python", "pyi"],
        "args": ["--ignore-missing-imports", "--scripts-are-modules"],
    },
    **{
        ("astral-sh/ruff-pre-commit", hook): {
            "entry": "ruff check --force-exclude",
            "types_or": ["python", "pyi", "jupyter"],
        }
        for hook in ("ruff", "ruff-check")
    },
    ("astral-sh/ruff-pre-commit", "ruff-format"): {
        "entry": "ruff format --force-exclude",
        "types_or": ["python", "pyi", "jupyter"],
    },
    **{
        (repo, "black"): {"entry": "black", "types_or": ["python", "pyi"]}
        for repo in ("psf/black", "psf/black-pre-commit-mirror")
    },
    ("pycqa/isort", "isort"): {
        "entry": "isort",
        "types_or": ["cython", "pyi", "python"],
        "args": ["--filter-files"],
    },
    ("pycqa/flake8", "flake8"): {"entry": "flake8", "types": ["python"]},
    ("robertcraigie/pyright-python", "pyright"): {
        "entry": "pyright",
        "types_or": ["python", "pyi"],
    },
    ("codespell-project/codespell", "codespell"): {"entry": "codespell", "types": ["text"]},
}
# Keys of a hook that change nothing of what it checks, and those SELECT replays.
INERT = {"id", "name", "description", "alias", "language", "language_version", "stages"}
INERT |= {"verbose", "log_file", "minimum_pre_commit_version", "require_serial", "fail_fast"}
INERT |= {"additional_dependencies"}  # installed by the seed's build (``hook_needs``)
REPLAYED = {"entry", "args", "files", "exclude", "types", "types_or", "exclude_types"}
REPLAYED |= {"pass_filenames", "always_run"}
# The tags SELECT computes as pre-commit's `identify` does (by name, extension, mode, shebang).
TAGS = {"file", "executable", "non-executable", "python", "pyi", "jupyter", "cython"}

# Run as `python3 -c SELECT [--files=RE] [--exclude=RE] [--top-files=RE] [--top-exclude=RE]
# [--types=T,..] [--types-or=T,..] [--exclude-types=T,..] [--always-run] [--no-filenames]
# -- COMMAND...`: pre-commit's selection, then COMMAND on the files (in chunks, as
# pre-commit's own xargs does), failing if any chunk fails.
SELECT = r"""import os, re, stat, subprocess, sys
i = sys.argv.index("--"); opt = dict(a[2:].partition("=")[::2] for a in sys.argv[1:i]); cmd = sys.argv[i + 1:]
named = os.environ.get("DAGRUNNER_PATHS")  # the tree's paths from dagrunner: no git read
listed = open(named, "rb").read() if named else subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout
paths = [p for p in listed.decode("utf-8", "surrogateescape").split("\0") if p]
if not paths: sys.exit("dagrunner: git lists no tracked file here: nothing checked, so no pass")
def tags(path):
    try: mode = os.lstat(path).st_mode
    except OSError: return None
    if not stat.S_ISREG(mode): return {"symlink"} if stat.S_ISLNK(mode) else None
    found = {"file", "executable" if os.access(path, os.X_OK) else "non-executable"}
    name = os.path.basename(path); ext = os.path.splitext(name)[1][1:].lower()
    for tag, exts in (("python", "py pyt pyw gyp gypi tac wsgi"), ("pyi", "pyi"), ("jupyter", "ipynb"), ("cython", "pxd pxi pyx")):
        if ext in exts.split(): found.add(tag)
    if any(part in (".pdbrc", "wscript") for part in [name, *name.split(".")]): found.add("python")
    if len(found) == 2 and "executable" in found:
        with open(path, "rb") as f: line = f.readline(256)
        words = line[2:].decode("ascii", "replace").split() if line.startswith(b"#!") else []
        words = words[1:] if words[:1] == ["/usr/bin/env"] else words
        words = words[1:] if words[:1] == ["-S"] else words
        if words and re.fullmatch(r"python[23]?(\.\d+)*", words[0].rpartition("/")[2]): found.add("python")
    return found
def chosen(path):
    for key, default in (("top-files", ""), ("files", "")):
        if not re.search(opt.get(key, default), path): return False
    for key in ("top-exclude", "exclude"):
        if key in opt and re.search(opt[key], path): return False
    found = tags(path)
    if found is None: return False
    need = {t for t in opt.get("types", "file").split(",") if t}
    some = {t for t in opt.get("types-or", "").split(",") if t}
    never = {t for t in opt.get("exclude-types", "").split(",") if t}
    return need <= found and (not some or bool(some & found)) and not (never & found)
files = ["./" + p if p.startswith(("-", "@")) else p for p in paths if chosen(p)]  # a path: never an option, nor mypy's @FILE of arguments
print(f"dagrunner: {len(files)} of {len(paths)} tracked files, as pre-commit would pass them: {' '.join(cmd)}", flush=True)
if not files and "always-run" not in opt: sys.exit(0)
if "no-filenames" in opt: sys.exit(subprocess.run(cmd).returncode)
limit = min(os.sysconf("SC_ARG_MAX") // 2, 1 << 17) - sum(len(a) + 1 for a in cmd)
worst, chunk, size = 0, [], 0
for path in [*files, None]:
    if path is None or (chunk and size + len(path) + 1 > limit):
        worst = max(worst, subprocess.run([*cmd, *chunk]).returncode) if chunk or not files else worst
        chunk, size = [], 0
    if path is not None: chunk.append(path); size += len(path) + 1
sys.exit(worst)
"""


@dataclass(frozen=True)
class Replay:
    """A hook as a gate's run, or why it cannot be one."""

    run: tuple[str, ...] = ()
    why_not: str = ""


def config(project: Project) -> Mapping[str, Any] | str:
    """``.pre-commit-config.yaml`` as a mapping, or why it cannot be read."""
    text = project.text(".pre-commit-config.yaml") or ""
    try:
        found = yaml.safe_load(text)  # as pre-commit reads it (safe: no tags, no objects)
    except yaml.YAMLError as error:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"init cannot read .pre-commit-config.yaml ({why})"
    if not isinstance(found, dict) or not isinstance(found.get("repos"), list):
        return "init cannot read .pre-commit-config.yaml (no list of repos)"
    return found


def replay(found: Mapping[str, Any] | str, hook_id: str) -> Replay:
    """The run of a gate that checks what hook ``hook_id`` checks, or why there is none."""
    if isinstance(found, str):
        return Replay(why_not=found)
    hooks = [
        (repo, hook)
        for repo in found["repos"]
        if isinstance(repo, dict) and isinstance(repo.get("hooks"), list)
        for hook in repo["hooks"]
        if isinstance(hook, dict) and hook.get("id") == hook_id
    ]
    if len(hooks) != 1:
        return Replay(why_not=f"more than one hook has id {hook_id} (SKIP would skip them all)")
    repo, hook = hooks[0]
    url = str(repo.get("repo", ""))
    name = url.lower().removesuffix("/").removesuffix(".git").removeprefix("https://github.com/")
    if url == "local":
        defaults: dict[str, Any] = {}
    elif (name, hook_id) in KNOWN:
        defaults = KNOWN[name, hook_id]
    else:
        return Replay(why_not=f"its repository's hook definition is not one init knows ({url})")
    unknown = sorted(set(hook) - INERT - REPLAYED)
    if unknown:
        return Replay(why_not=f"init does not replay its {', '.join(unknown)}")
    said = {**defaults, **hook}
    top = {k: found.get(k) for k in ("files", "exclude") if found.get(k) is not None}
    return _run(said, top)


def _run(hook: Mapping[str, Any], top: Mapping[str, Any]) -> Replay:
    lists = {k: hook.get(k, []) for k in ("types", "types_or", "exclude_types", "args")}
    strings = {k: hook.get(k) for k in ("entry", "files", "exclude")}
    flags = {k: hook.get(k, k == "pass_filenames") for k in ("pass_filenames", "always_run")}
    if not all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in lists.values()):
        return Replay(why_not="its types or args are not lists of strings")
    if not all(v is None or isinstance(v, str) for v in (*strings.values(), *top.values())):
        return Replay(why_not="its entry, files or exclude is not a string")
    if not all(isinstance(v, bool) for v in flags.values()):
        return Replay(why_not="its pass_filenames or always_run is not true or false")
    tags = {*lists["types"], *lists["types_or"], *lists["exclude_types"]}
    if tags - TAGS:
        return Replay(why_not=f"init cannot compute its types {', '.join(sorted(tags - TAGS))}")
    try:
        entry = shlex.split(strings["entry"] or "")
    except ValueError:
        entry = []
    if not entry:
        return Replay(why_not="it has no entry init can split")
    options = [f"--{key}={value}" for key, value in _regexes(strings, top)]
    for key in ("types", "types_or", "exclude_types"):
        if lists[key]:
            options.append(f"--{key.replace('_', '-')}={','.join(lists[key])}")
    options += ["--always-run"] * flags["always_run"] + ["--no-filenames"] * (
        not flags["pass_filenames"]
    )
    command = checking([*entry, *lists["args"]])
    return Replay(run=("python3", "-c", SELECT, *options, "--", *command))


def _regexes(strings: Mapping[str, Any], top: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = [(f"top-{k}", str(v)) for k, v in top.items() if v not in ("", "^$")]
    own = [k for k in ("files", "exclude") if strings[k] not in (None, "", "^$")]
    return found + [(k, str(strings[k])) for k in own]


def checking(command: list[str]) -> list[str]:
    """``command`` asked to check where it would rewrite (pre-commit fails a hook that
    changes a file; a gate must not change one): formatters ``--check``, ruff ``--no-fix``."""
    program = command[0].rpartition("/")[2]
    words = command[1:]
    if program == "ruff" and "format" in words and "--check" not in words:
        return [*command, "--check"]
    if program == "ruff":
        return [command[0], *("--no-fix" if w == "--fix" else w for w in words)]
    if program == "black" and "--check" not in words:
        return [*command, "--check"]
    if program == "isort" and "--check-only" not in words and "-c" not in words:
        return [*command, "--check-only"]
    return command


def hooks(project: Project) -> tuple[str, ...]:
    """The hook ids of ``.pre-commit-config.yaml``, in order."""
    text = project.text(".pre-commit-config.yaml") or ""
    return tuple(dict.fromkeys(re.findall(r"^\s*-?\s*id:\s*([\w.-]+)", text, re.MULTILINE)))


def hook_needs(project: Project, hook: str, program: str) -> tuple[str, ...]:
    """What the pre-commit hook ``hook`` installs beside its tool (``program``), which a gate
    that runs the tool in its stead needs too: its ``additional_dependencies`` (mypy's: the
    packages it type-checks against), and ``program`` itself, pinned to the hook repo's
    ``rev`` when that is a version (``v1.13.0``, or ``# frozen: v1.13.0``).  Read by lines,
    as ``ci`` reads workflows: a flow list (``[a, b]``) or a block list (``- a``)."""
    lines = (project.text(".pre-commit-config.yaml") or "").splitlines()
    rev = ""
    for n, line in enumerate(lines):
        if said := re.match(
            r"\s*-?\s*rev:\s*['\"]?([^\s'\"#]+)['\"]?\s*(?:#\s*frozen:\s*(\S+))?", line
        ):
            rev = said[2] or said[1]
        found = re.match(r"(\s*)-\s*id:\s*['\"]?([\w.-]+)", line)
        if found is None or found[2] != hook:
            continue
        pinned = re.fullmatch(r"v?(\d+(?:\.\d+)+)", rev)
        return (f"{program}=={pinned[1]}" if pinned else program, *_listed(lines, n, found[1]))
    return ()


def _listed(lines: list[str], start: int, indent: str) -> list[str]:
    """The ``additional_dependencies`` of the hook whose ``- id:`` is line ``start``."""
    items: list[str] = []
    for n in range(start + 1, len(lines)):
        line = lines[n].split(" #", 1)[0].rstrip()
        if line.strip() and len(line) - len(line.lstrip()) <= len(indent):
            break  # the next hook, or the next repo
        key = re.match(r"(\s*)additional_dependencies:\s*(?:&\S+)?\s*(.*)$", line)
        if key is None:
            continue
        if key[2].startswith("["):  # a flow list, maybe over several lines
            flow = " ".join([key[2], *lines[n + 1 : n + 20]])
            items = flow[1 : flow.find("]")].split(",") if "]" in flow else []
        for body in lines[n + 1 :] if not key[2] else ():
            entry = re.match(r"(\s*)-\s*(.+)$", body.split(" #", 1)[0])
            if entry is None or len(entry[1]) <= len(key[1]):
                break
            items.append(entry[2])
        break
    return [i.strip().strip("'\"") for i in items if i.strip().strip("'\"")]


def pre_commit(project: Project) -> list[Check]:
    if not project.is_file(".pre-commit-config.yaml"):
        return []
    listed = hooks(project)
    return [
        Check(
            id="pre-commit",
            concern="any:hooks",
            run=("pre-commit", "run", "--all-files", "--show-diff-on-failure"),
            source=f".pre-commit-config.yaml (hooks: {', '.join(listed[:12]) or 'none listed'})",
            tools=("pre-commit --version",),
            estimate="1m",
            memory="1G",
            commands=tuple((h,) for h in listed),
            runner=True,
        )
    ]
