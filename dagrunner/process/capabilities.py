"""What a contained gate may still do as root: the capabilities it keeps.

A gate that runs as root of its namespaces -- the runner is root (CI, a container), or the
mount(2) path's user namespace maps it to root -- would otherwise hold every capability
there, and ``CAP_SYS_ADMIN`` alone undoes its view: remount the read-only root writable,
unmount the cover of the cache store, bind what is hidden.  Others reach past the view
another way (``CAP_DAC_READ_SEARCH``: files by handle; ``CAP_MKNOD``: the raw disk;
``CAP_SYS_MODULE``: the kernel), and ``CAP_SETFCAP`` would let it leave a binary with
capabilities in the user's tree.

So a contained gate keeps only what a root build needs to handle its own files and
processes (``KEPT``: owners, modes, its own children, low ports); the rest is dropped from
its bounding set before it starts, so nothing it executes gets them back.  bubblewrap
does it (``--cap-drop``) where it holds the view; else ``setpriv`` does, in front of the
gate.  An ordinary user's gate under bubblewrap holds none at all (bubblewrap's default).
"""

from __future__ import annotations

KEPT = (
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
)


def bwrap_options() -> list[str]:
    """bubblewrap's options for a gate it starts as the real root (it keeps root's
    capabilities unless told otherwise; an ordinary user's gate holds none)."""
    options = ["--cap-drop", "ALL"]
    for name in KEPT:
        options += ["--cap-add", f"CAP_{name.upper()}"]
    return options


def limited(setpriv: str, argv: list[str]) -> list[str]:
    """``argv`` run with only ``KEPT`` in its bounding set (and none inherited)."""
    bounding = ",".join(["-all", *(f"+{name}" for name in KEPT)])
    return [
        setpriv,
        "--no-new-privs",  # a setuid program it runs gains nothing (bubblewrap sets it too)
        "--inh-caps=-all",
        "--ambient-caps=-all",
        f"--bounding-set={bounding}",
        "--",
        *argv,
    ]
