"""Reading a gate's bounded log back for reports: its tail, with ANSI escapes removed."""

from __future__ import annotations

import re
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0, DEL and C1 (8-bit CSI, OSC)


def read_log(run_dir: Path, rel: str, *, limit: int | None = None) -> str:
    """The log's text (its last ``limit`` bytes when given), or '' when there is none."""
    if not rel:
        return ""
    path = run_dir / rel
    try:
        with path.open("rb") as handle:
            if limit is not None:
                size = path.stat().st_size
                handle.seek(max(0, size - limit))
            data = handle.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def strip_ansi(text: str) -> str:
    return _CONTROL.sub("", ANSI.sub("", text))
