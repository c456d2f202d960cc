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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from dagrunner import __version__
from dagrunner.errors import DagrunnerError
from dagrunner.fsutil import atomic_write
from dagrunner.git import git
from dagrunner.snapshot import state_tree

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
    """The envelope of everything done in ``path`` since ``base`` (read-only for the worktree)."""
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
    status = _split_z(
        git(["status", "--porcelain=v2", "-z", "--untracked-files=all"], cwd=path).stdout
    )
    base_tree = git(["rev-parse", f"{base}^{{tree}}"], cwd=path).text
    try:
        text, encoding = diff.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(diff).decode(), "base64"
    ident = hashlib.sha256(f"{mission}/{worker}\0{base}\0{tree}".encode()).hexdigest()[:16]
    fields = {
        "schema": SCHEMA,
        "id": f"{mission}.{worker}.{ident}",
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
        "tool_version": __version__,
    }
    return Envelope(fields=fields, diff=diff)


def write_envelope(envelope: Envelope, path: Path) -> None:
    atomic_write(path, envelope.to_bytes())


# -- validation ---------------------------------------------------------------------------


def _reject(code: str, message: str, where: str | None, hint: str) -> DagrunnerError:
    return DagrunnerError(code, message, where=where, hint=hint)


def parse_envelope(data: bytes, *, where: str | None = None, limit: int | None = None) -> Envelope:
    """Validate raw envelope bytes; raise DagrunnerError (exit 2) naming the reason."""
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
            f"schema {schema!r} is not {SCHEMA!r}",
            where,
            "export it with this dagrunner (worktree export)",
        )
    for name, kind in REQUIRED.items():
        if not isinstance(fields.get(name), kind):
            raise _reject(
                "envelope-field",
                f"field {name!r} is missing or not a {kind}",
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
    try:
        if fields["diff_encoding"] == "base64":
            diff = base64.b64decode(fields["diff"], validate=True)
        elif fields["diff_encoding"] == "utf-8":
            diff = fields["diff"].encode("utf-8")
        else:
            raise ValueError(f"unknown diff_encoding {fields['diff_encoding']!r}")
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
    check_paths(diff_paths(diff), fields["changed_files"], where)
    return Envelope(fields=fields, diff=diff)


def load_envelope(path: Path, *, limit: int | None = None) -> Envelope:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _reject(
            "envelope-unreadable", exc.strerror or str(exc), str(path), "check the path"
        ) from None
    return parse_envelope(data, where=str(path), limit=limit)


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _unquote(text: str) -> str:
    """A path as git prints it: C-quoted (with octal escapes for bytes) or plain."""
    text = text.strip()
    match = _QUOTED.fullmatch(text)
    if not match:
        return text
    raw = match.group(1).encode("latin-1", "backslashreplace")
    return raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def diff_paths(diff: bytes) -> list[str]:
    """Every path a diff's headers name (``a/``/``b/`` prefixes removed)."""
    paths: list[str] = []
    for raw in diff.split(b"\n"):
        line = raw.decode("utf-8", "surrogateescape")
        if line.startswith(("--- ", "+++ ")):
            name = _unquote(line[4:].split("\t")[0])
            if name == "/dev/null":
                continue
            paths.append(name[2:] if name[:2] in ("a/", "b/") else name)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.append(_unquote(line.split(" ", 2)[2]))
        elif line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            quoted = _QUOTED.findall(rest)
            if len(quoted) == 2:
                names = [_unquote(f'"{q}"') for q in quoted]
            else:
                # Unquoted "a/X b/X": only the same path twice splits unambiguously; a
                # rename's two names are read from its "rename from/to" lines instead.
                half = len(rest) // 2
                names = [rest[:half], rest[half + 1 :]]
                if rest[half : half + 1] != " " or names[0][2:] != names[1][2:]:
                    continue
            paths.extend(n[2:] if n[:2] in ("a/", "b/") else n for n in names)
    return paths


def check_paths(paths: Iterable[str], changed: list[Any], where: str | None) -> None:
    symlinks = {str(c.get("path")) for c in changed if isinstance(c, dict) and c.get("symlink")}
    all_paths = list(paths) + [str(c.get("path")) for c in changed if isinstance(c, dict)]
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
