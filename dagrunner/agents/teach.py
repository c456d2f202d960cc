"""What ``dagrunner agents-md`` prints: a short section for a project's ``AGENTS.md`` or
``CLAUDE.md`` that teaches an agent the loop, and what never to do."""

from __future__ import annotations

SECTION = """\
## Shipping changes with dagrunner

This repository lands changes through dagrunner's merge queue; its release gates judge
every change before the target branch moves. Use the dagrunner MCP tools (or the CLI
named beside each) and nothing else: never run git to move, merge or throw away work.

1. Get a worktree of your own: `dagrunner_allocate(mission, worker)`
   (`dagrunner worktree allocate --mission M --worker W --json`). Edit only inside the
   `path` it answers; its `.venv` / `node_modules` are ready.
2. When your change is done (committed or not), submit it: `dagrunner_submit(worktree)`
   (`dagrunner worktree export M/W -o F && dagrunner integrate submit F --json`). Work that
   changes nothing is refused (`envelope-empty`).
3. Follow it: `dagrunner_wait(id, timeout_seconds=30)` returns within its bound (at most
   50 s); call it again with the `cursor` it answered until `final` is true. When it says
   `stuck` (code, message, hint), the queue cannot move your item for a reason that is not
   your change (no manifest on the target, the target's checkout dirty): keep waiting, or
   tell whoever runs the repository what the hint says.
4. Act on the final state (`next` in every answer says it too):
   - `landed`: done (`commit` is the target's new commit); `dagrunner_cleanup(worktree)`.
   - `gates-failed`: `dagrunner_why(id)` names the failed gates, tests and log lines. Fix
     them in your worktree and submit again; if the failure is the machine's, not your
     change's, `dagrunner_submit(worktree, requeue=true)`.
   - `conflict`: `dagrunner_sync(worktree)` merges what landed into your worktree and
     leaves conflict markers (`<<<<<<< landed` / `>>>>>>> yours`) in the files it lists
     under `conflicts` (your state before is kept on its `backup` ref). Edit those files,
     remove the markers, and submit again.
   - `rejected`: `dagrunner_why(id)` gives the reason (a protected path, a bad envelope);
     fix that and submit again.
   - `withdrawn`: you took it back with `dagrunner_withdraw(id)`
     (`dagrunner integrate withdraw ID`); it never lands. Submit with `requeue=true` to
     queue the same work again.
5. Every error is a coded object (`{"error": {"code", "message", "hint"}}`): do what its
   hint says.

Never: push to a remote, move a branch yourself, edit the main checkout or another
worker's worktree, or delete a worktree's work. The gates read the manifest from the
target branch: changing it in your worktree does not change how you are judged.
"""
