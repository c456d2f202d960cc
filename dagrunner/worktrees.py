"""Worker worktrees under the cache root: allocate, status, claim, release, clean up, prune, pool.

Every worktree is ``<root>/<mission>/<worker>`` on branch
``dagrunner/<mission>/<worker>``, locked in git (so ``git worktree prune``
never drops it) and recorded in the allocation manifest (``ledger.py``).
Allocation and cleanup of one repository are serialised by a lock in its
common git dir.  Work is never lost: a dirty or unlanded worktree is retained
with a lock file saying why, and ``--force`` first saves its full state on a
backup ref.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pathspec
import psutil

from dagrunner.doctor import RepoInfo, repo_info, worktree_root
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import atomic_write
from dagrunner.git import GitResult, git
from dagrunner.ledger import Ledger, now
from dagrunner.snapshot import backup_commit

SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
POOL_DIR = ".pool"
DEFAULT_POOL_SIZE = 4
SETUP_TAIL_LINES = 20


@dataclass(frozen=True)
class Context:
    info: RepoInfo
    root: Path
    ledger: Ledger

    @property
    def pool(self) -> Path:
        return self.root / POOL_DIR


def open_context(repo: Path | None, env: Mapping[str, str] | None = None) -> Context:
    """The repository, its checked worktree root (exit 3 if unsafe) and its ledger."""
    info = repo_info(repo)
    root = worktree_root(info, env)
    return Context(info=info, root=root, ledger=Ledger(info.state_dir))


def check_slug(kind: str, value: str) -> str:
    if not SLUG.fullmatch(value) or ".." in value or value.endswith((".lock", ".")):
        raise DagrunnerError(
            "bad-name",
            f"{kind} {value!r} is not a safe name",
            key=f"--{kind}",
            hint="use 1-63 letters, digits, '_', '-' or '.', starting with a letter or digit",
        )
    return value


def split_id(wt_id: str) -> tuple[str, str]:
    mission, sep, worker = wt_id.partition("/")
    if not sep:
        raise DagrunnerError(
            "bad-name", f"{wt_id!r} is not a worktree id", hint="ids look like MISSION/WORKER"
        )
    return check_slug("mission", mission), check_slug("worker", worker)


def pool_size(env: Mapping[str, str]) -> int:
    try:
        return max(0, int(env.get("DAGRUNNER_POOL_SIZE", DEFAULT_POOL_SIZE)))
    except ValueError:
        return DEFAULT_POOL_SIZE


# -- allocate ---------------------------------------------------------------------------


def allocate(
    *,
    mission: str,
    worker: str,
    base: str = "HEAD",
    session: str | None = None,
    repo: Path | None = None,
    setup: Sequence[str] = (),
    setup_timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A worktree for MISSION/WORKER at BASE, claimed for SESSION; the same one when called again.

    Raises DagrunnerError: bad-name / bad-base (2), unsafe-root (3), claimed /
    path-occupied / branch-exists (4), setup-failed (1).
    """
    env = os.environ if env is None else env
    check_slug("mission", mission)
    check_slug("worker", worker)
    if session is not None:
        check_slug("session", session)
    ctx = open_context(repo, env)
    wt_id = f"{mission}/{worker}"
    probe = git(
        ["rev-parse", "--verify", "-q", f"{base}^{{commit}}"], cwd=ctx.info.root, check=False
    )
    if probe.returncode != 0:
        raise DagrunnerError(
            "bad-base",
            f"{base!r} is not a commit in this repository",
            key="--base",
            hint="pass a branch, tag or commit id",
        )
    base_commit = probe.text
    # Reading the main checkout's status walks it; do that while the worktree is made.
    with ThreadPoolExecutor(max_workers=1) as pool:
        dirty = pool.submit(_main_dirty, ctx)
        result = _allocate_locked(
            ctx, wt_id, mission, worker, base_commit, session, setup, setup_timeout
        )
        return {**result, "main_checkout_dirty": dirty.result(), **_dirty_note(dirty.result())}


