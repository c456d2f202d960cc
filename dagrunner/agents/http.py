"""``integrate serve --http HOST:PORT``: the service's HTTP face, in a thread beside it.

- ``/healthz``: ``ok`` while the service runs.
- ``/metrics``: Prometheus text: the figures of ``integrate stats`` and the service's own
  gauges (runs so far, a run in flight).
- ``/mcp``: the agents' tools (``server.build``) over streamable HTTP, answered only with
  ``Authorization: Bearer <the token file's content>`` (401 otherwise, compared in constant
  time; no token file, no ``/mcp``).  ``dagrunner_submit`` there takes an envelope inline
  too (a worker on another machine), validated as ``integrate submit`` validates it.

The address is loopback unless the caller names another host; request bodies are bounded
(an inline envelope obeys the envelope size limit).
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.agents import tools
from dagrunner.envelope import max_bytes
from dagrunner.errors import DagrunnerError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class Gauges:
    """What the service says of itself on ``/metrics``."""

    runs: int = 0
    in_flight: int = 0

    def to_prometheus(self) -> str:
        return (
            "# HELP dagrunner_serve_runs_total Integration runs this service made.\n"
            "# TYPE dagrunner_serve_runs_total counter\n"
            f"dagrunner_serve_runs_total {self.runs}\n"
            "# HELP dagrunner_serve_in_flight Integration runs in flight now.\n"
            "# TYPE dagrunner_serve_in_flight gauge\n"
            f"dagrunner_serve_in_flight {self.in_flight}\n"
        )


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` or ``PORT``: loopback) as a host and a port."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DagrunnerError(
            "bad-usage",
            f"--http {text!r} is not HOST:PORT",
            key="--http",
            hint="give 127.0.0.1:8123, or :8123 for loopback",
        )
    return (host.strip("[]") or "127.0.0.1"), int(port)


def start(
    binding: tools.Binding, where: str, token_file: Path | None, gauges: Gauges
) -> Callable[[], None]:
    """Serve in a thread; the function that stops it."""
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response

    from dagrunner.agents.server import build
    from dagrunner.integration.events import queue_stats

    host, port = address(where)
    token = token_file.read_text().strip() if token_file is not None else ""
    server = build(binding)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def metrics(request: Request) -> Response:
        body = queue_stats(repo=binding.repo).to_prometheus() + gauges.to_prometheus()
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4")

    # an inline envelope travels as JSON text inside the request: twice its own limit
    app = server.streamable_http_app(host=host, max_request_body_size=2 * max_bytes() + 65536)
    app.add_route("/healthz", healthz, methods=["GET"])
    app.add_route("/metrics", metrics, methods=["GET"])
    guarded = _bearer(app, token)
    config = uvicorn.Config(guarded, host=host, port=port, log_level="warning", lifespan="on")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, name="dagrunner-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not running.started:
        raise DagrunnerError(
            "http-unavailable",
            f"could not listen on {host}:{port}",
            key="--http",
            hint="pick a free port (or another address)",
        )

    def stop() -> None:
        running.should_exit = True
        thread.join(timeout=10)

    return stop


def _bearer(app: App, token: str) -> App:
    """``app``, with ``/mcp`` answered only for the right bearer token (401 otherwise)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith("/mcp"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not token or not hmac.compare_digest(bytes(given), expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"),
                                        (b"www-authenticate", b"Bearer")]})  # fmt: skip
                await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
        await app(scope, receive, send)

    return guarded
