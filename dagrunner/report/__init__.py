"""Everything a run leaves behind.

- ``rundir``: ``run.json`` and ``gates/*.json`` written and read back; the rest written.
- ``html`` and ``svg``: the self-contained page and its drawings.
- ``junit``: ``junit.xml``.  ``ci``: annotations and summaries on CI.  ``ansi``: terminal
  colours in logs.  ``logtail``: the tail of a log for display.
- ``testresults``: a gate's own JUnit file read back, bounded (where the attempt ran).
- ``diagnose``: a failed gate's one line of why (a missing seed's program, an unreachable host).
- ``testnames``: a failed gate's failing tests named from its output, where it has no JUnit.
"""
