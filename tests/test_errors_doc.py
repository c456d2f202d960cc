"""Every error code the package can raise is documented in docs/errors.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAISED = re.compile(r'(?:DagrunnerError|_reject|\.fail)\(\s*"([a-z0-9-]+)"|code="([a-z0-9-]+)"')


def test_every_raised_code_is_documented() -> None:
    codes = {
        match.group(1) or match.group(2)
        for path in (ROOT / "dagrunner").rglob("*.py")
        for match in RAISED.finditer(path.read_text())
    }
    assert len(codes) > 40, "the scan found too few codes to be looking at the right files"
    doc = (ROOT / "docs" / "errors.md").read_text()
    missing = sorted(code for code in codes if f"`{code}`" not in doc)
    assert not missing, f"undocumented error codes: {missing}"


def test_every_error_says_what_to_do() -> None:
    """Each DagrunnerError raised in the package carries a hint (a user can act on it)."""
    import ast

    missing = []
    for path in (ROOT / "dagrunner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", getattr(node.func, "attr", None))
            if called == "DagrunnerError" and "hint" not in {k.arg for k in node.keywords}:
                missing.append(f"{path.name}:{node.lineno}")
    assert not missing, f"errors without a hint: {missing}"
