"""``worktree sync``: a worker brought onto the target's tip with all of its work carried.

Its commits since its base are replayed on the tip, one by one, with their messages and
authors; then its staged changes, its unstaged ones and its untracked files are re-applied
(staged stays staged, untracked stays untracked, ignored files are not touched).  Every
merge is computed first, with ``git merge-tree`` in an empty work tree, writing objects
only; a conflict anywhere refuses with ``sync-conflict`` naming the paths, and the worktree
is left exactly as it was.  Only when everything merged cleanly is the worktree moved: its
full state is saved on ``refs/dagrunner/backup/<id>/<time>`` first, then its branch, index
and files are set in three plumbing steps (no hook, no filter, no merge driver runs:
``git/drivers.py``), and the ledger records the tip as its new base.  No other worktree is
read or written.

``markers`` (what an agent's ``dagrunner_sync`` asks, and ``worktree sync --markers``): on a
conflict, the worktree's whole state is merged with the tip anyway, its state from before
saved on the backup ref first; the conflicting files get markers (``<<<<<<< landed`` /
``>>>>>>> yours``), the branch moves to the tip, nothing is staged, and an export is refused
(``export-unresolved``) while a marker is left in one of those files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.command import IDENTITY, git, split_z
from dagrunner.git.link import pin_gitfile
from dagrunner.git.merge import Merged, commit_tree, merge_commits
from dagrunner.git.repo import check_branch
from dagrunner.git.statetree import state_tree
from dagrunner.worktrees.allocate import (
    Context,
    default_target,
    open_context,
    recorded_state,
    split_id,
)


@dataclass(frozen=True, kw_only=True)
class Synced:
    id: str
    target: str
    old_base: str
    new_base: str
    old_head: str
    head: str
    replayed: int  # commits replayed on the tip
    backup: str  # the ref holding the worktree's full state from before
    carried: dict[str, int]  # staged / unstaged / untracked paths carried

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "target": self.target,
            "old_base": self.old_base,
            "new_base": self.new_base,
            "old_head": self.old_head,
            "head": self.head,
            "replayed": self.replayed,
            "backup": self.backup,
            "carried": self.carried,
        }


def _merge(common: Path, ours: str, theirs: str, what: str) -> str:
    """The tree of ``ours`` merged with ``theirs`` (their merge base from their history);
    ``sync-conflict`` naming the paths when it is not clean."""
    merged = merge_commits(common, ours, theirs)
    if merged.conflicts:
        paths = list(merged.conflicts)
        raise DagrunnerError(
            "sync-conflict",
            f"{what} conflicts with the target's tip in {', '.join(paths[:20])}",
            exit_code=ExitCode.REFUSED,
            details={"paths": paths},
            hint="nothing was changed; resolve it in the worktree (or land the other work "
            "first), then sync again",
        )
    if merged.tree is None:
        raise DagrunnerError(
            "git-failed",
            f"git merge-tree failed: {merged.failed}",
            hint="see git's message; nothing was changed",
            exit_code=ExitCode.ENVIRONMENT,
        )
    return merged.tree


def _author(repo: Path, commit: str) -> tuple[dict[str, str], bytes]:
    """A commit's author (name, email, date) as commit-tree's environment, and its message."""
    fields = git(["show", "-s", "--format=%an%x00%ae%x00%aI", commit], cwd=repo).text.split("\0")
    message = git(["show", "-s", "--format=%B", commit], cwd=repo).stdout
    env = {
        **IDENTITY,
        "GIT_AUTHOR_NAME": fields[0],
        "GIT_AUTHOR_EMAIL": fields[1],
        "GIT_AUTHOR_DATE": fields[2],
    }
    return env, message


def _refuse(code: str, message: str, hint: str) -> DagrunnerError:
    return DagrunnerError(code, message, exit_code=ExitCode.REFUSED, hint=hint)


def sync(
    wt_id: str, *, repo: Path | None = None, target: str | None = None, markers: bool = False
) -> dict[str, Any]:
    """Bring worktree ``wt_id`` onto ``target``'s tip (default: the main checkout's branch)
    with all of its work; see the module doc.  ``markers``: where the work conflicts with
    the tip, merge anyway and leave conflict markers (``marked``) instead of refusing."""
    split_id(wt_id)
    ctx = open_context(repo)
    goal = target or default_target(ctx)
    check_branch(ctx.info, goal)
    root, common = ctx.info.root, ctx.info.common_dir
    with ctx.ledger.exclusive():
        state = recorded_state(ctx, wt_id)
        path = Path(state.path)
        if not path.is_dir():
            raise DagrunnerError(
                "worktree-missing", f"{wt_id}'s folder {path} is gone", hint="worktree prune"
            )
        pin_gitfile(common, path)
        git_dir = Path(git(["rev-parse", "--absolute-git-dir"], cwd=path).text)
        if any((git_dir / n).exists() for n in ("rebase-merge", "rebase-apply", "MERGE_HEAD")):
            raise _refuse(
                "sync-busy",
                f"{wt_id} is in the middle of a merge or rebase",
                "finish or abort it in the worktree, then sync",
            )
        if git(["ls-files", "-u"], cwd=path).stdout:
            raise _refuse("sync-busy", f"{wt_id} has unmerged paths", "resolve them, then sync")
        branch = git(["symbolic-ref", "-q", "HEAD"], cwd=path, check=False).text
        if branch != f"refs/heads/{state.branch}":  # it could point at the target itself
            raise _refuse(
                "sync-off-branch",
                f"{wt_id} is not on its own branch {state.branch!r} ({branch or 'detached'})",
                f"check out {state.branch} in the worktree, then sync",
            )
        head = git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=path).text
        tip = git(["rev-parse", "--verify", f"refs/heads/{goal}^{{commit}}"], cwd=root).text
        chain = git(["rev-list", "--reverse", "--parents", f"{state.base}..{head}"], cwd=root)
        commits = [line.split() for line in chain.text.splitlines()]
        if any(len(c) != 2 for c in commits):
            raise _refuse(
                "sync-not-linear",
                f"{wt_id}'s history since its base has a merge commit",
                "sync replays a straight line of commits; rebase it by hand",
            )
        index_tree = git(["write-tree"], cwd=path).text
        full_tree = state_tree(path)
        staged = commit_tree(root, index_tree, head, b"dagrunner sync: staged\n")
        everything = commit_tree(root, full_tree, staged, b"dagrunner sync: worktree\n")
        if markers:
            whole = merge_commits(common, tip, everything)
            if whole.conflicts and whole.marked is not None:
                return marked(ctx, wt_id, path, branch, head, tip, everything, whole, goal)
        # 1. everything computed first: the commits replayed, then the index, then the rest
        new = tip
        for commit, _parent in commits:
            env, message = _author(root, commit)
            tree = _merge(common, new, commit, f"commit {commit[:12]}")
            new = commit_tree(root, tree, new, message, env)
        new_index = _merge(common, new, staged, "the staged work")
        new_files = _merge(common, new, everything, "the unstaged and untracked work")
        carried = _carried(path, head, index_tree, full_tree)
        # 2. the worktree moves: backup, branch, files, index
        backup = _backup(root, wt_id, everything)
        try:
            git(["update-ref", branch, new, head], cwd=path)
            git(["read-tree", "-u", "--reset", new_files], cwd=path)
            git(["read-tree", new_index], cwd=path)
            git(["update-index", "-q", "--refresh"], cwd=path, check=False)
        except DagrunnerError:
            _restore(path, branch, head, index_tree, full_tree)
            raise
        ctx.ledger.append("synced", wt_id, base=tip, head=new, backup=backup)
    return Synced(
        id=wt_id,
        target=goal,
        old_base=state.base,
        new_base=tip,
        old_head=head,
        head=new,
        replayed=len(commits),
        backup=backup,
        carried=carried,
    ).to_json()


def _carried(path: Path, head: str, index_tree: str, full_tree: str) -> dict[str, int]:
    def count(a: str, b: str) -> int:
        names = git(["diff", "--name-only", "-z", "--no-renames", a, b], cwd=path).stdout
        return len(split_z(names))

    untracked = git(["ls-files", "-z", "--others", "--exclude-standard"], cwd=path).stdout
    return {
        "staged": count(head, index_tree),
        "unstaged": count(index_tree, full_tree) - len(split_z(untracked)),
        "untracked": len(split_z(untracked)),
    }


def _restore(path: Path, branch: str, head: str, index_tree: str, full_tree: str) -> None:
    """Put the worktree back as it was (a step of the move failed)."""
    git(["update-ref", branch, head], cwd=path, check=False)
    git(["read-tree", "-u", "--reset", full_tree], cwd=path, check=False)
    git(["read-tree", index_tree], cwd=path, check=False)
    git(["update-index", "-q", "--refresh"], cwd=path, check=False)


def _backup(root: Path, wt_id: str, everything: str) -> str:
    """The worktree's full state kept on a ref of its own; the ref's name."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    backup = f"refs/dagrunner/backup/{wt_id}/{stamp}"
    git(["update-ref", backup, everything], cwd=root)
    return backup


