"""Tool fingerprints remembered by the identity of what they fingerprint.

A gate's ``tools`` commands run on every run, a fully cached one too, and
``python -m pip freeze`` alone costs about half a second.  Two shapes of
command are remembered instead, because what their output depends on can be
read without running them:

- a version query: the executable and options only (``ruff --version``,
  ``python -V``), or a Python module and options only (``python -m pytest --version``);
- a Python package listing: ``python -m pip freeze|list`` with options only;
- a node script's version query (``npm --version``): the script, node, and its package's
  ``package.json``.

A ``-m`` form is remembered only when the working folder holds no file or folder of the
module's top-level name: Python would run that one first.

The identity is the executable the command resolves to on the gate's PATH
(path, size, mtime, inode; a pyenv shim is followed to the version it selects,
from ``PYENV_VERSION``, a ``.python-version`` file or pyenv's global version
file), the interpreter named by a script's ``#!`` line, and -- when that is a
Python of this environment, or of a virtualenv that does not see the system's packages --
the distributions installed in its site-packages (their metadata directories, with
``mtime``).  The command runs
again whenever any part differs.  Anything else -- a file argument, ``sh -c``,
a shell-script tool, another Python (not a virtualenv's), a PYTHONPATH --
runs every time.  Entries are signed with the cache store's key, so a gate that
writes into the cache cannot plant one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import site
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from dagrunner.files import open_regular, read_regular

if TYPE_CHECKING:
    from dagrunner.engine.cache import Store
    from dagrunner.executors.base import Fingerprint

PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
NODE = re.compile(r"node(js)?")
PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "PYENV_DIR")
METADATA = (".dist-info", ".egg-info", ".egg-link", ".pth")

TOOL_TIMEOUT = 30.0
CONFIG_LIMIT = 1024 * 1024  # a pyvenv.cfg or .python-version larger than this is not read
TOOL_TEXT_KEPT = 64 * 1024  # of a tool's output, kept beside its hash: explain says what differs

Run = Callable[[], tuple[str, str]]


def remembered(
    command: str, env: Mapping[str, str], cwd: Path, run: Run, store: Store
) -> tuple[str, str]:
    """``run()``'s fingerprint of ``command``, or the one remembered for the same identity
    (signed into ``store``)."""
    identity = command_identity(command, env, cwd)
    if identity is None:
        return run()
    name = hashlib.sha256(orjson.dumps([command, sorted(env.items()), str(cwd)])).hexdigest()
    path = store.root / "tools" / f"{name}.json"
    known = store.verified(path)
    if known is not None and known.get("identity") == identity:
        digest, text = known.get("digest"), known.get("text")
        if isinstance(digest, str) and isinstance(text, str):
            return digest, text
    digest, text = run()
    if command_identity(command, env, cwd) == identity:  # nothing changed while it ran
        store.sign_to(path, {"identity": identity, "digest": digest, "text": text})
    return digest, text


def remembering(repo: Path, store: Store, writable: tuple[str, ...]) -> Fingerprint:
    """Tool fingerprints in ``repo``, remembered by identity in ``store``."""
    from dagrunner.process.command import tool_fingerprint

    def fingerprint(command: str, env: Mapping[str, str]) -> tuple[str, str]:
        return remembered(
            command,
            env,
            repo,
            lambda: tool_fingerprint(command, env, repo, hide=store.root, writable=writable),
            store,
        )

    return fingerprint


def command_identity(command: str, env: Mapping[str, str], cwd: Path) -> str | None:
    """What ``command``'s output depends on, read without running it; None when unknown."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if not argv or not _remembered_shape(argv) or any(k in env for k in PYTHON_ENV):
        return None
    parts: list[Any] = [argv]
    exe = _resolve(argv[0], env, cwd, parts)
    if exe is None:
        return None
    interpreter = _interpreter(exe, env, cwd, parts)
    if interpreter is None:
        return None
    if argv[1:2] == ["-m"] and _shadowed(argv[2], cwd):
        return None
    if PYTHON.fullmatch(Path(interpreter).name):
        packages = _site_identity(interpreter)
        if packages is None:
            return None
        parts.append(packages)
    elif argv[1:2] == ["-m"]:
        return None  # "-m pip" of something that is not a Python
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()


MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _remembered_shape(argv: list[str]) -> bool:
    args = argv[1:]
    if all(a.startswith("-") and a != "-c" for a in args):
        return bool(args)  # a version query
    options = args[2:]
    if (
        args[:1] == ["-m"]
        and options
        and MODULE.fullmatch(args[1])
        and all(a.startswith("-") and a != "-c" for a in options)
    ):
        return True  # a module's version query: python -m pytest --version
    return (
        args[:2] == ["-m", "pip"]
        and args[2:3] in (["freeze"], ["list"])
        and all(a.startswith("-") for a in args[3:])
    )


def _shadowed(module: str, cwd: Path) -> bool:
    """Whether ``python -m module`` run in ``cwd`` may find it there first."""
    top = module.split(".")[0]
    return (cwd / f"{top}.py").exists() or (cwd / top).exists()


