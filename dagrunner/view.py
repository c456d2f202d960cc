"""A gate's view of the filesystem: the write allow-list (docs/security.md).

Read-only everywhere but the gate's tree, its own HOME and TMPDIR and what the trusted
manifest names writable; the invoking user's homes covered by an empty read-only tmpfs,
``/tmp``, ``/var/tmp`` and ``/dev/shm`` by private writable ones; the cache store hidden.
``View.operations`` turns that into the mount operations the gate's PID 1 performs
(``contain._INIT``), one a line, before it starts the gate.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dagrunner.fsutil import is_inside

# The operations' interpreter, part of the gate's PID 1 (``contain._INIT``): ``$ops`` holds
# one operation a line; ``fail`` ends the init with 125 before the gate starts.  Every mount
# is ``-n``: no userspace mount table to update, which an ordinary user cannot write.
APPLY_VIEW = r"""fail() { echo "dagrunner: could not $1 for the gate" >&2; exit 125; }
if [ -n "$ops" ]; then
  tab=$(printf '\t'); keep=; under=
  while IFS= read -r op; do
    arg=${op#* }; src=${arg%%"$tab"*}; dst=${arg#*"$tab"}
    case $op in
      "tmpfs "*) mount -n -t tmpfs -o mode=0755 dagrunner-private "$arg" || fail "cover $arg" ;;
      "hide "*) [ ! -d "$arg" ] || mount -n -t tmpfs -o ro,size=4k,mode=000 dagrunner-hidden "$arg" \
                || fail "hide $arg" ;;
      "mkdir "*) mkdir -p "$arg" || fail "make $arg" ;;
      "bind "*) mount -n --rbind "$src" "$dst" || fail "show $src" ;;
      "move "*) mount -n --move "$src" "$dst" || fail "place $dst" ;;
      "keep "*) keep="$keep$tab$arg" ;;
      "under "*) under="$under$tab$arg" ;;
      "ro "*) mount -n -o remount,bind,ro "$arg" || fail "make $arg read-only" ;;
      "readonly")
        # every mount read-only but the kept ones, those under a cover (hidden there, or
        # placed by an op of their own) and the kernel's
        set -f
        while read -r _ _ _ _ point _; do
          point=$(printf '%b' "$point")
          case $point in /proc|/proc/*|/dev|/dev/*|/sys|/sys/*) continue ;; esac
          case "$keep$tab" in *"$tab$point$tab"*) continue ;; esac
          hidden=; IFS=$tab
          for c in $under; do case $point in "$c"|"$c"/*) hidden=1 ;; esac; done
          unset IFS
          [ -z "$hidden" ] || continue
          mount -n -o remount,bind,ro "$point" 2>/dev/null || ! mountpoint -q "$point" \
            || fail "make $point read-only"
        done < /proc/self/mountinfo
        set +f ;;
    esac
  done <<EOF_OPS
$ops
EOF_OPS
fi
"""


def homes() -> tuple[Path, ...]:
    """The invoking user's home folders: the password database's and ``$HOME``."""
    import pwd

    found = []
    with contextlib.suppress(KeyError):
        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    if os.environ.get("HOME"):
        found.append(os.environ["HOME"])
    return tuple(Path(os.path.realpath(h)) for h in found if h and h != "/")


PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # shared scratch places: each gate gets its own


@dataclass(frozen=True, kw_only=True)
class View:
    """A gate's filesystem: read-only everywhere but ``writable``; each cover (the invoking
    user's homes, /tmp, /var/tmp, /dev/shm) an empty private tmpfs holding only what is
    ``writable`` or ``visible`` inside it, each at its own path; the cache store hidden."""

    writable: tuple[Path, ...]
    stage: Path  # an empty folder of the attempt's, where the covers are built
    visible: tuple[Path, ...] = ()  # shown read-only even under a cover
    covers: tuple[Path, ...] = ()
    hide: Path | None = None

    @classmethod
    def for_gate(
        cls,
        *,
        writable: Sequence[Path],
        home: Path,
        visible: Sequence[Path],
        hide: Path | None,
        tools: Sequence[Path] = (),
    ) -> View:
        """The view of one gate whose own ``home`` (TMPDIR inside) is made just before it
        starts, beside its stage; ``tools`` are folders on its PATH: under a cover, the
        cover's top folder holding each stays visible, read-only (``~/.pyenv``,
        ``~/.cargo``, ``/tmp/venv``)."""
        home = Path(os.path.realpath(home.parent)) / home.name
        stage = home.with_name(home.name + ".view")
        rw = [home, *_real(writable)]  # HOME first: the init's count file goes there
        shown = _real(visible)
        covers: list[Path] = []
        for cover in _real([*homes(), *map(Path, PRIVATE)]):
            if any(is_inside(cover, p) for p in rw):
                continue  # the tree itself is (in) this home: all of it is writable anyway
            if any(is_inside(cover, c) for c in covers):
                continue
            covers = [c for c in covers if not is_inside(c, cover)] + [cover]
        for tool in _real(tools):  # the top folder holding each under a cover stays visible
            for cover in covers:
                if tool != cover and is_inside(tool, cover):
                    shown.append(cover / tool.relative_to(cover).parts[0])
        return cls(
            writable=tuple(rw),
            stage=stage,
            visible=tuple(dict.fromkeys(shown)),
            covers=tuple(covers),
            hide=hide,
        )

    def operations(self) -> list[str]:
        """The init's operations, one a line (``_INIT``): build each cover on the stage,
        show what must stay, move the covers into place, hide the store, then read-only."""
        ops = [f"tmpfs {self.stage}"]
        for n, _ in enumerate(self.covers):
            ops += [f"mkdir {self.stage}/{n}", f"tmpfs {self.stage}/{n}"]
        for path in sorted({*self.writable, *self.visible}, key=lambda p: len(p.parts)):
            under = next((i for i, c in enumerate(self.covers) if is_inside(path, c)), None)
            if under is None:
                ops.append(f"bind {path}\t{path}")
            else:
                place = self.stage / str(under) / path.relative_to(self.covers[under])
                ops += [f"mkdir {place}", f"bind {path}\t{place}"]
        # a cover that holds the stage goes last: after it, the stage is out of sight
        order = sorted(range(len(self.covers)), key=lambda i: is_inside(self.stage, self.covers[i]))
        ops += [f"move {self.stage}/{k}\t{self.covers[k]}" for k in order]
        if self.hide is not None:
            ops.append(f"hide {self.hide}")
        # what is shown under a cover is read-only unless writable; a hidden home turns
        # read-only, the private scratch places stay writable
        for path in {*self.visible} - {*self.writable}:
            if any(is_inside(path, c) for c in self.covers):
                ops.append(f"ro {path}")
        ops += [f"ro {c}" for c in self.covers if str(c) not in PRIVATE]
        ops += [f"keep {p}" for p in self.writable]
        ops += [f"under {c}" for c in self.covers]
        ops.append("readonly")
        return ops


def _real(paths: Sequence[Path]) -> list[Path]:
    """Existing folders by their real path; names the init's lines cannot carry are left out
    (what is left out stays unwritable or hidden: the safe side)."""
    found = []
    for path in paths:
        real = os.path.realpath(path)
        if "\n" not in real and "\t" not in real and os.path.isdir(real):
            found.append(Path(real))
    return found
