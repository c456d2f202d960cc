"""Where gate attempts run.  The scheduler sees only the ``Executor`` protocol.

- ``base``: the protocol, ``Machine``, ``Fingerprint``.
- ``factory``: ``executor_for``, the executor ``--executor`` names, opened and closed.
- ``local``: processes on this machine.
- ``dask``: a Dask distributed cluster (at-most-once attempts, deadlines kept here).
- ``placement``: the workers' facts; which one takes an attempt now, and whether any could.
- ``actors``: each worker's ``remote.Slots`` actor, made once per run.
- ``remote``: what runs on a Dask worker.
- ``source``: the run's source shipped to workers (a commit, a bundle, checkout slots).
"""
