"""Capability checks and the worktree root: what ``dagrunner doctor`` reports.

The worktree root is ``DAGRUNNER_WORKTREE_ROOT``, else
``$XDG_CACHE_HOME/dagrunner/worktrees``, else ``~/.cache/dagrunner/worktrees``,
namespaced per repository (``<name>-<hash of the common git dir>``).  A root
inside the repository is refused unless ``DAGRUNNER_ALLOW_IN_REPO_WORKTREES=1``.
Nothing here creates anything but the root folder itself, and only once every
check that could refuse has passed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import is_inside
from dagrunner.git import git

MIN_GIT = (2, 17)  # worktree move/remove
LOW_DISK = 1 << 30
FULL_DISK = 64 << 20


@dataclass(frozen=True, kw_only=True)
class RepoInfo:
    root: Path  # the work tree we were pointed at (for a bare repository, the git dir)
    common_dir: Path
    bare: bool
    git_version: tuple[int, ...]

    @property
    def state_dir(self) -> Path:
        """Where dagrunner keeps this repository's records (inside the common git dir)."""
        return self.common_dir / "dagrunner"


@dataclass
class Finding:
    level: str  # PASS, WARN or FAIL
    check: str
    detail: str
    hint: str = ""

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "check": self.check, "detail": self.detail, "hint": self.hint}


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, level: str, check: str, detail: str, hint: str = "") -> None:
        self.findings.append(Finding(level, check, detail, hint))

    @property
    def ok(self) -> bool:
        return all(f.level != "FAIL" for f in self.findings)


def git_version() -> tuple[int, ...]:
    text = git(["--version"], cwd=Path.cwd()).text
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise DagrunnerError(
            "git-version",
            f"cannot read git's version from {text!r}",
            exit_code=ExitCode.ENVIRONMENT,
        )
    return tuple(int(part) for part in match.groups() if part is not None)


def repo_info(path: Path | None) -> RepoInfo:
    """The repository at ``path`` (default: the current directory); exit 3 outside git."""
    where = (path or Path.cwd()).resolve()
    if not where.is_dir():
        raise DagrunnerError(
            "repo-not-found", "no such directory", where=str(where), hint="check --repo"
        )
    probe = git(
        ["rev-parse", "--is-bare-repository", "--git-common-dir", "--show-toplevel"],
        cwd=where,
        check=False,
    )
    if probe.returncode != 0:
        raise DagrunnerError(
            "not-a-repository",
            "not inside a git repository",
            where=str(where),
            exit_code=ExitCode.ENVIRONMENT,
            hint="run from a git work tree or pass --repo",
        )
    lines = probe.text.splitlines()
    bare = lines[0] == "true"
    common = Path(lines[1])
    if not common.is_absolute():
        common = (where / common).resolve()
    root = Path(lines[2]) if len(lines) > 2 and not bare else common
    return RepoInfo(root=root, common_dir=common, bare=bare, git_version=git_version())


def root_base(env: Mapping[str, str]) -> Path:
    explicit = env.get("DAGRUNNER_WORKTREE_ROOT")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(xdg) / "dagrunner" / "worktrees"


def namespace(info: RepoInfo) -> str:
    name = re.sub(
        r"[^A-Za-z0-9._-]",
        "_",
        info.common_dir.parent.name if not info.bare else info.common_dir.name,
    )
    ident = hashlib.sha256(str(info.common_dir.resolve()).encode()).hexdigest()[:10]
    return f"{name or 'repo'}-{ident}"


