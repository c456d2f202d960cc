"""A Python project's venv as a seed (``[[worktrees.seed]]``): what worktrees and integration
trees need to import the project at all.

A venv in the checkout (``.venv``, ``venv``, or the caller's ``VIRTUAL_ENV`` when it is
inside) that imports the project in place (an editable install: a ``direct_url.json``
marked editable, PEP 610, or a ``.pth`` naming a folder of the checkout) is what the
project's gates ran with here.  Integration gates never see the checkout, so without a seed
of their own every import of the project fails there.  The seed's build makes the same
venv: the project installed editable, and every other distribution of that venv pinned to
its version (those installed from a local path or a VCS are named, not pinned) -- but a
poetry or uv project's is its own install from its lock (``poetry install``, ``uv sync
--locked``, where the tool is on PATH), as its CI builds it: pins taken from the checkout's
venv would ignore a worker's lock change, and gate it with the old versions.  It is
written active where git ignores the folder (a seed must be ignored), commented out with
what to do otherwise.  The venv is the caller's own folder, read bounded; nothing is run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from dagrunner.git.command import git
from dagrunner.starter.checks import Seed

NAMES = (".venv", "venv")
KEYS = ("pyproject.toml", "setup.cfg", "setup.py", "uv.lock", "poetry.lock", "pdm.lock")
TOOLING = {"pip", "setuptools", "wheel"}  # the venv's own: `python -m venv` brings pip
MAX_DISTS = 2000


@dataclass(frozen=True)
class Locked:
    """How a lockfile's own tool installs the project into the seed's venv (``{rel}``, made
    by ``python3 -m venv`` first), and what a hook needs besides after it."""

    tool: str
    command: str  # what the project's guide runs, as said in the manifest's note
    install: str
    pip: str


LOCKED = {
    "poetry.lock": Locked(
        "poetry",
        "poetry install",
        'VIRTUAL_ENV="$PWD/{rel}" poetry install --no-interaction',
        "{rel}/bin/python -m pip install -q",
    ),
    "uv.lock": Locked(
        "uv",
        "uv sync --locked",
        'UV_PROJECT_ENVIRONMENT="$PWD/{rel}" uv sync --locked --python {rel}/bin/python',
        "uv pip install -q --python {rel}/bin/python",
    ),
}


def venv_seed(
    root: Path, env: Mapping[str, str] | None = None, extra: tuple[str, ...] = ()
) -> Seed | None:
    """The seed of the venv that imports the project at ``root`` in place, if there is one;
    its build installs ``extra`` too (requirements a gate's tool needs: a pre-commit hook's
    ``additional_dependencies``), each but those the venv has already."""
    env = os.environ if env is None else env
    root = root.resolve()
    candidates = [root / name for name in NAMES]
    with contextlib.suppress(OSError, ValueError):
        active = Path(env.get("VIRTUAL_ENV", "")).resolve()
        if env.get("VIRTUAL_ENV") and root in active.parents:
            candidates.insert(0, active)
    for venv in candidates:
        if (venv / "pyvenv.cfg").is_file() and not venv.is_symlink() and in_place(venv, root):
            return _seed(root, venv, *_pins(venv), extra)
    return None


def in_place(venv: Path, root: Path) -> Path | None:
    """The folder of ``root`` that ``venv`` imports in place (an editable install's
    ``direct_url.json``, or a ``.pth`` line), if any: what only this checkout provides."""
    root = root.resolve()
    for site in sorted(venv.glob("lib/python*/site-packages")):
        for info in sorted(site.glob("*.dist-info"))[:MAX_DISTS]:
            url = _direct_url(info, editable=True)
            if url is not None and _inside(url, root):
                return url
        for pth in sorted(site.glob("*.pth"))[:MAX_DISTS]:
            with contextlib.suppress(OSError, ValueError):
                for line in pth.read_text(errors="replace")[:65536].splitlines():
                    if line.startswith("/") and _inside(Path(line.strip()), root):
                        return Path(line.strip())
    return None


def _pins(venv: Path) -> tuple[list[str], list[str]]:
    """``name==version`` of each distribution of ``venv`` but its tooling and those
    installed from a folder or a URL (those named apart: they cannot be pinned here; the
    project's own editable install is made by the build itself)."""
    pinned: list[str] = []
    unpinned: list[str] = []
    for site in sorted(venv.glob("lib/python*/site-packages")):
        for info in sorted(site.glob("*.dist-info"))[:MAX_DISTS]:
            name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
            if _direct_url(info, editable=True) is not None:
                continue  # in place: the project (or another checkout's), not a pin
            if _direct_url(info) is not None:
                unpinned.append(name)
            elif name and version and name.lower() not in TOOLING:
                pinned.append(f"{name}=={version}")
    return pinned, unpinned


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503): ``Typing_Extensions>=4``
    is ``typing-extensions``."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    return re.sub(r"[-_.]+", "-", name[0]).lower() if name else requirement


