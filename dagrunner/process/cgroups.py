"""The cgroups this process may use for its gates: which hierarchies are mounted, where
this process sits in them, a parent folder for per-gate cgroups (made once per runner and
removed at exit; a dead runner's is removed by the next), and which controllers it can
enable there.  ``contain.detect`` decides from these what containment this machine gives."""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


def own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                found[name] = path
    return found


def cgroup_mounts() -> Iterator[tuple[str, Path, list[str]]]:
    """(filesystem type, mount point, super options) of each cgroup mount, from mountinfo."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            fields, extra = pre.split(), post.split()
            if len(fields) >= 5 and len(extra) >= 3 and extra[0] in ("cgroup", "cgroup2"):
                yield extra[0], Path(fields[4]), extra[2].split(",")


def mounts() -> dict[str, Path]:
    """ "" -> the cgroup2 mount; a v1 controller -> its hierarchy's mount."""
    found: dict[str, Path] = {}
    for kind, point, options in cgroup_mounts():
        for name in [""] if kind == "cgroup2" else options:
            found.setdefault(name, point)
    return found


def favors_dynmods() -> bool | None:
    """Whether the cgroup2 mount has ``favordynmods`` (None: no cgroup2 mount here).

    Without it, moving a process into a cgroup waits for an RCU grace period (5-17 ms
    measured) unless another move happened just before: a gate that starts alone, after
    a quiet moment, pays it (docs/benchmarks.md)."""
    for kind, _, options in cgroup_mounts():
        if kind == "cgroup2":
            return "favordynmods" in options
    return None


def pid_namespace() -> int:
    """This process's PID namespace (its inode): a pid means something only within it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def usable(directory: Path, files: Sequence[str]) -> Path | None:
    """A parent for per-gate cgroups under ``directory``, if we can make one with ``files``."""
    base = directory / f"dagrunner-{pid_namespace()}-{os.getpid()}"
    remove_stale(directory)
    try:
        base.mkdir(exist_ok=True)
        atexit.register(rmdir_tree, base)
        probe = Path(tempfile.mkdtemp(prefix="probe-", dir=base))
        ok = all((probe / name).exists() for name in files)
        probe.rmdir()
    except OSError:
        return None
    return base if ok else None


def rmdir_tree(base: Path) -> None:
    """Remove a runner's cgroup folder and its (empty) gate cgroups; a busy one stays."""
    with contextlib.suppress(OSError):
        for child in base.iterdir():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        base.rmdir()


def remove_stale(directory: Path) -> None:
    """Folders of runners that died without removing theirs (SIGKILL).  Only runners of our
    own PID namespace are judged: a nested run inside a gate sees other pids (or none) in
    its /proc, and must never take a live outer runner's folder for a dead one's."""
    ours = pid_namespace()
    with contextlib.suppress(OSError):
        for entry in directory.glob(f"dagrunner-{ours}-*"):
            pid = entry.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                rmdir_tree(entry)


def v2_controllers(base: Path, wanted: Sequence[str]) -> set[str]:
    """Enable ``wanted`` controllers for the children of ``base`` where the parent offers them."""
    enabled = set()
    for name in wanted:
        with contextlib.suppress(OSError):
            if name in (base / "cgroup.controllers").read_text().split():
                (base / "cgroup.subtree_control").write_text(f"+{name}")
                enabled.add(name)
    return enabled


def memory_files(base: Path | None, limit: int) -> dict[str, str]:
    """The files that set a per-gate cgroup's memory ``limit`` (v2 under ``base``, else v1)."""
    if base is not None and (base / "cgroup.controllers").exists():
        return {"memory.max": str(limit), "memory.swap.max": "0"}
    return {"memory.limit_in_bytes": str(limit)}
