"""The manifest's JSON Schema, generated from the loader itself (for editors: taplo, Even
Better TOML, VS Code's JSON support).

``manifest_schema`` runs the loader's own readers (``manifest.read_tables``) on a sample
with one node of each kind, and reads back what every table took: each key's converter
(``fields.py``) becomes its schema fragment, each sub-table an object of its own.  A key
the loader learns is in the schema the next time it is generated; a converter without a
fragment here fails generation (and ``tests/test_schema.py``), so the two never drift.
``dagrunner/manifest.schema.json`` and ``docs/manifest.schema.json`` are this output,
kept equal to it by that test (``python -m dagrunner.manifest.schema`` rewrites both).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagrunner.diagnostics import Problems
from dagrunner.manifest import fields as f
from dagrunner.manifest.load import SCHEMA_VERSION, read_tables
from dagrunner.manifest.settings import MAX_SEEDS, seeds
from dagrunner.units import MAX_WINDOW

SCHEMA_ID = "https://dagrunner.invalid/manifest.schema.json"
_DURATION: dict[str, Any] = {
    "type": ["string", "number"],
    "description": 'seconds, or a duration such as "90s", "5m", "1h30m"',
}
_SIZE: dict[str, Any] = {
    "type": ["string", "integer"],
    "description": 'bytes, or a size such as "512M", "2G"',
}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
FRAGMENTS: dict[Callable[[Any], Any], dict[str, Any]] = {
    f.string: {"type": "string"},
    f.network: {"enum": list(f.NETWORKS)},
    f.port_range: {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
    f.port_count: {"type": "integer", "minimum": 0, "maximum": 64},
    f.string_list: _STRINGS,
    f.number: {"type": "number"},
    f.count: {"type": "integer", "minimum": 0},
    f.positive: {"type": "number", "exclusiveMinimum": 0},
    f.duration: _DURATION,
    f.timeout: {**_DURATION, "description": "a duration above 0; none: no timeout"},
    f.interval: {**_DURATION, "description": "a duration of at least 10ms"},
    f.size: _SIZE,
    f.fraction: {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    f.window: {"type": "integer", "minimum": 1, "maximum": MAX_WINDOW},
    f.retries: {"type": "integer", "minimum": 0, "maximum": f.MAX_RETRIES},
    f.batch: {"type": "integer", "minimum": 1, "maximum": f.MAX_BATCH},
    f.baseline: {"enum": list(f.BASELINES)},
    f.message_template: {
        "type": "string",
        "minLength": 1,
        "maxLength": f.MAX_MESSAGE,
        "description": "a landed commit's message: text with {mission}, {worker}, {subject}",
    },
    f.writable_paths: {
        **_STRINGS,
        "description": "absolute paths, or paths relative to the repository, a gate may write",
    },
    f.command: {
        "description": "an argv array, or a string run by sh -c",
        "anyOf": [{"type": "string", "minLength": 1}, {**_STRINGS, "minItems": 1}],
    },
    f.relative_path: {"type": "string", "description": "a path inside the repository"},
    f.globs: {**_STRINGS, "description": "globs relative to the repository (** crosses /)"},
    f.env_names: {"type": "array", "items": {"type": "string", "pattern": f.ENV_NAME.pattern}},
    f.env_values: {"type": "object", "additionalProperties": {"type": "string"}},
    f.durations: {"type": "object", "additionalProperties": _DURATION},
    f.boolean: {"type": "boolean"},
    seeds: {
        "type": "array",
        "description": "[[worktrees.seed]]: a git-ignored folder built once per key, in each worktree",
        "maxItems": MAX_SEEDS,
        "items": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "a folder inside the worktree"},
                "key": {**_STRINGS, "minItems": 1, "description": "globs of the lockfiles"},
                "build": {
                    "description": "an argv array, or a string run by sh -c",
                    "anyOf": [{"type": "string", "minLength": 1}, {**_STRINGS, "minItems": 1}],
                },
                "timeout": _DURATION,
                "tools": {**_STRINGS, "description": "commands whose output keys the seed"},
                "also": {**_STRINGS, "description": "globs of more folders the build makes"},
                "store": {
                    "type": "string",
                    "pattern": "^[a-z0-9][a-z0-9._-]{0,39}$",
                    "description": "a package manager's store that outlives builds",
                },
            },
            "required": ["path", "key", "build"],
            "additionalProperties": False,
        },
    },
    f.split_spec: {
        "type": "object",
        "description": "shards share out these files, balanced by recorded durations",
        "properties": {
            "files": {**_STRINGS, "minItems": 1},
            "shards": {
                "anyOf": [
                    {"const": "auto"},
                    {"type": "integer", "minimum": 1, "maximum": f.MAX_SHARDS},
                ]
            },
        },
        "required": ["files"],
        "additionalProperties": False,
    },
}
# One node of each kind, and every table: what the readers take from them is the schema.
SAMPLE: dict[str, Any] = {
    "governor": {},
    "budget": {},
    "env": {},
    "defaults": {},
    "worktrees": {},
    "gates": {"g": {"run": "true"}},
    "workers": {"w": {"run": "true"}},
    "integrate": {"i": {"needs": ["w"]}},
    "land": {"l": {"needs": ["i"]}},
}
NODE_SECTIONS = ("gates", "workers", "integrate", "land")


def fragment(convert: Callable[[Any], Any]) -> dict[str, Any]:
    """The schema of what ``convert`` accepts (``auto(x)``: "auto" or what ``x`` accepts)."""
    inner = getattr(convert, "__wrapped__", None)
    if inner is not None:
        return {"anyOf": [{"const": "auto"}, fragment(inner)]}
    if convert not in FRAGMENTS:
        raise KeyError(f"no schema fragment for the converter {convert.__name__}")
    return FRAGMENTS[convert]


def _object(table: f.Table) -> dict[str, Any]:
    properties = {name: fragment(convert) for name, convert in table.converters.items()}
    for name, child in table.children.items():
        if table.key == "" and name in NODE_SECTIONS:
            (node,) = child.children.values()
            properties[name] = {
                "type": "object",
                "description": f"[{name}.ID] tables; ids are shared by every kind of node",
                "additionalProperties": _object(node),
            }
            settings = {key: fragment(convert) for key, convert in child.converters.items()}
            if settings:  # [integrate] window = ...: the section's own keys beside its nodes
                properties[name]["properties"] = settings
        else:
            properties[name] = _object(child)
    return {"type": "object", "additionalProperties": False, "properties": properties}


def manifest_schema() -> dict[str, Any]:
    """The JSON Schema of a manifest, as the loader reads one today."""
    top = f.Table(SAMPLE, "", "(sample)", Problems("", json=True))
    read_tables(top, Path("sample.json"))
    schema = _object(top)
    schema["properties"]["schema"] = {"const": SCHEMA_VERSION}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "dagrunner manifest",
        "description": "manifests/release.toml and friends; docs/manifest.md",
        **schema,
    }


def rendered() -> str:
    return json.dumps(manifest_schema(), indent=2, sort_keys=True) + "\n"


PUBLISHED = (
    Path(__file__).resolve().parent / "manifest.schema.json",
    Path(__file__).resolve().parents[2] / "docs" / "manifest.schema.json",
)

if __name__ == "__main__":
    for path in PUBLISHED:
        if path.parent.is_dir():
            path.write_text(rendered())
            print(f"wrote {path}")
