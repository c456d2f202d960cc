"""Containment: each gate's processes are held so that ending them is one operation.

Three layers, each used where this machine allows it (``detect()``, shown by
``dagrunner doctor`` and recorded in ``run.json``):

- **PID namespace** (``unshare --pid --fork --kill-child --mount-proc``): the
  gate runs under a small init (PID 1) that forwards SIGTERM, reaps, and
  counts what is left when the gate exits.  When PID 1 dies the kernel kills
  everything in the namespace -- setsid and token-dropping escapees included.
  The gate's ``/proc`` shows only its namespace, so the runner's environment
  is out of its reach, and the cache store is covered by an empty read-only
  tmpfs in the gate's own mount namespace, so it can neither read the cache's
  key nor write an entry.
- **cgroups**: a cgroup v2 per gate (``cgroup.kill`` ends it at once), with
  ``pids.max`` (fork bombs) and ``memory.max`` (``[governor] enforce = true``)
  where those controllers are delegated -- from cgroup v2, or else from the
  v1 ``pids``/``memory`` hierarchies.
- **parent-death signal** (``setpriv --pdeathsig KILL``): if the runner is killed, the
  namespace goes with it (the signal follows the parent *thread*: one spawns every gate).

A gate root of its namespaces keeps few capabilities (``view.kept_caps``).  Where none
of these is available, ``tree.py``'s process-group and token sweep is the fallback.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.files import is_inside
from dagrunner.process import cgroups
from dagrunner.process.view import APPLY_VIEW, View, kept_caps, kept_caps_options

# PID 1 of the gate's namespace: join the cgroups, shape the gate's view of the filesystem
# (one operation per line of $2, applied by $5 in the Python $4: ``view.APPLY_VIEW``), run
# the gate in $3, forward SIGTERM, reap,
# and count the processes still alive when the gate has exited (into $1: a place the view
# keeps writable, since no file may be open for writing where a mount turns read-only).
_INIT = r"""
left=$1; ops=$2; dir=$3; py=$4; view=$5; shift 5
while [ "$1" != -- ]; do echo 0 > "$1/cgroup.procs" || exit 125; shift; done; shift
if [ -n "$ops" ]; then "$py" -S -I -c "$view" "$ops" || exit 125; fi
cd "$dir" || { echo "dagrunner: could not enter $dir for the gate" >&2; exit 125; }
"$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT HUP
while :; do
  wait $child; code=$?
  kill -0 $child 2>/dev/null || break
