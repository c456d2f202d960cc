"""Workers' worktrees.

- ``allocate``: allocate (idempotent, locked, claimed), claim, release.
- ``ledger``: the append-only record of every allocation, claim, export and cleanup.
- ``pool``: cleaned worktrees kept for reuse.
- ``lifecycle``: status, cleanup with retention, prune.  ``gone``: a worktree's removal (a
  kill leaves it whole or in its trash), and one whose folder vanished or was half removed.
- ``export``: a worktree's work as a patch envelope.
- ``landed``: a worker's worktree after its envelope landed (cleaned only on proof).
- ``overlaps``: which live work (worktrees, envelopes, the tip) would conflict, on content.
- ``foresight``: submit's foresight, kept per target (each queued item's side, computed
  once, and their combined commits), so a submit costs the same with a long queue.
- ``sync``: a worktree onto the target's tip, all of its work carried.
- ``ports``: the ports leased to each worktree (``[worktrees] ports``).  ``disk``: what
  the worktrees hold on disk, and the budget an allocation keeps (``max_disk``).
- ``prepare``: what a new worktree gets: ``.worktreeinclude`` files, seeds, ``--setup``;
  the manifest at its base commit (``[worktrees]``).
- ``seeds``: dependency folders (``[[worktrees.seed]]``) built once per key and stored;
  ``seedstores``: package managers' stores that outlive builds, and pruning the store
  (how a worktree gets its own copy of a seed is ``process/share``).
"""
