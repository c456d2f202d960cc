"""A gate's view of the filesystem: the write allow-list (docs/security.md).

Read-only everywhere but the gate's tree, its own HOME and TMPDIR and what the trusted
manifest names writable; the invoking user's homes covered by an empty read-only tmpfs,
``/tmp``, ``/var/tmp`` and ``/dev/shm`` by private writable ones; the cache store hidden.
``View.operations`` turns that into the mount operations the gate's PID 1 performs
(``contain._INIT``), one a line, before it starts the gate; ``View.bwrap_options`` into
bubblewrap's options, where bubblewrap is installed (a fifth of the cost per gate).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The operations' interpreter, run by the gate's PID 1 (``contain._INIT``) with the
# runner's own Python (``-S -I``: the standard library only, nothing of the caller's or
# the tree's): each operation is a mount(2) call, about 11 ms for a whole view where one
# mount(8) per operation cost 30.  Any failure ends the init with 125 before the gate starts.
APPLY_VIEW = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
RDONLY, REMOUNT, BIND, MOVE, REC = 1, 32, 4096, 8192, 16384
KEPT = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
        "relatime": 1 << 21, "strictatime": 1 << 24}  # locked in a user namespace: kept

def mount(src, dst, kind, flags, data, what):
    if libc.mount(src, dst.encode(), kind, flags, data) != 0:
        err = ctypes.get_errno()
        raise SystemExit(f"dagrunner: could not {what} {dst} for the gate: {os.strerror(err)}")

def table():
    found = {}
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            fields = line.split(b" ")
            point = fields[4].decode("unicode_escape").encode("latin-1").decode()
            found[point] = fields[5].decode().split(",")  # the last one at a path is on top
    return found

def read_only(point, options):
    flags = REMOUNT | BIND | RDONLY | sum(KEPT.get(o, 0) for o in options)
    if libc.mount(None, point.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        # EINVAL, ENOENT, EACCES, ENOTDIR: covered by another mount (an outer gate's, say)
        if err in (22, 2, 13, 20) and not os.path.ismount(point):
            return
        raise SystemExit(f"dagrunner: could not make {point} read-only for the gate: "
                         f"{os.strerror(err)}")

keep, under, mounts = set(), [], None  # the table is read once, after the moves
for op in sys.argv[1].splitlines():
    verb, _, arg = op.partition(" ")
    src, _, dst = arg.partition("\t")
    if verb == "tmpfs":
        mount(b"dagrunner-private", arg, b"tmpfs", 0, b"mode=0755", "cover")
    elif verb == "hide" and os.path.isdir(arg):
        mount(b"dagrunner-hidden", arg, b"tmpfs", RDONLY, b"size=4k,mode=000", "hide")
    elif verb == "mkdir":
        os.makedirs(arg, exist_ok=True)
    elif verb == "file":
        open(arg, "a").close()
    elif verb == "link":
        os.symlink(src, dst)
    elif verb == "devpts":
        mount(b"devpts", arg, b"devpts", 2 | 8, b"newinstance,ptmxmode=0666,mode=0620", "give")
    elif verb == "bind":
        mount(src.encode(), dst, None, BIND | REC, None, "show")
    elif verb == "move":
        mount(src.encode(), dst, None, MOVE, None, "place")
    elif verb == "keep":
        keep.add(arg)
    elif verb == "loopback":  # a network namespace of its own: bring lo up (SIOC[GS]IFFLAGS)
        import fcntl, socket, struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            got = fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0))
            flags = struct.unpack("16sH22x", got)[1] | 1  # IFF_UP
            fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags))
    elif verb == "under":
        under.append(arg)
    elif verb == "ro":
        mounts = mounts or table()
        read_only(arg, mounts.get(arg, []))
    elif verb == "readonly":
        # every mount read-only but the kept ones, those under a cover (hidden there, or
        # placed by an operation of their own) and the kernel's
        for point, options in (mounts or table()).items():
            if point in keep or point.split("/")[1] in ("proc", "dev"):
                continue
            if any(point == c or point.startswith(c + "/") for c in under):
                continue
            if "ro" not in options:
                read_only(point, options)
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
# What of the kernel a gate sees, as container runtimes give it (OCI/runc and Docker's
# defaults): a /dev of its own with only these devices (no disk, no host terminal), the
# kernel's knobs read-only (a root gate wrote core_pattern: a "|program" there runs as the
# real root at the next crash), its secrets masked; /sys read-only with the rest.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
KNOBS = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
MASKED = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/kallsyms",
    "/proc/sched_debug",
    "/proc/latency_stats",
)
MASKED_DIRS = ("/proc/acpi", "/proc/scsi")


@functools.cache
def _present(paths: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``paths`` this kernel has (a gate's /proc is of the same kernel)."""
    return tuple(p for p in paths if os.path.exists(p))


