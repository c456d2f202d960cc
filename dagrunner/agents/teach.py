"""What ``dagrunner agents-md`` prints: a short section for a project's ``AGENTS.md`` or
``CLAUDE.md`` that teaches an agent the loop, and what never to do."""

from __future__ import annotations

SECTION = """\
## Shipping changes with dagrunner

This repository lands changes through dagrunner's merge queue; its release gates judge
every change before the target branch moves. Work this way:

1. Get a worktree of your own: `dagrunner_allocate(mission, worker)` (MCP), or
   `dagrunner worktree allocate --mission M --worker W --json`. Edit only inside the
   `path` it answers; its `.venv` / `node_modules` are ready.
2. When your change is done (committed or not), submit it: `dagrunner_submit(worktree)`
   or `dagrunner worktree export M/W -o FILE && dagrunner integrate submit FILE --json`.
3. Follow it: `dagrunner_wait(id, timeout_seconds=30)` returns within its bound; call it
   again with the `cursor` it answered until `final` is true.
4. If it did not land, ask why: `dagrunner_why(id)` names the failed gates, tests and log
   lines, or the conflicting paths. Fix in your worktree and submit again; on a conflict
   `dagrunner_sync(worktree)` first. If the failure is the machine's, not your change's,
   submit again with `--requeue`.
5. When it landed, `dagrunner_cleanup(worktree)`.

Never: push to a remote, move a branch yourself, edit the main checkout or another
worker's worktree, or delete a worktree's work. The gates read the manifest from the
target branch: changing it in your worktree does not change how you are judged.
"""