done
n=0; for d in /proc/[0-9]*; do n=$((n + 1)); done
echo $((n - 1)) > "$left"
exit $code
"""
# Joins every cgroup directory named before "--", then becomes the rest of the command.
_JOIN = r"""
while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done
shift; exec "$@"
"""


@dataclass(frozen=True, kw_only=True)
class Containment:
    """What this machine allows (see the module doc)."""

    pidns: bool
    pdeathsig: bool
    views: bool = False  # with pidns: the write allow-list (everything else read-only)
    userns: bool = False  # the namespaces come with a user namespace (not root)
    unshare: str = "unshare"  # resolved once by detect(), not per gate
    setpriv: str = "setpriv"
    bwrap: str = ""  # bubblewrap, where it holds the view: it applies it (``bubblewrapped``)
    cgroup_kill: Path | None  # a cgroup v2 directory under which each gate gets its own
    pids: Path | None  # where a per-gate cgroup can carry pids.max (v2 or v1)
    memory: Path | None  # where a per-gate cgroup can carry a memory limit (v2 or v1)

    @property
    def mode(self) -> str:
        parts = [name for name, on in (("pidns", self.pidns), ("cgroup", self.cgroup_kill)) if on]
        return "+".join(parts) or "session"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "pid_namespace": self.pidns,
            "read_only_views": self.views,
            "write_allow_list": self.views,
            "user_namespace": self.userns,
            "views_by": ("bubblewrap" if self.bwrap else "mount") if self.views else "",
            "parent_death_signal": self.pdeathsig,
            "cgroup_kill": self.cgroup_kill is not None,
            "pids_limit": self.pids is not None,
            "memory_limit": self.memory is not None,
        }

    def describe(self) -> str:
        root = "few capabilities as root" if self.pdeathsig or self.bwrap else ""
        found = [
            "PID namespace (kill-all, private /proc, cache hidden)" if self.pidns else "",
            "writes only to its tree, HOME, TMPDIR and what the manifest names; the "
            f"invoking user's home hidden ({'bubblewrap' if self.bwrap else 'mount'})"
            if self.views
            else "",
            ("user namespace (not root)" if self.userns else root) if self.pidns else "",
            "cgroup v2 (cgroup.kill)" if self.cgroup_kill else "",
            "pids limit" if self.pids else "",
            "memory limit" if self.memory else "",
            "parent-death signal" if self.pdeathsig else "",
        ]
        text = ", ".join(f for f in found if f)
        return text or "process group and token sweep only (no namespace or cgroup here)"


@functools.cache
def detect() -> Containment:
    """What containment this machine allows; probed once per process."""
    forced = os.environ.get("DAGRUNNER_CONTAINMENT", "")  # tests and debugging
    if forced == "session":
        return Containment(pidns=False, pdeathsig=False, cgroup_kill=None, pids=None, memory=None)
    setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
    bwrap = "" if forced == "unshare" else shutil.which("bwrap") or ""
    pidns = views = False
    userns = os.geteuid() != 0
    if unshare:
        pidns = _probe(unshare, userns, confine=False)
        # the allow-list apart: a machine whose mounts fail keeps its PID namespace;
        # bubblewrap first (where it holds the view, the mount(2) path is not needed)
        bwrap = bwrap if pidns and bwrap and _probe(unshare, userns, bwrap=bwrap) else ""
        views = pidns and (bool(bwrap) or _probe(unshare, userns, confine=True))
    own, mounts = cgroups.own_cgroups(), cgroups.mounts()
    cgroup_kill = pids = memory = None
    if "" in own and "" in mounts:
        base = cgroups.usable(mounts[""] / own[""].lstrip("/"), ["cgroup.kill", "cgroup.procs"])
        if base is not None:
            cgroup_kill = base
            enabled = cgroups.v2_controllers(base, ["pids", "memory"])
            pids = base if "pids" in enabled else None
            memory = base if "memory" in enabled else None
    for name, limit in (("pids", "pids.max"), ("memory", "memory.limit_in_bytes")):
        if (name == "pids" and pids) or (name == "memory" and memory):
            continue
        if name in own and name in mounts:
            found = cgroups.usable(mounts[name] / own[name].lstrip("/"), [limit, "cgroup.procs"])
            if name == "pids":
                pids = found
            else:
                memory = found
    return Containment(
        pidns=pidns,
        views=views,
        userns=userns and pidns,
        pdeathsig=setpriv is not None,
        unshare=unshare or "unshare",
        setpriv=setpriv or "setpriv",
        bwrap=bwrap,
        cgroup_kill=cgroup_kill,
        pids=pids,
        memory=memory,
    )


@functools.cache
def network_isolation() -> bool:
    """Whether a gate can get a network namespace of its own with loopback up (probed once,
    and only when a gate asks for one)."""
    found = detect()
    if not found.pidns:
        return False
    with tempfile.TemporaryDirectory(prefix="dagrunner-probe-") as tmp:
        left, cwd = Path(tmp) / "left", Path(tmp)
        ways = [
            namespaced(["true"], ops="loopback", left=left, cwd=cwd, unshare=found.unshare,
                       userns=found.userns, net=True),
        ]  # fmt: skip
        if found.bwrap:  # an isolated gate with a view goes through bubblewrap: both must work
            options = View(writable=(cwd,), stage=cwd).bwrap_options()
            ways.append(bubblewrapped(["true"], options=options, left=left,
                                      cwd=cwd, bwrap=found.bwrap, userns=found.userns, net=True))  # fmt: skip
        for argv in ways:
            try:
                done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=10)  # fmt: skip
            except (OSError, subprocess.TimeoutExpired):
                return False
            if done.returncode != 0:
                return False
    return True


def _probe(unshare: str, userns: bool, *, confine: bool = True, bwrap: str = "") -> bool:
    """Whether the init runs a command in a new namespace; with ``confine``, whether the
    view holds: a covered folder's secret hidden, a writable folder inside it written, and a
    folder outside every allowed place read-only (applied by ``bwrap`` when given)."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-probe-") as tmp:
        root = Path(os.path.realpath(tmp))  # a View holds real paths (compared by name)
        for folder in ("cover/keep", "stage", "outside", "hidden"):
            (root / folder).mkdir(parents=True)
        (root / "cover" / "secret").write_text("")
        view = View(
            writable=(root / "cover" / "keep",),
            stage=root / "stage",
            covers=(root / "cover",),
            hide=root / "hidden",
        )
        ops = "\n".join(view.operations()) if confine else ""
        check = ["true"]
        if confine:
            test = '[ ! -e "$1/secret" ] && touch "$1/keep/ok" && ! touch "$2/x" 2>/dev/null'
            check = ["/bin/sh", "-c", test, "probe", f"{tmp}/cover", f"{tmp}/outside"]
        left = Path(f"{tmp}/cover/keep/left" if confine else f"{tmp}/left")
        if bwrap and confine:
            options = view.bwrap_options()
            argv = bubblewrapped(check, options=options, left=left, cwd=root, bwrap=bwrap, userns=userns)  # fmt: skip
        else:
            argv = namespaced(check, ops=ops, left=left, cwd=root, unshare=unshare, userns=userns)
        try:
            probe = subprocess.run(
                argv,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False  # the fallback holds; doctor says which mode is in force
        return probe.returncode == 0 and (not confine or (root / "cover" / "keep" / "ok").exists())


def namespaced(
    argv: Sequence[str],
    *,
    ops: str,
    left: Path,
    cwd: Path,
    unshare: str = "unshare",
    userns: bool = False,
    groups: Sequence[Path] = (),
    python: str = sys.executable,
    net: bool = False,
) -> list[str]:
    """``argv`` run by the init in new PID and mount namespaces (with a user namespace when
    ``userns``: how an ordinary user gets them), after the view's ``ops`` (one a line) and
    joining ``groups``; the count of what was left goes to ``left``.  ``python`` applies the
    view (the one running dagrunner: the invoking user's own)."""
    # Not root: a user namespace (mapped to root inside) gives the mount and PID namespaces.
    user = ["--user", "--map-root-user"] if userns else []
    init = ["/bin/sh", "-c", _INIT, "init", str(left), ops, str(cwd), python, APPLY_VIEW]
    init += [*map(str, groups), "--"]
    # its own UTS, IPC and cgroup namespaces too: hostname, SysV IPC, its view of cgroups
    spaces = ["--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--ipc", "--cgroup"]
    spaces += ["--net"] if net else []
    return [unshare, *user, *spaces, "--", *init, *argv]


def bubblewrapped(
    argv: Sequence[str],
    *,
    options: Sequence[str],
    left: Path,
    cwd: Path,
    bwrap: str,
    userns: bool = False,
    groups: Sequence[Path] = (),
    net: bool = False,
) -> list[str]:
    """``argv`` run by the init as PID 1 of bubblewrap's PID and mount namespaces, which
    apply the view's ``options`` (``View.bwrap_options``) before it starts; ``groups`` are
    joined first, from outside (the view makes cgroupfs read-only).  The same init and the
    same view as ``namespaced``, in two processes instead of four (no Python starts)."""
    # Not root: a user namespace, mapped to root inside as ``namespaced`` maps it.
    user = ["--unshare-user", "--uid", "0", "--gid", "0"] if userns else []
    init = ["/bin/sh", "-c", _INIT, "init", str(left), "", str(cwd), "", "", "--"]
    spaces = ["--die-with-parent", "--unshare-pid", "--as-pid-1", *user]
    spaces += ["--unshare-uts", "--unshare-ipc", "--unshare-cgroup-try"]
    command = [bwrap, *spaces, *(["--unshare-net"] if net else []), *options, "--", *init]
    if groups:
        command = ["/bin/sh", "-c", _JOIN, "join", *map(str, groups), "--", *command]
    return [*command, *argv]


@dataclass(frozen=True, kw_only=True)
class Jail:
    """One gate attempt's containment: the command to start and the cgroups that hold it."""

    argv: list[str]
    cgroups: tuple[Path, ...]
    left_file: Path
    pidns: bool
    bwrap: bool = False  # bubblewrap applies the view: a line of its own starts 'bwrap: '

    def leftovers(self) -> int:
        """Processes the init found still running when the gate exited (then ended)."""
        try:
            return max(0, int(self.left_file.read_text().strip() or 0))
        except (OSError, ValueError):
            return 0

    def kill_all(self) -> None:
        """SIGKILL everything in the gate's cgroups at once (cgroup.kill, else each member)."""
        for group in self.cgroups:
            if (group / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (group / "cgroup.kill").write_text("1")
                continue
            for _ in range(50):  # v1: no kill file; pids.max keeps this converging
                members = self.members(group)
                if not members:
                    break
                for pid in members:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)

    @staticmethod
    def members(group: Path) -> list[int]:
        try:
            return [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def empty(self) -> bool:
        return not any(self.members(group) for group in self.cgroups)

    def remove(self) -> None:
        """Remove the gate's cgroups (they must be empty); the leftover count file too."""
        deadline = time.monotonic() + 2.0
        for group in self.cgroups:
            while True:
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
        self.left_file.unlink(missing_ok=True)


def jail(
    argv: Sequence[str],
    *,
    token: str,
    work: Path,
    hide: Path | None,
    cwd: Path,
    memory: int | None,
    max_pids: int | None,
    view: View | None = None,
    isolated: bool = False,
    observe: Sequence[str] = (),  # bubblewrap's options of the gate's observer (observe.py)
) -> Jail:
    """Wrap ``argv`` in this machine's containment; ``work`` holds the leftover count file.
    With a mount namespace that allows it (``Containment.views``), the gate sees ``view``;
    otherwise only the cache store (``hide``) is covered.  ``isolated``: a network namespace
    of its own with only loopback up (the plan checked ``network_isolation()``)."""
    found = detect()
    confined = view is not None and found.pidns and found.views
    # confined, the count goes where the gate can write: its own HOME
    left = (view.writable[0] if view is not None and confined else work) / f".{token}.left"
    groups: list[Path] = []
    for base, files in (
        (found.cgroup_kill, {}),
        (found.pids, {"pids.max": str(max_pids)} if max_pids else {}),
        (found.memory, cgroups.memory_files(found.memory, memory) if memory else {}),
    ):
        if base is None or (base != found.cgroup_kill and not files) or base in groups:
            continue
        group = base / token
        with contextlib.suppress(OSError):
            group.mkdir()
            for name, value in files.items():
                if (group / name).exists():
                    (group / name).write_text(value)
            groups.append(group)
    command = list(argv)
    if confined and view is not None and found.bwrap:
        root = [] if found.userns else kept_caps_options()  # else bwrap drops all
        command = bubblewrapped(
            command,
            options=[*view.bwrap_options(), *root, *observe],
            left=left,
            cwd=cwd,
            bwrap=found.bwrap,
            userns=found.userns,
            groups=groups,
            net=isolated,
        )
    elif found.pidns:
        # The init joins the cgroups itself ("0" moves the writer): one process fewer per gate.
        if view is not None and confined:
            ops = view.operations()
        elif hide is not None and hide.is_dir() and not is_inside(cwd, hide):
            ops = [f"hide {hide}"]
        else:
            ops = []
        if found.pdeathsig:  # root of its namespaces: only the capabilities it keeps
            command = kept_caps(found.setpriv, command)
        command = namespaced(
            command,
            ops="\n".join([*ops, *(["loopback"] if isolated else [])]),
            left=left,
            cwd=cwd,
            unshare=found.unshare,
            userns=found.userns,
            groups=groups,
            net=isolated,
        )
    elif groups:
        command = ["/bin/sh", "-c", _JOIN, "join", *map(str, groups), "--", *command]
    if found.pdeathsig:
        command = [found.setpriv, "--pdeathsig", "KILL", *command]
    bwrap = confined and bool(found.bwrap)
    return Jail(argv=command, cgroups=tuple(groups), left_file=left, pidns=found.pidns, bwrap=bwrap)


# One thread spawns every gate and lives as long as the process: the parent-death
# signal fires when the *thread* that forked a child ends, and trio's own spawning
# threads end after ten idle seconds.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dagrunner-spawn")


def spawn(factory: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``factory`` (a Popen) on the spawner thread; its result."""
    return _SPAWNER.submit(factory).result()


def disable_dumping() -> None:
    """PR_SET_DUMPABLE 0: other processes of our user cannot read our /proc (environ, mem).

    Root keeps that power (CAP_SYS_PTRACE): there only the PID namespace hides us.
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
