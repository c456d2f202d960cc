"""A mount namespace of a gate's own, seen: the observer's mark is on the gate's mount of
its tree, and a namespace a gate process makes copies that mount without the mark (any
tool can: ``unshare --user --mount cat file``).  So an observed gate starts under a
seccomp filter that lets every call through as before but tells the observer of each
call that makes a mount namespace (``unshare``/``clone`` with ``CLONE_NEWNS``); ``clone3``,
whose flags a filter cannot read, answers ENOSYS, as container runtimes' filters do (the C
library then uses ``clone``).  The filter is installed by ``WATCH``, the gate's first
process, which hands the filter's listener to the observer and becomes the gate.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import sys

# Runs inside the gate's namespace (the runner's own Python, ``-S -I``): install the filter
# (hex in argv[2], through seccomp(2), whose number is argv[1]) with a listener, send the
# listener down the socket at argv[3], then become the gate.  Any failure: the gate runs
# all the same, and the observer, given no listener, says the observation is incomplete.
WATCH = r"""
import ctypes, os, sys, _socket  # not socket nor struct: 7 ms more of every gate's start
number, program, fd = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3])
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # no new privileges: what an unprivileged filter needs
    code = ctypes.create_string_buffer(program, len(program))
    size, where = len(program) // 8, ctypes.addressof(code)
    prog = size.to_bytes(8, "little") + where.to_bytes(8, "little")  # struct sock_fprog
    listener = libc.syscall(number, 1, 8, prog)  # SET_MODE_FILTER, FLAG_NEW_LISTENER
    if listener >= 0:  # to the observer, as SCM_RIGHTS (SOL_SOCKET 1, SCM_RIGHTS 1)
        end = _socket.socket(fileno=os.dup(fd))
        end.sendmsg([b"x"], [(1, 1, listener.to_bytes(4, sys.byteorder))])
        end.close()
        os.close(listener)
except Exception:
    pass
os.close(fd)
os.execvp(sys.argv[4], sys.argv[4:])
"""
SECCOMP = {"x86_64": 317, "aarch64": 277}
CLONE_NEWNS = 0x20000
X32 = 0x40000000
# per machine: (audit arch, unshare, clone, clone3) of each ABI a process there may use
ABIS = {
    "x86_64": [
        (0xC000003E, 272, 56, 435),
        (0xC000003E, X32 | 272, X32 | 56, X32 | 435),
        (0x40000003, 310, 120, 435),  # i386 programs
    ],
    "aarch64": [(0xC00000B7, 97, 220, 435)],
}
ALLOW, NOTIFY, ENOSYS = 0x7FFF0000, 0x7FC00000, 0x00050000 | 38
LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
RECV, SEND, CONTINUE = 0xC0502100, 0xC0182101, 1  # SECCOMP_IOCTL_NOTIF_*, USER_NOTIF_FLAG
MADE = "a process of the gate made a mount namespace of its own: its reads there are not seen"


def program(machine: str) -> bytes:
    """The filter for ``machine`` (``KeyError`` where none is known)."""
    out: list[tuple[int, int, int, int]] = []  # code, jt, jf, k; jumps resolved below
    jumps: list[tuple[int, str, str]] = []  # instruction, true label, false label

    def jump(code: int, k: int, true: str, false: str) -> None:
        jumps.append((len(out), true, false))
        out.append((code, 0, 0, k))

    labels: dict[str, int] = {}
    out.append((LD, 0, 0, 4))  # arch
    for arch, unshare, clone, clone3 in ABIS[machine]:
        jump(JEQ, arch, "", f"not{arch}{unshare}")
        out.append((LD, 0, 0, 0))  # nr
        jump(JEQ, unshare, "flags", "")
        jump(JEQ, clone, "flags", "")
        jump(JEQ, clone3, "enosys", "")
        out.append((RET, 0, 0, ALLOW))
        labels[f"not{arch}{unshare}"] = len(out)
        out.append((LD, 0, 0, 4))
    out.append((RET, 0, 0, ALLOW))
    labels["flags"] = len(out)
    out.append((LD, 0, 0, 16))  # the low half of the first argument: the flags
    jump(JSET, CLONE_NEWNS, "notify", "allow")
    labels["enosys"], labels["notify"], labels["allow"] = len(out), len(out) + 1, len(out) + 2
    out += [(RET, 0, 0, ENOSYS), (RET, 0, 0, NOTIFY), (RET, 0, 0, ALLOW)]
    for at, true, false in jumps:
        code, _, _, k = out[at]
        jt = labels[true] - at - 1 if true else 0
        jf = labels[false] - at - 1 if false else 0
        out[at] = (code, jt, jf, k)
    return b"".join(struct.pack("HBBI", *ins) for ins in out)


def watched(argv: list[str], fd: int) -> list[str]:
    """``argv`` started by ``WATCH``, which sends the filter's listener down ``fd``; as it
    is where this machine has no filter known (the observer then says so)."""
    machine = os.uname().machine
    if machine not in SECCOMP:
        return argv
    code = program(machine).hex()
    return [sys.executable, "-S", "-I", "-c", WATCH, str(SECCOMP[machine]), code, str(fd), *argv]


def receive(sock: int) -> int:
    """The listener sent down ``sock`` (-1: none came, the filter is not installed)."""
    with socket.socket(fileno=os.dup(sock)) as end:
        _, fds, _, _ = socket.recv_fds(end, 1, 1)
    return fds[0] if fds else -1


def answer(listener: int) -> bool:
    """Let one notified call go on as it was; whether one was there to let go."""
    notice = bytearray(80)  # struct seccomp_notif: id, pid, flags, seccomp_data
    try:
        fcntl.ioctl(listener, RECV, notice)
    except OSError:  # its process died meanwhile (ENOENT), or it was interrupted
        return False
    (ident,) = struct.unpack_from("Q", notice)
    with contextlib.suppress(OSError):
        fcntl.ioctl(listener, SEND, struct.pack("QqiI", ident, 0, 0, CONTINUE))
    return True
