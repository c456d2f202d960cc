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
"""

from __future__ import annotations

import json
from pathlib import Path


def furnish(home: Path) -> None:
    """Write the gate's settings files into ``home``, a folder just made (its own)."""
    (home / ".yarnrc").write_text(f"prefix {json.dumps(str(home / '.yarn'))}\n")
