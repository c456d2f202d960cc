"""The manifest's JSON Schema is generated from the loader and published as generated; it
accepts what the loader accepts and rejects the mistakes an editor should flag."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dagrunner.errors import DagrunnerError
from dagrunner.manifest.load import load_manifest
from dagrunner.manifest.schema import PUBLISHED, manifest_schema, rendered

ROOT = Path(__file__).resolve().parent.parent


def test_the_published_schema_is_what_the_loader_generates() -> None:
    for path in PUBLISHED:
        assert path.read_text() == rendered(), f"{path}: run python -m dagrunner.manifest.schema"


def test_every_key_the_loader_reads_is_in_the_schema() -> None:
    gate = manifest_schema()["properties"]["gates"]["additionalProperties"]["properties"]
    assert {"run", "needs", "cpu", "memory", "timeout", "retries", "env", "cwd", "inputs"} <= set(
        gate
    )
    assert set(gate["env"]["properties"]) == {"pass", "set"}


def test_a_json_manifest_may_name_the_schema(tmp_path: Path) -> None:
    manifest = {"$schema": "../docs/manifest.schema.json", "gates": {"a": {"run": "true"}}}
    file = tmp_path / "m.json"
    file.write_text(json.dumps(manifest))
    assert list(load_manifest(file).gates) == ["a"]
    assert list(_validator().iter_errors(manifest)) == []


def _validator() -> Any:
    schema = manifest_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", sorted((ROOT / "manifests").rglob("*.toml")), ids=str)
def test_the_projects_manifests_are_valid_against_it(path: Path) -> None:
    load_manifest(path)  # the loader accepts it ...
    errors = list(_validator().iter_errors(tomllib.loads(path.read_text())))
    assert errors == [], [e.message for e in errors]  # ... and so does the schema


@pytest.mark.parametrize(
    ("manifest", "where"),
    [
        ({"gates": {"a": {"run": "x", "timout": "1s"}}}, ["gates", "a"]),  # a misspelt key
        ({"gates": {"a": {"run": "x", "cpu": -1}}}, ["gates", "a", "cpu"]),
        ({"gates": {"a": {"run": ["x"], "needs": "b"}}}, ["gates", "a", "needs"]),
        ({"governor": {"cpu": "lots"}, "gates": {"a": {"run": "x"}}}, ["governor", "cpu"]),
        ({"schema": 2, "gates": {"a": {"run": "x"}}}, ["schema"]),
    ],
)
def test_it_flags_what_the_loader_refuses(
    manifest: dict[str, Any], where: list[str], tmp_path: Path
) -> None:
    file = tmp_path / "m.json"
    file.write_text(json.dumps(manifest))
    with pytest.raises(DagrunnerError) as refused:
        load_manifest(file)
    assert refused.value.code.startswith("manifest-")
    errors = list(_validator().iter_errors(manifest))
    assert [list(e.absolute_path) for e in errors] == [where]
