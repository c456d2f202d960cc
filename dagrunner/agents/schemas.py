"""What the agents' tools take and answer, as JSON Schemas an agent (and its SDK) can check.

Inputs are bounded where the CLI bounds them (a wait's timeout, a priority, a cursor, the
``M/W`` form of a worktree id, the length of every name), and an argument a tool does not
take is refused (``additionalProperties: false``): a misspelt ``requeue`` is never ignored.
Outputs name the keys every answer has and their types; the rest of the CLI's ``--json``
answer may follow (``additionalProperties`` stays open: new keys go last, as the CLI's do).
An error answers ``ERROR`` (with ``isError``), never the tool's output schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from dagrunner.agents.tools import MAX_WAIT

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"  # names.py's rule (the ".." and ".lock" checks
ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$"  # are the library's, with their coded errors)

Mission = Annotated[str, Field(pattern=NAME, max_length=63, description="the mission's name")]
Worker = Annotated[str, Field(pattern=NAME, max_length=63, description="the worker's name")]
Worktree = Annotated[
    str,
    Field(
        pattern=NAME.rstrip("$") + "/" + NAME.lstrip("^"),
        max_length=127,
        description="the worktree's id, MISSION/WORKER (as dagrunner_allocate made it)",
    ),
]
Item = Annotated[
    str,
    Field(
        pattern=ID,
        max_length=200,
        description="the queue item's id (dagrunner_submit's id), or a release check's handle",
    ),
]
Timeout = Annotated[
    float,
    Field(ge=0, le=MAX_WAIT, description=f"seconds to wait at most (0 to {MAX_WAIT:g})"),
]
Cursor = Annotated[
    int, Field(ge=0, description="the cursor the last answer gave (0: from the start)")
]
Priority = Annotated[
    Annotated[int, Field(ge=-1000, le=1000)] | Literal["urgent"],
    Field(description="-1000 to 1000, higher first; 'urgent' is the operator's to give"),
]
Branch = Annotated[str, Field(max_length=255, description="a branch (default: the target)")]
Ref = Annotated[str, Field(max_length=255, description="a commit or branch (default HEAD)")]

_TEXT: dict[str, Any] = {"type": "string"}
_TEXTS: dict[str, Any] = {"type": "array", "items": _TEXT}
_INT: dict[str, Any] = {"type": "integer"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_MAYBE_TEXT: dict[str, Any] = {"type": ["string", "null"]}
_OBJECT: dict[str, Any] = {"type": "object"}
FINAL_STATES = ["landed", "conflict", "gates-failed", "rejected", "withdrawn"]
STATES = ["queued", "applying", "applied", "gating", "landing", *FINAL_STATES]


def _shape(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": sorted(required),
    }


CAUSE = _shape(
    {"code": _TEXT, "message": _TEXT, "hint": _TEXT},
    {"since": _MAYBE_TEXT},
)
ERROR = _shape(
    {"error": _shape({"code": _TEXT, "message": _TEXT, "hint": _MAYBE_TEXT}, {"key": _TEXT})}
)

OUTPUT: dict[str, dict[str, Any]] = {
    "dagrunner_allocate": _shape(
        {"id": _TEXT, "path": _TEXT, "branch": _TEXT, "base": _TEXT},
        {"ports": {"type": "array"}, "seeds": {"type": "array"}, "reused": _BOOL},
    ),
    "dagrunner_submit": _shape(
        {
            "id": _TEXT,
            "state": {"enum": STATES},
            "duplicate": _BOOL,
            "position": _INT,
            "target": _TEXT,
            "provenance": _TEXT,
            "overlaps": {"type": "array", "items": _OBJECT},
        },
        {"again_of": _MAYBE_TEXT, "export": _OBJECT, "envelope": _TEXT},
    ),
    "dagrunner_wait": _shape(
        {
            "id": _TEXT,
            "state": _TEXT,
            "final": _BOOL,
            "cursor": _INT,
            "events": {"type": "array", "items": _OBJECT},
            "next": _TEXT,
        },
        {
            "eta_seconds": {"type": ["number", "null"]},
            "commit": _TEXT,
            "stuck": CAUSE,
            "summary": _OBJECT,
            "exit_code": _INT,
        },
    ),
    "dagrunner_why": _shape(
        {"id": _TEXT, "state": {"enum": STATES}, "final": _BOOL, "next": _TEXT},
        {
            "reason": _TEXT,
            "commit": _TEXT,
            "stuck": CAUSE,
            "failed_gates": {"type": "array", "items": _OBJECT},
            "conflicts": _TEXTS,
            "hunks": _MAYBE_TEXT,
            "hunk_labels": _OBJECT,
        },
    ),
    "dagrunner_status": _shape(
        {
            "envelopes": {"type": "array", "items": _OBJECT},
            "counts": _OBJECT,
            "integrator": _OBJECT,
        },
        {"eta": _OBJECT, "target_red": _OBJECT},
    ),
    "dagrunner_overlaps": _shape(
        {"target": _TEXT, "pairs": {"type": "array", "items": _OBJECT}, "conflicts": _INT}
    ),
    "dagrunner_sync": _shape(
        {"id": _TEXT, "target": _TEXT, "head": _TEXT, "backup": _TEXT, "conflicts": _TEXTS},
        {"new_base": _TEXT, "old_head": _TEXT, "replayed": _INT, "carried": _OBJECT, "next": _TEXT},
    ),
    "dagrunner_cleanup": _shape({"id": _TEXT, "action": _TEXT}, {"reason": _TEXT}),
    "dagrunner_withdraw": _shape(
        {"id": _TEXT, "state": {"const": "withdrawn"}, "final": _BOOL, "already": _BOOL},
        {"was": _TEXT},
    ),
    "dagrunner_release_check": _shape(
        {"id": _TEXT, "state": _TEXT, "final": _BOOL}, {"target": _TEXT}
    ),
}