@dataclass(frozen=True, kw_only=True)
class View:
    """A gate's filesystem: read-only everywhere but ``writable``; each cover (the invoking
    user's homes, /tmp, /var/tmp, /dev/shm) an empty private tmpfs holding only what is
    ``writable`` or ``visible`` inside it, each at its own path; the cache store hidden.
    Every path is real (no symlink on the way): ``for_gate`` makes them so."""

    writable: tuple[Path, ...]
    stage: Path  # an empty folder of the attempt's, where the covers are built
    visible: tuple[Path, ...] = ()  # shown read-only even under a cover
    covers: tuple[Path, ...] = ()
    hide: Path | None = None
    kernel: bool = True  # a /dev of its own, the kernel's knobs read-only (module doc)
    # a writable place shown from another folder: (place, folder), the tree under test
    # from the gate's own layer over it (``process.layers``)
    sources: tuple[tuple[Path, Path], ...] = ()

    def source(self, path: Path) -> Path:
        """The folder ``path`` is bound from: its own, or the one ``sources`` names."""
        return next((src for dst, src in self.sources if dst == path), path)

    @classmethod
    def for_gate(
        cls,
        *,
        writable: Sequence[Path],
        home: Path,
        visible: Sequence[Path],
        hide: Path | None,
        tools: Sequence[Path] = (),
        conceal: Sequence[Path] = (),
        sources: Sequence[tuple[Path, Path]] = (),
    ) -> View:
        """The view of one gate whose own ``home`` (TMPDIR inside) is made just before it
        starts, beside its stage; ``tools`` are folders on its PATH: under a cover, the
        cover's top folder holding each stays visible, read-only (``~/.pyenv``,
        ``~/.cargo``, ``/tmp/venv``).  Each of ``conceal`` is covered too (an empty
        read-only tmpfs: what a gate must not see at all, the user's checkout when the tree
        under test is another), unless the tree is inside it."""
        home = Path(os.path.realpath(home.parent)) / home.name
        stage = home.with_name(home.name + ".view")
        layered = [(Path(os.path.realpath(dst)), src) for dst, src in sources]
        # a place inside a tree shown from its layer is that layer's already: bound on its
        # own it would come from the tree itself (the host's path), past the layer
        rw = [home] + [
            p for p in _real(writable) if not any(p != d and _within(p, d) for d, _ in layered)
        ]  # HOME first: the init's count file goes there
        shown = _real(visible)
        covers: list[Path] = []
        for cover in _real([*homes(), *map(Path, PRIVATE), *conceal]):
            if any(_within(cover, p) for p in rw):
                continue  # the tree itself is (in) this home: all of it is writable anyway
            if any(_within(cover, c) for c in covers):
                continue
            covers = [c for c in covers if not _within(c, cover)] + [cover]
        # the top folder holding each tool under a cover (or under a concealed folder inside
        # one: the caller's venv in a hidden checkout, never the whole checkout) stays visible
        concealed = _real(conceal)
        bounds = [*covers, *concealed]
        for tool in _real(tools):
            inner = [b for b in bounds if tool != b and _within(tool, b)]
            if not inner or any(_within(tool, p) for p in (*rw, *shown)):
                continue  # not covered, or in sight already (the tree's own venv)
            bound = max(inner, key=lambda b: len(b.parts))
            if not any(_within(bound, c) for c in covers):
                continue
            # the shallowest folder holding the tool that holds nothing concealed: a tool
            # beside the user's checkout (/tmp/x/node/bin, /tmp/x/repo) shows /tmp/x/node
            parts = tool.relative_to(bound).parts
            tops = (bound.joinpath(*parts[:n]) for n in range(1, len(parts) + 1))
            top = next((t for t in tops if not any(_within(c, t) for c in concealed)), None)
            if top is not None:
                shown.append(top)
        return cls(
            writable=tuple(rw),
            stage=stage,
            visible=tuple(dict.fromkeys(shown)),
            covers=tuple(covers),
            hide=hide,
            sources=tuple(layered),
        )

    def operations(self) -> list[str]:
        """The init's operations, one a line (``_INIT``): build each cover on the stage,
        show what must stay, move the covers into place, hide the store, then read-only."""
        ops = [f"tmpfs {self.stage}"]
        for n, _ in enumerate(self.covers):
            ops += [f"mkdir {self.stage}/{n}", f"tmpfs {self.stage}/{n}"]
        for path in sorted({*self.writable, *self.visible}, key=lambda p: len(p.parts)):
            under = next((i for i, c in enumerate(self.covers) if _within(path, c)), None)
            if under is None:
                ops.append(f"bind {self.source(path)}\t{path}")
            else:
                place = self.stage / str(under) / path.relative_to(self.covers[under])
                ops += [f"mkdir {place}", f"bind {self.source(path)}\t{place}"]
        if self.kernel:  # before the covers: /dev/shm's goes on the gate's own /dev
            ops += self._dev(self.stage / "dev")
        # a cover that holds the stage goes last: after it, the stage is out of sight
        order = sorted(range(len(self.covers)), key=lambda i: _within(self.stage, self.covers[i]))
        ops += [f"move {self.stage}/{k}\t{self.covers[k]}" for k in order]
        if self.hide is not None:
            ops.append(f"hide {self.hide}")
        if self.kernel:
            for knob in _present(KNOBS):
                ops += [f"bind {knob}\t{knob}", f"ro {knob}"]
            for secret in _present(MASKED):
                ops += [f"bind /dev/null\t{secret}", f"ro {secret}"]
            ops += [f"hide {folder}" for folder in _present(MASKED_DIRS)]
        # what is shown under a cover is read-only unless writable; a hidden home turns
        # read-only, the private scratch places stay writable
        for path in {*self.visible} - {*self.writable}:
            if any(_within(path, c) for c in self.covers):
                ops.append(f"ro {path}")
        ops += [f"ro {c}" for c in self.covers if str(c) not in PRIVATE]
        ops += [f"keep {p}" for p in self.writable]
        ops += [f"under {c}" for c in self.covers]
        ops.append("readonly")
        return ops

    @staticmethod
    def _dev(dev: Path) -> list[str]:
        """A /dev of the gate's own, built at ``dev`` then moved over /dev: the harmless
        devices bound from the host's, a private devpts, the usual links."""
        ops = [f"mkdir {dev}", f"tmpfs {dev}"]
        for name in DEVICES:
            if os.path.exists(f"/dev/{name}"):
                ops += [f"file {dev}/{name}", f"bind /dev/{name}\t{dev}/{name}"]
        ops += [f"mkdir {dev}/pts", f"devpts {dev}/pts", f"link pts/ptmx\t{dev}/ptmx"]
        ops += [f"mkdir {dev}/shm", f"link /proc/self/fd\t{dev}/fd"]
        for n, name in enumerate(("stdin", "stdout", "stderr")):
            ops.append(f"link /proc/self/fd/{n}\t{dev}/{name}")
        return [*ops, f"move {dev}\t/dev"]

    def bwrap_options(self) -> list[str]:
        """The same view as bubblewrap options (``contain.bubblewrapped``), applied in
        order: every mount read-only (recursively), the kernel's ``/dev`` and a ``/proc`` of
        the gate's own PID namespace, each cover an empty tmpfs, what is writable or shown
        bound at its own path (the shallower first, so a place shown inside a writable one
        stays read-only), the store hidden, then the covered homes read-only (not what is
        bound inside them: the remount is not recursive)."""
        opts = ["--ro-bind", "/", "/"]
        if self.kernel:  # bubblewrap's own minimal /dev; the knobs read-only, secrets masked
            opts += ["--dev", "/dev", "--proc", "/proc"]
            for knob in _present(KNOBS):
                opts += ["--ro-bind", knob, knob]
            for secret in _present(MASKED):
                opts += ["--ro-bind", "/dev/null", secret]
            for folder in _present(MASKED_DIRS):
                opts += ["--perms", "0000", "--size", "4096", "--tmpfs", folder]
                opts += ["--remount-ro", folder]
        else:
            opts += ["--dev-bind", "/dev", "/dev", "--proc", "/proc"]
        for cover in sorted(self.covers, key=lambda c: len(c.parts)):
            opts += ["--tmpfs", str(cover)]
        for path in sorted({*self.writable, *self.visible}, key=lambda p: len(p.parts)):
            kind = "--bind" if path in self.writable else "--ro-bind"
            opts += [kind, str(self.source(path)), str(path)]
        shown = [*self.writable, *self.visible]
        # a store not made yet has nothing to hide (and no mount point in a read-only place);
        # one under a cover and under nothing shown is out of sight already
        if (
            self.hide is not None
            and self.hide.is_dir()
            and (
                not any(_within(self.hide, c) for c in self.covers)
                or any(_within(self.hide, p) for p in shown)
            )
        ):
            hidden = str(self.hide)
            opts += ["--perms", "0000", "--size", "4096", "--tmpfs", hidden, "--remount-ro", hidden]
        opts += [x for c in self.covers if str(c) not in PRIVATE for x in ("--remount-ro", str(c))]
        return opts


