"""Hostile review of what a gate's own files are (observed reads, issue 46): another gate
running beside it, neither needing the other, hands it what it read of the tree by a way
its own mount does not show.  Each reproduced end to end -- a real ``release-check`` whose
cached answer must be what ``--no-cache`` says on the edited tree."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from conftest import PY, SIDE_BY_SIDE
from test_observed_hostile import observed, stale

__all__ = ["observed"]  # the fixture, used by name

WAIT = "n=0; until {cond}; do sleep 0.05; n=$((n+1)); test $n -lt 200 || exit 2; done"


def wait(cond: str) -> str:
    """A shell loop waiting (10 s at most) for ``cond``: by ``stat``, which is not seen."""
    return WAIT.format(cond=cond)


def gates(relay: str, test: str) -> str:
    """A manifest of a ``relay`` gate and a ``test`` gate, both observed: the relay starts
    once the gate runs (``go``), so what it makes is born while the gate runs."""
    relay, test = wait("test -e go") + f"; {relay}", f"touch go; {test}"
    return (
        SIDE_BY_SIDE
        + f"""
    [gates.relay]
    run = {relay!r}
    inputs = ["**"]
    observe = true
    [gates.test]
    run = {test!r}
    inputs = ["**"]
    observe = true
"""
    )


# The relay names empty folders after ``conf``: a folder is no file, so who made it is not
# known by any inode the gate wrote; a new folder holding only folders was the gate's own.
# And a folder it put a file in only after listing the folder above (its name learnt there).
@pytest.mark.parametrize(
    "then",
    [
        "",
        pytest.param(
            "for d in junk/*/; do echo x > $d/f; done; ",
            marks=pytest.mark.xfail(
                reason="open: a folder holding a file the gate wrote is taken for its own, "
                "even one it found by listing the folder above (an open of a folder to walk "
                "from it, as mkdir -p does, is not told from one to list it); a gate doing "
                "this could as well stat the name (docs/cache.md, Residuals)",
                strict=False,
            ),
        ),
    ],
    ids=["empty", "filled-after-listing"],
)
def test_a_folder_of_folders_another_gate_made_is_no_folder_the_gate_made(
    capsys: pytest.CaptureFixture[str], observed: Path, then: str
) -> None:
    manifest = gates(
        "mkdir -p junk/$(cat conf)",
        wait('test -n "$(ls junk 2>/dev/null)"') + f"; {then}! ls junk | grep -q bad",
    )
    stale(capsys, observed, manifest, {".gitignore": "junk/\n"})


# A listed bytecode folder counts for nothing (its files stand for their sources); the relay
# names a file in one after ``conf``: a new one, or one the tree held before (ignored).
@pytest.mark.parametrize("held", [False, True], ids=["new", "held"])
def test_a_bytecode_folder_another_gate_named_files_in_is_no_folder_of_bytecode(
    capsys: pytest.CaptureFixture[str], observed: Path, held: bool
) -> None:
    files = {".gitignore": "__pycache__/\n", "m.py": "M = 1\n"}
    if held:  # before each run: the relay's names are gone, its folder is not
        files["__pycache__/m.cpython-311.pyc"] = ""
    manifest = gates(
        "mkdir -p __pycache__; touch __pycache__/$(cat conf)",
        wait('test -n "$(ls __pycache__ | grep -v pyc)"') + "; ! ls __pycache__ | grep -q bad",
    )
    made = ("__pycache__/good", "__pycache__/bad") if held else ("__pycache__",)
    stale(capsys, observed, manifest, files, made=made)


# Bytecode stands for its source whoever wrote it; the relay writes ``mod``'s, valid for
# ``mod.py`` by its stamp (mtime and size), but compiled from what ``conf`` says.
FORGE = """\
import importlib.util, os
from importlib._bootstrap_external import _code_to_timestamp_pyc
bad = "bad" in open("conf").read()
code = compile("import sys; sys.exit(3)" if bad else "X = 1", "mod.py", "exec")
st = os.stat("mod.py")
os.makedirs("__pycache__", exist_ok=True)
target = importlib.util.cache_from_source("mod.py")
with open(target + ".part", "wb") as out:
    out.write(_code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))
