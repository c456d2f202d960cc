"""Observed reads (issue 46): real gates through ``run_job``, their opens seen by fanotify on
their own bubblewrap mount of the tree, by every process of theirs, whatever the language."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import PY, git

from dagrunner.process import nested, observe
from dagrunner.process.contain import detect
from dagrunner.process.sandbox import AttemptResult, GateJob, run_job
from dagrunner.records.run import Observation

NODE = shutil.which("node")


@pytest.fixture
def observable() -> None:
    """Where gates run under bubblewrap, observing must work: a refused fanotify fails the
    test loudly.  Skipped only where they do not (no bubblewrap, no mount namespace): there
    the gate has no mount of its own to mark, and ``test_unobservable_gate_*`` covers what
    such a machine answers."""
    found = detect()
    if not (found.bwrap and found.views):
        pytest.skip("gates do not run under bubblewrap here: no mount of their own to mark")
    assert observe.refused() == "", observe.refused()


def tree_of(tmp_path: Path) -> Path:
    tree = tmp_path / "tree with space"
    for name, text in {
        "a.txt": "a\n",
        "sub/b.txt": "b\n",
        "sub/n.txt": "n\n",
        "lib/mod.py": "",
        "unread.txt": "never opened\n",
        "run.sh": "#!/bin/sh\necho ran\n",
        # the grandchild in Python: opens a file, lists a folder, runs a script of the tree
        "child.py": "import os, subprocess\nopen('sub/b.txt').read()\nos.listdir('lib')\n"
        "subprocess.run(['./run.sh'], check=True)\n",
        "child.js": "require('fs').readFileSync('sub/n.txt')\n",
    }.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    (tree / "run.sh").chmod(0o755)
    return tree


def job(tmp_path: Path, tree: Path, name: str, script: str, **extra: Any) -> GateJob:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return GateJob(
        gate=name,
        argv=("/bin/sh", "-c", script),
        cwd=str(tree),
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        sandbox_dir=str(work / name),
        log_path=str(work / f"{name}.log"),
        log_limit=1 << 20,
        timeout=60.0,
        **{"observe": str(tree), **extra},
    )


def run(gate: GateJob) -> AttemptResult:
    result = trio.run(run_job, gate)
    assert result.exit_code == 0, Path(gate.log_path).read_text()
    return result


def test_every_process_of_the_gate_is_seen_and_nothing_else(
    tmp_path: Path, observable: None
) -> None:
    tree = tree_of(tmp_path)
    node = f"{NODE} child.js" if NODE else "true"
    # sh, then a shell of its own, then the other languages: grandchildren of the gate
    script = f"cat a.txt >/dev/null; /bin/sh -c '{PY} -I child.py; {node}'; true"
    result = run(job(tmp_path, tree, "reads", script))
    assert result.observation is not None
    assert result.observation.complete, result.observation.why
    read = {
        "a.txt",
        "child.py",
        "sub/b.txt",
        "run.sh",
        *(["child.js", "sub/n.txt"] if NODE else []),
    }
    assert result.observation.read == read
    assert result.observation.listed == {"lib"}
    assert "unread.txt" not in result.observation.read
    assert "ran" in Path(tmp_path / "work" / "reads.log").read_text()


def test_two_gates_at_once_in_one_tree_each_see_only_their_own(
    tmp_path: Path, observable: None
) -> None:
    tree = tree_of(tmp_path)
    # each reads while the other runs: the first reads, waits, reads; the second reads between
    first = job(tmp_path, tree, "first", "cat a.txt; sleep 0.6; cat sub/b.txt")
    second = job(tmp_path, tree, "second", "sleep 0.3; cat unread.txt; sleep 0.6")
    results: dict[str, AttemptResult] = {}

    async def both() -> None:
        async def one(gate: GateJob) -> None:
            results[gate.gate] = await run_job(gate)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, first)
            nursery.start_soon(one, second)

    trio.run(both)
    seen = {name: result.observation for name, result in results.items()}
    assert all(o is not None and o.complete for o in seen.values()), seen
    assert seen["first"] == Observation(complete=True, read=frozenset({"a.txt", "sub/b.txt"}))
    assert seen["second"] == Observation(complete=True, read=frozenset({"unread.txt"}))


def test_what_a_gate_wrote_is_told_apart_from_what_it_only_opened(
    tmp_path: Path, observable: None
) -> None:
    """Only a need's writes are excused for the gates after it (``stands_for``): a file it
    only opened, a cache it read, is not its to answer for."""
    tree = tree_of(tmp_path)
    gate = job(tmp_path, tree, "writes", "cat a.txt > /dev/null; echo made > made.txt")
    made = frozenset({"made.txt"})  # written, and a file born while the gate ran
    assert run(gate).observation == Observation(
        complete=True, read=frozenset({"a.txt", "made.txt"}), wrote=made, new=made
    )


def test_a_writable_place_inside_the_tree_is_a_mount_of_its_own_and_seen_too(
    tmp_path: Path, observable: None
) -> None:
    tree = tree_of(tmp_path)
    (tree / "out").mkdir()
    (tree / "out" / "made.txt").write_text("made\n")
    gate = job(tmp_path, tree, "place", "cat out/made.txt a.txt", writable=("out",))
    result = run(gate)
    assert result.observation == Observation(
        complete=True, read=frozenset({"out/made.txt", "a.txt"})
    )


def test_a_gate_that_runs_git_is_incomplete(tmp_path: Path, observable: None) -> None:
    tree = tree_of(tmp_path)
    assert shutil.which("git")
    gate = job(tmp_path, tree, "git", "git init -q . && git status --short >/dev/null")
    result = run(gate)
    assert result.observation == Observation(complete=False, why=observe.GIT)


def test_a_worktrees_git_database_read_outside_the_tree_makes_it_incomplete(
    tmp_path: Path, repo: Path, observable: None
) -> None:
    """A worktree's git database is outside it, bound for its gates on its own (a trusted
    run's writable common dir, an envelope's read-only one): a gate that reads it there,
    never opening the tree's ``.git`` file, read the tree's content through git, unseen."""
    tree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(tree))
    common = repo / ".git"
    gate = job(tmp_path, tree, "common", f"cat '{common}/HEAD' README", writable=(str(common),))
    assert run(gate).observation == Observation(complete=False, why=observe.GIT)
    plain = run(job(tmp_path, tree, "plain", "cat README", read_only=(str(common),)))
    assert plain.observation == Observation(complete=True, read=frozenset({"README"}))


# A gate's code maps a user namespace its child made (a root gate keeps CAP_SETUID); the
# child makes a mount namespace, whose copy of the tree's mount carries no mark.
NESTED = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ready, go = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    assert libc.unshare(0x10000000) == 0  # CLONE_NEWUSER
    os.write(ready[1], b"x"); os.read(go[0], 1)
    assert libc.unshare(0x20000) == 0  # CLONE_NEWNS
    open("a.txt").read(); os._exit(0)
os.read(ready[0], 1)
for name, text in (("setgroups", "deny"), ("uid_map", "0 1000 1"), ("gid_map", "0 1000 1")):
    with open(f"/proc/{pid}/{name}", "w") as f: f.write(text)
os.write(go[1], b"x")
assert os.waitpid(pid, 0)[1] == 0
"""


