"""The integration queue and its integrator.

- ``queue``: the durable queue and its journal, and the journal's compaction (``integrate
  prune``).  ``events``: the journal as a stream.
- ``submit``: envelopes onto the queue (validated, with priority and the overlaps foreseen).
- ``run``: ``integrate``, ``queue_status``, ``overlaps`` and ``prune`` (the journal and the
  worktree ledger compacted, what only final items needed removed), the entry points.
- ``steps``: the integrator's steps (admit, apply with ``--3way``, land).
- ``needs``: what the helpers below may use of the integrator (a protocol).
- ``pipeline`` and ``items``: the speculative pipeline and what it tracks; ``trees``: where
  its trees are made and gated; ``proofs``: the landing invariant in one place (a pass of
  every gate on exactly the tree that lands), and the landed proof of each commit it lands.
- ``batching``: how many envelopes an item holds (``--batch auto``: sized from the outcomes).
- ``baseline``: what the target's own head fails (``[integrate] baseline = "differential"``).
- ``admission``: what the target lets in, and the manifest that judges it.
- ``landing``: the compare-and-swap, the trailers of the commits it lands, and the
  target's checkout after a landing.
- ``recovery``: after a crash (landed workers' worktrees cleaned too), and the preflight.
- ``journal``: the journal's lines read back, and the process's one incremental index of it
  (shared by the integrator, the waiters and status).
"""
