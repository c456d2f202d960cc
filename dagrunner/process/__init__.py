"""Where commands run, contained.

- ``sandbox``: one hermetic attempt of a gate (environment, HOME/TMPDIR, log, timeout).
- ``contain``: PID and mount namespaces under a reaping init, cgroups, parent-death signal.
- ``view``: a gate's view of the filesystem, the write allow-list.
- ``capabilities``: what a gate that is root of its namespaces may still do.
- ``cgroups``: the cgroup hierarchies this process may use.
- ``tree``: a gate's process tree: sampled, swept, ended.
- ``logs``: the bounded log and redaction.
- ``command``: the door for non-gate commands (worker setup, tool fingerprints).
- ``prove``: the sandbox's escape suite, run as a real gate (``doctor --prove``);
  ``escapes``: the suite itself, a script the gate runs (never imported).
"""
