"""What a gate's ``inputs`` globs match, and the content id of each file.

One snapshot of the repository is taken per run.  In a git work tree, tracked
files that are unmodified reuse git's own blob ids (``git ls-files -s``), so
only modified and untracked files are read and hashed; outside git every file
is hashed.  Ids are git blob ids (sha1 of ``blob <size>\\0<content>``) either
way, so they compare across both paths.  Gitignored files are left out unless
a glob names one exactly (no wildcard).

And what the snapshot leaves out that a gate keyed by its reads may have read
(``Before``, ``stands_for``): ignored caches may stand for files only ``stat``-ed.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dagrunner.files import folder_beneath, read_regular
from dagrunner.git.command import git, split_z, toplevel
from dagrunner.manifest.globs import glob_regex, literal_prefix
from dagrunner.manifest.load import GateSpec, Manifest
from dagrunner.records.run import Observation

_WILDCARD = re.compile(r"[*?\[]")


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def file_id(path: Path) -> str | None:
    """The git blob id of a file's content (a symlink's target text), or None if unreadable."""
    try:
        if path.is_symlink():
            return blob_id(os.readlink(path).encode("utf-8", "surrogateescape"))
        return blob_id(read_regular(path, limit=sys.maxsize))  # never a FIFO a gate made
    except OSError:
        return None


@dataclass
class Snapshot:
    """Every candidate input file of the repository and its content id."""

    root: Path
    paths: list[str]  # sorted, repository-relative, '/'-separated
    ids: dict[str, str]
    git: bool
    hashed: int = 0  # files read and hashed (the rest reused git's ids)
    modes: dict[str, str] = field(default_factory=dict)  # path -> git's mode (100644, 120000...)
    untracked: frozenset[str] = frozenset()  # in a git work tree: files outside its index
    _cache: dict[str, list[str]] = field(default_factory=dict)
    _names: dict[frozenset[str], str] = field(default_factory=dict)

    def names(self, leave_out: Iterable[str] = ()) -> str:
        """A digest of the tree's name set: every path with its mode, and the target of a
        symlink (and a submodule's commit).  A gate keyed by its reads is keyed by this too:
        a reading process is seen, a ``stat`` or a failed lookup is not, so a file added,
        removed, renamed or made executable must miss."""
        skip = frozenset(leave_out)
        if skip not in self._names:
            digest = hashlib.sha256()
            for path in self.paths:
                if path in skip:
                    continue
                mode = self.modes.get(path, "100644")
                target = self.ids[path] if mode in ("120000", "160000") else ""
                digest.update(f"{path}\0{mode}\0{target}\0".encode("utf-8", "surrogateescape"))
            self._names[skip] = digest.hexdigest()
        return self._names[skip]

    def match(self, pattern: str) -> list[str]:
        """Paths the glob matches (an exact path names an ignored file too)."""
        if pattern in self._cache:
            return self._cache[pattern]
        prefix = literal_prefix(pattern)
        if prefix == pattern:
            found = [pattern] if pattern in self.ids or self._add_exact(pattern) else []
        else:
            regex = glob_regex(pattern)
            start = bisect.bisect_left(self.paths, prefix)
            found = []
            for path in self.paths[start:]:
                if not path.startswith(prefix):
                    break
                if regex.match(path):
                    found.append(path)
        self._cache[pattern] = found
        return found

    def _add_exact(self, rel: str) -> bool:
        path = self.root / rel
        if not path.is_file() and not path.is_symlink():
            return False
        ident = file_id(path)
        if ident is None:
            return False
        self.ids[rel] = ident
        self.modes[rel] = _mode(path)
        self.hashed += 1
        return True


def _mode(path: Path) -> str:
    """git's mode for a file of the work tree: a symlink, an executable, a plain file."""
    try:
        found = path.lstat().st_mode
    except OSError:
        return "100644"
    if stat.S_ISLNK(found):
        return "120000"
    if stat.S_ISDIR(found):
        return "160000"
    return "100755" if found & 0o111 else "100644"


def take_snapshot(root: Path) -> Snapshot:
    top = toplevel(root)
    if top is not None and top.resolve() == root.resolve():
        return _git_snapshot(root)
    return _walk_snapshot(root)


def _git_snapshot(root: Path) -> Snapshot:
    ids: dict[str, str] = {}
    modes: dict[str, str] = {}
    staged = git(["ls-files", "-s", "-z"], cwd=root).stdout
    for entry in staged.split(b"\0"):
        if not entry:
            continue
        meta, _, name = entry.partition(b"\t")
        mode, oid, stage = meta.split(b" ")
        rel = name.decode("utf-8", "surrogateescape")
        if mode == b"160000":  # a submodule: its commit id stands for its content
            ids[rel], modes[rel] = oid.decode(), mode.decode()
            continue
        if stage in (b"0", b"2"):
            ids[rel], modes[rel] = oid.decode(), mode.decode()
    # Worktree files that differ from the index (stat-based; a false positive is just re-hashed)
    changed = split_z(git(["diff-files", "--name-only", "-z"], cwd=root).stdout)
    untracked = split_z(git(["ls-files", "--others", "--exclude-standard", "-z"], cwd=root).stdout)
    hashed = 0
    for rel in [*changed, *untracked]:
        path = root / rel
        if not path.exists() and not path.is_symlink():
            ids.pop(rel, None)  # deleted in the worktree
            continue
        if path.is_dir() and not path.is_symlink():
            continue
        ident = file_id(path)
        hashed += 1
        if ident is None:
            ids.pop(rel, None)
        else:
            ids[rel], modes[rel] = ident, _mode(path)
    return Snapshot(
        root=root,
        paths=sorted(ids),
        ids=ids,
        git=True,
        hashed=hashed,
        modes=modes,
        untracked=frozenset(untracked) & ids.keys(),
    )


def _walk_snapshot(root: Path) -> Snapshot:
    ids: dict[str, str] = {}
    modes: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            path = Path(folder) / name
            ident = file_id(path)
            if ident is not None:
                rel = path.relative_to(root).as_posix()
                ids[rel], modes[rel] = ident, _mode(path)
    return Snapshot(root=root, paths=sorted(ids), ids=ids, git=False, hashed=len(ids), modes=modes)


def input_files(snapshot: Snapshot, patterns: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(path -> content id for every file the globs match, the globs that matched nothing)."""
    files: dict[str, str] = {}
    unmatched: list[str] = []
    for pattern in patterns:
        found = snapshot.match(pattern.lstrip("/"))
        if not found:
            unmatched.append(pattern)
        for path in found:
            files[path] = snapshot.ids[path]
    return files, unmatched


# A Python module's cached bytecode (or the file it is written to first): opened instead of
# its source, which is only stat-ed
PYCACHE = re.compile(r"^(?P<dir>(?:.*/)?)__pycache__/(?P<name>[^./]+)\.[^/]*\.pyc(\.\d+)?$")


@dataclass(frozen=True)
class Before:
    """What the tree held, before its gates ran, that its snapshot leaves out: the ignored
    files (``unknown``: they could not be listed), the folders that hold only such files,
    and the seed folders (a pattern of each) with their key files."""

    ignored: frozenset[str] = frozenset()
    folders: frozenset[str] = frozenset()
    unknown: bool = False
    untracked: frozenset[str] = frozenset()  # files of the snapshot outside git's index
    seeds: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = ()
    # files dagrunner removed before a gate started (its own JUnit file: ``clear``)
    removed: set[str] = field(default_factory=set)
    failures: bool = False  # pytest's cache held last failures (``neutral``)

    def held(self, path: str, *, folder: bool = False) -> bool:
        """Whether ``path`` (a file, or a ``folder``) was there, ignored, before the gates
        ran: a file the gate made new, or a folder of the snapshot, was not."""
        if not folder and path in self.removed:
            return False
        return self.unknown or path in (self.folders if folder else self.ignored)

    def clear(self, root: Path, rel: str) -> None:
        """Remove ``rel``, the JUnit file a gate declares, left in ``root`` by an earlier run,
        before the gate starts: what it held is then never read, and the gate's new file is
        its own (made in its run), not an ignored cache that makes its observation
        incomplete.  Never through a link (the tree may be an envelope's, whose ``build``
        may name any folder), and only a plain file: a folder opened at each step without
        following links, so a gate swapping one in meanwhile cannot redirect it."""
        *folders, name = rel.split("/")
        if not name or ".." in folders or "." in folders:
            return
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in folders:
                step = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = step
            if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=fd)
                self.removed.add(rel)
        except OSError:
            return  # not there, or not a plain file under plain folders: left alone
        finally:
            os.close(fd)

    def seed_keys(self, path: str) -> tuple[str, ...] | None:
        for folder, keys in self.seeds:
            if any(folder.fullmatch(p) for p in _up(path)):
                return keys
        return None


def _up(path: str) -> list[str]:
    """``path`` and each folder above it (``a/b/c``: ``a/b/c``, ``a/b``, ``a``)."""
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]


def held_before(repo: Path, manifest: Manifest, snapshot: Snapshot) -> Before:
    """What ``repo`` holds outside ``snapshot`` now, before any gate runs (``stands_for``):
    its ignored files, but those of its seeds (which their key files stand for)."""
    for gate in manifest.gates.values():
        if gate.junit is not None and gate.observe:
            make_folders(repo, os.path.normpath(os.path.join(gate.cwd, gate.junit)))
    seeds = manifest.worktrees.seeds
    patterns = tuple(
        (glob_regex(pattern), tuple(input_files(snapshot, seed.key)[0]))
        for seed in seeds
        for pattern in (seed.path, *seed.also)
    )
    if not snapshot.git:
        return Before(seeds=patterns)  # a walked tree: every file is in the snapshot
    leave = [f":(exclude,glob){p}" for seed in seeds for p in (seed.path, *seed.also)]
    listed = git(
        ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--", ".", *leave],
        cwd=repo,
        check=False,
    )
    if listed.returncode != 0:
        return Before(unknown=True, seeds=patterns)
    files = frozenset(split_z(listed.stdout))
    above = {folder for path in files for folder in _up(path)[1:]}
    return Before(
        ignored=files,
        folders=frozenset(f for f in above if not _holds(snapshot.paths, f)),
        seeds=patterns,
        untracked=snapshot.untracked,
        failures=_failures(repo / LAST_FAILED),
    )


def make_folders(root: Path, rel: str) -> None:
    """The folders above ``rel`` (an observed gate's JUnit file), made before the run began
    (``Listing``): made by the gate, ``build`` in a fresh tree's root was another gate's
    name in the root a gate beside it listed (ruff, mypy: incomplete).  Made before, they
    are the tree's, as in a checkout that ran the gate once.  Never through a link
    (``folder_beneath``): the tree may be an envelope's."""
    *folders, _ = rel.split("/")
    if ".." in folders or "." in folders or rel.startswith("/"):
        return
    for n, name in enumerate(folders):
        try:
            fd = folder_beneath(root, folders[:n])
        except OSError:
            return  # a link, or not a folder: left alone
        try:
            os.mkdir(name, dir_fd=fd)  # a name already there (a link too) is left as it is
        except FileExistsError:
            pass
        except OSError:
            return
        finally:
            os.close(fd)


def _failures(path: Path) -> bool:
    """Whether pytest's last failures at ``path`` name any test, or may (a file the tree's
    gates wrote: not followed, never waited on, read up to ``FAILURES_READ``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        data = os.read(fd, FAILURES_READ + 1)
        if len(data) > FAILURES_READ:
            return True
        held = json.loads(data or b"{}")
    except (OSError, ValueError):
        return True
    finally:
        os.close(fd)
    return bool(held)


def _holds(paths: list[str], folder: str) -> bool:
    """Whether the sorted snapshot ``paths`` have a file under ``folder``."""
    at = bisect.bisect_left(paths, f"{folder}/")
    return at < len(paths) and paths[at].startswith(f"{folder}/")


def stands_for(
    seen: Observation,
    ids: Mapping[str, str],
    before: Before,
    written: frozenset[str],
    neutral: tuple[str, ...] = (),
    made: Callable[[str], list[str]] = lambda _: [],
) -> tuple[frozenset[str], str]:
    """The files of the snapshot a complete observation's reads stand for, and why they do
    not stand for all the gate learnt ("" when they do).  A file the tree held outside its
    snapshot before the gate ran (an ignored cache: bytecode, ``target/``, ``.eslintcache``)
    may stand for files the gate only stat-ed, which no observer sees: bytecode is its
    source, a seed's folder its key files; a file a need wrote in this run is the need's
    (its key is in the gate's: ``written`` holds what needs that ran wrote, and the folders
    above); ``neutral`` files hold nothing a verdict depends on; any other makes the
    observation incomplete."""
    found: set[str] = set()
    # the folders above what a need wrote, but those holding a file of the snapshot: a
    # folder of the tree (``tests/``, where a need read its conftest) is listed for its
    # names, ignored ones too, whoever else opened a file in it
    paths = sorted(ids)
    folders = {above for path in written for above in _up(path)[1:] if not _holds(paths, above)}
    for path in sorted(seen.read | seen.listed):
        if path in ids and (path not in before.untracked or path in written):
            found.add(path)
            continue
        if path in ids:  # a file outside git's index: a cache the gate wrote, maybe
            return frozenset(), (
                f"it opened {path}, a file of the tree outside git's index (a cache it wrote "
                "may stand for files it only stat-ed: git add it, or ignore it)"
            )
        compiled = PYCACHE.match(path)
        source = f"{compiled['dir']}{compiled['name']}.py" if compiled else ""
        # bytecode held before the run, or made in it: not an older file linked or renamed
        # to a bytecode name (its content would go unkeyed)
        if source in ids and (path in seen.new or before.held(path)):
            found.add(source)
            continue
        if path.endswith("__pycache__") and path in seen.listed and path not in seen.foreign:
            continue  # a folder of bytecode only: each file of it is read above
        keys, folder = before.seed_keys(path), path not in seen.read
        if path in seen.foreign and path not in neutral:  # made beside it, from what it
            return frozenset(), (  # may not have read: no seed's, no need's (needs end first)
                f"it opened {path}, which another gate (or a process it did not see write) "
                "made or filled while it ran, from files it may never have read"
            )
        if keys is not None:
            found.update(keys)
        elif path in (folders if folder else written) or path in neutral:
            continue  # what a need that ran in this run wrote (or a folder of it)
        elif not before.held(path, folder=folder):
            if folder and path not in seen.new:  # its names count, ignored ones too
                found.add(f"{path}/")  # (a new one holds only what the gate made: ``foreign``)
            elif path not in seen.new:  # a new name of an older file: a link, a rename
                return frozenset(), (
                    f"it opened {path}, a name the tree did not hold of a file older than "
                    "its run (a link to or a rename of a file it did not open by its name)"
                )
        else:
            return frozenset(), (
                f"it opened {path}, which the tree held outside its snapshot before it ran "
                "(an ignored cache or install: what it stands for is not seen)"
            )
    # a name made in the run in a folder it listed: its own, a need's, or another gate's,
    # whose name may stand for what this one never read (its listing is keyed without it)
    own = seen.wrote | (seen.new - seen.foreign)
    mine = own | written | folders | {above for path in own for above in _up(path)[1:]}
    for listed in sorted(p[:-1] for p in found if p.endswith("/")):
        for name in made(listed):
            if name in mine or name.startswith(neutral) or name.endswith("__pycache__"):
                continue  # (a bytecode folder's name: Python's own, whoever imported first)
            return frozenset(), (
                f"it listed {listed or 'the tree'}, where {name} was made in this run by "
                "another gate, or in a way the observer does not see"
            )
    return frozenset(found), ""


# pytest's own cache (``cacheprovider``): the last failures and the tests seen, which only
# --lf, --ff and --nf make a run depend on (such a gate gets no exemption: ``neutral``), and
# --lf only when there are last failures: an ini file of the tree may ask for it (where a
# stepwise run stopped is read only by a run that asks for --sw: never exempt); not a value
# a test or plugin keeps there itself (``cache.set``: read once from the tree, it stands
# for what it was read from)
LAST_FAILED = ".pytest_cache/v/cache/lastfailed"
FAILURES_READ = 1 << 20  # more than that is not "no failures"
PYTEST_CACHE = (LAST_FAILED, ".pytest_cache/v/cache/nodeids")
ORDERING = re.compile(r"(^|\s)--(lf|last-failed|ff|failed-first|nf|new-first|sw|stepwise)\b")


def neutral(gate: GateSpec, before: Before) -> tuple[str, ...]:
    """The ignored files whose content ``gate``'s verdict does not depend on, in a tree
    that held ``before`` when its gates started."""
    words = gate.run if isinstance(gate.run, str) else " ".join(gate.run)
    if ORDERING.search(words):
        return ()
    return tuple(p for p in PYTEST_CACHE if not (p == LAST_FAILED and before.failures))
