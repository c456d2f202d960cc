"""``dagrunner mcp``, ``dagrunner agents-md`` and ``integrate serve``: the agents' own
interface, and the integrator as a service."""

from __future__ import annotations

import argparse

from dagrunner.cli.output import emit_json
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


def cmd_serve(args: argparse.Namespace) -> int:
    """``integrate serve``: a line per run (JSON Lines with --json), until SIGTERM/SIGINT."""
    from dagrunner.agents.drain import Drained
    from dagrunner.agents.serve import serve

    def said(drained: Drained) -> None:
        run = drained.body or {}
        if args.json:
            emit_json(run)
            return
        states = ", ".join(f"{o['id']} {o['state']}" for o in run["envelopes"]) or "nothing to do"
        print(f"{run['target']}: {run['start'][:12]} -> {run['end'][:12]}: {states}", flush=True)

    def failed(exc: DagrunnerError) -> None:
        if args.json:
            emit_json({"error": exc.to_json()})
        else:
            print(f"stuck: {exc.render()}", flush=True)

    served = serve(
        on_error=failed,
        repo=args.repo,
        target=args.target,
        on_run=said,
        on_ready=lambda goal: None if args.json else print(f"serving {goal}", flush=True),
        executor=args.executor,
        http=args.http,
        token_file=args.token_file,
        prune_every=args.prune_every,
        prune_keep=args.prune_keep,
    )
    if not args.json:
        print(f"stopped ({served.stopped_by or 'done'}) after {served.runs} run(s)")
    # stopped by a signal, as `integrate run` is: 130 (a service stops no other way)
    return ExitCode.INTERRUPTED if served.stopped_by else ExitCode.OK
