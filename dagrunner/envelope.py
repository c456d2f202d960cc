"""Patch envelopes (schema ``dagrunner.patch-envelope/1``): export from a worktree, and validate.

Export builds the worker's full state as a tree through a temporary index
(``snapshot.py``), so every blob is in the shared object database, then diffs
the recorded base against that tree with ``--binary --full-index``.  Commits,
staged and unstaged edits, untracked files (gitignored ones excluded),
deletions, renames, modes, symlinks and binary files all travel.  The diff is
read whole -- never through a bounded buffer -- and hashed.

Validation refuses, with a code naming the reason: unreadable JSON, another
schema, a missing or mistyped field, a size over the limit, a hash or size
that does not match the diff, and any path in the diff that is absolute,
climbs out with ``..``, enters ``.git``, or goes through a symlink the patch
itself creates.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.fsutil import atomic_write
from dagrunner.git import git
from dagrunner.names import RULE, is_safe_id, is_safe_name
from dagrunner.patch import FilePatch, PatchFormatError, parse_patch
from dagrunner.snapshot import state_tree
from dagrunner.version import VERSION

SCHEMA = "dagrunner.patch-envelope/1"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "id": str,
    "mission": str,
    "worker": str,
    "repo": dict,
    "base": str,
    "head": str,
    "tree": str,
    "branch": str,
    "status": list,
    "changed_files": list,
    "diff_bytes": int,
    "diff_sha256": str,
    "created_at": str,
    "tool_version": str,
    "diff_encoding": str,
    "empty": bool,
}
_HEX40 = re.compile(r"[0-9a-f]{40}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_KIND = {
    "A": "added",
    "D": "deleted",
    "M": "modified",
    "T": "type-changed",
    "R": "renamed",
    "C": "copied",
}


def max_bytes(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return int(env.get("DAGRUNNER_ENVELOPE_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


def repo_identity(path: Path) -> dict[str, Any]:
    common = git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=path).text
    roots = git(["rev-list", "--max-parents=0", "HEAD"], cwd=path, check=False).text.split()
    return {"common_dir": common, "root_commits": sorted(roots)}


@dataclass(frozen=True)
class Envelope:
    """A validated envelope: its fields and the raw diff bytes."""

    fields: dict[str, Any]
    diff: bytes

    @property
    def id(self) -> str:
        return str(self.fields["id"])

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.fields, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


# -- export ----------------------------------------------------------------------------


def envelope_id(mission: str, worker: str, base: str, tree: str) -> str:
    """``mission.worker.<hash of mission, worker, base and tree>``: the same work, the same id."""
    ident = hashlib.sha256(f"{mission}/{worker}\0{base}\0{tree}".encode()).hexdigest()[:16]
    return f"{mission}.{worker}.{ident}"


def _split_z(data: bytes) -> list[str]:
    return [p.decode("utf-8", "surrogateescape") for p in data.split(b"\0")]


def changed_files(path: Path, base: str, tree: str) -> list[dict[str, Any]]:
    raw = git(
        ["diff", "--raw", "-z", "--no-abbrev", "--find-renames", "--no-ext-diff", base, tree],
        cwd=path,
    ).stdout
    numstat = git(
        ["diff", "--numstat", "-z", "--find-renames", "--no-ext-diff", base, tree], cwd=path
    ).stdout
    binary = set()
    fields = _split_z(numstat)
    i = 0
    while i < len(fields):
        entry = fields[i]
        if not entry:
            i += 1
            continue
        added, deleted, name = entry.split("\t", 2)
        if not name:  # a rename: the two paths follow
            name = fields[i + 2]
            i += 2
        if added == "-" and deleted == "-":
            binary.add(name)
        i += 1
    out: list[dict[str, Any]] = []
    parts = _split_z(raw)
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
    status = _split_z(
        git(["status", "--porcelain=v2", "-z", "--untracked-files=all"], cwd=path).stdout
    )
    check_finished(path, status)
    tree = state_tree(path)
    head = git(["rev-parse", "HEAD"], cwd=path).text
    branch = git(["symbolic-ref", "--short", "-q", "HEAD"], cwd=path, check=False).text
    diff = git(
        [
            "diff",
            "--binary",
            "--full-index",
            "--no-ext-diff",
            "--no-color",
            "--find-renames",
            base,
            tree,
        ],
        cwd=path,
    ).stdout
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
        "repo": repo_identity(path),
        "base": base,
        "head": head,
        "tree": tree,
        "branch": branch,
        "status": [entry for entry in status if entry],
        "changed_files": changed_files(path, base, tree),
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


# -- validation ---------------------------------------------------------------------------


def _reject(code: str, message: str, where: str | None, hint: str) -> DagrunnerError:
    return DagrunnerError(code, message, where=where, hint=hint)


def parse_envelope(data: bytes, *, where: str | None = None, limit: int | None = None) -> Envelope:
    """Validate raw envelope bytes; raise DagrunnerError (exit 2) naming the reason.

    Every field is checked before anything uses it: names against the safe-name
    rule (they become paths, refs and commit trailers), the id against the
    mission, worker, base and tree it is derived from, the diff against its hash,
    and what the diff touches -- read from the diff's own structure -- against
    ``changed_files``.
    """
    limit = max_bytes() if limit is None else limit
    if len(data) > 2 * limit + 1024 * 1024:
        raise _reject(
            "envelope-too-large",
            f"the envelope is {len(data)} bytes",
            where,
            f"the limit is {limit} bytes of diff (DAGRUNNER_ENVELOPE_MAX_BYTES)",
        )
    try:
        fields = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _reject(
            "envelope-unreadable", f"not valid JSON: {exc}", where, "re-export it"
        ) from None
    if not isinstance(fields, dict) or fields.get("schema") != SCHEMA:
        schema = fields.get("schema") if isinstance(fields, dict) else None
        raise _reject(
            "envelope-schema",
            f"schema {str(schema)[:80]!r} is not {SCHEMA!r}",
            where,
            "export it with this dagrunner (worktree export)",
        )
    _check_fields(fields, where)
    try:
        if fields["diff_encoding"] == "base64":
            diff = base64.b64decode(fields["diff"], validate=True)
        elif fields["diff_encoding"] == "utf-8":
            diff = fields["diff"].encode("utf-8")
        else:
            raise ValueError(f"unknown diff_encoding {fields['diff_encoding'][:40]!r}")
    except ValueError as exc:
        raise _reject("envelope-field", str(exc), where, "re-export it") from None
    if len(diff) > limit:
        raise _reject(
            "envelope-too-large",
            f"the diff is {len(diff)} bytes, over {limit}",
            where,
            "split the work, or raise DAGRUNNER_ENVELOPE_MAX_BYTES",
        )
    if (
        len(diff) != fields["diff_bytes"]
        or hashlib.sha256(diff).hexdigest() != fields["diff_sha256"]
    ):
        raise _reject(
            "envelope-hash",
            "the diff does not match its recorded size and sha256",
            where,
            "the envelope was changed or truncated after export; re-export it",
        )
    try:
        patches = parse_patch(diff)
    except PatchFormatError as exc:
        raise _reject(
            "envelope-diff",
            f"the diff is not a git binary diff: {exc}",
            where,
            "re-export it with `dagrunner worktree export`",
        ) from None
    check_paths(patches, fields["changed_files"], where)
    check_changed_files(patches, fields["changed_files"], where)
    return Envelope(fields=fields, diff=diff)


def _check_fields(fields: dict[str, Any], where: str | None) -> None:
    """Types, names, object ids, the repository identity and the worktree's status."""
    for name, kind in REQUIRED.items():
        if not isinstance(fields.get(name), kind) or (
            kind is int and isinstance(fields.get(name), bool)
        ):
            raise _reject(
                "envelope-field",
                f"field {name!r} is missing or not a {getattr(kind, '__name__', kind)}",
                where,
                "re-export it; envelopes are not meant to be edited",
            )
    if not isinstance(fields.get("diff"), str):
        raise _reject("envelope-field", "field 'diff' is missing", where, "re-export it")
    for name in ("base", "head", "tree"):
        if not _HEX40.fullmatch(fields[name]):
            raise _reject(
                "envelope-field", f"{name} is not a full object id", where, "re-export it"
            )
    for name in ("mission", "worker"):
        if not is_safe_name(fields[name]):
            raise _reject(
                "envelope-name",
                f"{name} {fields[name][:80]!r} is not a safe name",
                where,
                f"names are {RULE}; re-export it from a worktree dagrunner allocated",
            )
    session = fields.get("session")
    if session is not None and not is_safe_name(session):
        raise _reject(
            "envelope-name",
            f"session {str(session)[:80]!r} is not a safe name",
            where,
            f"sessions are {RULE}",
        )
    if not is_safe_id(fields["id"]) or fields["id"] != envelope_id(
        fields["mission"], fields["worker"], fields["base"], fields["tree"]
    ):
        raise _reject(
            "envelope-name",
            f"id {fields['id'][:80]!r} is not the id of this mission, worker, base and tree",
            where,
            "ids are derived at export; re-export it instead of editing it",
        )
    for name in ("branch", "created_at", "tool_version"):
        if len(fields[name]) > 255 or _CONTROL.search(fields[name]):
            raise _reject(
                "envelope-field",
                f"{name} is longer than 255 characters or holds control characters",
                where,
                "re-export it",
            )
    repo = fields["repo"]
    roots = repo.get("root_commits")
    if (
        not isinstance(repo.get("common_dir"), str)
        or not isinstance(roots, list)
        or not all(isinstance(r, str) and _HEX40.fullmatch(r) for r in roots)
    ):
        raise _reject(
            "envelope-field",
            "repo must hold common_dir (a string) and root_commits (object ids)",
            where,
            "re-export it",
        )
    if not all(isinstance(entry, str) for entry in fields["status"]):
        raise _reject("envelope-field", "status must be a list of strings", where, "re-export it")
    unmerged = [entry[2:].rsplit(" ", 1)[-1] for entry in fields["status"] if entry[:2] == "u "]
    if unmerged:
        raise _reject(
            "envelope-unmerged",
            f"the worktree had unmerged paths when it was exported: {', '.join(unmerged[:10])}",
            where,
            "resolve the conflict in the worktree and export again",
        )
    for entry in fields["changed_files"]:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("path"), str)
            and isinstance(entry.get("old_path"), str | None)
            and isinstance(entry.get("symlink", False), bool)
        ):
            raise _reject(
                "envelope-field",
                "changed_files entries need a path (string), old_path and symlink",
                where,
                "re-export it",
            )


