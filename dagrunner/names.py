"""Safe names: the one rule for every name that becomes a path, a ref or a commit trailer.

Missions, workers, sessions and envelope ids come from callers and, inside an
envelope, from untrusted workers.  A safe name is 1-63 (ids: 1-200) letters,
digits, ``_``, ``-`` or ``.``, starts with a letter or digit, holds no ``..``
and does not end in ``.`` or ``.lock`` -- so it can never climb out of a
folder, name a git lock file, or smuggle a newline into a commit message.
"""

from __future__ import annotations

import re

_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
RULE = "1-63 letters, digits, '_', '-' or '.', starting with a letter or digit, no '..'"


def _safe(value: object, pattern: re.Pattern[str]) -> bool:
    return (
        isinstance(value, str)
        and pattern.fullmatch(value) is not None
        and ".." not in value
        and not value.endswith((".lock", "."))
    )


def is_safe_name(value: object) -> bool:
    """A mission, worker or session name."""
    return _safe(value, _SLUG)


def is_safe_id(value: object) -> bool:
    """An envelope id (``mission.worker.hash``: longer than a name, same alphabet)."""
    return _safe(value, _ID)


def is_object_id(value: object) -> bool:
    """A full git object id (SHA-1 or SHA-256) as git writes it: never an option or a range."""
    return isinstance(value, str) and _OBJECT_ID.fullmatch(value) is not None
