"""``dagrunner mcp``: the agents' tools over MCP (the official SDK, 2.x), stdio by default.

Each tool is named ``dagrunner_<verb>``, has a title, its annotations (never open-world: it
acts on this repository only), bounded inputs and a real output schema (``schemas.py``);
an argument it does not take is refused.  It answers the CLI's ``--json`` answer as
structured content; any error -- a coded one, a bad argument -- is ``isError`` with the
coded error object (``{"error": {"code", "message", "hint"}}``, bounded) as structured
content and as text.  A wait never outlasts its bound (at most 50 s, all included), sends
progress notifications while it waits, and frees its slot the moment its caller cancels
it.  ``--worker M/W`` binds the server to one worktree (``tools.Binding``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import orjson
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ConfigDict, ValidationError

from dagrunner.agents import follow, schemas, tools
from dagrunner.agents.schemas import (
    Branch,
    Cursor,
    Item,
    Mission,
    Priority,
    Ref,
    Timeout,
    Worker,
    Worktree,
)
from dagrunner.errors import DagrunnerError
from dagrunner.version import VERSION

INSTRUCTIONS = """dagrunner: work on this repository in a worktree of your own, and ship it
through the merge queue. dagrunner_allocate gives you a worktree (edit only there), then
dagrunner_submit queues your work, dagrunner_wait follows it (call again with its cursor
until final; when it says stuck, the cause is not yours: keep waiting). Final states:
landed (dagrunner_cleanup), gates-failed (dagrunner_why, fix, submit again), conflict
(dagrunner_sync, resolve the markers, submit again), rejected (dagrunner_why), withdrawn
(you took it back with dagrunner_withdraw). Never push, never edit another worktree or the
main checkout, never run git to move your work: the tools do it."""


def _hints(*, read_only: bool, destructive: bool, idempotent: bool) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,  # this repository and its queue, nothing beyond
    )


READS = _hints(read_only=True, destructive=False, idempotent=True)
WRITES = _hints(read_only=False, destructive=False, idempotent=False)
SAME = _hints(read_only=False, destructive=False, idempotent=True)
REMOVES = _hints(read_only=False, destructive=True, idempotent=True)

WAITS_AT_ONCE = 16  # waits hold a thread each, up to 50 s: never all of them


def answer(body: dict[str, Any]) -> CallToolResult:
    text = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS).decode()  # enum keys: counts
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=orjson.loads(text)
    )


def failure(exc: DagrunnerError) -> CallToolResult:
    """The coded error as a tool error: structured, and the same object as text."""
    body = tools.error_body(exc)
    return CallToolResult(
        content=[TextContent(type="text", text=orjson.dumps(body).decode())],
        structured_content=body,
        is_error=True,
    )


async def _call(
    function: Callable[..., dict[str, Any]],
    *args: Any,
    limiter: anyio.CapacityLimiter | None = None,
) -> CallToolResult:
    """``function(*args)`` in a worker thread (git and processes block).  Cancelled, the
    call returns at once and gives its thread slot back (a wait sees its stop and ends);
    ``limiter``: the threads it may take (the waits have their own)."""
    try:
        body = await anyio.to_thread.run_sync(
            lambda: function(*args), limiter=limiter, abandon_on_cancel=True
        )
    except DagrunnerError as exc:
        return failure(exc)
    return answer(body)


class Server(MCPServer):
    """The SDK's server, with a bad argument answered as a coded error (``bad-argument``,
    naming the argument and the rule it breaks, never echoing the value)."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            return failure(tools.bad_arguments(name, exc.__cause__))


