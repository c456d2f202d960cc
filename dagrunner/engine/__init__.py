"""The release check's engine: load, plan, schedule, record.

- ``graph``: the DAG.  ``plan``: what a run is given and plans.  ``governor``: capacity and
  live pressure.  ``scheduler``: critical-path scheduling on trio.  ``attempts``: a gate's
  attempts and verdict.  ``steps``: the pipeline of steps (``release_check``, ``gate_run``).
- ``shards``: a split gate as shards balanced by recorded durations.
- ``evidence``: speed and budget.  ``history``: measured durations.  ``dry_run``.
- The gate cache: ``keys`` (a gate's key), ``cache`` (the signed store, explain),
  ``cachestep`` (its place in a run, the reuse rule, single flight), ``inputs`` (what the
  globs match), ``tools`` (fingerprints remembered by identity), ``landed`` (signed landed
  proofs in git notes).
"""