def test_a_mount_namespace_of_the_gates_own_makes_it_incomplete(
    tmp_path: Path, observable: None
) -> None:
    """Its copy of the tree's mount has no mark: what is read through it is not seen.  The
    gate still does what it did (the call goes on), and threads still start (clone3 is
    answered ENOSYS: the C library falls back to clone)."""
    tree = tree_of(tmp_path)
    (tree / "nest.py").write_text(NESTED)
    tool = job(tmp_path, tree, "tool", "unshare --user --mount cat a.txt")
    assert run(tool).observation == Observation(complete=False, why=nested.MADE)
    assert Path(tool.log_path).read_text() == "a\n"
    code = run(job(tmp_path, tree, "code", f"{PY} -I nest.py"))
    assert code.observation == Observation(complete=False, why=nested.MADE)
    threads = f"{PY} -I -c 'import threading; t = threading.Thread(target=open, args=(\"a.txt\",)); t.start(); t.join()'"
    assert run(job(tmp_path, tree, "threads", threads)).observation == Observation(
        complete=True, read=frozenset({"a.txt"})
    )


def test_a_file_of_the_tree_opened_then_removed_makes_it_incomplete(
    tmp_path: Path, observable: None
) -> None:
    """An older file's name is read with its event, later: once removed, or swapped with
    another, the name it was recorded by may not be the one it was opened by."""
    tree = tree_of(tmp_path)
    script = f"{PY} -I -c \"import os; f = open('a.txt'); os.remove('a.txt'); f.read()\""
    result = run(job(tmp_path, tree, "removed", script))
    assert result.observation is not None and not result.observation.complete
    assert "a.txt was renamed, replaced or removed" in result.observation.why
    made = (
        f"{PY} -I -c \"import os; open('m.txt', 'w').close(); open('m.txt'); os.remove('m.txt')\""
    )
    seen = run(job(tmp_path, tree, "made", made)).observation
    assert seen is not None and seen.complete and seen.read == {"m.txt"}  # its own: no matter


