"""Patch envelopes (schema ``dagrunner.patch-envelope/1``): export from a worktree, and validate.

Export builds the worker's full state as a tree through a temporary index
(``statetree.py``), so every blob is in the shared object database, then diffs
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
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError
from dagrunner.git.command import git
from dagrunner.git.diff import FilePatch, PatchFormatError, parse_patch
from dagrunner.names import RULE, is_safe_id, is_safe_name

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


def max_bytes(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return int(env.get("DAGRUNNER_ENVELOPE_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class RepoIdentity:
    """Which repository an envelope says it came from: its common git dir and root commits."""

    common_dir: str | None
    root_commits: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {"common_dir": self.common_dir, "root_commits": sorted(self.root_commits)}

    def same_as(self, other: RepoIdentity) -> bool:
        """The same repository: one common dir, or (a clone) a shared root commit."""
        if self.common_dir is not None and self.common_dir == other.common_dir:
            return True
        return bool(self.root_commits & other.root_commits)


def repo_identity(path: Path) -> RepoIdentity:
    common = git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=path).text
    roots = git(["rev-list", "--max-parents=0", "HEAD"], cwd=path, check=False).text.split()
    return RepoIdentity(common, frozenset(roots))


@dataclass(frozen=True)
class Envelope:
    """A validated envelope: its fields (the wire form, kept to write back byte-for-byte),
    the raw diff bytes, and typed views of the fields other modules read."""

    fields: dict[str, Any]
    diff: bytes
    item: str | None = None  # its id on the queue where another item held its own (queue.py)

    @property
    def id(self) -> str:
        """The id the queue, the journal and the trailers know it by: its own, unless
        another envelope was queued with that id first."""
        return self.item or self.exported_id

    @property
    def exported_id(self) -> str:
        """The id export gave it (the one the ledger's record of the export names)."""
        return str(self.fields["id"])

    @property
    def mission(self) -> str:
        return str(self.fields["mission"])

    @property
    def worker(self) -> str:
        return str(self.fields["worker"])

    @property
    def base(self) -> str:
        return str(self.fields["base"])

    @property
    def head(self) -> str:
        return str(self.fields["head"])

    @property
    def tree(self) -> str:
        return str(self.fields["tree"])

    @property
    def diff_sha256(self) -> str:
        return str(self.fields["diff_sha256"])

    @property
    def diff_bytes(self) -> int:
        return int(self.fields["diff_bytes"])

    @property
    def empty(self) -> bool:
        return bool(self.fields["empty"])

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths it changes (a rename's new path), in changed_files order."""
        return tuple(str(c["path"]) for c in self.fields["changed_files"])

    @property
    def touched(self) -> frozenset[str]:
        """Every path it touches: new paths and a rename's old ones."""
        olds = {str(c["old_path"]) for c in self.fields["changed_files"] if c.get("old_path")}
        return frozenset(self.paths) | olds

    @property
    def repo(self) -> RepoIdentity:
        claimed = self.fields["repo"]
        common = claimed.get("common_dir")
        roots = claimed.get("root_commits")
        return RepoIdentity(
            common if isinstance(common, str) else None,
            frozenset(r for r in roots if isinstance(r, str))
            if isinstance(roots, list)
            else frozenset(),
        )

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.fields, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def envelope_id(mission: str, worker: str, base: str, tree: str) -> str:
    """``mission.worker.<hash of mission, worker, base and tree>``: the same work, the same id."""
    ident = hashlib.sha256(f"{mission}/{worker}\0{base}\0{tree}".encode()).hexdigest()[:16]
    return f"{mission}.{worker}.{ident}"


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
            f"the diff is not one git export writes (a full-index binary diff, a/ and b/ names): {exc}",
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
    if not isinstance(fields.get("subject", ""), str):  # its text is cleaned where it is used
        raise _reject("envelope-field", "subject is not a string", where, "re-export it")
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
        if str(pure) != name or "." in name.split("/"):
            # git applies "a//b" as "a/b": a protected glob must see the path git writes
            raise _reject(
                "envelope-path",
                f"path {name!r} is not in git's form (an empty or '.' component, a '/' at its end)",
                where,
                "an envelope names each path as git does; re-export it",
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
