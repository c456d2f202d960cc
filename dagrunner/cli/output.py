"""One JSON object on stdout: how every command answers ``--json``."""

from __future__ import annotations

import sys
from typing import Any

import orjson


def emit_json(body: Any) -> None:
    sys.stdout.write(orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    sys.stdout.flush()
