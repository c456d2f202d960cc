"""The command line: a thin layer over the library's functions.

- ``main``: the parser, exit codes, ``entry``.  ``parsing``: the parser class and argument
  types; ``swarm_args``: the worktree and integrate commands' arguments.
- ``checks``: release-check, graph, the cache and reports.
- ``swarm``: doctor, worktrees and the queue (they import no networkx, trio or report).
- ``console``: progress and the final table.  ``output``: ``--json`` output; a worker's text made safe to print.
- ``agents``: ``mcp`` (the agents' tools over MCP) and ``agents-md``.
"""