os.rename(target + ".part", target)
"""


@pytest.mark.xfail(
    reason="open: bytecode another gate wrote stands for its source, as the gate's own does "
    "(telling it from its source's compiled code costs a compile in a process of the "
    "gate's Python, and gates of one project share bytecode as a rule); docs/cache.md",
    strict=False,
)
def test_bytecode_another_gate_wrote_is_not_its_source(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    tag = sys.implementation.cache_tag
    manifest = gates(
        f"{PY} forge.py",
        wait(f"test -e __pycache__/mod.{tag}.pyc") + f"; {PY} -c 'import mod'",
    )
    files = {".gitignore": "__pycache__/\n", "mod.py": "X = 1\n", "forge.py": FORGE}
    stale(capsys, observed, manifest, files, made=("__pycache__",))


# The gate writes files and removes them; the relay's next new file in that folder takes a
# freed inode number, which the gate "made" (ext4 hands out the lowest free one of the
# folder's group: the gate's many files took the lowest ones there were).
def test_an_inode_number_the_gate_freed_is_not_its_own_when_another_gate_reuses_it(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    manifest = gates(
        wait("test -e junk/t199") + "; while test -e junk/t199; do sleep 0.01; done; "
        "cat conf > junk/answer.part; mv junk/answer.part junk/answer",
        "mkdir -p junk; for i in $(seq 0 199); do echo mine > junk/t$i; done; sleep 0.3; "
        "for i in $(seq 0 199); do rm junk/t$i; done; "  # not listing junk: not judged as a folder
        + wait("test -e junk/answer")
        + "; ! grep -q bad junk/answer",
    )
    stale(capsys, observed, manifest, {".gitignore": "junk/\n"})


# The relay copies ``conf`` into a new file; the gate appends a line to it, then reads it:
# it wrote the file (closed it after a write), so the file is taken for one it made.
@pytest.mark.xfail(
    reason="open: a file the gate wrote to is its own, made by it or not (its mount's events "
    "do not tell an open that made a file from one that appends to another gate's); "
    "docs/cache.md, Residuals",
    strict=False,
)
def test_a_file_another_gate_made_that_the_gate_appended_to_is_not_its_own(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    manifest = gates(
        "mkdir -p junk; cat conf > junk/log.part; mv junk/log.part junk/log",
        wait("test -e junk/log") + "; echo test >> junk/log; ! grep -q bad junk/log",
    )
    stale(capsys, observed, manifest, {".gitignore": "junk/\n"})


# The residual docs/cache.md names: the gate writes a file, the relay rewrites it in place
# (the same inode) from ``conf``, the gate reads it back.
@pytest.mark.xfail(
    reason="open: a file the gate wrote is its own even when another gate rewrote it in "
    "place after (no event of its mount shows that write); docs/cache.md, Residuals",
    strict=False,
)
def test_a_file_the_gate_wrote_that_another_gate_rewrote_is_not_its_own(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    manifest = gates(
        wait("test -e junk/mine") + "; sleep 0.2; cat conf > junk/mine; touch junk/done",
        "mkdir -p junk; echo good > junk/mine; "
        + wait("test -e junk/done")
        + "; ! grep -q bad junk/mine",
    )
    stale(capsys, observed, manifest, {".gitignore": "junk/\n"})


# A file a need wrote is the need's (its key is in the gate's); another gate that runs after
# the same need rewrites it in place from ``conf`` before the gate reads it.
NEED_REWRITTEN = (
    SIDE_BY_SIDE
    + """
    [gates.prep]
    run = "mkdir -p junk; echo good > junk/answer"
    inputs = ["**"]
    observe = true
    [gates.relay]
    run = "cat conf > junk/answer"
    inputs = ["**"]
    observe = true
    needs = ["prep"]
    [gates.test]
    run = "sleep 1; ! grep -q bad junk/answer"
    inputs = ["**"]
    observe = true
    needs = ["prep"]
"""
)


@pytest.mark.xfail(
    reason="open: a file a need wrote is the need's by its name, whoever wrote it after "
    "(another gate that ran after the need); docs/cache.md, Residuals",
    strict=False,
)
def test_a_file_a_need_wrote_that_another_gate_rewrote_is_not_the_needs(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    stale(capsys, observed, NEED_REWRITTEN, {".gitignore": "junk/\n"})


# Ways between gates side by side that are no open of a file: the relay names a file after
# ``conf`` and the gate only looks the name up (``stat``); the relay writes ``conf`` into a
# named pipe (fanotify tells of opens of files and folders only); the relay serves ``conf``
# on an abstract unix socket (gates on the host's network, the default, share it).
SERVE = """\
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind("\\0" + sys.argv[1]); s.listen(1); s.settimeout(5)
try:
    c, _ = s.accept()
