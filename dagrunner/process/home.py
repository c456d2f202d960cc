"""What a gate's own HOME holds when it starts (made new for each attempt, removed after):
the settings a tool would otherwise look for only where the gate's view is read-only.

yarn 1 run as root looks for its global prefix (whose ``bin`` it puts on every script's
PATH) in ``/usr/local`` and ``/usr/local/share/.yarn`` alone, never under HOME; finding
neither writable in the gate's view, it warned "Cannot find a suitable global folder" on
stderr on every ``yarn run``, and a project's snapshot tests of a CLI's stderr failed only
inside a gate.  Any other user's yarn falls back to ``~/.yarn``: the gate's HOME.  A
``.yarnrc`` there says that for root too (root's yarn reads HOME's ``.yarnrc`` after
``/usr/local/share``'s), so every user's gate sees the same.  Only yarn 1 reads ``.yarnrc``
(berry reads ``.yarnrc.yml``, npm and pnpm ``.npmrc``), and a project's own ``.yarnrc``, or
a ``yarn_prefix`` the manifest sets, still wins.  Not a variable: ``PREFIX`` and
``npm_config_prefix`` move npm's global prefix too (``PREFIX`` a Makefile's install
folder), and yarn berry refuses ``YARN_PREFIX`` ("Unrecognized or legacy configuration
settings found").  Nothing of the caller's comes in: the files say only the gate's HOME.

A gate keyed by the whole tree also finds there the paths of the tree's snapshot, named by
``$DAGRUNNER_PATHS`` (NUL-ended, relative to its folder): the list ``init``'s selector in a
pre-commit hook's stead (``starter/hookgates``) runs on instead of ``git ls-files``, which
reads git's database, unseen by the observer (docs/cache.md).  The name set the gate's key
holds is exactly that list, so it changes only when the key does.  Only this gate sees its
HOME: another gate cannot change what it is given (it can change only its own, as it can
its own verdict).
"""

from __future__ import annotations

import json
from pathlib import Path

PATHS_VAR = "DAGRUNNER_PATHS"
PATHS_FILE = ".dagrunner-paths"


def furnish(home: Path, paths: str = "") -> None:
    """Write the gate's settings files into ``home``, a folder just made (its own), and
    ``paths`` (NUL-separated) where ``$DAGRUNNER_PATHS`` names them, when given."""
    (home / ".yarnrc").write_text(f"prefix {json.dumps(str(home / '.yarn'))}\n")
    if paths:
        (home / PATHS_FILE).write_bytes(paths.encode("utf-8", "surrogateescape") + b"\0")
