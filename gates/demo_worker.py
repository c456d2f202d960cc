"""The swarm demo's worker and gate program (manifests/swarm-demo.toml).

    python gates/demo_worker.py ROLE

Workers run in their own worktree and change it: ``docs`` adds a notes file,
``feature`` adds a module and commits it, ``tune-a`` and ``tune-b`` both edit
the same line of the settings file (so one of them conflicts), ``breaker``
writes a value the check refuses.  ``check`` is the gate: the settings must
parse and hold sane values.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SETTINGS = Path("manifests/swarm-demo/settings.txt")


def set_threads(value: str) -> None:
    lines = SETTINGS.read_text().splitlines()
    SETTINGS.write_text(
        "\n".join(f"threads = {value}" if line.startswith("threads") else line for line in lines)
        + "\n"
    )


def commit(message: str) -> None:
    """Commit everything; nothing to commit (a rerun on a base that has it) is fine."""
    subprocess.run(["git", "add", "-A"], check=True)
    if subprocess.run(["git", "diff", "--cached", "--quiet"], check=False).returncode == 0:
        return
    subprocess.run(
        [
            "git",
            "-c",
            "user.name=demo worker",
            "-c",
            "user.email=demo@localhost",
            "commit",
            "-q",
            "--no-gpg-sign",
            "-m",
            message,
        ],
        check=True,
    )


def check() -> int:
    values = dict(
        line.split(" = ", 1) for line in SETTINGS.read_text().splitlines() if line.strip()
    )
    threads = values.get("threads", "")
    if not threads.isdigit() or not 1 <= int(threads) <= 64:
        print(f"settings: threads = {threads!r} is not a number from 1 to 64")
        return 1
    print(f"settings ok: {values}")
    return 0


def main(role: str) -> int:
    if role == "docs":
        Path("manifests/swarm-demo/NOTES.md").write_text("# Notes\n\nWritten by the docs worker.\n")
    elif role == "feature":
        Path("manifests/swarm-demo/feature.py").write_text(
            'def greet() -> str:\n    return "hello"\n'
        )
        commit("feature: greet")
    elif role == "tune-a":
        set_threads("8")
    elif role == "tune-b":
        set_threads("16")
    elif role == "breaker":
        set_threads("lots")
    elif role == "check":
        return check()
    else:
        print(f"unknown role {role!r}", file=sys.stderr)
        return 2
    print(f"{role}: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