except TimeoutError:
    sys.exit(0)
c.sendall(open("conf", "rb").read()); c.close()
"""
HEAR = """\
import socket, sys, time
for _ in range(200):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect("\\0" + sys.argv[1]); break
    except OSError:
        time.sleep(0.05)
sys.exit(1 if b"bad" in s.recv(100) else 0)
"""


@pytest.mark.xfail(
    reason="open: what is not an open of a file or folder in the tree is not seen (a stat, a "
    "named pipe, a socket); docs/cache.md, Residuals",
    strict=False,
)
@pytest.mark.parametrize("way", ["stat", "pipe", "socket"])
def test_what_another_gate_hands_the_gate_by_no_open_of_a_file(
    capsys: pytest.CaptureFixture[str], observed: Path, way: str
) -> None:
    name = "dagrunner-relay-" + hashlib.sha256(str(observed).encode()).hexdigest()[:12]
    relay, test = {
        "stat": ("mkdir -p junk; touch junk/$(cat conf)", "sleep 1; ! test -e junk/bad"),
        "pipe": (
            "mkdir -p junk; mkfifo junk/p.part; mv junk/p.part junk/p; "
            'timeout 5 sh -c "cat conf > junk/p"; true',
            wait("test -p junk/p") + "; ! grep -q bad < junk/p",
        ),
        "socket": (f"{PY} serve.py {name}", f"{PY} hear.py {name}"),
    }[way]
    files = {".gitignore": "junk/\n", "serve.py": SERVE, "hear.py": HEAR}
    stale(capsys, observed, gates(relay, test), files)


# The same by a rename over it: the relay's file is new, made while the gate ran, so no
# need's (a need ends before the gate starts), whatever its name.
NEED_REPLACED = NEED_REWRITTEN.replace(
    'run = "cat conf > junk/answer"',
    'run = "' + wait("test -e go") + "; cat conf > junk/a.part; mv junk/a.part junk/answer; "
    'touch junk/done"',
).replace('run = "sleep 1; ', 'run = "touch go; ' + wait("test -e junk/done") + "; ")


def test_a_file_another_gate_put_in_place_of_one_a_need_wrote_is_not_the_needs(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    assert NEED_REPLACED.count("touch go") == 1 and "mv junk/a.part" in NEED_REPLACED
    stale(capsys, observed, NEED_REPLACED, {".gitignore": "junk/\n"})


# A file under a seed (``node_modules``) stands for the seed's key files (its lockfile); one
# another gate made there while the gate ran, from what it read, does not.
def test_a_file_another_gate_made_in_a_seed_is_not_the_seeds(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    manifest = gates(
        "mkdir -p deps; cat conf > deps/x.part; mv deps/x.part deps/x",
        wait("test -e deps/x") + "; ! grep -q bad deps/x",
    ).replace(
        "    [gates.relay]",
        '    [[worktrees.seed]]\n    path = "deps"\n    key = ["lock"]\n'
        '    build = "true"\n    [gates.relay]',
    )
    assert "[[worktrees.seed]]" in manifest
    stale(capsys, observed, manifest, {".gitignore": "deps/\n", "lock": "1\n"}, made=("deps",))


# The residual docs/cache.md names first: the relay names a folder after ``conf`` in a new
# folder, and removes it all once the gate has listed it (the folder is checked at the end).
@pytest.mark.xfail(
    reason="open: a new folder gone when the gate ends held only what the gate made and "
    "removed, for all the walk can tell; docs/cache.md, Residuals",
    strict=False,
)
def test_a_folder_another_gate_made_and_removed_while_the_gate_ran(
    capsys: pytest.CaptureFixture[str], observed: Path
) -> None:
    manifest = gates(
        "mkdir -p junk/$(cat conf); " + wait("test -e listed") + "; rm -r junk",
        wait('test -n "$(ls junk 2>/dev/null)"')
        + "; v=$(ls junk); touch listed; until ! test -e junk; do sleep 0.05; done; "
        + '! echo "$v" | grep -q bad',
    )
    stale(capsys, observed, manifest, {".gitignore": "junk/\nlisted\n"}, made=("junk", "listed"))
