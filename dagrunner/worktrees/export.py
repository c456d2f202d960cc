"""Export: everything a worker did in its worktree, as a patch envelope.

The worker's full state is written as a tree through a temporary index
(``statetree.py``), so every blob is in the shared object database, then the
recorded base is diffed against that tree with ``--binary --full-index``.
Commits, staged and unstaged edits, untracked files (gitignored ones
excluded), deletions, renames, modes, symlinks and binary files all travel.
The diff is read whole -- never through a bounded buffer -- and hashed.  A
worktree in the middle of a merge, rebase, cherry-pick, revert or am, or with
unmerged paths, is refused: conflict markers never travel.  Read-only for the
worktree.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

from dagrunner.envelope import (
    SCHEMA,
    Envelope,
    envelope_id,
    max_bytes,
    parse_envelope,
    repo_identity,
)
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.files import atomic_write
from dagrunner.git.command import git, git_output, split_z
from dagrunner.git.diff import parse_patch
from dagrunner.git.statetree import indexed_state
from dagrunner.records.worktree import ExportSummary, as_json
from dagrunner.version import VERSION
from dagrunner.worktrees.allocate import open_context, recorded_state, split_id

_KIND = {
    "A": "added",
    "D": "deleted",
    "M": "modified",
    "T": "type-changed",
    "R": "renamed",
    "C": "copied",
}


def changed_files(
    path: Path, base: str, index: dict[str, str], diff: bytes
) -> list[dict[str, Any]]:
    """Each changed path with its kind and modes (``git diff --raw`` of the worktree through
    the ``index`` that holds its state); ``binary`` when the envelope's ``diff`` carries
    its content as a GIT binary patch (read from that diff: no second content pass)."""
    raw = git(
        ["diff", "--raw", "-z", "--no-abbrev", "--find-renames", "--no-ext-diff", base],
        cwd=path,
        env=index,
    ).stdout
    binary = {p.path for p in parse_patch(diff) if p.binary}
    out: list[dict[str, Any]] = []
    parts = split_z(raw)
    i = 0
    while i < len(parts):
        meta = parts[i]
        if not meta.startswith(":"):
            i += 1
            continue
        old_mode, new_mode, _old_id, _new_id, status = meta[1:].split(" ")
        kind = _KIND.get(status[0], status)
        if status[0] in "RC":
            old_path, new_path = parts[i + 1], parts[i + 2]
            i += 3
        else:
            old_path, new_path = None, parts[i + 1]
            i += 2
        out.append(
            {
                "path": new_path,
                "kind": kind,
                "old_path": old_path,
                "mode": new_mode if kind != "deleted" else old_mode,
                "old_mode": old_mode,
                "binary": new_path in binary,
                "symlink": new_mode == "120000",
            }
        )
    return out


def worktree_diff(path: Path, base: str, index: dict[str, str]) -> bytes:
    """The diff, refused (``envelope-too-large``) as soon as it passes the limit that submit
    applies: a 200 MB file is never held, encoded and written only to be refused."""
    # --no-textconv: a user's textconv driver (which a worker's .gitattributes can select)
    # would put its rendering in place of the file's bytes.
    argv = ["diff", "--binary", "--full-index", "--no-ext-diff", "--no-textconv"]
    limit = max_bytes()
    diff = git_output(
        [*argv, "--no-color", "--find-renames", base], cwd=path, env=index, limit=limit
    )
    if diff is None:
        raise DagrunnerError(
            "envelope-too-large",
            f"the worktree's diff is over the limit of {limit} bytes",
            where=str(path),
            hint="split the work into smaller envelopes, or raise DAGRUNNER_ENVELOPE_MAX_BYTES "
            "for submitter and integrator alike",
        )
    return diff


def export_worktree(
    path: Path,
    *,
    mission: str,
    worker: str,
    base: str,
    session: str | None = None,
) -> Envelope:
    """The envelope of everything done in ``path`` since ``base`` (read-only for the worktree).

    Raises DagrunnerError ``export-unfinished`` (exit 4) while a merge, rebase,
    cherry-pick, revert or am is in progress or paths are unmerged: conflict
    markers must never travel as work.
    """
    status = split_z(
        git(["status", "--porcelain=v2", "-z", "--untracked-files=all"], cwd=path).stdout
    )
    check_finished(path, status)
    with indexed_state(path, status) as state:
        tree = state.tree
        # The worktree against the base, through the index that holds its state: the
        # same diff as base..tree, with no blob of the worktree written to read it.
        try:
            diff = worktree_diff(path, base, state.env)
        except DagrunnerError as error:
            if "unable to read" not in error.message:
                raise
            state.write_objects()  # a symlink's or a converted file's blob: write them
            diff = worktree_diff(path, base, state.env)
        changed = changed_files(path, base, state.env, diff)
    head = git(["rev-parse", "HEAD"], cwd=path).text
    branch = git(["symbolic-ref", "--short", "-q", "HEAD"], cwd=path, check=False).text
    # the worker's own subject line (its newest commit since the base), for the message a
    # landed commit may carry ([integrate] message); '' when it committed nothing
    subject = git(["log", "-1", "--format=%s", f"{base}..HEAD"], cwd=path, check=False).text
    base_tree = git(["rev-parse", f"{base}^{{tree}}"], cwd=path).text
    try:
        text, encoding = diff.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(diff).decode(), "base64"
    fields = {
        "schema": SCHEMA,
        "id": envelope_id(mission, worker, base, tree),
        "mission": mission,
        "worker": worker,
        "session": session,
        "repo": repo_identity(path).to_json(),
        "base": base,
        "head": head,
        "tree": tree,
        "branch": branch,
        "subject": subject,
        "status": [entry for entry in status if entry],
        "changed_files": changed,
        "empty": tree == base_tree,
        "diff": text,
        "diff_encoding": encoding,
        "diff_bytes": len(diff),
        "diff_sha256": hashlib.sha256(diff).hexdigest(),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tool_version": VERSION,
    }
    return Envelope(fields=fields, diff=diff)


OPERATIONS = {
    "MERGE_HEAD": "a merge",
    "rebase-merge": "a rebase",
    "rebase-apply": "a rebase or am",
    "CHERRY_PICK_HEAD": "a cherry-pick",
    "REVERT_HEAD": "a revert",
}


def check_finished(path: Path, status: list[str]) -> None:
    """Refuse (exit 4) a worktree with unmerged paths or a git operation in progress."""
    git_dir = Path(git(["rev-parse", "--absolute-git-dir"], cwd=path).text)
    going = [what for name, what in OPERATIONS.items() if (git_dir / name).exists()]
    unmerged = [entry.rsplit(" ", 1)[-1] for entry in status if entry.startswith("u ")]
    if going or unmerged:
        what = ", ".join(going) if going else "no operation"
        raise DagrunnerError(
            "export-unfinished",
            f"{what} in progress; unmerged paths: {', '.join(unmerged) or 'none'}",
            where=str(path),
            exit_code=ExitCode.REFUSED,
            details={"operations": going, "unmerged": unmerged},
            hint="finish or abort it in the worktree (git merge --abort, git rebase --continue, "
            "...), then export again",
        )


def write_envelope(envelope: Envelope, path: Path) -> None:
    atomic_write(path, envelope.to_bytes())


def export_summary(
    wt_id: str, *, output: Path | None = None, repo: Path | None = None
) -> ExportSummary:
    """Write the patch envelope of everything the worktree did since its base.

    Read-only for the worktree.  Returns a summary with the envelope's path.
    """
    mission, worker = split_id(wt_id)
    ctx = open_context(repo)
    state = recorded_state(ctx, wt_id)
    path = Path(state.path)
    if not path.is_dir():
        raise DagrunnerError(
            "worktree-missing",
            f"the directory of {wt_id} is gone",
            where=str(path),
            hint="nothing to export; `worktree prune` drops the record",
        )
    from dagrunner.worktrees.sync import unresolved

    if left := unresolved(path):  # a sync's markers never travel as work either
        raise DagrunnerError(
            "export-unresolved",
            f"{wt_id} still has the conflict markers sync left in {', '.join(left[:20])}",
            exit_code=ExitCode.REFUSED,
            details={"paths": left},
            hint="edit those files: keep what is right of the landed and the yours sides, "
            "remove the <<<<<<< landed / ======= / >>>>>>> yours lines, then export again",
        )
    envelope = export_worktree(
        path, mission=mission, worker=worker, base=state.base, session=state.session
    )
    # What submit would refuse (a worktree deleted while it was read, say) is refused here,
    # before any file is written or any export recorded.
    parse_envelope(envelope.to_bytes(), where=str(path))
    target = output or ctx.info.state_dir / "exports" / f"{envelope.id}.json"
    write_envelope(envelope, target)
    ctx.ledger.append(
        "exported",
        wt_id,
        envelope=envelope.id,
        tree=envelope.tree,
        diff_sha256=envelope.diff_sha256,
        session=state.session,
        file=str(target),
    )
    return ExportSummary(
        id=envelope.id,
        file=str(target),
        worktree=wt_id,
        empty=envelope.empty,
        base=envelope.base,
        head=envelope.head,
        tree=envelope.tree,
        changed_files=len(envelope.paths),
        diff_bytes=envelope.diff_bytes,
        diff_sha256=envelope.diff_sha256,
    )


export = as_json(export_summary)  # the JSON shape (docs/worktrees.md)