def worktree_root(info: RepoInfo, env: Mapping[str, str] | None = None) -> Path:
    """This repository's worktree root, checked (exit 3 when unsafe or unusable) and created."""
    env = os.environ if env is None else env
    base = root_base(env)
    if not base.is_absolute() or base.resolve() == Path("/"):
        raise DagrunnerError(
            "unsafe-root",
            f"the worktree root {str(base)!r} is "
            + ("the filesystem root" if base.is_absolute() else "not an absolute path"),
            exit_code=ExitCode.ENVIRONMENT,
            hint="set DAGRUNNER_WORKTREE_ROOT to an absolute folder of its own, "
            "such as ~/.cache/dagrunner/worktrees",
        )
    root = base / namespace(info)
    in_repo = is_inside(root, info.root) or is_inside(root, info.common_dir)
    if in_repo and env.get("DAGRUNNER_ALLOW_IN_REPO_WORKTREES") != "1":
        raise DagrunnerError(
            "unsafe-root",
            f"the worktree root {root} is inside the repository {info.root}",
            exit_code=ExitCode.ENVIRONMENT,
            hint="set DAGRUNNER_WORKTREE_ROOT outside the repository "
            "(or DAGRUNNER_ALLOW_IN_REPO_WORKTREES=1 if you really mean it)",
        )
    existing = next((p for p in [root, *root.parents] if p.exists()), None)
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        raise DagrunnerError(
            "root-unwritable",
            f"cannot create or write {root} ({existing} is not writable)",
            exit_code=ExitCode.ENVIRONMENT,
            hint="set DAGRUNNER_WORKTREE_ROOT to a writable folder",
        )
    free = shutil.disk_usage(existing).free
    if free < FULL_DISK:
        raise DagrunnerError(
            "disk-full",
            f"only {free >> 20} MiB free under {existing}",
            exit_code=ExitCode.ENVIRONMENT,
            hint="free some space or move DAGRUNNER_WORKTREE_ROOT",
        )
    root.mkdir(parents=True, exist_ok=True)
    return root


def doctor(path: Path | None, env: Mapping[str, str] | None = None) -> Report:
    """Every check as a finding; never raises for a failed check."""
    env = os.environ if env is None else env
    report = Report()
    try:
        version = git_version()
    except DagrunnerError as exc:
        report.add("FAIL", "git", exc.message, exc.hint)
        return report
    text = ".".join(map(str, version))
    if version >= MIN_GIT:
        report.add("PASS", "git", f"git {text}")
    else:
        report.add("FAIL", "git", f"git {text} is older than 2.17", "upgrade git")
    try:
        info = repo_info(path)
    except DagrunnerError as exc:
        report.add("FAIL", "repository", exc.message, exc.hint)
        return report
    report.facts.update(
        repository=str(info.root), common_dir=str(info.common_dir), bare=info.bare, git=text
    )
    report.add("PASS", "repository", f"{info.root} (common git dir {info.common_dir})")
    report.add(
        "WARN" if info.bare else "PASS",
        "bare",
        "bare repository" if info.bare else "not bare",
        "worktrees of a bare repository have no main checkout to compare with" if info.bare else "",
    )
    listing = git(["worktree", "list", "--porcelain"], cwd=info.root, check=False)
    if listing.returncode == 0:
        count = listing.text.count("worktree ")
        report.add("PASS", "worktrees", f"supported ({count} registered)")
    else:
        report.add("FAIL", "worktrees", "git worktree is not usable here", "upgrade git")
    from dagrunner.contain import detect

    contained = detect()
    report.facts["containment"] = contained.to_json()
    report.add(
        "PASS" if contained.pidns or contained.cgroup_kill else "WARN",
        "containment",
        f"{contained.mode}: {contained.describe()}",
        ""
        if contained.pidns or contained.cgroup_kill
        else "gates are held by their process group only; see docs/security.md "
        "(run as root, or enable user namespaces or cgroup delegation)",
    )
    try:
        root = worktree_root(info, env)
    except DagrunnerError as exc:
        report.add("FAIL", "root", exc.message, exc.hint)
        return report
    report.facts["worktree_root"] = str(root)
    report.add("PASS", "root", f"{root}")
    free = shutil.disk_usage(root).free
    report.facts["free_bytes"] = free
    if free < LOW_DISK:
        report.add("WARN", "disk", f"{free >> 20} MiB free under the root", "free some space")
    else:
        report.add("PASS", "disk", f"{free >> 30} GiB free under the root")
    return report
