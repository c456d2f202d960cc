"""One JSON object on stdout: how every command answers ``--json``; and untrusted text made
safe for a terminal (``printable``)."""

from __future__ import annotations

import re
import sys
from typing import Any

import orjson

# C0 (ESC, CR, BS...), DEL, C1 (8-bit CSI, OSC) and the Unicode line breaks
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def emit_json(body: Any) -> None:
    sys.stdout.write(orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    sys.stdout.flush()


def printable(text: str) -> str:
    """``text`` a worker chose (a path in its envelope, git's words on its patch) as one
    line a terminal shows as it is: each control character as its escape (``\\x1b``), so a
    name cannot move the cursor, erase a line or retitle the window."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)
