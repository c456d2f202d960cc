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
