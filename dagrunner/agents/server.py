"""``dagrunner mcp``: the agents' tools over MCP (the official SDK, 2.x), stdio by default.

Each tool is named ``dagrunner_<verb>``, carries its annotations, and answers the CLI's
``--json`` answer as structured content; an error is a tool error whose text is the coded
error object (``{"error": {"code", "message", "hint"}}``).  A wait never outlasts its bound
(at most 50 s) and sends progress notifications while it waits; an agent calls it again
with the answer's ``cursor`` until ``final``.  ``--worker M/W`` binds the server to one
worktree (``tools.Binding``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import orjson
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from dagrunner.agents import tools
from dagrunner.errors import DagrunnerError

INSTRUCTIONS = """dagrunner: work on this repository in a worktree of your own, and ship it
through the merge queue. dagrunner_allocate gives you a worktree (edit only there), then
dagrunner_submit queues your work, dagrunner_wait follows it (call again until final),
dagrunner_why says why it did not land (fix and submit again, or dagrunner_sync on a
conflict). Never push, never edit another worktree or the main checkout."""

READS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)
SAME = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
REMOVES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)


WAITS_AT_ONCE = 16  # waits hold a thread each, up to 50 s: never all of them


async def _call(
    function: Callable[..., dict[str, Any]],
    *args: Any,
    limiter: anyio.CapacityLimiter | None = None,
) -> dict[str, Any]:
    """``function(*args)`` in a worker thread (git and processes block); a coded error as a
    tool error carrying the coded error object.  ``limiter``: the threads it may take (the
    waits have their own, so many waiting clients never starve the other tools)."""
    try:
        return await anyio.to_thread.run_sync(lambda: function(*args), limiter=limiter)
    except DagrunnerError as exc:
        raise ToolError(tools.error_json(exc)) from None


def build(binding: tools.Binding) -> MCPServer:
    """The server with every tool, bound as ``binding`` says."""
    server = MCPServer("dagrunner", instructions=INSTRUCTIONS)
    b = binding
    waits = anyio.CapacityLimiter(WAITS_AT_ONCE)

    @server.tool(name="dagrunner_allocate", annotations=SAME)
    async def allocate(
        mission: str, worker: str, base: str | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Your own worktree (path, branch, ports, seeds) for MISSION/WORKER at BASE; the
        same one when called again."""
        return await _call(tools.allocate, b, mission, worker, base, session)

    @server.tool(name="dagrunner_submit", annotations=WRITES)
    async def submit(
        worktree: str | None = None,
        priority: int = 0,
        envelope: str | dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Export WORKTREE (M/W) and queue its work: the queue item's id to wait on, its
        state, position, foreseen overlaps and provenance.  Or queue ENVELOPE, a patch
        envelope's JSON text (from `dagrunner worktree export` on another machine).
        PRIORITY: -1000 to 1000, higher first (urgency is the operator's to give)."""
        text = orjson.dumps(envelope).decode() if isinstance(envelope, dict) else envelope
        return await _call(tools.submit, b, worktree, priority, text)

    @server.tool(name="dagrunner_wait", annotations=READS)
    async def wait(
        id: str, timeout_seconds: float = 30.0, cursor: int = 0, ctx: Context | None = None
    ) -> dict[str, Any]:
        """Wait at most TIMEOUT_SECONDS (at most 50) for queue item ID (or a release check's
        handle): its state, whether it is final, the events since CURSOR and an ETA.  Call
        again with the answer's cursor until final."""
        notes: list[tuple[float, str]] = []

        def progress(done: float, message: str) -> None:
            notes.append((done, message))

        async def report() -> None:
            sent = 0
            while True:
                await anyio.sleep(1.0)
                if ctx is not None and len(notes) > sent:
                    done, message = notes[-1]
                    sent = len(notes)
                    await ctx.report_progress(done, min(timeout_seconds, tools.MAX_WAIT), message)

        answer: dict[str, Any] = {}
        async with anyio.create_task_group() as group:
            group.start_soon(report)
            try:
                answer = await _call(
                    tools.wait, b, id, timeout_seconds, cursor, progress, limiter=waits
                )
            finally:
                group.cancel_scope.cancel()
        return answer

    @server.tool(name="dagrunner_why", annotations=READS)
    async def why(id: str) -> dict[str, Any]:
        """Why queue item ID did not land: failed gates with their reasons, failed tests and
        log excerpts, or conflicting paths and hunks; and what to do next."""
        return await _call(tools.why, b, id)

    @server.tool(name="dagrunner_status", annotations=READS)
    async def status() -> dict[str, Any]:
        """The queue: every item's state (a worker-bound server: its own items only)."""
        return await _call(tools.status, b)

    @server.tool(name="dagrunner_overlaps", annotations=READS)
    async def overlaps(target: str | None = None) -> dict[str, Any]:
        """Which live work (worktrees, queued envelopes, the target) conflicts, on content."""
        return await _call(tools.overlaps, b, target)

    @server.tool(name="dagrunner_sync", annotations=SAME)
    async def sync(worktree: str, target: str | None = None) -> dict[str, Any]:
        """Bring WORKTREE onto the target's tip with all of its work (after a conflict)."""
        return await _call(tools.sync, b, worktree, target)

    @server.tool(name="dagrunner_cleanup", annotations=REMOVES)
    async def cleanup(worktree: str) -> dict[str, Any]:
        """Remove WORKTREE once its work landed (work that did not is kept, never lost)."""
        return await _call(tools.cleanup, b, worktree)

    @server.tool(name="dagrunner_release_check", annotations=WRITES)
    async def release_check() -> dict[str, Any]:
        """Start the repository's release check; its handle is waited on with dagrunner_wait."""
        return await _call(tools.release_check, b)

    return server


def serve_stdio(binding: tools.Binding) -> None:
    """Serve ``binding``'s tools over stdio until the client closes it."""
    build(binding).run("stdio")


def tool_schemas() -> dict[str, Any]:
    """Every tool as MCP lists it (name, description, input and output schemas,
    annotations), generated from the code: ``docs/agents.tools.json`` is this output, kept
    equal to it by ``tests/test_agents.py`` (``python -m dagrunner.agents.server`` rewrites it)."""
    listed = anyio.run(build(tools.Binding()).list_tools)
    return {"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed]}


def rendered() -> str:
    return (
        orjson.dumps(tool_schemas(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
        + "\n"
    )


if __name__ == "__main__":
    from pathlib import Path

    target = Path(__file__).resolve().parents[2] / "docs" / "agents.tools.json"
    target.write_text(rendered())
    print(f"wrote {target}")