def _direct_url(info: Path, *, editable: bool = False) -> Path | None:
    """Where a distribution was installed from, when not from an index (PEP 610); with
    ``editable``, only a folder it is imported from in place."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        said = orjson.loads((info / "direct_url.json").read_bytes()[:65536])
        url = str(said.get("url", ""))
        if editable and not said.get("dir_info", {}).get("editable"):
            return None
        if url.startswith("file://"):
            return Path(urllib.parse.unquote(url.removeprefix("file://")))
        if url:
            return Path("/")  # a VCS or an archive: not pinnable by name and version
    return None


def _inside(path: Path, root: Path) -> bool:
    with contextlib.suppress(OSError, ValueError):
        path = path.resolve()
        return path == root or root in path.parents
    return False


def _seed(
    root: Path, venv: Path, pinned: list[str], unpinned: list[str], extra: tuple[str, ...]
) -> Seed:
    rel = venv.relative_to(root).as_posix()
    has = {_name(p) for p in (*pinned, *unpinned)}
    more = "".join(f" {shlex.quote(e)}" for e in dict.fromkeys(extra) if _name(e) not in has)
    note = f"installed from elsewhere, not pinned here: {', '.join(unpinned)}" if unpinned else ""
    key = tuple(k for k in KEYS if (root / k).is_file()) or ("pyproject.toml",)
    tools: tuple[str, ...] = ("python3 --version",)
    lock = next((k for k in LOCKED if (root / k).is_file()), None)
    locked = LOCKED[lock] if lock else None
    if locked is not None and shutil.which(locked.tool):
        # the project's own install, from its lock: a worker's lock change is what it gates
        build = f"python3 -m venv {rel} && {locked.install.format(rel=rel)}"
        build += f" && {locked.pip.format(rel=rel)}{more}" if more else ""
        tools = ("python3 --version", f"{locked.tool} --version")
    else:
        build = f"python3 -m venv {rel} && {rel}/bin/python -m pip install -q -e ."
        build += "".join(f" {p}" for p in pinned) + more
        if locked is not None:
            off = (
                f"{lock} is not followed: `{locked.tool}` is not on PATH here, so this build "
                "pins what the venv holds now and a change of the lock rebuilds the same venv; "
                f"put {locked.tool} on PATH and run init again to build it with "
                f"`{locked.command}`"
            )
            note = "; ".join(n for n in (note, off) if n)
        elif (root / "pdm.lock").is_file():  # no build from it written yet: say so
            off = "pdm.lock is not followed: this build pins what the venv holds now"
            note = "; ".join(n for n in (note, off) if n)
    said = (
        f"from {rel}: it imports this project in place; each worktree and integration",
        "tree gets its own venv built so (docs/worktrees.md), or their gates cannot import it",
    )
    ignored = ignored_by_rules(root, rel)
    return Seed(path=rel, key=key, build=build, ignored=ignored, note=note, tools=tools, said=said)


def ignored_by_rules(root: Path, rel: str) -> bool:
    """Whether the ignore rules a fresh checkout has cover the folder ``rel``: not a
    ``.gitignore`` inside the folder itself (what ``uv venv`` writes), which the seed's
    build may not make (``python -m venv`` before 3.13 writes none) -- the first allocation
    would refuse the seed as not ignored."""
    rel = rel.removeprefix("./")
    said = git(["check-ignore", "-v", "--", f"{rel}/"], cwd=root, check=False)
    source = said.text.partition(":")[0]
    return said.returncode == 0 and not source.startswith(f"{rel}/")