def _dirty_note(dirty: bool | None) -> dict[str, str]:
    if not dirty:
        return {}
    return {"note": "the main checkout has uncommitted work; it is not in this worktree's base"}


def _allocate_locked(
    ctx: Context,
    wt_id: str,
    mission: str,
    worker: str,
    base_commit: str,
    session: str | None,
    setup: Sequence[str],
    setup_timeout: float,
) -> dict[str, Any]:
    branch = f"dagrunner/{mission}/{worker}"
    path = ctx.root / mission / worker
    with ctx.ledger.exclusive():
        existing = ctx.ledger.state().get(wt_id)
        if existing is not None and not existing.get("missing") and Path(existing["path"]).is_dir():
            owner = existing.get("session")
            if owner and session and owner != session:
                raise DagrunnerError(
                    "claimed",
                    f"{wt_id} is claimed by session {owner!r}",
                    exit_code=ExitCode.REFUSED,
                    details={"owner": owner},
                    hint="use another worker name, or release it from that session",
                )
            if session and not owner:
                ctx.ledger.append("claimed", wt_id, session=session)
            return _describe(ctx, wt_id, {**existing, "session": owner or session}, reused=True)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise DagrunnerError(
                "path-occupied",
                f"{path} exists and is not a worktree dagrunner allocated",
                exit_code=ExitCode.REFUSED,
                where=str(path),
                hint="move it away; dagrunner never reuses or overwrites a stray directory",
            )
        if (
            git(
                ["rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
                cwd=ctx.info.root,
                check=False,
            ).returncode
            == 0
        ):
            raise DagrunnerError(
                "branch-exists",
                f"branch {branch} already exists and is not a recorded worktree",
                exit_code=ExitCode.REFUSED,
                hint=f"rename or delete that branch (git branch -m {branch} ...), or pick another worker",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        pooled = _take_from_pool(ctx, path, branch, base_commit, wt_id)
        if not pooled:
            git(
                [
                    "worktree",
                    "add",
                    "--lock",
                    "--reason",
                    f"dagrunner: {wt_id}",
                    "-b",
                    branch,
                    str(path),
                    base_commit,
                ],
                cwd=ctx.info.root,
            )
        copied = _copy_included(ctx.info.root, path)
        record = ctx.ledger.append(
            "allocated",
            wt_id,
            path=str(path),
            branch=branch,
            base=base_commit,
            session=session,
            pooled=pooled,
            copied=copied,
        )
    if setup:
        _run_setup(ctx, wt_id, path, branch, setup, setup_timeout)
    return _describe(
        ctx,
        wt_id,
        {**record, "session": session, "created": record["at"]},
        reused=False,
        pooled=pooled,
        copied=copied,
    )


def _main_dirty(ctx: Context) -> bool | None:
    """Whether the main checkout has uncommitted work (None for a bare repository)."""
    if ctx.info.bare:
        return None
    return bool(git(["status", "--porcelain", "-z"], cwd=ctx.info.root, check=False).stdout)


def _describe(ctx: Context, wt_id: str, state: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    body = {
        "id": wt_id,
        "path": state["path"],
        "branch": state["branch"],
        "base": state["base"],
        "root": str(ctx.root),
        "session": state.get("session"),
        "created": state.get("created", state.get("at")),
        **extra,
    }
    return body


def _take_from_pool(ctx: Context, path: Path, branch: str, base: str, wt_id: str) -> bool:
    """Move a cleaned pooled worktree to ``path`` at ``base`` on a new ``branch``; False if none."""
    if not ctx.pool.is_dir():
        return False
    for entry in sorted(ctx.pool.iterdir()):
        if not (entry / ".git").exists():
            continue
        git(["worktree", "unlock", str(entry)], cwd=ctx.info.root, check=False)
        moved = git(["worktree", "move", str(entry), str(path)], cwd=ctx.info.root, check=False)
        if moved.returncode != 0:
            continue
        # One checkout both moves to the base (touching only files that differ, and
        # discarding any change to tracked files) and makes the branch; clean drops the rest.
        git(["checkout", "-q", "--force", "-B", branch, base], cwd=path)
        git(["clean", "-q", "-ffdx"], cwd=path)
        git(["worktree", "lock", "--reason", f"dagrunner: {wt_id}", str(path)], cwd=ctx.info.root)
        return True
    return False


def _reset_clean(path: Path, commit: str) -> None:
    """Detached at ``commit`` with nothing else: touches only the files that differ."""
    git(["checkout", "-q", "--detach", "--force", commit], cwd=path)
    git(["reset", "-q", "--hard", commit], cwd=path)
    git(["clean", "-q", "-ffdx"], cwd=path)


def _copy_included(main: Path, path: Path) -> list[str]:
    """Copy files that ``.worktreeinclude`` (gitignore syntax) names, never over a tracked file."""
    spec_file = main / ".worktreeinclude"
    if not spec_file.is_file():
        return []
    spec = pathspec.GitIgnoreSpec.from_lines(spec_file.read_text().splitlines())
    candidates = git(["ls-files", "--others", "-z"], cwd=main).stdout.split(b"\0")
    tracked = set(git(["ls-files", "-z"], cwd=path).stdout.split(b"\0"))
    copied = []
    for raw in candidates:
        if not raw or raw in tracked:
            continue
        rel = raw.decode("utf-8", "surrogateescape")
        if not spec.match_file(rel):
            continue
        source, dest = main / rel, path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest)
        copied.append(rel)
    return copied


def _run_setup(
    ctx: Context, wt_id: str, path: Path, branch: str, setup: Sequence[str], timeout: float
) -> None:
    for command in setup:
        argv = shlex.split(command)
        try:
            proc = subprocess.run(
                argv,
                cwd=path,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
                start_new_session=True,
            )
            ok, output = (
                proc.returncode == 0,
                (proc.stdout + proc.stderr).decode("utf-8", "replace"),
            )
            why = f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired as exc:
            ok, output = (
                False,
                ((exc.stdout or b"") + (exc.stderr or b"")).decode("utf-8", "replace"),
            )
            why = f"timed out after {timeout:g}s"
        except OSError as exc:
            ok, output, why = False, str(exc), "could not start"
        if ok:
            continue
        with ctx.ledger.exclusive():
            _remove(ctx, path, branch, delete_branch=True)
            ctx.ledger.append("cleaned", wt_id, reason=f"setup failed: {command}")
        tail = output.strip().splitlines()[-SETUP_TAIL_LINES:]
        raise DagrunnerError(
            "setup-failed",
            f"setup step {command!r} failed ({why}); the worktree was removed",
            exit_code=ExitCode.FAILED,
            details={"step": command, "output_tail": tail},
            hint="last output lines: " + (" | ".join(tail[-5:]) or "(none)"),
        )


def _remove(ctx: Context, path: Path, branch: str, *, delete_branch: bool) -> None:
    git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
    git(["worktree", "remove", "--force", "--force", str(path)], cwd=ctx.info.root, check=False)
    if path.exists():
        shutil.rmtree(path)
    git(["worktree", "prune"], cwd=ctx.info.root, check=False)
    if delete_branch:
        git(["branch", "-D", branch], cwd=ctx.info.root, check=False)


# -- status -----------------------------------------------------------------------------


def default_target(ctx: Context) -> str:
    if not ctx.info.bare:
        head = git(["symbolic-ref", "--short", "-q", "HEAD"], cwd=ctx.info.root, check=False).text
        if head:
            return head
    return "main"


def _state(ctx: Context, wt_id: str) -> dict[str, Any]:
    state = ctx.ledger.state().get(wt_id)
    if state is None:
        raise DagrunnerError(
            "unknown-worktree",
            f"no worktree {wt_id!r} is recorded for this repository",
            hint="see `dagrunner worktree list`",
        )
    return state


def integrated(path: Path, head: str, base: str, target: str) -> tuple[bool, str]:
    """Whether ``head``'s work is on ``target``, and why (so a landed branch reads as landed)."""

    def run(*args: str) -> GitResult:
        return git(list(args), cwd=path, check=False)

    if run("rev-parse", "--verify", "-q", f"{target}^{{commit}}").returncode != 0:
        return False, f"target {target!r} does not exist"
    if run("merge-base", "--is-ancestor", head, target).returncode == 0:
        return True, "ancestor of the target"
    if run("rev-parse", f"{head}^{{tree}}").text == run("rev-parse", f"{target}^{{tree}}").text:
        return True, "same tree as the target"
    cherry = run("cherry", target, head, base).text.splitlines()
    if cherry and all(line.startswith("-") for line in cherry):
        return True, "same patches already on the target (rebased)"
    combined = _patch_id(run("diff", "--no-ext-diff", "--binary", base, head).stdout, path)
    if combined:
        log = run("log", "-p", "--no-ext-diff", "--format=commit %H", f"{base}..{target}").stdout
        for line in _patch_ids(log, path):
            if line.split()[0] == combined:
                return True, f"squashed onto the target as {line.split()[1][:12]}"
    ahead = len([c for c in cherry if c.startswith("+")])
    return False, f"{ahead} commit(s) not on the target"


def _patch_ids(data: bytes, path: Path) -> list[str]:
    if not data.strip():
        return []
    return git(["patch-id", "--stable"], cwd=path, input=data, check=False).text.splitlines()


def _patch_id(diff: bytes, path: Path) -> str:
    lines = _patch_ids(diff, path)
    return lines[0].split()[0] if lines else ""


def status(wt_id: str, *, repo: Path | None = None, target: str | None = None) -> dict[str, Any]:
    """Everything about one worktree; a vanished directory is reconciled in the ledger."""
    ctx = open_context(repo)
    split_id(wt_id)
    return _status(ctx, wt_id, _state(ctx, wt_id), target or default_target(ctx))


def _status(ctx: Context, wt_id: str, state: dict[str, Any], target: str) -> dict[str, Any]:
    path = Path(state["path"])
    body: dict[str, Any] = {
        "id": wt_id,
        "path": str(path),
        "branch": state["branch"],
        "base": state["base"],
        "session": state.get("session"),
        "created": state.get("created"),
        "last_activity": state.get("last_activity"),
        "target": target,
        "retained": state.get("retained"),
    }
    if not path.is_dir():
        if not state.get("missing"):
            ctx.ledger.append("missing", wt_id)
        return {**body, "missing": True, "clean": None, "integrated": None}
    porcelain = git(["status", "--porcelain=v2", "-z", "--untracked-files=all"], cwd=path).stdout
    staged = unstaged = untracked = unmerged = 0
    for entry in porcelain.split(b"\0"):
        if entry[:2] in (b"1 ", b"2 "):
            xy = entry[2:4]
            staged += xy[0:1] != b"."
            unstaged += xy[1:2] != b"."
        elif entry[:2] == b"u ":
            unmerged += 1
        elif entry[:2] == b"? ":
            untracked += 1
    # a rename entry ("2 ") is followed by its original path as a separate field
    head = git(["rev-parse", "HEAD"], cwd=path).text
    git_dir = Path(git(["rev-parse", "--absolute-git-dir"], cwd=path).text)
    rebase = (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists()
    merge = (git_dir / "MERGE_HEAD").exists()
    counts = git(["rev-list", "--left-right", "--count", f"{target}...HEAD"], cwd=path, check=False)
    behind, ahead = (
        (int(n) for n in counts.text.split()) if counts.returncode == 0 else (None, None)
    )
    landed, why = integrated(path, head, state["base"], target)
    clean = staged == unstaged == untracked == unmerged == 0 and not rebase and not merge
    return {
        **body,
        "missing": False,
        "head": head,
        "clean": clean,
        "staged": staged,
        "unstaged": unstaged,
        "untracked": untracked,
        "unmerged": unmerged,
        "ahead": ahead,
        "behind": behind,
        "diffstat": git(["diff", "--shortstat", "--no-ext-diff", state["base"]], cwd=path).text,
        "rebase_in_progress": rebase,
        "merge_in_progress": merge,
        "integrated": landed,
        "integrated_reason": why,
    }


def list_worktrees(*, repo: Path | None = None, target: str | None = None) -> list[dict[str, Any]]:
    ctx = open_context(repo)
    goal = target or default_target(ctx)
    return [_status(ctx, wt_id, state, goal) for wt_id, state in sorted(ctx.ledger.state().items())]


# -- claim / release ---------------------------------------------------------------------


def _check_owner(wt_id: str, owner: str | None, session: str, force: bool, code: str) -> None:
    """Refuse (exit 4, naming the owner) when another session holds the claim, unless ``force``."""
    if owner and owner != session and not force:
        raise DagrunnerError(
            code,
            f"{wt_id} is claimed by session {owner!r}, not {session!r}",
            exit_code=ExitCode.REFUSED,
            details={"owner": owner},
            hint="ask the owning session to release it, or pass --force",
        )


def claim(
    wt_id: str, *, session: str, force: bool = False, repo: Path | None = None
) -> dict[str, Any]:
    """Claim for ``session``; another session's claim is refused (exit 4) unless ``force``."""
    check_slug("session", session)
    ctx = open_context(repo)
    with ctx.ledger.exclusive():
        owner = _state(ctx, wt_id).get("session")
        _check_owner(wt_id, owner, session, force, "claimed")
        if owner != session:
            ctx.ledger.append(
                "claimed", wt_id, session=session, previous=owner, forced=bool(owner and force)
            )
    return {"id": wt_id, "session": session, "previous": owner}


def release(
    wt_id: str, *, session: str, force: bool = False, repo: Path | None = None
) -> dict[str, Any]:
    """Release ``session``'s claim; a non-owner is refused (exit 4) unless ``force``."""
    check_slug("session", session)
    ctx = open_context(repo)
    with ctx.ledger.exclusive():
        owner = _state(ctx, wt_id).get("session")
        _check_owner(wt_id, owner, session, force, "not-owner")
        if owner:
            ctx.ledger.append("released", wt_id, session=session, owner=owner)
    return {"id": wt_id, "session": None, "previous": owner}


# -- cleanup / prune ---------------------------------------------------------------------


def processes_using(path: Path) -> list[int]:
    """Pids of processes whose cwd or an open file is under ``path``."""
    prefix = str(path.resolve())
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cwd"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            cwd = proc.info.get("cwd") or ""
            if cwd == prefix or cwd.startswith(prefix + os.sep):
                found.append(proc.pid)
                continue
            for handle in proc.open_files():
                if handle.path.startswith(prefix + os.sep):
                    found.append(proc.pid)
                    break
    return found


def retention_file(path: Path) -> Path:
    return path.parent / f"{path.name}.retained.json"


def cleanup(
    wt_id: str,
    *,
    force: bool = False,
    repo: Path | None = None,
    target: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Remove a clean, landed worktree and its branch (or return it to the pool).

    A dirty or unlanded one is retained (exit 4, with a retention file) unless
    ``force``, which first saves its full state on ``refs/dagrunner/backup/...``.
    A worktree a running process uses is refused (exit 4) even with ``force``.
    """
    env = os.environ if env is None else env
    split_id(wt_id)
    ctx = open_context(repo, env)
    with ctx.ledger.exclusive():
        state = _state(ctx, wt_id)
        return _cleanup(
            ctx, wt_id, state, force=force, target=target or default_target(ctx), env=env
        )


def _cleanup(
    ctx: Context,
    wt_id: str,
    state: dict[str, Any],
    *,
    force: bool,
    target: str,
    env: Mapping[str, str],
    keep_unlanded_branch: bool = False,
    assume_landed: bool = False,
) -> dict[str, Any]:
    """``assume_landed``: the caller checked that everything the worktree holds has landed."""
    path, branch = Path(state["path"]), state["branch"]
    if not path.is_dir():
        git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
        git(["worktree", "prune"], cwd=ctx.info.root, check=False)
        ctx.ledger.append("pruned", wt_id, reason="directory gone; branch kept")
        return {
            "id": wt_id,
            "action": "dropped-record",
            "reason": "directory gone",
            "branch_kept": branch,
        }
    users = processes_using(path)
    if users:
        raise DagrunnerError(
            "in-use",
            f"{wt_id} is in use by process(es) {users}",
            exit_code=ExitCode.REFUSED,
            details={"pids": users},
            hint="stop those processes (or leave their directory) first",
        )
    info = _status(ctx, wt_id, state, target)
    landed = bool(info["integrated"]) or assume_landed
    problems = []
    if not info["clean"] and not assume_landed:
        problems.append(
            f"uncommitted work ({info['staged']} staged, {info['unstaged']} unstaged, "
            f"{info['untracked']} untracked{', rebase or merge in progress' if info['rebase_in_progress'] or info['merge_in_progress'] else ''})"
        )
    if not landed and not keep_unlanded_branch:
        problems.append(f"not landed on {target}: {info['integrated_reason']}")
    backup = None
    if problems and not force:
        why = "; ".join(problems)
        atomic_write(
            retention_file(path),
            orjson.dumps(
                {
                    "id": wt_id,
                    "retained_at": now(),
                    "why": why,
                    "branch": branch,
                    "head": info["head"],
                    "base": state["base"],
                    "status": {
                        k: info[k] for k in ("staged", "unstaged", "untracked", "ahead", "diffstat")
                    },
                },
                option=orjson.OPT_INDENT_2,
            ),
        )
        ctx.ledger.append("retained", wt_id, reason=why)
        raise DagrunnerError(
            "retained",
            f"{wt_id} holds work and was kept: {why}",
            exit_code=ExitCode.REFUSED,
            where=str(retention_file(path)),
            details={"why": why},
            hint="land or export its work first; --force saves its state on a backup ref, then removes it",
        )
    if problems:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        ref = f"refs/dagrunner/backup/{wt_id}/{stamp}"
        backup = {
            "ref": ref,
            "commit": backup_commit(
                path, ref, f"dagrunner backup of {wt_id} before forced cleanup"
            ),
        }
    delete_branch = landed or backup is not None
    action = "removed"
    if info["clean"] and _pool_room(ctx, env):
        _to_pool(ctx, path, branch, delete_branch=delete_branch)
        action = "pooled"
    else:
        _remove(ctx, path, branch, delete_branch=delete_branch)
    retention_file(path).unlink(missing_ok=True)
    ctx.ledger.append("cleaned", wt_id, action=action, backup=backup, branch_deleted=delete_branch)
    return {
        "id": wt_id,
        "action": action,
        "backup": backup,
        "branch_deleted": delete_branch,
        "integrated_reason": info["integrated_reason"],
    }


def _pool_room(ctx: Context, env: Mapping[str, str]) -> bool:
    size = pool_size(env)
    count = sum(1 for _ in ctx.pool.iterdir()) if ctx.pool.is_dir() else 0
    return count < size


def _to_pool(ctx: Context, path: Path, branch: str, *, delete_branch: bool) -> None:
    head = git(["rev-parse", "HEAD"], cwd=path).text
    _reset_clean(path, head)
    if delete_branch:
        git(["branch", "-D", branch], cwd=ctx.info.root, check=False)
    ctx.pool.mkdir(parents=True, exist_ok=True)
    slot = ctx.pool / uuid.uuid4().hex[:12]
    git(["worktree", "unlock", str(path)], cwd=ctx.info.root, check=False)
    git(["worktree", "move", str(path), str(slot)], cwd=ctx.info.root)
    git(["worktree", "lock", "--reason", "dagrunner: pool", str(slot)], cwd=ctx.info.root)


def prune(
    *,
    idle_days: float | None = None,
    dry_run: bool = False,
    repo: Path | None = None,
    target: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Drop records of vanished worktrees; remove integrated ones and clean unclaimed idle ones.

    Everything else is listed as retained, with the reason.  An idle worktree
    that is clean but unlanded loses its directory, never its branch.
    """
    env = os.environ if env is None else env
    ctx = open_context(repo, env)
    goal = target or default_target(ctx)
    removed: list[dict[str, Any]] = []
    retained: list[dict[str, Any]] = []
    cutoff = None
    if idle_days is not None:
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=idle_days)
    with ctx.ledger.exclusive():
        for wt_id, state in sorted(ctx.ledger.state().items()):
            path = Path(state["path"])
            if not path.is_dir():
                removed.append(
                    {"id": wt_id, "action": "dropped-record", "reason": "directory gone"}
                )
                if not dry_run:
                    _cleanup(ctx, wt_id, state, force=False, target=goal, env=env)
                continue
            info = _status(ctx, wt_id, state, goal)
            idle = cutoff is not None and dt.datetime.fromisoformat(state["last_activity"]) < cutoff
            reason = None
            if state.get("session") and not info["integrated"]:
                reason = f"claimed by session {state['session']!r}"
            elif not info["clean"]:
                reason = "uncommitted work"
            elif not info["integrated"] and not idle:
                reason = f"not landed ({info['integrated_reason']}) and not idle"
            if reason:
                retained.append({"id": wt_id, "reason": reason})
                continue
            why = (
                info["integrated_reason"]
                if info["integrated"]
                else f"idle since {state['last_activity']}"
            )
            removed.append(
                {
                    "id": wt_id,
                    "action": "remove",
                    "reason": why,
                    "branch_kept": None if info["integrated"] else state["branch"],
                }
            )
            if not dry_run:
                _cleanup(
                    ctx,
                    wt_id,
                    state,
                    force=False,
                    target=goal,
                    env=env,
                    keep_unlanded_branch=not info["integrated"],
                )
    return {"dry_run": dry_run, "removed": removed, "retained": retained}


# -- export ---------------------------------------------------------------------------------


def export(wt_id: str, *, output: Path | None = None, repo: Path | None = None) -> dict[str, Any]:
    """Write the patch envelope of everything the worktree did since its base.

    Read-only for the worktree.  Returns a summary with the envelope's path.
    """
    from dagrunner.envelope import export_worktree, write_envelope

    mission, worker = split_id(wt_id)
    ctx = open_context(repo)
    state = _state(ctx, wt_id)
    path = Path(state["path"])
    if not path.is_dir():
        raise DagrunnerError(
            "worktree-missing",
            f"the directory of {wt_id} is gone",
            where=str(path),
            hint="nothing to export; `worktree prune` drops the record",
        )
    envelope = export_worktree(
        path, mission=mission, worker=worker, base=state["base"], session=state.get("session")
    )
    target = output or ctx.info.state_dir / "exports" / f"{envelope.id}.json"
    write_envelope(envelope, target)
    ctx.ledger.append(
        "exported", wt_id, envelope=envelope.id, tree=envelope.fields["tree"], file=str(target)
    )
    fields = envelope.fields
    return {
        "id": envelope.id,
        "file": str(target),
        "worktree": wt_id,
        "empty": fields["empty"],
        "base": fields["base"],
        "head": fields["head"],
        "tree": fields["tree"],
        "changed_files": len(fields["changed_files"]),
        "diff_bytes": fields["diff_bytes"],
        "diff_sha256": fields["diff_sha256"],
    }
