"""Records that cross folders, built once and passed on (JSON only at the edges).

- ``run``: a run's gate results and its record (``GateResult``, ``RunRecord``, ``Status``),
  and what a gate was seen to open (``Observation``).
- ``evidence``: a run's speed evidence and its budget (``Speed``, ``Budget``).
- ``integration``: an envelope's queue state, a journal line's details, an integration
  run's outcomes and result.
- ``summary``: what a run's integrations did, as ``run.json`` carries it for the report.
- ``worktree``: a worktree's status and an export's summary.
- ``failures``: what a gate run failed, per JUnit case or gate (a differential baseline's).
"""