def build(binding: tools.Binding) -> MCPServer:
    """The server with every tool, bound as ``binding`` says."""
    server = Server("dagrunner", instructions=INSTRUCTIONS, version=VERSION)
    b = binding
    waits = anyio.CapacityLimiter(WAITS_AT_ONCE)

    @server.tool(name="dagrunner_allocate", title="Get your worktree", annotations=SAME)
    async def allocate(
        mission: Mission, worker: Worker, base: Ref | None = None, session: Mission | None = None
    ) -> CallToolResult:
        """Your own worktree (path, branch, ports, seeds) for MISSION/WORKER at BASE; the
        same one when called again."""
        return await _call(tools.allocate, b, mission, worker, base, session)

    @server.tool(name="dagrunner_submit", title="Queue your work", annotations=WRITES)
    async def submit(
        worktree: Worktree | None = None,
        priority: Priority = 0,
        envelope: str | dict[str, Any] | None = None,
        requeue: bool = False,
    ) -> CallToolResult:
        """Export WORKTREE (M/W) and queue its work: the queue item's id to wait on, its
        state, position, foreseen overlaps and provenance.  Or queue ENVELOPE, a patch
        envelope's JSON text (from `dagrunner worktree export` on another machine).
        PRIORITY: -1000 to 1000, higher first.  REQUEUE: the same work whose item ended
        gates-failed, rejected or withdrawn is queued again as a new item (a failure that
        was the machine's).  Work with no change is refused (envelope-empty)."""
        text = orjson.dumps(envelope).decode() if isinstance(envelope, dict) else envelope
        return await _call(tools.submit, b, worktree, priority, text, requeue)

    @server.tool(name="dagrunner_wait", title="Follow a queue item", annotations=READS)
    async def wait(
        id: Item, timeout_seconds: Timeout = 30.0, cursor: Cursor = 0, ctx: Context | None = None
    ) -> CallToolResult:
        """Wait at most TIMEOUT_SECONDS (at most 50, all included) for queue item ID (or a
        release check's handle): its state, whether it is final, the events since CURSOR,
        an ETA, and -- when the queue cannot move it -- why (stuck: code, message, what to
        do).  Call again with the answer's cursor until final."""
        began = time.monotonic()
        stop = threading.Event()
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

        def run() -> dict[str, Any]:
            return follow.wait(b, id, timeout_seconds, cursor, progress, began=began, stop=stop)

        async with anyio.create_task_group() as group:
            group.start_soon(report)
            try:
                said = await _call(run, limiter=waits)
            finally:
                stop.set()  # cancelled or done: the thread ends at its next look
                group.cancel_scope.cancel()
        return said

    @server.tool(name="dagrunner_why", title="Why it did not land", annotations=READS)
    async def why(id: Item) -> CallToolResult:
        """Why queue item ID did not land, or what holds it: failed gates with their
        reasons, failed tests and log excerpts; conflicting paths and hunks (landed / yours);
        the cause that holds it (stuck); and what to do next."""
        return await _call(follow.why, b, id)

    @server.tool(name="dagrunner_status", title="The queue", annotations=READS)
    async def status() -> CallToolResult:
        """The queue: every item's state (a worker-bound server: its own items only), and
        the integrator's health (what holds the queue, if anything)."""
        return await _call(follow.status, b)

    @server.tool(name="dagrunner_overlaps", title="Who would conflict", annotations=READS)
    async def overlaps(target: Branch | None = None) -> CallToolResult:
        """Which live work (worktrees, queued envelopes, the target) conflicts, on content."""
        return await _call(tools.overlaps, b, target)

    @server.tool(name="dagrunner_sync", title="Onto the target's tip", annotations=SAME)
    async def sync(worktree: Worktree, target: Branch | None = None) -> CallToolResult:
        """Bring WORKTREE onto the target's tip with all of its work.  Where your work
        conflicts with what landed, the files get conflict markers (<<<<<<< landed /
        >>>>>>> yours) and the answer lists them under conflicts: edit them, then submit.
        Your state from before is kept on the answer's backup ref."""
        return await _call(tools.sync, b, worktree, target)

    @server.tool(name="dagrunner_withdraw", title="Take an item back", annotations=SAME)
    async def withdraw(id: Item) -> CallToolResult:
        """Take queue item ID back while it is queued or gating: it never lands, and ends
        final 'withdrawn' (submit again with requeue to queue the same work again)."""
        return await _call(tools.withdraw, b, id)

    @server.tool(name="dagrunner_cleanup", title="Remove your worktree", annotations=REMOVES)
    async def cleanup(worktree: Worktree) -> CallToolResult:
        """Remove WORKTREE once its work landed (work that did not is kept, never lost);
        success when the integrator removed it already."""
        return await _call(tools.cleanup, b, worktree)

    @server.tool(name="dagrunner_release_check", title="Run the release check", annotations=WRITES)
    async def release_check() -> CallToolResult:
        """Start the repository's release check; its handle is waited on with dagrunner_wait."""
        return await _call(tools.release_check, b)

    _strict(server)
    return server


def _strict(server: MCPServer) -> None:
    """Every tool refuses arguments it does not take, and publishes its output schema."""
    for tool in server._tool_manager.list_tools():
        model = tool.fn_metadata.arg_model
        config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
        strict: type[ArgModelBase] = type(model.__name__, (model,), {"model_config": config})
        tool.fn_metadata.arg_model = strict
        tool.parameters = strict.model_json_schema(by_alias=True)
        tool.fn_metadata.output_schema = schemas.OUTPUT[tool.name]


def serve_stdio(binding: tools.Binding) -> None:
    """Serve ``binding``'s tools over stdio until the client goes: stdin's end, or the
    parent's death (the kernel says so: the server never outlives its client)."""
    _die_with_parent()
    build(binding).run("stdio")
    # a wait's thread may still look at the queue for a moment: nobody is left to answer
    os._exit(0)


def _die_with_parent() -> None:
    """SIGTERM when the process that started this one dies (Linux; elsewhere stdin's end)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the wish was made
        os.kill(os.getpid(), signal.SIGTERM)


def tool_schemas() -> dict[str, Any]:
    """Every tool as MCP lists it (name, title, description, input and output schemas,
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
