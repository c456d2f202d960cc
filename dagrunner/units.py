"""Durations (``90s``, ``5m``, ``1h30m``), sizes (``512M``, ``2GiB``) and a few bounds."""

from __future__ import annotations

import math
import re

MAX_WINDOW = 64  # queue items an integration pipeline gates at once, at most

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)", re.IGNORECASE)
_SIZE_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_duration(value: object) -> float:
    """Seconds in ``value``: a number of seconds, or text such as ``90s``, ``5m``, ``1h30m``.

    Raises ValueError with a sentence saying what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s or 5m, not a boolean")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite duration")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 90s or 5m, got {type(value).__name__}")
    text = value.strip().lower()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text or not math.isfinite(total):
        raise ValueError(f"{value[:40]!r} is not a duration; use forms like 500ms, 90s, 5m, 1h30m")
    return total


def parse_size(value: object) -> int:
    """Bytes in ``value``: a number of bytes, or ``512M``, ``2G``, ``1.5GiB`` (powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512M, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size such as 512M or 2G, got {type(value).__name__}")
    match = _SIZE.fullmatch(value.strip())
    power = _SIZE_POWER[match.group(2).lower()] if match else 0
    # "5i" (a binary suffix with no unit) and "1.5" (a fraction of a byte) are mistakes.
    if match is None or (power == 0 and ("i" in match.group(3).lower() or "." in match.group(1))):
        raise ValueError(f"{value[:40]!r} is not a size; use forms like 4096, 512K, 512M, 2G")
    return int(float(match.group(1)) * 1024**power)


def format_duration(seconds: float) -> str:
    """Short human text: ``850ms``, ``12.3s``, ``4m05s``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_size(n: float) -> str:
    """Short human text in powers of 1024: ``512B``, ``3.0M``, ``1.2G``."""
    for unit in ("B", "K", "M", "G"):
        if abs(n) < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}G"
