"""The agents' own interface: what a coding agent (or its harness) calls instead of the CLI.

- ``tools``: each tool as a library call answering the CLI's ``--json``; the binding to one
  worktree, the bounded wait.
- ``server``: those tools over MCP (``dagrunner mcp``), on the official SDK.
- ``serve``: the integrator as a long-lived service (``integrate serve``); ``http``: its
  ``/metrics``, ``/healthz`` and the tools at ``/mcp`` behind a bearer token.
- ``teach``: the section ``dagrunner agents-md`` prints for a project's ``AGENTS.md``.
"""
