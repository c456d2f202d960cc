"""One line that says why a gate failed when its log says more than its exit code: a program
not found that the checkout's ``node_modules/.bin`` holds (a missing seed), or a host it
could not reach (no network), read from the log's tail in the common tools' words (pip,
npm, pnpm, yarn, git, curl, sphinx's intersphinx, pre-commit)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dagrunner.records.run import RunRecord
from dagrunner.report.logtail import read_log, strip_ansi

NOT_FOUND = re.compile(r"([^\s:'\"]+): (?:command )?not found\s*$", re.M)  # dash and bash
# Where a tool names the host it could not reach; the first group is the host (or a URL).
HOSTS = (
    re.compile(r"Could not resolve host(?:name)?:?\s+'?([\w.-]+)"),
    re.compile(r"\b(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ENETUNREACH)\s+([\w.-]+\.\w+)"),
    re.compile(r"host='([\w.-]+)'"),
    re.compile(r"network request to (https?://[^\s'\"]+) failed"),
    re.compile(r"inventory '(https?://[^\s']+)' not fetchable"),
    re.compile(r"unable to access '(https?://[^\s']+)'"),
    re.compile(r"Failed to connect to ([\w.-]+)"),
)
OFFLINE = re.compile(
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|No route to host|getaddrinfo|Could not resolve host|NewConnectionError"
    r"|not fetchable due to|ERR_SOCKET_TIMEOUT|Connection refused|connection timed out",
    re.IGNORECASE,
)
TAIL = 200  # lines of the log's end read
MANIFEST_BYTES = 4 << 20  # of the run's manifest read for its marks


def seed_hint(program: str, checkout: Path | None) -> str:
    """'' or which seed to add: ``program`` is in a ``node_modules/.bin`` of ``checkout``
    (the caller's), which the tree the gate ran in did not have."""
    if checkout is None or "/" in program:
        return ""
    for bin_dir in [checkout / "node_modules" / ".bin", *checkout.glob("*/*/node_modules/.bin")]:
        if (bin_dir / program).exists():
            where = bin_dir.relative_to(checkout).as_posix()
            return (
                f"`{program}` is in {where} of your checkout, which the gate's tree lacks: add a "
                "node_modules seed ([[worktrees.seed]], `dagrunner init --dry-run` proposes it; "
                "docs/worktrees.md)"
            )
    return ""


def unreachable(text: str) -> str:
    """The host the log says could not be reached, '' when it says no such thing."""
    lines = text.splitlines()[-TAIL:]
    for line in reversed(lines):
        if not OFFLINE.search(line) and not any(p.search(line) for p in HOSTS[3:]):
            continue
        for pattern in HOSTS:
            if found := pattern.search(line):
                host = found[1]
                if "://" in host:
                    host = host.split("://", 1)[1].split("/", 1)[0]
                return host.split(":")[0].strip("'\".")
        return "the network"
    return ""


def network_marked(manifest: Path) -> frozenset[str]:
    """The gates ``manifest`` marks ``network = "host"`` itself (the default's value, so
    written only to say the gate needs the network): none when it cannot be read."""
    try:
        with manifest.open("rb") as file:
            body = tomllib.loads(file.read(MANIFEST_BYTES).decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return frozenset()
    gates, defaults = body.get("gates"), body.get("defaults")
    if not isinstance(gates, dict):
        return frozenset()
    every = isinstance(defaults, dict) and defaults.get("network") == "host"
    return frozenset(
        name
        for name, table in gates.items()
        if isinstance(table, dict) and table.get("network", "host" if every else "") == "host"
    )


def diagnose(
    text: str, exit_code: int | None, checkout: Path | None = None, *, marked: bool = False
) -> str:
    """One line for a failed gate's log ``text``, '' when there is nothing to add.
    ``marked``: the manifest says the gate needs the network already."""
    missing = NOT_FOUND.findall(text)
    if exit_code == 127 and missing:
        said = f"command not found: {missing[-1]}"
        hint = seed_hint(missing[-1], checkout)
        return f"{said}; {hint}" if hint else said
    host = unreachable(text)
    if host:
        where = "reach the network" if host == "the network" else f"reach {host}"
        if marked:
            return f"needs the network: could not {where} (run it where the network is reachable)"
        return f'needs the network: could not {where} (mark it network = "host" and run it online)'
    return ""


def why_failed(record: RunRecord, run_dir: Path, checkout: Path | None = None) -> dict[str, str]:
    """The one line of each failed or timed-out gate of ``record`` that has one, by gate id:
    what the terminal and the report page both say.  ``checkout``: the caller's (default:
    where dagrunner runs), where a missing program may be found."""
    said_in = record.manifest.get("path") if isinstance(record.manifest, dict) else None
    marked = network_marked(Path(said_in)) if isinstance(said_in, str) else frozenset()
    lines: dict[str, str] = {}
    for gate in record.gates:
        if not gate.status.failed or not gate.attempts:
            continue
        text = strip_ansi(read_log(run_dir, gate.attempts[-1].log, limit=64 * 1024))
        on = (gate.shard_of or gate.id) in marked
        if said := diagnose(text, gate.exit_code, checkout or Path.cwd(), marked=on):
            lines[gate.id] = said
    return lines
