"""A log file that keeps a gate's first and last bytes and says how many it left out.

Memory stays bounded by the cap however much a gate prints: the head goes
straight to disk, and only the tail is held, in a buffer trimmed as it grows.  Also what a
log says of its own (the notes for bubblewrap's failures) and keeps out (secrets).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import trio

EROFS_NOTE = (
    "a write outside the gate's own places was refused (read-only file system): a gate writes "
    "only its tree, HOME, TMPDIR and what the manifest names ([sandbox] writable, or the "
    "gate's writable)"
)
BWRAP_NOTE = (
    "bubblewrap could not set up the gate's view (its 'bwrap:' message is above): a path the "
    "view binds or hides may be missing or unmountable; the gate itself may not have started"
)
# A mount of the machine's that goes while bubblewrap copies the mount table fails its view
# (containers/bubblewrap#650: dagrunner's own tool-cache overlays come and go, so do other
# programs'): the gate never started, and is started again (``sandbox.SETUP_WAITS``).
SETUP_NOTE = "bubblewrap could not set the gate's view up (above); the gate never started: again"
OPENING = 512  # bytes of a gate's output kept apart: a 'bwrap:' line first is bubblewrap's
ELISION = b"\n[dagrunner: %d bytes left out of this log; it keeps the first %d and last %d bytes]\n"


class BoundedLog:
    """Append-only log capped at ``limit`` bytes of the gate's own output."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.total = 0
        self.head_written = 0
        self._tail = bytearray()
        self._file = path.open("wb")
        self._notes: list[bytes] = []
        self.opening = bytearray()  # the first bytes of this attempt's output (cleared for another)

    def write(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        if len(self.opening) < OPENING:
            self.opening += data[: OPENING - len(self.opening)]
        room = self.head_limit - self.head_written
        if room > 0:
            self._file.write(data[:room])
            self.head_written += min(room, len(data))
            data = data[room:]
        if data and self.tail_limit > 0:
            self._tail += data
            # Trim lazily so that many small writes do not each copy the buffer.
            if len(self._tail) > 2 * self.tail_limit:
                del self._tail[: len(self._tail) - self.tail_limit]

    def note(self, text: str) -> None:
        """A line of dagrunner's own (a timeout marker, say), kept after the gate's output."""
        self._notes.append(f"\n[dagrunner: {text}]\n".encode())

    @property
    def elided(self) -> int:
        return self.total - self.head_written - min(len(self._tail), self.tail_limit)

    def close(self) -> None:
        if self._file.closed:
            return
        tail = bytes(self._tail[-self.tail_limit :]) if self.tail_limit else b""
        elided = self.elided
        if elided > 0:
            self._file.write(ELISION % (elided, self.head_limit, self.tail_limit))
        self._file.write(tail)
        for note in self._notes:
            self._file.write(note)
        self._file.close()
        self._tail = bytearray()

    def __enter__(self) -> BoundedLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def redact_file(path: Path, secrets: Mapping[str, str]) -> int:
    """Replace each secret value (value -> variable name) in the log at ``path``; how many.

    Logs are bounded, so reading one whole is cheap; the file is rewritten only
    when a secret was found.
    """
    if not secrets:
        return 0
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    count = 0
    for value, name in secrets.items():
        raw = value.encode("utf-8", "surrogateescape")
        if raw in data:
            count += data.count(raw)
            data = data.replace(raw, f"[redacted: ${name}]".encode())
    if count:
        path.write_bytes(data)
    return count


async def pump(
    stream: trio.abc.ReceiveStream,
    log: BoundedLog,
    drained: trio.Event,
    refused: list[bool] | None = None,
) -> None:
    """Copy the gate's output into its log; with ``refused``, add to it, for each line that
    tells of a refused write, whether it is a ``bwrap:`` line (a view bubblewrap could not
    set up, not a write of the gate's)."""
    try:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            while chunk := await stream.receive_some(65536):
                log.write(chunk)
                if refused is not None and len(refused) < 64 and b"Read-only file system" in chunk:
                    refused += [
                        line.startswith(b"bwrap: ")
                        for line in chunk.splitlines()
                        if b"Read-only file system" in line
                    ]
    finally:
        drained.set()


# Caller variables that are never secrets, or whose values are everywhere (paths, terminals).
NOT_SECRET = frozenset(
    {"PATH", "PWD", "OLDPWD", "HOME", "SHELL", "TERM", "USER", "LOGNAME", "LANG", "TZ", "SHLVL"}
    | {"HOSTNAME", "TMPDIR", "_", "COLUMNS", "LINES", "PYTHONPATH", "VIRTUAL_ENV"}
)
MIN_SECRET = 8  # shorter values are too common to redact without mangling every log


def secret_values(
    caller: Mapping[str, str], envs: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """value -> name of every caller variable that no gate was given: redacted from logs.

    A gate cannot print what it was not given, unless it reads the runner some
    other way; this is the last line if it ever does.
    """
    given = {value for env in envs.values() for value in env.values()}
    found: dict[str, str] = {}
    for name, value in caller.items():
        if (
            len(value) >= MIN_SECRET
            and not value.startswith(("/", "~"))  # paths (PYENV_DIR=/x): not secrets, and common
            and value not in given
            and name not in NOT_SECRET
            and not name.startswith(("LC_", "XDG_", "DAGRUNNER_"))
        ):
            found.setdefault(value, name)
    return dict(sorted(found.items(), key=lambda item: -len(item[0])))  # longest first
