"""Measured gate durations from earlier runs, which feed critical-path priorities.

Kept beside the gate cache, one small JSON file per repository and manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import orjson

from dagrunner.files import atomic_write, locked
from dagrunner.git.repo import cache_root
from dagrunner.records.run import GateResult, Status


def history_path(repo: Path, manifest_name: str, root: Path | None = None) -> Path:
    ident = hashlib.sha256(f"{repo.resolve()}\0{manifest_name}".encode()).hexdigest()[:16]
    return (root or cache_root()) / "history" / f"{manifest_name}-{ident}.json"


def read_history(path: Path, part: str = "durations") -> dict[str, float]:
    """Gate id -> last measured seconds (``part="cases"``: test file or class -> seconds, from
    the gates' JUnit files); empty when there is no (readable) history."""
    with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError, TypeError):
        data = orjson.loads(path.read_bytes())
        return {str(k): float(v) for k, v in data.get(part, {}).items()}
    return {}


def read_splits(path: Path) -> dict[str, dict[str, int]]:
    """Each split gate's last assignment: file -> shard number."""
    with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError, TypeError):
        data = orjson.loads(path.read_bytes()).get("splits", {})
        return {
            str(gate): {str(f): int(n) for f, n in files.items() if isinstance(n, int)}
            for gate, files in data.items()
            if isinstance(files, dict)
        }
    return {}


MAX_CASES = 20000


def record_history(
    path: Path,
    results: Iterable[GateResult],
    splits: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """Merge the durations of gates that really ran (passed, flaky or failed) into the
    history, and the seconds their JUnit files gave per test file (how splits balance)."""
    ran = [
        r
        for r in results
        if r.status in (Status.PASSED, Status.FLAKY, Status.FAILED) and r.attempts
    ]
    measured = {r.id: round(r.duration, 4) for r in ran}
    cases = {k: v for r in ran if r.tests is not None for k, v in r.tests.seconds.items()}
    if not measured:
        return
    with locked(path.with_suffix(".lock")):
        durations = read_history(path)
        durations.update(measured)
        known = read_history(path, "cases")
        known.update(cases)
        kept = dict(list(known.items())[-MAX_CASES:])
        assigned = read_splits(path) | {g: dict(f) for g, f in (splits or {}).items()}
        body = {"durations": durations, "cases": kept, "splits": assigned}
        atomic_write(path, orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
