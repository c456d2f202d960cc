"""Run one gate attempt hermetically: explicit environment, own HOME and TMPDIR,
closed stdin, own session, bounded log, timeout that ends the whole tree.

``GateJob`` and ``AttemptResult`` hold only plain values so that an executor
can ship them to another machine (see ``executors/dask.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from dagrunner.files import is_inside
from dagrunner.manifest.load import DEFAULT_MAX_PIDS, EnvSpec
from dagrunner.process.contain import detect, jail, spawn
from dagrunner.process.logs import BWRAP_NOTE, EROFS_NOTE, SETUP_NOTE, BoundedLog, pump
from dagrunner.process.observe import NOT_BWRAPPED, NOT_TREE, Observer
from dagrunner.process.tree import ISSUED, RUNNING, TOKEN_VAR, TreeWatch, become_subreaper
from dagrunner.process.view import PATHS_FILE, PATHS_VAR, View, furnish
from dagrunner.records.run import Observation, TestRun

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
FIXED_ENV = {"TZ": "UTC", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
KILL_GRACE = 3.0
SETUP_WAITS = (0.05, 0.2, 0.6)  # before each start again of a gate whose view was not set up


@dataclass(frozen=True, kw_only=True)
class GateJob:
    """Everything needed to run one attempt of one gate."""

    gate: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    sandbox_dir: (
        str  # HOME, with TMPDIR inside; made new (its parent must exist), removed by the caller
    )
    log_path: str
    log_limit: int
    timeout: float | None = None
    grace: float = KILL_GRACE
    sample_interval: float = 0.5
    memory_limit: int | None = None  # enforced where a memory cgroup is delegated
    max_pids: int | None = DEFAULT_MAX_PIDS  # enforced where a pids cgroup is delegated
    hide: str | None = None  # a folder the gate must not see (the cache store)
    # Where a mount namespace allows it (``contain.View``), the gate writes only its tree,
    # its HOME and TMPDIR, and ``writable`` (absolute, or relative to the tree); it sees
    # ``read_only`` folders even inside the invoking user's home, which is hidden.
    tree: str = ""  # the tree under test ("" : cwd)
    read_only: tuple[str, ...] = ()
    conceal: tuple[str, ...] = ()  # folders hidden outright (an empty tmpfs over each)
    writable: tuple[str, ...] = ()
    keep_home: bool = False  # non-gate commands (proc.py) may keep the caller's HOME/TMPDIR
    network: str = "host"  # "isolated": a network namespace of its own, only loopback up
    cpu: float = 1.0  # declared: where a cluster places the attempt
    memory: int = 0
    junit: str = ""  # the JUnit file the gate writes, relative to cwd (a cluster brings it back)
    observe: str = ""  # the tree (absolute) whose reads to record (``observe``), "" for none
    paths: str = ""  # the tree's paths, NUL-separated, for ``$DAGRUNNER_PATHS`` (``home``)
    # the merged folder of the gate's own layer over its tree, shown at the tree's path
    # (``process.layers``): "" where the gate writes the tree itself
    layer: str = ""
    # On a cluster ([executor]): how long an attempt no worker can take waits for one, and
    # how far past timeout + grace the submitter waits for a result before giving up on it.
    wait_for_workers: float = 180.0
    margin: float = 30.0


@dataclass(frozen=True, kw_only=True)
class AttemptResult:
    exit_code: int | None  # None when it never started or was killed by us
    timed_out: bool = False
    interrupted: bool = False
    error: str = ""  # why it could not start
    peak_rss: int = 0
    cpu_seconds: float = 0.0
    log_bytes: int = 0
    log_elided: int = 0
    leftover_killed: int = 0  # processes still running after the gate exited
    survivors: tuple[int, ...] = ()  # pids that outlived SIGKILL (should never happen)
    containment: str = "session"
    worker: str = ""  # the remote worker that ran it ("" here)
    ran: float | None = None  # seconds from the gate's start to its end, measured where it ran
    tests: TestRun | None = None  # its JUnit file, read where it ran (a cluster's worker)
    observation: Observation | None = None  # None: not asked; else what it opened, or why not
    unset: bool = False  # bubblewrap could not set its view up: the gate never started

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.survivors


def gate_environment(
    *,
    common: EnvSpec,
    gate: EnvSpec,
    caller: Mapping[str, str],
    source_date_epoch: int,
) -> dict[str, str]:
    """The gate's environment, built from nothing (``run_job`` adds HOME and TMPDIR).

    Only names listed in ``pass`` (manifest-wide or the gate's) come from the
    caller; ``set`` values come next.
    """
    env = dict(FIXED_ENV)
    env["PATH"] = DEFAULT_PATH
    for name in (*common.passed, *gate.passed):
        if name in caller:
            env[name] = caller[name]
    env.update(common.values)
    env.update(gate.values)
    env["SOURCE_DATE_EPOCH"] = str(source_date_epoch)
    return activated(env)


def activated(env: dict[str, str]) -> dict[str, str]:
    """``env`` with its ``VIRTUAL_ENV``'s ``bin`` first on PATH, as activating it does: a
    launcher that runs dagrunner (pyenv's shims, ``pipx run``) puts its own interpreter
    first, and the gates ran that one, not the venv the caller had activated."""
    venv = env.get("VIRTUAL_ENV", "")
    folder = os.path.join(venv, "bin")
    if venv.startswith("/") and os.path.isdir(folder):
        rest = [p for p in env.get("PATH", "").split(":") if p and p != folder]
        env["PATH"] = ":".join([folder, *rest])
    return env


def tree_environment(env: dict[str, str], tree: Path, seeds: Iterable[str]) -> dict[str, str]:
    """``env`` with the tree's own environment first: each seed folder (``seeds``: the
    manifest's, relative) present in ``tree`` that holds programs (a venv's ``bin``,
    ``node_modules/.bin``) ahead on PATH, and ``VIRTUAL_ENV`` naming the tree's venv -- so
    ``python`` or ``pytest`` from PATH is the tree's, never the caller's (whose editable
    install would import another checkout's code).  A cache key's environment is the
    gate's without it (the seed is the tree's, keyed by its key files), but its tools are
    fingerprinted with it: they are the programs the gate runs."""
    found, venv = [], ""
    for seed in seeds:
        folder = tree / seed
        for bin_dir in (folder / "bin", folder / ".bin"):
            if bin_dir.is_dir() and not bin_dir.is_symlink():
                found.append(str(bin_dir))
        if not venv and (folder / "pyvenv.cfg").is_file():
            venv = str(folder)
    if not found and not venv:
        return env
    env = dict(env)
    env["PATH"] = ":".join([*found, env.get("PATH", "")]).rstrip(":")
    if venv:
        env["VIRTUAL_ENV"] = venv
    return env


async def run_job(job: GateJob) -> AttemptResult:
    """Run ``job`` once and report how it ended.  Cancellation ends the tree first."""
    become_subreaper()
    home = Path(job.sandbox_dir)
    tmp = home / ".tmp"
    token = uuid.uuid4().hex
    if not detect().pidns:
        ISSUED.add(token)  # a PID namespace leaves no orphan (tree.sweep_orphans)
    env = dict(job.env)
    if not job.keep_home:
        env.update(HOME=str(home), TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp))
        env.update({PATHS_VAR: str(home / PATHS_FILE)} if job.paths else {})
    env[TOKEN_VAR] = token
    log = BoundedLog(Path(job.log_path), job.log_limit)
    try:
        result = await _run(job, env, token, log, (home, tmp))
        for wait in SETUP_WAITS:  # bubblewrap dies when a mount goes while it copies the table
            if not result.unset:
                break
            log.note(SETUP_NOTE)
            for made in (home, home.with_name(f"{home.name}.view")):  # nothing ran in them
                shutil.rmtree(made, ignore_errors=True)
            await trio.sleep(wait)
            log.opening.clear()
            result = await _run(job, env, token, log, (home, tmp))
        if result.unset:
            log.note(f"the view was not set up in {len(SETUP_WAITS) + 1} starts: the gate fails")
        return result
    finally:
        log.close()


class _Child:
    """A started gate: its pid, an async wait (pidfd), and its output as a trio stream."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        assert popen.stdout is not None
        self.stdout = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
        popen.stdout.close()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        if self.popen.poll() is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):  # not Linux >= 5.3: a thread waits instead
                return await trio.to_thread.run_sync(self.popen.wait, abandon_on_cancel=True)
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        return self.popen.wait()


