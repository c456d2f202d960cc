"""The agents' own interface: what a coding agent (or its harness) calls instead of the CLI.

- ``tools``: each tool as a library call answering the CLI's ``--json``; the binding to one
  worktree, the integrator a server drives, errors bounded for sending back.
- ``follow``: following a queue item: the bounded, cancellable wait, why, and the queue's
  status with the integrator's health (what holds an item: its ``stuck`` cause).
- ``schemas``: the tools' bounded inputs and their output schemas.
- ``server``: those tools over MCP (``dagrunner mcp``), on the official SDK.
- ``serve``: the integrator as a long-lived service (``integrate serve``); ``http``: its
  ``/metrics``, ``/healthz`` and the tools at ``/mcp`` behind a bearer token; ``drain``:
  each of its drains in a child process, under its lock and its signals.
- ``teach``: the section ``dagrunner agents-md`` prints for a project's ``AGENTS.md``.
"""
