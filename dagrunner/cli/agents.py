"""``dagrunner mcp`` and ``dagrunner agents-md``: the agents' own interface."""

from __future__ import annotations

import argparse

from dagrunner.errors import DagrunnerError, ExitCode


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from dagrunner.agents.server import serve_stdio
    except ImportError:
        raise DagrunnerError(
            "mcp-unavailable",
            "the MCP server needs the mcp package, which is not installed",
            exit_code=ExitCode.ENVIRONMENT,
            hint="pip install 'dagrunner[mcp]'",
        ) from None
    from dagrunner.agents.tools import Binding
    from dagrunner.worktrees.allocate import split_id

    if args.worker is not None:
        split_id(args.worker)  # a bad id is bad usage now, not at the first call
        if args.allow_urgent:
            raise DagrunnerError(
                "bad-usage",
                "--allow-urgent is for an unbound server: a worker-bound one never submits "
                "as urgent",
                key="--allow-urgent",
                hint="drop --allow-urgent, or --worker",
            )
    binding = Binding(repo=args.repo, worker=args.worker, drive=not args.no_drive)
    binding.urgent = args.allow_urgent
    serve_stdio(binding)
    return ExitCode.OK


def cmd_agents_md(args: argparse.Namespace) -> int:
    from dagrunner.agents.teach import SECTION

    print(SECTION, end="")
    return ExitCode.OK
