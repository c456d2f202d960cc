"""The escape suite a gate runs for ``doctor --prove`` (``prove.py``), by path, with the
runner's Python in ``-I -S`` mode: standard library only, never imported by dagrunner.

    python -I -S escapes.py SPEC.json [isolated]

Each try prints nothing; the last line is a JSON list of ``{line, held, detail}``.  A try
that would change the machine changes nothing when it succeeds: a kernel knob is written
back with the value it had, a device node or mount made is removed at once.  What only the
runner can judge (a file outside, a process left behind) it judges from outside.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from typing import Any

LIBC = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
PTRACE_SEIZE = 0x4206  # attaches without stopping the tracee; detached when this one ends


def tried(action: Callable[[], object]) -> str:
    """'' when ``action`` worked, else why not."""
    try:
        action()
        return ""
    except OSError as exc:
        return exc.strerror or str(exc)


def write_to(path: str, text: str) -> Callable[[], object]:
    def write() -> int:
        with open(path, "w") as handle:
            return handle.write(text)

    return write


def sysctl() -> tuple[bool, str]:
    wrote = []
    for knob in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname"):
        try:
            with open(knob) as handle:
                value = handle.read()
        except OSError:
            continue
        if not tried(write_to(knob, value)):
            wrote.append(knob)
    return bool(wrote), "wrote " + ", ".join(wrote) if wrote else "the knobs are read-only"


def block_devices(attached: str) -> tuple[bool, str]:
    devices = [
        e.path for e in os.scandir("/dev") if not e.is_symlink() and stat.S_ISBLK(e.stat().st_mode)
    ]
    opened = []
    for path in ([attached] if attached else []) + devices:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            continue
        opened.append(path)
    if opened:
        return True, "opened " + ", ".join(sorted(set(opened)))
    tail = f"; {attached} was attached on the host to try" if attached else ""
    return False, f"no block device opens ({len(devices)} in its /dev{tail})"


def mknod() -> tuple[bool, str]:
    node = "dagrunner-prove-node"
    made = not tried(lambda: os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(7, 0)))
    if made:
        os.unlink(node)
    return made, "made a block device node" if made else "refused"


def mount() -> tuple[bool, str]:
    os.makedirs("dagrunner-prove-mnt", exist_ok=True)
    fresh = LIBC.mount(b"none", b"dagrunner-prove-mnt", b"tmpfs", 0, None) == 0
    if fresh:
        LIBC.umount2(b"dagrunner-prove-mnt", MNT_DETACH)
    remount = LIBC.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None) == 0
    said = "mounted a tmpfs" if fresh else "remounted / writable" if remount else "refused"
    return fresh or remount, said


def read_secret(path: str, secret: str) -> tuple[bool, str]:
    try:
        with open(path, "rb") as handle:
            return handle.read() == secret.encode(), f"read {path}"
    except OSError as exc:
        return False, f"not readable: {exc.strerror}"


def runner(pid: int) -> tuple[bool, str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            seen = b"release-check" in handle.read()
    except OSError:
        seen = False
    if not seen:
        return False, "the runner is out of sight"
    traced = LIBC.ptrace(PTRACE_SEIZE, pid, None, None) == 0
    signalled = not tried(lambda: os.kill(pid, 0))
    said = "could ptrace it" if traced else "could signal it" if signalled else "refused"
    return traced or signalled, said


def cgroups() -> tuple[bool, str]:
    left = []
    for procs in ["/sys/fs/cgroup/cgroup.procs", *glob.glob("/sys/fs/cgroup/*/cgroup.procs")]:
        if os.path.exists(procs) and not tried(write_to(procs, str(os.getpid()))):
            left.append(procs)
    if left:
        return True, "moved itself to " + ", ".join(sorted(set(left)))
    return False, "the cgroup tree is read-only"


def loopback(port: int) -> tuple[bool, str]:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return True, "connected to the host's loopback listener"
    except OSError as exc:
        return False, f"refused: {exc.strerror or exc}"


def suite(spec: dict[str, Any]) -> list[tuple[str, tuple[bool, str]]]:
    expect = spec["expect"]
    planted = os.path.join(spec["outside"], "planted")
    why = tried(write_to(planted, "x"))
    found = [
        ("sysctl-write", sysctl()),
        ("block-device", block_devices(spec["block"])),
        ("mknod", mknod()),
        ("mount", mount()),
        ("write-outside", (False, f"refused: {why}" if why else "written (judged outside)")),
        ("cache-key", read_secret(spec["key"], expect["cache-key"])),
        ("hidden-home", read_secret(spec["secret"], expect["hidden-home"])),
        ("signal-runner", runner(int(spec["runner"]))),
        ("leave-cgroup", cgroups()),
    ]
    subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)", spec["marker"]],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return [*found, ("outlive-gate", (False, "left a session leader behind (judged outside)"))]


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    isolated = len(sys.argv) > 2  # the isolated gate tries only the host's loopback
    found = [("host-loopback", loopback(int(spec["port"])))] if isolated else suite(spec)
    lines = [{"line": n, "held": not leaked, "detail": d} for n, (leaked, d) in found]
    print(json.dumps(lines))


if __name__ == "__main__":
    main()