async def _start(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    dirs: tuple[Path, ...],
    home: Path | None,
    fds: tuple[int, ...] = (),
    paths: str = "",
) -> _Child:
    def popen() -> subprocess.Popen[bytes]:
        # The gate's own HOME and TMPDIR, made here on the spawner thread: a mkdir can take
        # 0.2 ms on a journalled disk, and the trio loop serves the other gates meanwhile.
        for folder in dirs:
            folder.mkdir()
        if home is not None:
            furnish(home, paths)
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=fds,
        )

    return _Child(await trio.to_thread.run_sync(spawn, popen))


def _unstartable(argv0: str, cwd: str, env: dict[str, str]) -> str:
    """Why ``argv0`` cannot be executed, as exec would say it ('' when it can).

    Checked before the gate is wrapped in its containment, whose own shell would
    otherwise turn a missing program into a bare exit 127.
    """
    if "/" in argv0:
        path = Path(cwd) / argv0
        if not path.exists():
            return "No such file or directory"
        return "" if os.access(path, os.X_OK) and path.is_file() else "Permission denied"
    found = shutil.which(argv0, path=env.get("PATH", DEFAULT_PATH))
    return "" if found else "No such file or directory"


def _in_layer(job: GateJob, path: str) -> str:
    """``path`` (absolute) as this process finds what the gate sees there: inside the tree
    of a gate on a layer of its own, the same place in the layer's merged folder."""
    if not job.layer or not job.tree or not path.startswith("/"):
        return path
    rel = os.path.relpath(path, job.tree)
    if rel == ".." or rel.startswith("../"):
        return path
    return os.path.normpath(os.path.join(job.layer, rel))