def _real(paths: Sequence[Path]) -> list[Path]:
    """Existing folders by their real path; names the init's lines cannot carry are left out
    (what is left out stays unwritable or hidden: the safe side)."""
    found = []
    for path in paths:
        real = os.path.realpath(path)
        if "\n" not in real and "\t" not in real and os.path.isdir(real):
            found.append(Path(real))
    return found


def _within(child: Path, parent: Path) -> bool:
    """Whether ``child`` is ``parent`` or below it, by name: every path a ``View`` holds is
    real already (``_real``), so no symlink is read again (a gate's view took 10 ms of
    ``realpath`` calls when this resolved them)."""
    inner, outer = str(child), str(parent)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


# What a gate's own HOME holds when it starts (``furnish``):
# What a gate's own HOME holds when it starts (made new for each attempt, removed after):
# the settings a tool would otherwise look for only where the gate's view is read-only.
#
# yarn 1 run as root looks for its global prefix (whose ``bin`` it puts on every script's
# PATH) in ``/usr/local`` and ``/usr/local/share/.yarn`` alone, never under HOME; finding
# neither writable in the gate's view, it warned "Cannot find a suitable global folder" on
# stderr on every ``yarn run``, and a project's snapshot tests of a CLI's stderr failed only
# inside a gate.  Any other user's yarn falls back to ``~/.yarn``: the gate's HOME.  A
# ``.yarnrc`` there says that for root too (root's yarn reads HOME's ``.yarnrc`` after
# ``/usr/local/share``'s), so every user's gate sees the same.  Only yarn 1 reads ``.yarnrc``
# (berry reads ``.yarnrc.yml``, npm and pnpm ``.npmrc``), and a project's own ``.yarnrc``, or
# a ``yarn_prefix`` the manifest sets, still wins.  Not a variable: ``PREFIX`` and
# ``npm_config_prefix`` move npm's global prefix too (``PREFIX`` a Makefile's install
# folder), and yarn berry refuses ``YARN_PREFIX`` ("Unrecognized or legacy configuration
# settings found").  Nothing of the caller's comes in: the files say only the gate's HOME.
#
# A gate keyed by the whole tree also finds there the paths of the tree's snapshot, named by
# ``$DAGRUNNER_PATHS`` (NUL-ended, relative to its folder): the list ``init``'s selector in a
# pre-commit hook's stead (``starter/hookgates``) runs on instead of ``git ls-files``, which
# reads git's database, unseen by the observer (docs/cache.md).  The name set the gate's key
# holds is exactly that list, so it changes only when the key does.  Only this gate sees its
# HOME: another gate cannot change what it is given (it can change only its own, as it can
# its own verdict).
PATHS_VAR = "DAGRUNNER_PATHS"
PATHS_FILE = ".dagrunner-paths"