def _stat(path: str) -> list[Any]:
    info = os.stat(path)
    return [path, info.st_size, info.st_mtime_ns, info.st_ino, info.st_dev]


def _resolve(name: str, env: Mapping[str, str], cwd: Path, parts: list[Any]) -> str | None:
    """The executable ``name`` runs, with a pyenv shim followed; None when it cannot be known."""
    if "/" in name:
        found: str | None = str(cwd / name) if not name.startswith("/") else name
        if found is None or not os.access(found, os.X_OK):
            return None
    else:
        found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        return None
    found = os.path.abspath(found)
    try:
        parts.append(_stat(found))
        if Path(found).parent.name == "shims":
            return _pyenv_target(Path(found), env, cwd, parts)
        return found
    except OSError:
        return None


def _pyenv_target(shim: Path, env: Mapping[str, str], cwd: Path, parts: list[Any]) -> str | None:
    """The program a pyenv shim runs: the first selected version that has it."""
    root = shim.parent.parent
    if not (root / "versions").is_dir() or b"pyenv" not in _head(shim, 4096):
        return None
    selected = env.get("PYENV_VERSION")
    source = "PYENV_VERSION"
    if not selected:
        for folder in [cwd, *cwd.parents]:
            candidate = folder / ".python-version"
            if candidate.is_file():
                selected, source = _text(candidate), str(candidate)
                break
        else:
            global_file = root / "version"
            if not global_file.is_file():
                return None  # "system": whatever the rest of PATH holds
            selected, source = global_file.read_text(), str(global_file)
    versions = [v for v in re.split(r"[\s:]+", selected) if v and not v.startswith("#")]
    parts.append([source, versions])
    for version in versions:
        if version == "system" or "/" in version or version.startswith("."):
            return None
        program = root / "versions" / version / "bin" / shim.name
        if program.is_file():
            parts.append(_stat(str(program)))
            return str(program)
    return None


def _head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of the regular file ``path`` (a tree's venv may have built it:
    ``open_regular``, never a FIFO)."""
    with open_regular(path, follow=True) as (fd, _info):
        return os.read(fd, size)


def _text(path: Path) -> str:
    return read_regular(path, limit=CONFIG_LIMIT, follow=True).decode("utf-8", "replace")


def _interpreter(exe: str, env: Mapping[str, str], cwd: Path, parts: list[Any]) -> str | None:
    """``exe`` itself when it is a binary; the interpreter of its ``#!`` line when that is a
    Python; None otherwise (a shell script can depend on anything)."""
    try:
        head = _head(Path(exe), 256)  # a tree's venv may have built it
    except OSError:
        return None
    if head.startswith(b"\x7fELF"):
        return exe
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if words[:1] == ["/usr/bin/env"] and len(words) == 2:
        target = _resolve(words[1], env, cwd, parts)
    elif len(words) == 1:
        target = words[0]
        try:
            parts.append(_stat(target))
        except OSError:
            return None
    else:
        return None
    if target is not None and NODE.fullmatch(Path(target).name):
        # a node script (npm, npx, eslint...): what it prints follows from its package's
        # manifest beside it, which every install or upgrade rewrites
        package = _package_json(Path(os.path.realpath(exe)))
        if package is None:
            return None
        parts.append(_stat(str(package)))
        return target
    if target is None or not PYTHON.fullmatch(Path(target).name):
        return None
    return target


def _package_json(script: Path) -> Path | None:
    """The ``package.json`` of the package a node script belongs to (None: not in one)."""
    for folder in list(script.parents)[:6]:
        if (folder / "package.json").is_file():
            return folder / "package.json"
    return None


def _site_identity(interpreter: str) -> list[Any] | None:
    """The installed distributions of ``interpreter``'s environment: this one's, or a
    virtualenv's that does not see the system's packages (None: another Python)."""
    if Path(interpreter).parent == Path(sys.executable).parent:
        folders = sorted({*site.getsitepackages(), site.getusersitepackages()})
        return [_listing(folder) for folder in folders]
    venv = Path(interpreter).parent.parent
    try:
        config = _text(venv / "pyvenv.cfg")
    except OSError:
        return None
    settings = dict(
        (k.strip().lower(), v.strip())
        for k, _, v in (line.partition("=") for line in config.splitlines())
    )
    if settings.get("include-system-site-packages", "false").lower() != "false":
        return None  # it sees the system's packages too: not known from here
    folders = sorted(str(p) for p in venv.glob("lib*/python*/site-packages"))
    return [config, *(_listing(folder) for folder in folders)] if folders else None


def _listing(folder: str) -> list[Any]:
    try:
        with os.scandir(folder) as entries:
            listed = sorted(
                [e.name, e.stat().st_mtime_ns] for e in entries if e.name.endswith(METADATA)
            )
        return [folder, os.stat(folder).st_mtime_ns, *listed]
    except OSError:
        return [folder, None]
