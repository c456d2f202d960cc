"""Programs a repository's config can name for git to run on file contents -- merge drivers
(``merge.<name>.driver``) and filters (``filter.<name>.clean``, ``.smudge``, ``.process``) --
turned off for every git dagrunner runs.

A tree's ``.gitattributes`` picks a driver by name; the command comes from the repository's
config, which a worker running beside the repository can write.  A worker that planted
``merge.evil.driver`` and sent an envelope with ``* merge=evil`` would otherwise run code in
the integrator's ``git apply --3way``, outside every sandbox (and a ``filter.evil.smudge`` in
its checkouts).  So each defined driver is overridden on the command line: a merge driver
becomes ``false`` (the file conflicts), a filter ``cat`` (content passes through unchanged),
a long-running filter process nothing.  The names are read with ``git config`` and
remembered while the config files are unchanged (their size, time and inode; run by this
module itself with the helper's environment, since the helper cannot call itself); a config
with ``include`` directives is read again every time, since an included file may change.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

DRIVER = re.compile(r"^(merge|filter)\.(.+)\.(driver|clean|smudge|process)$", re.IGNORECASE)
INCLUDE = re.compile(r"^include(if\..+)?\.path$", re.IGNORECASE)
SAFE = {"merge": {"driver": "false"}, "filter": {"clean": "cat", "smudge": "cat", "process": ""}}

_remembered: dict[tuple[object, ...], tuple[tuple[str, str], ...]] = {}
REMEMBERED = 256  # entries kept at most (each a git dir's config files as last seen)
_lock = threading.Lock()


def _given_git_dir(args: Sequence[str]) -> str | None:
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--git-dir"), None)


def _git_dirs(cwd: Path, args: Sequence[str]) -> tuple[Path, Path] | None:
    """(the git dir, the common git dir) that git run in ``cwd`` with ``args`` uses."""
    given = _given_git_dir(args)
    if given is not None:
        git_dir = Path(given) if Path(given).is_absolute() else cwd / given
    else:
        for folder in (cwd, *cwd.parents):
            dot = folder / ".git"
            if dot.is_dir():
                git_dir = dot
                break
            if dot.is_file():
                text = dot.read_text(errors="replace").strip()
                if not text.startswith("gitdir:"):
                    return None
                linked = Path(text[len("gitdir:") :].strip())
                git_dir = linked if linked.is_absolute() else folder / linked
                break
            if (folder / "HEAD").is_file() and (folder / "objects").is_dir():
                git_dir = folder  # a bare repository, or a git dir itself
                break
        else:
            return None
    common = git_dir
    pointer = git_dir / "commondir"
    if pointer.is_file():
        named = Path(pointer.read_text(errors="replace").strip())
        common = named if named.is_absolute() else git_dir / named
    return git_dir, common


def _stamp(paths: Sequence[Path]) -> tuple[object, ...]:
    stamp: list[object] = []
    for path in paths:
        try:
            st = path.stat()
            stamp.append((str(path), st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            stamp.append((str(path), None))
    return tuple(stamp)


def _read(
    cwd: Path, args: Sequence[str], env: Mapping[str, str]
) -> tuple[list[tuple[str, str]], bool]:
    """The overrides for every driver defined in the config git reads there; whether the
    config includes other files."""
    given = _given_git_dir(args)
    where = ["--git-dir", given] if given is not None else []
    done = subprocess.run(
        ["git", *where, "config", "--includes", "--null", "--list"],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        check=False,
        start_new_session=True,  # a group signal must not leave the drivers unread
    )
    overrides: dict[str, str] = {}
    includes = False
    for entry in done.stdout.split(b"\0"):
        key = entry.split(b"\n", 1)[0].decode("utf-8", "replace")
        includes = includes or bool(INCLUDE.match(key))
        found = DRIVER.match(key)
        if found:
            section, name = found.group(1).lower(), found.group(2)
            for field, value in SAFE[section].items():
                overrides[f"{section}.{name}.{field}"] = value
    return sorted(overrides.items()), includes


def neutral_drivers(
    cwd: Path, args: Sequence[str], env: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """(key, value) settings that turn off every driver the config defines for git run in
    ``cwd`` with ``args``; nothing outside a repository."""
    dirs = _git_dirs(cwd.resolve(), args) if cwd.exists() else None
    if dirs is None:
        return ()
    git_dir, common = dirs
    stamp = _stamp([common / "config", git_dir / "config.worktree"])
    with _lock:
        known = _remembered.get(stamp)
    if known is not None:
        return known
    overrides, includes = _read(cwd, args, env)
    found = tuple(overrides)
    if not includes:
        with _lock:
            if len(_remembered) >= REMEMBERED:  # one per worktree: a service sees thousands
                _remembered.clear()
            _remembered[stamp] = found
    return found


def with_overrides(env: dict[str, str], overrides: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``env`` (made by ``git_env``) with ``overrides`` appended to its GIT_CONFIG_* list."""
    count = int(env.get("GIT_CONFIG_COUNT", "0"))
    for i, (key, value) in enumerate(overrides, start=count):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    env["GIT_CONFIG_COUNT"] = str(count + len(overrides))
    return env
