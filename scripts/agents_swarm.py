"""A swarm of scripted agents driven through the MCP tools only (issue 45's done-when).

Four agents work at once on a fresh repository, each through the official SDK's client and
nothing else but editing files in the worktree it was given:

- ``feature`` adds a module and lands;
- ``first`` and ``second`` change the same line of ``calc.py``: one lands, the other ends
  ``conflict``, reads ``dagrunner_why``, runs ``dagrunner_sync`` (markers left), resolves
  the markers by editing the file, submits again and lands;
- ``breaker`` adds a function with a bug and its test: ``gates-failed``; ``dagrunner_why``
  names the failing test; it fixes the function, submits again and lands.

The gate sleeps GATE seconds before the tests, longer than any one wait (WAIT): every agent
calls ``dagrunner_wait`` again with its cursor.  ``--transport stdio`` gives each agent its
own ``dagrunner mcp --worker M/W`` (which starts integrators itself); ``--transport http``
runs ``integrate serve --http`` with a bearer token and every agent talks to its ``/mcp``.
Prints one line per agent (its final state, tool calls, wall seconds) and exits 1 unless
every agent ends right.

    python scripts/agents_swarm.py --transport stdio [--gate 12] [--wait 10]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

ENV = {**os.environ, "GIT_AUTHOR_NAME": "swarm", "GIT_AUTHOR_EMAIL": "swarm@example.com",
       "GIT_COMMITTER_NAME": "swarm", "GIT_COMMITTER_EMAIL": "swarm@example.com"}  # fmt: skip
CALC = "def add(a, b):\n    return a + b\n"
TEST = "import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=ENV, check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def project(root: Path, gate: float) -> Path:
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text("reports/\nbuild/\n__pycache__/\n")
    (repo / "calc.py").write_text(CALC)
    (repo / "checks").mkdir()
    (repo / "checks" / "conftest.py").write_text(
        "import os, sys\nsys.path.insert(0, os.getcwd())\n"
    )
    (repo / "checks" / "test_calc.py").write_text(TEST)
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text(
        '[env]\npass = ["PATH"]\n\n[gates.unit]\n'
        f'run = ["sh", "-c", "sleep {gate:g} && python -m pytest -q -p no:cacheprovider '
        '--junitxml=build/unit.xml checks"]\njunit = "build/unit.xml"\ntimeout = "300s"\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    return repo


@dataclass
class Agent:
    name: str
    calls: int = 0
    wall: float = 0.0
    final: str = ""
    path: Path = Path()
    trail: list[str] = field(default_factory=list)
    session: ClientSession | None = None
    wait: float = 10.0

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        assert self.session is not None
        self.calls += 1
        result = await self.session.call_tool(tool, arguments)
        body = result.structured_content or {}
        self.trail.append(f"{tool}: {body.get('error', {}).get('code') or body.get('state', 'ok')}")
        if result.is_error:
            raise RuntimeError(f"{self.name}: {tool} -> {body}")
        return body

    async def ship(self) -> dict[str, Any]:
        """Submit, then wait (again and again, with the cursor) until final."""
        queued = await self.call("dagrunner_submit", worktree=f"swarm/{self.name}")
        cursor = 0
        while True:
            said = await self.call("dagrunner_wait", id=queued["id"], timeout_seconds=self.wait,
                                   cursor=cursor)  # fmt: skip
            cursor = said["cursor"]
            if said["final"]:
                return {**said, "id": queued["id"]}


async def feature(a: Agent) -> None:
    (a.path / "feature.py").write_text("FEATURE = True\n")
    a.final = (await a.ship())["state"]


async def same_line(a: Agent, body: str, resolved: str) -> None:
    (a.path / "calc.py").write_text(body)
    said = await a.ship()
    if said["state"] == "conflict":
        why = await a.call("dagrunner_why", id=said["id"])
        assert "<<<<<<< landed" in (why.get("hunks") or ""), why
        synced = await a.call("dagrunner_sync", worktree=f"swarm/{a.name}")
        assert synced["conflicts"] == ["calc.py"], synced
        assert "<<<<<<< landed" in (a.path / "calc.py").read_text()
        (a.path / "calc.py").write_text(resolved)  # the agent resolves: an edit, no git
        said = await a.ship()
    a.final = said["state"]


async def breaker(a: Agent) -> None:
    (a.path / "mul.py").write_text("def mul(a, b):\n    return a + b\n")
    (a.path / "checks" / "test_mul.py").write_text(
        "import mul\n\n\ndef test_mul():\n    assert mul.mul(2, 3) == 6\n"
    )
    said = await a.ship()
    if said["state"] == "gates-failed":
        why = await a.call("dagrunner_why", id=said["id"])
        failed = [t["test"] for g in why["failed_gates"] for t in g["failed_tests"]]
        assert any("test_mul" in t for t in failed), why
        (a.path / "mul.py").write_text("def mul(a, b):\n    return a * b\n")
        said = await a.ship()
    a.final = said["state"]


Session = Callable[[Agent], Any]


async def run_agent(agent: Agent, connect: Callable[[str], Any], work: Session) -> None:
    began = time.monotonic()
    async with connect(agent.name) as session:
        agent.session = session
        mine = await agent.call("dagrunner_allocate", mission="swarm", worker=agent.name)
        agent.path = Path(mine["path"])
        await work(agent)
        if agent.final == "landed":
            await agent.call("dagrunner_cleanup", worktree=f"swarm/{agent.name}")
    agent.wall = time.monotonic() - began


def stdio(repo: Path) -> Callable[[str], Any]:
    @asynccontextmanager
    async def connect(name: str) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "dagrunner", "mcp", "--repo", str(repo), "--worker", f"swarm/{name}"],
            env=ENV,
            cwd=str(repo),
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            yield s

    return connect


def http(url: str, token: str) -> Callable[[str], Any]:
    @asynccontextmanager
    async def connect(name: str) -> AsyncIterator[ClientSession]:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=90) as client,
            streamable_http_client(url, http_client=client) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            yield s

    return connect


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--gate", type=float, default=12.0, help="seconds the gate sleeps")
    parser.add_argument("--wait", type=float, default=10.0, help="each wait's timeout")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dagrunner-swarm-"))
    repo = project(root, args.gate)
    agents = [Agent(n, wait=args.wait) for n in ("feature", "first", "second", "breaker")]
    work: dict[str, Session] = {
        "feature": feature,
        "first": lambda a: same_line(
            a, CALC.replace("a + b", "b + a"), CALC.replace("a + b", "(b + a)")
        ),
        "second": lambda a: same_line(
            a, CALC.replace("a + b", "(a + b)"), CALC.replace("a + b", "(b + a)")
        ),
        "breaker": breaker,
    }
    server = None
    if args.transport == "stdio":
        connect = stdio(repo)
    else:
        token = secrets.token_hex(16)
        (root / "token").write_text(token)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "dagrunner", "integrate", "serve", "--repo", str(repo),
             "--http", f"127.0.0.1:{port}", "--token-file", str(root / "token")],
            env=ENV, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().startswith("serving")
        time.sleep(1.0)
        connect = http(f"http://127.0.0.1:{port}/mcp", token)
    began = time.monotonic()

    async def swarm() -> None:
        async with anyio.create_task_group() as group:
            for agent in agents:
                group.start_soon(run_agent, agent, connect, work[agent.name])

    try:
        anyio.run(swarm)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    landed = git(repo, "show", "main:calc.py")
    right = all(a.final == "landed" for a in agents) and "return (b + a)" in landed
    print(f"transport {args.transport}, gate {args.gate:g} s, waits {args.wait:g} s, "
          f"wall {time.monotonic() - began:.1f} s")  # fmt: skip
    for a in agents:
        print(f"  {a.name:<8} {a.final:<13} {a.calls:>3} tool calls  {a.wall:6.1f} s")
    print("correct" if right else f"WRONG: main:calc.py is {landed!r}")
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
