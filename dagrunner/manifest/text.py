"""A manifest's text to a dict: TOML (or JSON), with its syntax errors, duplicate keys and
too-deep nesting turned into coded errors; ``manifest.py`` reads the dict's keys."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagrunner.errors import DagrunnerError


def _no_duplicate_keys(file: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise DagrunnerError(
                    "manifest-duplicate-id",
                    f"{key!r} is defined twice",
                    where=file,
                    key=key,
                    hint="give each gate (and each key) one definition",
                )
            result[key] = value
        return result

    return hook


def parse_text(path: Path, data: bytes) -> dict[str, Any]:
    """The manifest file's data as a dict (TOML, or JSON for ``*.json``)."""
    try:
        return _parse_text(path, data)
    except RecursionError:
        raise DagrunnerError(
            "manifest-parse",
            "the file is nested too deeply to read",
            where=str(path),
            hint="a manifest needs a few levels of tables; flatten it",
        ) from None


def _parse_text(path: Path, data: bytes) -> dict[str, Any]:
    file = str(path)
    if path.suffix == ".json":
        try:
            parsed = json.loads(data, object_pairs_hook=_no_duplicate_keys(file))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DagrunnerError(
                "manifest-parse", f"not valid JSON: {exc}", where=file, hint="fix the syntax"
            ) from None
        if not isinstance(parsed, dict):
            raise DagrunnerError(
                "manifest-type", "the top level must be an object", where=file, hint="wrap it in {}"
            )
        return parsed
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DagrunnerError(
            "manifest-parse", f"not UTF-8: {exc}", where=file, hint="save the file as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        if "twice" in text or "overwrite" in text.lower():
            raise DagrunnerError(
                "manifest-duplicate-id",
                f"a table or key is defined twice ({text})",
                where=file,
                hint="give each gate (and each key) one definition",
            ) from None
        raise DagrunnerError(
            "manifest-parse", f"not valid TOML: {text}", where=file, hint="fix the syntax"
        ) from None
