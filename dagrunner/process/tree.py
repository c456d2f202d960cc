"""Finding, measuring and ending a gate's whole process tree.

A gate runs in its own session, so its process group holds everything it
starts unless a descendant calls ``setsid``.  Those escapees are still found:
every gate process carries a token in its environment, and the runner makes
itself a child subreaper (Linux), so orphans re-parent to it instead of to
init, where the token identifies their gate.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import psutil

from dagrunner.process.contain import Jail

TOKEN_VAR = "DAGRUNNER_GATE_TOKEN"
_PR_SET_CHILD_SUBREAPER = 36
_subreaper_done = False
# token -> gate id of every gate whose tree is running in this process; see sweep_orphans().
RUNNING: dict[str, str] = {}
# Every token this process gave a gate that can leave orphans: one outside a PID namespace
# (where the namespace's end takes everything in it, nothing is left to sweep, and no
# sweep scans /proc).  A runner that is itself inside a gate (nested runs, the project's
# own tests) inherits that gate's token: its own children carry it, and they are not
# orphans of ours.
ISSUED: set[str] = set()


def become_subreaper() -> bool:
    """Make orphans of our gates re-parent to this process (Linux only); True if it took."""
    global _subreaper_done
    if _subreaper_done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            _subreaper_done = True
    return _subreaper_done


@dataclass
class TreeWatch:
    """What has been seen of one gate's tree: its processes, peak memory and CPU time."""

    root_pid: int
    token: str
    procs: dict[int, psutil.Process] = field(default_factory=dict)
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    peak_rss: int = 0
    jail: Jail | None = None  # the gate's containment (contain.py), when this machine has one
    kernel_cpu: float = 0.0  # the cgroup's own count of the tree's CPU (``settle_cpu``)

    def sample(self, *, full: bool = True) -> None:
        """Add the tree's current processes and usage to what has been seen.

        ``full=False`` reads only the root: finding descendants scans /proc,
        which very short gates should not pay for.
        """
        if full:
            members = self._members()
        else:
            try:
                members = [self.procs.setdefault(self.root_pid, psutil.Process(self.root_pid))]
            except psutil.Error:
                return
        rss = 0
        for proc in members:
            with contextlib.suppress(psutil.Error):
                with proc.oneshot():
                    info = proc.memory_info()
                    times = proc.cpu_times()
                rss += info.rss
                self.cpu_by_pid[proc.pid] = max(
                    self.cpu_by_pid.get(proc.pid, 0.0), times.user + times.system
                )
                self.procs.setdefault(proc.pid, proc)
        self.peak_rss = max(self.peak_rss, rss)

    @property
    def cpu_seconds(self) -> float:
        return max(sum(self.cpu_by_pid.values()), self.kernel_cpu)

    def settle_cpu(self) -> None:
        """Where the gate has a cgroup of its own, the kernel's count of the whole tree's CPU
        (v2 ``cpu.stat``, v1 ``cpuacct.usage``): exact, where sampling misses what a short
        process took between two looks.  Read before the cgroup is removed."""
        for group in self.jail.cgroups if self.jail is not None else ():
            with contextlib.suppress(OSError, ValueError):
                if (stat := group / "cpu.stat").is_file():
                    usage = dict(line.split(" ", 1) for line in stat.read_text().splitlines())
                    self.kernel_cpu = max(self.kernel_cpu, int(usage["usage_usec"]) / 1e6)
                elif (acct := group / "cpuacct.usage").is_file():
                    self.kernel_cpu = max(self.kernel_cpu, int(acct.read_text()) / 1e9)

    def _members(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        listed = self._in_cgroup()
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.root_pid)
            found[root.pid] = root
            if listed is None:  # no cgroup of its own: its descendants, by a /proc scan
                for child in root.children(recursive=True):
                    found[child.pid] = child
        for pid in listed or ():
            with contextlib.suppress(psutil.Error):
                found.setdefault(pid, self.procs.get(pid) or psutil.Process(pid))
        for proc in self.procs.values():
            if proc.pid not in found and _alive(proc):
                found[proc.pid] = proc
        return list(found.values())

    def _in_cgroup(self) -> list[int] | None:
        """The pids in the gate's own cgroup (the init put the whole tree there), or None
        when it has none: one small file read, where finding descendants reads all of /proc
        (2-3 ms a sample, six samples in a gate's first second)."""
        if self.jail is None or not self.jail.cgroups:
            return None
        try:
            text = (self.jail.cgroups[0] / "cgroup.procs").read_text()
        except OSError:
            return None
        return [int(pid) for pid in text.split()]

    def leftovers_after_exit(self) -> list[psutil.Process]:
        """``leftovers()`` once the root has exited, without a /proc scan when nothing is left.

        A descendant that left the process group (setsid) and was never
        sampled is caught later by :func:`sweep_orphans`.
        """
        if self.jail is not None and self.jail.pidns:
            return []  # PID 1 of the namespace has exited: the kernel ended the rest
        if not _group_alive(self.root_pid) and not any(
            _alive(p) for pid, p in self.procs.items() if pid != self.root_pid
        ):
            return []
        return self.leftovers()

    def leftovers(self) -> list[psutil.Process]:
        """Live processes of this tree other than the (exited) root, escapees included."""
        found = {p.pid: p for p in self._members() if p.pid != self.root_pid and _alive(p)}
        for proc in _group_members(self.root_pid) + _token_orphans(self.token):
            if proc.pid != self.root_pid and _alive(proc):
                found.setdefault(proc.pid, proc)
        return list(found.values())

    def end(self, grace: float) -> list[int]:
        """SIGTERM the tree, SIGKILL what is left after ``grace``; the pids that survived both."""
        if self.jail is not None and (self.jail.pidns or self.jail.cgroups):
            return self._end_jailed(self.jail, grace)
        targets = self.leftovers()
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.root_pid)
            if _alive(root):
                targets.append(root)
        if not targets and not _group_alive(self.root_pid):
            return []
        _signal_all(self.root_pid, targets, signal.SIGTERM)
        alive = self._wait_gone(targets, grace)
        if alive or _group_alive(self.root_pid):
            _signal_all(self.root_pid, self.leftovers() + alive, signal.SIGKILL)
        return [p.pid for p in self._wait_gone(self.leftovers() + alive, 2.0)]

    def _end_jailed(self, jail: Jail, grace: float) -> list[int]:
        """SIGTERM the group (the init forwards it), then one kill for everything: no /proc scan.

        Killing the namespace's outer process makes the kernel SIGKILL its PID 1
        (``--kill-child``), and PID 1's death ends every process in the namespace;
        ``cgroup.kill`` does the same for the cgroup.  Then we wait until they are gone.
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.root_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self._root_alive() or not jail.empty()):
            time.sleep(0.02)
        jail.kill_all()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.root_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.root_pid, signal.SIGKILL)
        known = [p for pid, p in self.procs.items() if pid != self.root_pid]
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            _reap(known)
            alive = [p for p in known if _alive(p)]
            if not alive and jail.empty() and not self._root_alive():
                return []
            time.sleep(0.02)
        return [p.pid for p in known if _alive(p)] + [
            pid for group in jail.cgroups for pid in jail.members(group)
        ]

    def _root_alive(self) -> bool:
        with contextlib.suppress(psutil.Error):
            return _alive(psutil.Process(self.root_pid))
        return False

    def _wait_gone(self, procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
        """Poll until ``procs`` are dead; the ones still alive after ``timeout``.

        Polls rather than waits: waiting on the root would take its exit
        status from trio, which owns it.
        """
        deadline = time.monotonic() + timeout
        while True:
            _reap([p for p in procs if p.pid != self.root_pid])
            alive = [p for p in procs if _alive(p)]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.02)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(_alive(p) for p in _group_members(pgid))


def sweep_orphans(grace: float = 1.0) -> list[tuple[int, str]]:
    """End orphans of finished gates that re-parented to this runner; (pid, gate) of each.

    Catches a descendant that escaped its gate's process group (setsid) and
    outlived the gate's own check.  Cheap when there are none.
    """
    if not _subreaper_done or not ISSUED:
        return []
    me = psutil.Process()
    strays: list[tuple[psutil.Process, str]] = []
    with contextlib.suppress(psutil.Error):
        # Only direct children: an orphan re-parents to its nearest subreaper, and a
        # deeper process may belong to a nested dagrunner run with tokens of its own.
        for proc in me.children():
            with contextlib.suppress(psutil.Error):
                token = proc.environ().get(TOKEN_VAR)
                if not token or token not in ISSUED or token in RUNNING or not _alive(proc):
                    continue
                strays.append((proc, token))
                for child in proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if child.environ().get(TOKEN_VAR) == token:
                            strays.append((child, token))
    if not strays:
        return []
    procs = [p for p, _ in strays]
    _signal_all(-1, procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in procs):
        _reap(procs)
        time.sleep(0.02)
    _signal_all(-1, [p for p in procs if _alive(p)], signal.SIGKILL)
    _reap(procs)
    return [(p.pid, token) for p, token in strays]


def _group_members(pgid: int) -> list[psutil.Process]:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return []
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
    return members


def _token_orphans(token: str) -> list[psutil.Process]:
    """Processes re-parented to this runner (as subreaper) that carry the gate's token."""
    if not _subreaper_done:
        return []
    found = []
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get(TOKEN_VAR) == token:
                    found.append(proc)
    return found


def _signal_all(pgid: int, procs: list[psutil.Process], sig: signal.Signals) -> None:
    if pgid > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _reap(procs: list[psutil.Process]) -> None:
    """Collect exit statuses of orphans that re-parented to us, so they do not linger as zombies."""
    me = os.getpid()
    for proc in procs:
        with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
            if proc.ppid() == me and proc.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(proc.pid, os.WNOHANG)