def furnish(home: Path, paths: str = "") -> None:
    """Write the gate's settings files into ``home``, a folder just made (its own), and
    ``paths`` (NUL-separated) where ``$DAGRUNNER_PATHS`` names them, when given."""
    (home / ".yarnrc").write_text(f"prefix {json.dumps(str(home / '.yarn'))}\n")
    if paths:
        (home / PATHS_FILE).write_bytes(paths.encode("utf-8", "surrogateescape") + b"\0")


# -- What a contained gate may still do as root: the capabilities it keeps --
#
# A gate that runs as root of its namespaces -- the runner is root (CI, a container), or the
# mount(2) path's user namespace maps it to root -- would otherwise hold every capability
# there, and ``CAP_SYS_ADMIN`` alone undoes its view: remount the read-only root writable,
# unmount the cover of the cache store, bind what is hidden.  Others reach past the view
# another way (``CAP_DAC_READ_SEARCH``: files by handle; ``CAP_MKNOD``: the raw disk;
# ``CAP_SYS_MODULE``: the kernel), and ``CAP_SETFCAP`` would let it leave a binary with
# capabilities in the user's tree.
#
# So a contained gate keeps only what a root build needs to handle its own files and
# processes (``KEPT``: owners, modes, its own children, low ports); the rest is dropped from
# its bounding set before it starts, so nothing it executes gets them back.  bubblewrap
# does it (``--cap-drop``) where it holds the view; else ``setpriv`` does, in front of the
# gate.  An ordinary user's gate under bubblewrap holds none at all (bubblewrap's default).

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


def kept_caps_options() -> list[str]:
    """bubblewrap's options for a gate it starts as the real root (it keeps root's
    capabilities unless told otherwise; an ordinary user's gate holds none)."""
    options = ["--cap-drop", "ALL"]
    for name in KEPT:
        options += ["--cap-add", f"CAP_{name.upper()}"]
    return options


def kept_caps(setpriv: str, argv: list[str]) -> list[str]:
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
