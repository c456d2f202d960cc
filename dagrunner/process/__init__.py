"""Where commands run, contained.

- ``sandbox``: one hermetic attempt of a gate (environment, HOME/TMPDIR, log, timeout).
- ``home``: what a gate's own HOME holds when it starts (yarn 1's global prefix).
- ``contain``: PID and mount namespaces under a reaping init, cgroups, parent-death signal.
- ``view``: a gate's view of the filesystem, the write allow-list; what a gate that is
  root of its namespaces may still do (the capabilities it keeps).
- ``cgroups``: the cgroup hierarchies this process may use.
- ``tree``: a gate's process tree: sampled, swept, ended.
- ``logs``: the bounded log and redaction; the pump that fills it from the gate's output.
- ``observe``: what a gate opened in its tree, seen by fanotify on its own mount of it;
  ``nested``: the seccomp filter that tells it of a mount namespace a gate makes itself;
  ``made``: what of the tree the gate made itself (another gate's files are not its own).
- ``share``: how a tree gets its own copy of a shared folder (a seed, a tool cache): a
  reflink copy, an overlay mount, else a plain copy.
- ``layers``: each gate of an envelope's tree on an overlay layer of its own over the tree
  (what it writes, only the gates that need it see).
- ``toolcaches``: gates' tool caches: the trusted tier (the main checkout's runs alone write
  it) and the private layers every other tree's gates get, made from it by ``share``.
- ``racy``: before a tree's gates, files rewritten in the second a tool may have read them
  in are touched, and bytecode Python would load for a newer source removed.
- ``command``: the door for non-gate commands (worker setup, tool fingerprints).
- ``prove``: the sandbox's escape suite, run as a real gate (``doctor --prove``);
  ``escapes``: the suite itself, a script the gate runs (never imported).
"""