def _view(job: GateJob, env: Mapping[str, str], hide: Path | None) -> View:
    """The gate's view of the filesystem (``contain.View``); its HOME and stage are made
    just before the gate starts."""
    tree = Path(job.tree or job.cwd)
    home = Path(job.sandbox_dir)
    writable = [tree, *_places(tree, job.writable)]
    tools = [Path(p) for p in env.get("PATH", DEFAULT_PATH).split(":") if p.startswith("/")]
    if job.argv[0].startswith("/"):
        tools.append(Path(job.argv[0]).parent)
    tools += [Path(sys.prefix), Path(sys.base_prefix)]  # the Python running dagrunner
    if hide is not None and is_inside(Path(job.cwd), hide):
        hide = None
    return View.for_gate(
        writable=writable,
        home=home,
        visible=[Path(p) for p in job.read_only],
        hide=hide,
        tools=tools,
        conceal=[Path(p) for p in job.conceal],
        sources=[(tree, Path(job.layer))] if job.layer else [],
    )


def _places(tree: Path, paths: tuple[str, ...]) -> list[Path]:
    """The manifest's writable places: an absolute one as it is; a relative one only where
    it stays inside the tree once its symlinks are read -- the tree may be an envelope's,
    which must not point ``build/cache`` at the user's ``~/.ssh`` to have it made writable."""
    inside = os.path.realpath(tree)
    found = []
    for path in paths:
        if path.startswith("/"):
            found.append(Path(path))
        elif is_inside(Path(os.path.realpath(tree / path)), Path(inside)):
            found.append(tree / path)
    return found