def load_envelope(path: Path, *, limit: int | None = None) -> Envelope:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _reject(
            "envelope-unreadable", exc.strerror or str(exc), str(path), "check the path"
        ) from None
    return parse_envelope(data, where=str(path), limit=limit)


def check_paths(patches: list[FilePatch], changed: list[Any], where: str | None) -> None:
    """Refuse a path that is absolute, climbs out, enters ``.git``, or goes through a new symlink."""
    symlinks = {p.path for p in patches if p.symlink}
    symlinks |= {str(c.get("path")) for c in changed if c.get("symlink")}
    all_paths = [name for p in patches for name in p.paths]
    all_paths += [str(c.get(k)) for c in changed for k in ("path", "old_path") if c.get(k)]
    for name in all_paths:
        pure = PurePosixPath(name)
        parts = pure.parts
        if not name or "\0" in name or pure.is_absolute() or name.startswith("\\"):
            raise _reject(
                "envelope-path",
                f"absolute or empty path {name!r}",
                where,
                "an envelope may only touch paths inside the repository",
            )
        if ".." in parts:
            raise _reject(
                "envelope-path",
                f"path {name!r} climbs out with '..'",
                where,
                "an envelope may only touch paths inside the repository",
            )
        if any(part.lower() == ".git" for part in parts):
            raise _reject(
                "envelope-path",
                f"path {name!r} enters .git",
                where,
                "an envelope may not touch git's own files",
            )
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in symlinks:
                raise _reject(
                    "envelope-symlink",
                    f"path {name!r} goes through a symlink the patch creates",
                    where,
                    "a patch may not write through a symbolic link",
                )


def check_changed_files(patches: list[FilePatch], changed: list[Any], where: str | None) -> None:
    """``changed_files`` must say exactly what the diff does: the same paths, the same symlinks."""
    from_diff = {name for p in patches for name in p.paths}
    listed = {str(c[k]) for c in changed for k in ("path", "old_path") if c.get(k)}
    links = {p.path for p in patches if p.symlink}
    listed_links = {str(c["path"]) for c in changed if c.get("symlink")}
    if from_diff != listed or links != listed_links:
        extra = sorted((listed - from_diff) | (listed_links - links))
        missing = sorted((from_diff - listed) | (links - listed_links))
        raise _reject(
            "envelope-changed-files",
            f"changed_files does not match the diff (listed only: {extra[:5]}, "
            f"in the diff only: {missing[:5]})",
            where,
            "re-export it; changed_files is derived from the diff at export",
        )