def test_an_observer_that_cannot_attach_leaves_the_gate_alone(
    tmp_path: Path, observable: None
) -> None:
    """A folder of the tree the gate's view does not hold: nothing to mark; the gate runs and
    passes.  A folder outside the tree is refused first: the only mount there is the gate's
    read-only root, whose opens are not all of this tree's."""
    tree = tree_of(tmp_path)
    gate = job(tmp_path, tree, "lost", "cat a.txt")
    result = run(GateJob(**{**gate.__dict__, "observe": str(tree / "missing")}))
    assert result.observation is not None and not result.observation.complete
    assert "could not attach" in result.observation.why
    outside = job(tmp_path, tree, "outside", "cat a.txt", observe=str(tmp_path))
    assert run(outside).observation == Observation(complete=False, why=observe.NOT_TREE)


def test_unobservable_gate_runs_and_says_why(tmp_path: Path) -> None:
    """A command keeping the caller's HOME does not run under bubblewrap: asked to be
    observed, it runs as ever and its observation says it is incomplete, and why."""
    tree = tree_of(tmp_path)
    result = run(job(tmp_path, tree, "kept", "cat a.txt", keep_home=True))
    assert result.observation == Observation(complete=False, why=observe.NOT_BWRAPPED)
    unasked = run(job(tmp_path, tree, "unasked", "cat a.txt", keep_home=True, observe=""))
    assert unasked.observation is None


def test_an_observation_round_trips_and_a_hostile_one_is_refused() -> None:
    seen = Observation(
        complete=True,
        read=frozenset({"a.txt", "sub/b c.txt"}),
        listed=frozenset({""}),
        wrote=frozenset({"a.txt"}),
        new=frozenset({"a.txt", "out"}),
        foreign=frozenset({"out"}),
    )
    body = seen.to_json()
    assert body == {
        "complete": True,
        "why": "",
        "read": ["a.txt", "sub/b c.txt"],
        "listed": [""],
        "wrote": ["a.txt"],
        "new": ["a.txt", "out"],
        "foreign": ["out"],
    }
    assert Observation.from_json(body) == seen
    for bad in ("../x", "/etc/passwd", "a/../../x", "a//b", "a/", "./a", 3, None, "a\0b"):
        with pytest.raises(ValueError):
            Observation.from_json({**body, "read": [bad]})
        with pytest.raises(ValueError):
            Observation.from_json({**body, "listed": [bad]})
        with pytest.raises(ValueError):
            Observation.from_json({**body, "foreign": [bad]})
        with pytest.raises(ValueError):
            Observation.from_json({**body, "wrote": [bad]})
        with pytest.raises(ValueError):
            Observation.from_json({**body, "new": [bad]})
    for field, value in (("complete", "yes"), ("why", 1), ("read", "a.txt"), ("listed", {})):
        with pytest.raises(ValueError):
            Observation.from_json({**body, field: value})
    with pytest.raises(ValueError):
        Observation.from_json(["not", "an", "object"])  # type: ignore[arg-type]


def test_a_gate_cancelled_while_running_leaves_no_observer_behind(
    tmp_path: Path, observable: None
) -> None:
    """A speculation cancelled half-run (the queue does it every time a batch ahead fails):
    its observer's reader thread and descriptors end with it; a thread left polling kept
    the integrator's process from ever exiting."""
    tree = tree_of(tmp_path)
    gate = job(tmp_path, tree, "cancelled", "cat a.txt; sleep 30")

    async def cancelled() -> None:
        with trio.move_on_after(1.5):
            await run_job(gate)

    trio.run(cancelled)
    left = [t for t in threading.enumerate() if t.name == "dagrunner-observe"]
    for thread in left:
        thread.join(timeout=5)
    assert not [t for t in left if t.is_alive()]