async def _run(
    job: GateJob, env: dict[str, str], token: str, log: BoundedLog, dirs: tuple[Path, ...]
) -> AttemptResult:
    # what its needs built (a program, the folder it runs in) is in its layer, not the tree
    path = ":".join(_in_layer(job, p) for p in env.get("PATH", DEFAULT_PATH).split(":"))
    why = _unstartable(job.argv[0], _in_layer(job, job.cwd), {**env, "PATH": path})
    if why:
        message = f"could not start {job.argv[0]!r}: {why}"
        log.note(message)
        return AttemptResult(exit_code=None, error=message)
    hide = Path(job.hide) if job.hide else None
    view = None if job.keep_home else _view(job, env, hide)
    if view is not None and detect().views:
        dirs = (*dirs, view.stage)
    found = detect()  # a gate with a view runs under bubblewrap where it is: observable
    bwrapped = view is not None and found.pidns and found.views and bool(found.bwrap)
    # only in the tree its view binds afresh is a mount of the gate's own (not the root's)
    mine = not job.observe or is_inside(Path(job.observe), Path(job.tree or job.cwd))
    why = NOT_BWRAPPED if not bwrapped else "" if mine else NOT_TREE
    observer = Observer(job.observe, why=why, seen=job.layer)
    box = jail(
        observer.argv(job.argv),
        token=token,
        work=Path(job.sandbox_dir).parent,
        hide=hide,
        cwd=Path(job.cwd),
        memory=job.memory_limit,
        max_pids=job.max_pids,
        view=view,
        isolated=job.network == "isolated",
        observe=observer.options(),
    )
    # Running before it starts: the orphan sweep (another run's, or this one's, in a thread)
    # must never take a just-spawned gate for the leftover of a finished one.
    RUNNING[token] = job.gate
    try:
        home = None if job.keep_home else Path(job.sandbox_dir)
        start = _in_layer(job, job.cwd)  # the init enters the gate's own cwd in its view
        process = await _start(box.argv, start, env, dirs, home, observer.fds, job.paths)
    except OSError as exc:
        RUNNING.pop(token, None)
        box.remove()
        message = f"could not start {job.argv[0]!r}: {exc.strerror or exc}"
        log.note(message)
        return AttemptResult(exit_code=None, error=message, observation=observer.finish())
    except BaseException:  # cancelled while starting: what did start is an orphan to sweep
        RUNNING.pop(token, None)
        observer.close()
        raise
    observer.started()
    watch = TreeWatch(root_pid=process.pid, token=token, jail=box)
    refused: list[bool] = []  # pump's, per line telling of EROFS: was it bubblewrap's own?
    timed_out = finished = unset = False
    leftover = 0
    survivors: list[int] = []
    stdout = process.stdout
    try:
        async with trio.open_nursery() as nursery:
            drained = trio.Event()
            nursery.start_soon(pump, stdout, log, drained, refused if view else None)
            nursery.start_soon(_monitor, watch, job.sample_interval)
            nursery.start_soon(observer.attach)  # the gate waits for it
            with trio.move_on_after(job.timeout if job.timeout else float("inf")) as scope:
                await process.wait()
            if scope.cancelled_caught:
                timed_out = True
                log.note(f"timed out after {job.timeout:g}s; ending the whole process tree")
                survivors = await trio.to_thread.run_sync(watch.end, job.grace)
                await process.wait()
            else:
                # its init writes what was left once the gate ended: no such file, and a
                # 'bwrap:' line first (once drained), is a view bubblewrap could not set up
                unset = box.bwrap and process.returncode == 1 and not box.left_file.exists()
                left = watch.leftovers_after_exit()
                leftover = len(left) + box.leftovers()
                if left:
                    survivors = await trio.to_thread.run_sync(watch.end, job.grace)
                if leftover:
                    log.note(f"{leftover} process(es) still running after the gate exited; ended")
            # Output still held open by an escaped descendant must not keep us waiting.
            with trio.move_on_after(job.grace):
                await drained.wait()
            nursery.cancel_scope.cancel()
        finished = True
    finally:
        # Cancelled (Ctrl-C, --fail-fast) or failed: the tree must not outlive us.
        # (A flag, not `except Cancelled`: it arrives wrapped in an exception group.)
        if not finished:
            with trio.CancelScope(shield=True):
                log.note("interrupted; ending the whole process tree")
                await trio.to_thread.run_sync(watch.end, job.grace)
                await process.wait()
        RUNNING.pop(token, None)
        # Shielded, all of it: cancelled, each await here raised at once and left the
        # observer's reader polling (the process could never exit) and the cgroups behind.
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.ClosedResourceError, OSError):
                await stdout.aclose()
            watch.settle_cpu()
            # the gate has ended: every event it made is queued
            observation = await trio.to_thread.run_sync(observer.finish)
            await trio.to_thread.run_sync(box.remove)
    if survivors:
        log.note(f"processes {survivors} survived SIGKILL")
    if refused and process.returncode != 0:
        log.note(BWRAP_NOTE if box.bwrap and all(refused) else EROFS_NOTE)
    return AttemptResult(
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        peak_rss=watch.peak_rss,
        cpu_seconds=round(watch.cpu_seconds, 3),
        log_bytes=log.total,
        log_elided=log.elided,
        unset=unset and log.opening.startswith(b"bwrap: "),
        leftover_killed=leftover,
        survivors=tuple(survivors),
        containment=detect().mode,
        observation=observation,
    )


async def _monitor(watch: TreeWatch, interval: float) -> None:
    # The root at once; its whole tree soon after (short gates), then at the configured interval.
    watch.sample(full=False)
    delay = 0.02
    while True:
        await trio.sleep(delay)
        watch.sample()
        delay = min(delay * 2, interval)