CONFLICTS_FILE = "dagrunner-sync-conflicts"  # in the worktree's git dir: what sync marked
LANDED, YOURS = "<<<<<<< landed", ">>>>>>> yours"


def marked(
    ctx: Context, wt_id: str, path: Path, branch: str, head: str, tip: str, everything: str,
    merged: Merged, goal: str,
) -> dict[str, Any]:  # fmt: skip
    """The worktree's whole state merged with the tip, conflicts left as markers: its state
    from before on a backup ref, its branch at the tip, the merged files in its folder with
    the sides named ``landed`` (the target's) and ``yours``, nothing staged; the paths are
    remembered so that an export with a marker left is refused (``unresolved``)."""
    root = ctx.info.root
    backup = _backup(root, wt_id, everything)
    git(["update-ref", branch, tip, head], cwd=path)
    git(["read-tree", "-u", "--reset", str(merged.marked)], cwd=path)
    git(["read-tree", tip], cwd=path)
    for name in merged.conflicts:
        file = path / name
        if file.is_file() and not file.is_symlink():
            text = file.read_bytes()
            text = text.replace(f"<<<<<<< {tip}".encode(), LANDED.encode())
            file.write_bytes(text.replace(f">>>>>>> {everything}".encode(), YOURS.encode()))
    git(["update-index", "-q", "--refresh"], cwd=path, check=False)
    git_dir = Path(git(["rev-parse", "--absolute-git-dir"], cwd=path).text)
    (git_dir / CONFLICTS_FILE).write_text("".join(f"{n}\n" for n in merged.conflicts))
    ctx.ledger.append("synced", wt_id, base=tip, head=tip, backup=backup)
    return {
        "id": wt_id,
        "target": goal,
        "old_head": head,
        "new_base": tip,
        "head": tip,
        "backup": backup,
        "conflicts": list(merged.conflicts),
        "next": "edit each conflicting file: keep what is right of the landed and the yours "
        "sides and remove the markers, then submit",
    }


def unresolved(path: Path) -> list[str]:
    """The paths a marking sync left conflicted that still hold a marker (none left: the
    record goes)."""
    git_dir = Path(git(["rev-parse", "--absolute-git-dir"], cwd=path).text)
    record = git_dir / CONFLICTS_FILE
    if not record.is_file():
        return []
    left = []
    for name in record.read_text().splitlines():
        file = path / name
        with contextlib.suppress(OSError):
            lines = file.read_bytes().splitlines()
            if LANDED.encode() in lines or YOURS.encode() in lines:
                left.append(name)
    if not left:
        record.unlink(missing_ok=True)
    return left
