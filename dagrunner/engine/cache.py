"""The content-addressed gate cache, with proof of why a gate was skipped.

A gate with ``inputs`` is cacheable, under its key (``keys.py``).  Secrets never reach
the store: environment values are kept only as hashes.

Entries live under ``DAGRUNNER_CACHE_DIR`` as ``entries/<k[:2]>/<k>.json``
(written atomically) plus ``entries/<k[:2]>/<k>.log``.  Each entry carries an
HMAC-SHA256 of its body (which holds its log's digest) under a key made once
per store (``key``, mode 0600) and never passed into a sandbox -- gates run
with the store hidden (``contain.py``) -- so a torn, tampered or forged entry
is a miss: knowing a gate's cache key is not enough to fake its verdict.  ``gates/`` keeps,
per manifest and gate, the components of the newest entry so that
``cache explain`` can say what changed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.engine.keys import KeyParts
from dagrunner.files import atomic_write, mark_own_output
from dagrunner.git.repo import cache_root
from dagrunner.records.run import GateResult, Observation

READ_SETS = 8  # read sets kept under one shape key (docs/cache.md)

# -- the store ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Hit:
    key: str
    result: dict[str, Any]
    run_id: str
    stored_at: str
    duration: float
    log: Path
    layered: bool = False  # stored by a run whose gates each had a layer of their own


class Store:
    """Entries on disk; every read failure is a miss (with a warning), never a crash."""

    def __init__(self, root: Path | None = None, *, layered: bool = False) -> None:
        self.root = root or cache_root()
        # A run whose gates each wrote a layer of their own (an envelope's tree) stores its
        # passes marked so, and is answered only by such passes: a pass of a tree whose gates
        # shared its scratch (a checkout) may have read what another gate left there.
        self.layered = layered
        self.warnings: list[str] = []
        self._key: bytes | None = None

    def _secret(self) -> bytes:
        """The store's HMAC key: made once (0600, exclusive create), then read."""
        if self._key is None:
            path = self.root / "key"
            try:
                mark_own_output(self.root)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(secrets.token_bytes(32))
                    handle.flush()
                    os.fsync(handle.fileno())
            except FileExistsError:
                pass
            key = path.read_bytes()
            deadline = time.monotonic() + 1.0
            while len(key) < 32 and time.monotonic() < deadline:  # its writer, still writing
                time.sleep(0.01)
                key = path.read_bytes()
            if len(key) < 32:  # a writer that crashed mid-way: nothing was signed with it
                raise OSError(f"the cache key {path} is incomplete; delete it")
            self._key = key
        return self._key

    def _sign(self, body: dict[str, Any]) -> str:
        # Through JSON once first: a record inside (a gate's TestRun) keeps its fields in
        # their own order when dumped, and reads back as a dict, which sorts.
        plain = orjson.loads(orjson.dumps(body))
        canonical = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
        return hmac.new(self._secret(), canonical, hashlib.sha256).hexdigest()

    def sign_to(self, path: Path, body: dict[str, Any]) -> None:
        """Write ``body`` signed to ``path`` (a failure to write is a warning, not an error)."""
        try:
            atomic_write(path, orjson.dumps({"body": body, "hmac": self._sign(body)}))
        except OSError as exc:
            self.warnings.append(f"could not write {path}: {exc}")

    def verified(self, path: Path) -> dict[str, Any] | None:
        """The body ``sign_to`` wrote at ``path``; None when absent, damaged or forged."""
        try:
            wrapper = orjson.loads(path.read_bytes())
            body = wrapper["body"]
            if isinstance(body, dict) and hmac.compare_digest(
                self._sign(body), str(wrapper["hmac"])
            ):
                return body
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            pass
        return None

    def _entry(self, key: str) -> Path:
        return self.root / "entries" / key[:2] / f"{key}.json"

    def _read_sets(self, shape: str) -> Path:
        return self.root / "reads" / shape[:2] / shape

    def read_sets(self, shape: str) -> list[frozenset[str]]:
        """The read sets of the complete observations kept under a shape key (``keys.py``),
        most recently used first; each one signed, so a gate cannot plant one."""
        try:
            files = [(p.stat().st_mtime, p) for p in self._read_sets(shape).glob("*.json")]
        except OSError:
            return []
        found = []
        for _, path in sorted(files, key=lambda f: f[0], reverse=True):
            body = self.verified(path)
            paths = body.get("read") if body is not None and body.get("shape") == shape else None
            if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
                found.append(frozenset(paths))
        return found

    def keep_read_set(self, shape: str, gate: str, read: frozenset[str]) -> None:
        """Keep ``read`` under ``shape``, and only the :data:`READ_SETS` newest there: each
        is one more lookup on every run, and an old one answers an old tree."""
        folder = self._read_sets(shape)
        name = hashlib.sha256("\0".join(sorted(read)).encode("utf-8", "surrogateescape"))
        path = folder / f"{name.hexdigest()}.json"
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        self.sign_to(path, {"shape": shape, "gate": gate, "read": sorted(read)})
        with contextlib.suppress(OSError):
            kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in kept[READ_SETS:]:
                old.unlink(missing_ok=True)

    def used_read_set(self, shape: str, read: frozenset[str]) -> None:
        """A set that answered a lookup is kept longest (least recently used goes first)."""
        name = hashlib.sha256("\0".join(sorted(read)).encode("utf-8", "surrogateescape"))
        with contextlib.suppress(OSError):
            os.utime(self._read_sets(shape) / f"{name.hexdigest()}.json")

    def _gate_index(self, manifest_name: str, gate: str) -> Path:
        return self.root / "gates" / manifest_name / f"{gate}.json"

    def lookup(self, key: str) -> Hit | None:
        path = self._entry(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.warnings.append(f"cache entry {path} unreadable ({exc}); treated as a miss")
            return None
        try:
            wrapper = orjson.loads(raw)
            body = wrapper["body"]
            if (
                not hmac.compare_digest(self._sign(body), str(wrapper["hmac"]))
                or body["key"] != key
            ):
                raise ValueError("its signature does not match its content (forged or damaged)")
            log = path.with_suffix(".log")
            if hashlib.sha256(log.read_bytes()).hexdigest() != body["log_sha256"]:
                raise ValueError("its log does not match the recorded digest")
            hit = Hit(
                key=key,
                result=body["result"],
                run_id=body["run_id"],
                stored_at=body["stored_at"],
                duration=float(body["duration"]),
                log=log,
                layered=body.get("layered") is True,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OSError) as exc:
            self.warnings.append(f"cache entry {path} is corrupt ({exc}); treated as a miss")
            return None
        if self.layered and not hit.layered:
            return None  # not a verdict of gates that saw only their tree and their needs
        with contextlib.suppress(OSError):
            os.utime(path)  # least-recently-used order for prune
        return hit

    def store(
        self,
        *,
        manifest_name: str,
        parts: KeyParts,
        result: GateResult,
        run_id: str,
        log: Path,
        key: str | None = None,
        read: Mapping[str, str | None] | None = None,
    ) -> None:
        """Store a pass under ``key`` (default: its input key; a tree-scoped key for a
        verdict that holds only for one tree, ``keys.tree_scope``; a verdict key for a gate
        keyed by ``read``, the files it read and their content ids, kept for explain)."""
        key = key or parts.key
        path = self._entry(key)
        try:
            log_bytes = log.read_bytes()
        except OSError:
            log_bytes = b""
        body = {
            "key": key,
            "gate": parts.gate,
            "run_id": run_id,
            "stored_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "duration": round(result.duration, 4),
            "result": result.to_json(),
            "log_sha256": hashlib.sha256(log_bytes).hexdigest(),
        } | ({"layered": True} if self.layered else {})
        try:
            signature = self._sign(body)
            # Not fsynced (docs/cache.md): this runs before the gate's dependants start, and
            # what a power loss can leave (an empty entry) is a miss with a warning.
            atomic_write(path.with_suffix(".log"), log_bytes, durable=False)
            atomic_write(path, orjson.dumps({"body": body, "hmac": signature}), durable=False)
            atomic_write(
                self._gate_index(manifest_name, parts.gate),
                orjson.dumps(
                    {"key": key, "run_id": run_id, "parts": parts.to_json(), "read": read}
                ),
                durable=False,
            )
        except OSError as exc:
            self.warnings.append(f"could not store cache entry for {parts.gate!r}: {exc}")

    def alias(self, hit: Hit, key: str) -> None:
        """Store ``hit``'s verdict under ``key`` too: a verdict scoped to a tree that has
        landed since holds for every tree with its verdict key (``RunCache.lookup``)."""
        path = self._entry(key)
        try:
            log_bytes = hit.log.read_bytes()
            if path.exists():
                return
            body = {
                "key": key,
                "gate": str(hit.result.get("id", "")),
                "run_id": hit.run_id,
                "stored_at": hit.stored_at,
                "duration": hit.duration,
                "result": hit.result,
                "log_sha256": hashlib.sha256(log_bytes).hexdigest(),
            } | ({"layered": True} if hit.layered else {})
            signature = self._sign(body)
            atomic_write(path.with_suffix(".log"), log_bytes, durable=False)
            atomic_write(path, orjson.dumps({"body": body, "hmac": signature}), durable=False)
        except OSError as exc:
            self.warnings.append(f"could not store cache entry {key[:12]}: {exc}")

    def newest_parts(self, manifest_name: str, gate: str) -> dict[str, Any] | None:
        try:
            data = orjson.loads(self._gate_index(manifest_name, gate).read_bytes())
            parts: dict[str, Any] = data["parts"]
            parts["key"] = data["key"]
            parts["read"] = data.get("read")
            return parts
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            return None

    def _all_read_sets(self) -> Iterator[Path]:
        return (self.root / "reads").glob("*/*/*.json")

    def prune(self, max_size: int, *, dry_run: bool = False) -> dict[str, Any]:
        """Delete least-recently-used entries until the store is at most ``max_size`` bytes."""
        entries = []
        for path in [*(self.root / "entries").glob("*/*.json"), *self._all_read_sets()]:
            with contextlib.suppress(OSError):
                log = path.with_suffix(".log")
                size = path.stat().st_size + (log.stat().st_size if log.exists() else 0)
                entries.append((path.stat().st_mtime, size, path))
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, path in sorted(entries):
            if total <= max_size:
                break
            if not dry_run:
                path.unlink(missing_ok=True)
                path.with_suffix(".log").unlink(missing_ok=True)
            removed.append(path.stem)
            total -= size
        return {
            "removed": removed,
            "size_after": total,
            "entries_left": len(entries) - len(removed),
        }


def undeclared_reads(
    parts: KeyParts | str | None, seen: Observation | None, ids: Mapping[str, str]
) -> list[str]:
    """Files of the tree (``ids``: its snapshot) a gate keyed by narrower inputs read
    outside them: the inputs to add before a stale pass teaches them."""
    if not isinstance(parts, KeyParts) or parts.names or seen is None:
        return []
    return sorted(p for p in seen.read if p in ids and p not in parts.inputs)


def reads_account(
    parts: KeyParts,
    seen: Observation | None,
    ids: Mapping[str, str],
    by_read: bool,
    read: int | None = None,
    stands: frozenset[str] | None = None,
) -> dict[str, Any]:
    """A gate's proof of what it was seen to read (``read``: the size of the stored read
    set that answered it; ``stands``: the files a run's reads stand for, bytecode's
    sources among them) and what it is keyed by: its reads, the whole tree (its
    observation was incomplete), or its declared inputs."""
    if read is not None:
        return {"keyed_by": "reads", "read": read}
    body: dict[str, Any] = {"keyed_by": "declared inputs"}
    if by_read:
        body["keyed_by"] = "reads" if seen and seen.complete else "whole tree"
    if seen is None:  # answered by its whole key, or not asked
        return body
    body |= {"complete": seen.complete, "why": seen.why}
    count = len(stands) if stands else sum(1 for p in seen.read if p in ids)
    body |= {"read": count, "listed": len(seen.listed)}
    if undeclared := undeclared_reads(parts, seen, ids):
        body |= {"undeclared": undeclared[:10], "undeclared_count": len(undeclared)}
    return body


def reads_warnings(
    seen: Mapping[str, Observation],
    by_read: Mapping[str, KeyParts],
    undeclared: Callable[[str], list[str]],
) -> list[str]:
    """The run's warnings about reads: each gate that read outside its inputs, and the gates
    keyed by their reads whose observation was incomplete (one line per reason)."""
    found = []
    for gate in sorted(seen):
        if files := undeclared(gate):
            more = f" and {len(files) - 10} more" if files[10:] else ""
            found.append(
                f"gate {gate!r} read files outside its inputs, which its cache key does not "
                f"hold: {', '.join(files[:10])}{more} (add them to its inputs)"
            )
    fell: dict[str, list[str]] = {}
    for gate, observation in sorted(seen.items()):
        if gate in by_read and not observation.complete:
            fell.setdefault(observation.why or "incomplete", []).append(gate)
    return found + [
        f"observation incomplete ({why}): keyed by the whole tree instead of what it read: "
        + ", ".join(gates)
        for why, gates in fell.items()
    ]
