"""A gate's cache key: a sha256 over a canonical encoding of its components.

The components are the resolved definition (run, cwd, timeout), the hermetic environment
(names and hashes of the values), the manifest's ``cache_salt``, the content ids of every
input file, the keys of the gates it needs, the output of its declared ``tools`` commands,
and :data:`CACHE_FORMAT`.  ``cache.py`` stores verdicts under these keys; ``landed.py``
proves them.

A gate whose inputs are the whole tree is keyed by what it was seen to read (issue 46,
docs/cache.md): its *shape* key is everything above but the input contents, plus a digest
of the tree's name set (every path, its mode, a symlink's target); its *verdict* key is the
shape key with the content id of each file one complete observation saw it read.  And the
reuse rule of an untrusted tree (:func:`tree_scope`) lives here: which verdicts hold for one
exact tree only.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dagrunner.engine.graph import Graph, integration_map, spec, topological_order
from dagrunner.engine.inputs import Snapshot, blob_id, input_files
from dagrunner.executors.base import Fingerprint
from dagrunner.git.command import git, split_z
from dagrunner.manifest.globs import glob_regex
from dagrunner.manifest.load import GateSpec, Manifest
from dagrunner.process.command import tool_fingerprint
from dagrunner.process.made import born_at
from dagrunner.process.sandbox import tree_environment

CACHE_FORMAT = 2  # 2: entries are signed (HMAC) instead of carrying a plain digest
# 2: a file or folder another gate made while the gate ran makes its reads incomplete (the
# read sets kept before may have left such a file's sources out); 3: a listed folder's names
# leave out those made in the run (verdicts kept before may hold a name the gate never saw),
# a name another gate made there makes the reads incomplete; a folder is the gate's
# only if it holds a file the gate wrote, a file is known by more than its inode number, a
# bytecode folder holding another file counts (the same), and of .pytest_cache/ only
# pytest's own files count for nothing (a value a test kept there stood for its source),
# its last failures only while they name no test (an ini file may ask for --lf), and a file
# made while the gate ran by another gate is no need's whatever its name, nor a seed's
READS_FORMAT = 3
WHOLE_TREE_GLOBS = frozenset({"**", "/**"})  # inputs that name every file: keyed by reads
# Derived from the commit, so it would miss every entry on every commit; it is
# recorded in the proof instead (docs/cache.md says why).
NOT_KEYED_ENV = frozenset({"SOURCE_DATE_EPOCH"})


def _digest(value: object) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _hash_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class KeyParts:
    """The components of one gate's key, in the form kept in the store."""

    gate: str
    definition: dict[str, Any]
    env: dict[str, str]  # name -> sha256 of the value
    salt: str
    inputs: dict[str, str]  # path -> content id
    unmatched: list[str]
    needs: dict[str, str]  # gate -> its key
    tools: dict[str, str]  # command -> sha256 of its output
    tool_lines: dict[str, str] = field(default_factory=dict)  # command -> its output, for people
    # Keyed by the whole tree (``inputs`` is {TREE: tree id}) for a landed proof only: why the
    # gate is not cacheable in the store (it declares no inputs, or needs such a gate).
    whole_tree: str = ""
    # The tree's name set digest (``Snapshot.names``) for a gate keyed by what it reads
    # (:func:`observed`); "" for a gate keyed by its declared inputs alone.
    names: str = ""

    @property
    def shape(self) -> str:
        """The key of everything but the input contents, and the tree's name set: the read
        sets of its complete observations are kept under it (``Store.read_sets``)."""
        return _digest(
            {
                "format": CACHE_FORMAT,
                "reads": READS_FORMAT,
                "definition": self.definition,
                "env": self.env,
                "salt": _hash_text(self.salt),
                "names": self.names,
                "needs": self.needs,
                "tools": self.tools,
            }
        )

    @property
    def flight(self) -> str:
        """What a run computing an observed gate claims (``Flights``): its verdict key is
        known only once it ran, and a tree of the same shape may well be answered by it."""
        return f"shape:{self.shape}"

    def verdict(
        self, read: Iterable[str], listing: Callable[[str], str | None] = lambda _: None
    ) -> tuple[str, dict[str, str | None]]:
        """The verdict key of a run that read ``read`` (files of the snapshot, and folders it
        listed, each ending in ``/``) on this tree, and the content id of each (None: not in
        the tree now, so no stored set matches); a folder's is ``listing``'s, of its names."""
        ids = {
            path: listing(path[:-1]) if path.endswith("/") else self.inputs.get(path)
            for path in sorted(read)
        }
        return _digest({"format": CACHE_FORMAT, "shape": self.shape, "reads": ids}), ids

    @property
    def key(self) -> str:
        return _digest(
            {
                "format": CACHE_FORMAT,
                "definition": self.definition,
                "env": self.env,
                "salt": _hash_text(self.salt),
                "inputs": self.inputs,
                "needs": self.needs,
                "tools": self.tools,
                # a gate keyed by its reads: its whole key (an incomplete observation's) holds
                # the modes and symlinks of the name set too, as its verdict keys do
                **({"names": self.names} if self.names else {}),
            }
        )

    def summary(self) -> dict[str, Any]:
        """The proof shown in a gate's record: counts and digests, not the whole file list."""
        return {
            "inputs": {"count": len(self.inputs), "digest": _digest(self.inputs)},
            "unmatched_globs": self.unmatched,
            "env_digest": _digest(self.env),
            "env_names": sorted(self.env),
            "definition_digest": _digest(self.definition),
            "needs": self.needs,
            "tools": {cmd: self.tool_lines.get(cmd, "").split("\n")[0] for cmd in self.tools},
            "format": CACHE_FORMAT,
            **({"shape": self.shape} if self.names else {}),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "definition": self.definition,
            "env": self.env,
            "salt": _hash_text(self.salt),
            "inputs": self.inputs,
            "unmatched": self.unmatched,
            "needs": self.needs,
            "tools": self.tools,
            "tool_lines": self.tool_lines,
            "format": CACHE_FORMAT,
            "names": self.names,
        }


@dataclass(frozen=True)
class Candidate:
    """A stored key that may answer a gate, the key its dependants then hold (a verdict key,
    not its scoped form), and the read set it came from (None: the gate's whole key)."""

    key: str
    counts: str
    read: frozenset[str] | None


def observed(gate: GateSpec) -> bool:
    """Whether ``gate`` is keyed by what it reads: its inputs are the whole tree and its
    manifest does not say ``observe = false``."""
    return gate.kind == "gate" and gate.observe and bool(WHOLE_TREE_GLOBS & set(gate.inputs))


"""(command, the gate's environment) -> (hash of its output, the output for people)."""


def compute_keys(
    manifest: Manifest,
    graph: Graph,
    snapshot: Snapshot,
    envs: Mapping[str, Mapping[str, str]],
    repo: Path,
    *,
    hide: Path | None = None,
    fingerprint: Fingerprint | None = None,
    tree: str | None = None,
) -> dict[str, KeyParts | str]:
    """Each gate's key parts, or a sentence saying why it is not cacheable.

    ``fingerprint`` takes the tools' fingerprints where the gates run (a cluster's
    workers); by default here, in ``repo``.  With ``tree`` (the id of the clean tree under
    test), a gate that would not be cacheable only for want of inputs is keyed by that
    whole tree instead, with ``whole_tree`` saying why (a landed proof's keys, ``landed.py``)."""
    result: dict[str, KeyParts | str] = {}
    tools: dict[tuple[str, str], tuple[str, str]] = {}
    above = integration_map(graph)
    outputs = declared_outputs(graph)
    seeds = [seed.path for seed in manifest.worktrees.seeds]
    for node in topological_order(graph):
        gate = spec(graph, node)
        if gate.kind != "gate":
            result[node] = f"not cacheable: a {gate.kind} node always runs"
            continue
        if above[node]:
            result[node] = "not cacheable: it runs in an integration worktree"
            continue
        whole = "" if gate.inputs else "not cacheable: the gate declares no inputs"
        if whole and tree is None:
            result[node] = whole
            continue
        blocked = [n for n in gate.needs if not isinstance(result.get(n), KeyParts)]
        if blocked:
            result[node] = f"not cacheable: it needs {blocked[0]!r}, which is not cacheable"
            continue
        below = [n for n in gate.needs if _whole(result[n])]
        if below and not whole:
            whole = f"not cacheable: it needs {below[0]!r}, which is not cacheable"
        env = envs[node]
        runs = tree_environment(dict(env), repo, seeds)  # the programs the gate runs
        fingerprints: dict[str, str] = {}
        lines: dict[str, str] = {}
        for command in gate.tools:
            cache_key = (command, _digest(runs))
            if cache_key not in tools:
                tools[cache_key] = (
                    fingerprint(command, runs)
                    if fingerprint is not None
                    else tool_fingerprint(
                        command, runs, repo, hide=hide, writable=manifest.sandbox.writable
                    )
                )
            fingerprints[command], lines[command] = tools[cache_key]
        files, unmatched = (
            ({TREE: tree}, []) if whole and tree else input_files(snapshot, gate.inputs)
        )
        files = {path: ident for path, ident in files.items() if path not in outputs}
        names = snapshot.names(outputs) if observed(gate) and not (whole and tree) else ""
        needs: dict[str, str] = {}
        for need in gate.needs:
            parts = result[need]
            assert isinstance(parts, KeyParts)
            needs[need] = parts.key
        result[node] = KeyParts(
            gate=node,
            definition=_definition(gate),
            env={k: _hash_text(v) for k, v in env.items() if k not in NOT_KEYED_ENV},
            salt=manifest.cache_salt,
            inputs=files,
            unmatched=unmatched,
            needs=needs,
            tools=fingerprints,
            tool_lines=lines,
            whole_tree=whole or "",
            names=names,
        )
    return result


TREE = "(the whole tree)"  # the one "input" of a gate keyed by its tree


def declared_outputs(graph: Graph) -> set[str]:
    """The files gates declare they write (their ``junit``), repository-relative: no gate's
    key holds them, since each run writes them again (a ``**`` gate would never hit)."""
    found = set()
    for node in graph.nodes:
        gate = spec(graph, node)
        if gate.junit:
            found.add(posixpath.normpath(posixpath.join(gate.cwd or ".", gate.junit)))
    return found


def _whole(parts: KeyParts | str) -> bool:
    return isinstance(parts, KeyParts) and bool(parts.whole_tree)


def store_keys(keys: Mapping[str, KeyParts | str]) -> dict[str, KeyParts | str]:
    """The keys the store answers: a gate keyed by its whole tree is not cacheable there."""
    return {
        g: p.whole_tree if isinstance(p, KeyParts) and p.whole_tree else p for g, p in keys.items()
    }


def _definition(gate: GateSpec) -> dict[str, Any]:
    return {
        "run": gate.run if isinstance(gate.run, str) else list(gate.run),
        "cwd": gate.cwd,
        "timeout": gate.timeout,
    }


@dataclass(frozen=True)
class TreeScope:
    """An untrusted tree (an envelope's) against the trusted commit: its id, the paths that
    differ (``known`` False: it could not be compared), and the trees whose tree-scoped
    verdicts hold here too (the trusted commit's, and the pipeline's commits up to this
    tree's speculative base)."""

    ident: str
    changed: tuple[str, ...]
    known: bool
    trusted: tuple[str, ...]

    def outside(self, inputs: Iterable[str]) -> tuple[str, ...]:
        """The changed paths no input glob matches (every one when not ``known``)."""
        if not self.known:
            return ("(the tree could not be compared)",)
        patterns = [glob_regex(g) for g in inputs]
        return tuple(p for p in self.changed if not any(r.match(p) for r in patterns))

    def keys(self, key: str) -> tuple[str, ...]:
        """``key`` scoped to each tree whose verdicts hold here (this one's is :meth:`own`)."""
        return tuple(scoped_key(key, tree) for tree in self.trusted)

    def own(self, key: str) -> str:
        return scoped_key(key, self.ident)


@dataclass(frozen=True)
class Placement:
    """Where a run's passes are stored and which stored keys answer it: by input key (a
    trusted run), scoped to an untrusted tree under the reuse rule (``scope``; ``scoped``:
    gate -> its changed paths outside its inputs), or as a linked worktree's own
    (``private``: a worker's own check, where what sits beside a gate's inputs -- an
    undeclared helper it edited, a package it installed -- is not trusted)."""

    scope: TreeScope | None = None
    scoped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    private: str | None = None

    def mine(self, key: str) -> str:
        return scoped_key(key, f"worktree {self.private}") if self.private else key

    def answering(self, key: str, gate: str = "") -> list[str]:
        """``key``, and as scoped to this tree and to the trees whose verdicts hold here: for
        a gate the reuse rule scopes (``gate``), or a verdict key in an untrusted tree; in a
        linked worktree, as its own."""
        if self.private:
            return [key, self.mine(key)]
        if self.scope is None or (gate and gate not in self.scoped):
            return [key]
        return [key, self.scope.own(key), *self.scope.keys(key)]

    def verdict_key(self, verdict: str) -> str:
        """Where a verdict key's pass is stored: in an untrusted tree, scoped to it (it holds
        for other trees once this one has landed: ``answering``)."""
        return self.scope.own(verdict) if self.scope is not None else self.mine(verdict)

    def store_key(self, gate: str, key: str) -> str:
        """Where ``gate``'s pass under its input ``key`` is stored: there, or this tree's."""
        return self.scope.own(key) if gate in self.scoped and self.scope else self.mine(key)


def tree_scope(repo: Path, trusted: str, ahead: str | None) -> TreeScope:
    """The reuse rule for an untrusted tree (an envelope's): a verdict computed on it may be
    reused by input key only when the tree equals the ``trusted`` commit outside the gate's
    declared inputs; otherwise only for this exact tree (docs/security.md).

    Trees whose tree-scoped verdicts hold here too: the trusted commit's (judged while it
    was an envelope's, it has landed since), and, in the pipeline, the trees of the commits
    between it and ``ahead`` (this tree's speculative base): this tree lands only after every
    one of them has landed, so only once their verdicts are trusted ones; when one does not
    land, this tree is built and gated again without it.  A tree that cannot be compared
    scopes every gate."""
    tree = git(["rev-parse", "--verify", "-q", "HEAD^{tree}"], cwd=repo, check=False)
    head = git(["rev-parse", "--verify", "-q", f"{trusted}^{{tree}}"], cwd=repo, check=False)
    diff = git(
        ["diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", trusted, "HEAD", "--"],
        cwd=repo,
        check=False,
    )
    dirty = git(["status", "--porcelain", "-z", "--untracked-files=all"], cwd=repo, check=False)
    chain = git(["log", "--format=%T", f"{trusted}..{ahead}", "--"], cwd=repo, check=False)
    known = tree.returncode == 0 and diff.returncode == 0 and not dirty.stdout
    trees = [head.text, *(chain.text.split() if ahead and chain.returncode == 0 else ())]
    return TreeScope(
        ident=tree.text if known else "unknown",
        changed=tuple(split_z(diff.stdout)) if known else (),
        known=known,
        trusted=tuple(trees),
    )


def scoped_key(key: str, tree: str) -> str:
    """The cache key of a verdict that holds for one exact tree only."""
    return hashlib.sha256(f"tree-scoped\0{key}\0{tree}".encode()).hexdigest()


@dataclass(frozen=True)
class Listing:
    """The names in a folder of ``root`` (all of them: a file git ignores is listed too),
    as one id; None when it is not a folder now.  With ``since`` (ns since the epoch: when
    the run began, before any gate), a name made since is left out: every tree of the queue
    starts without the folders its gates make (``build/``, ``.tox``), and a gate stored
    with another gate's ``build`` in the root it listed never answered a fresh tree.  The
    tree's names as they were before the run key it: a name made in the run must be the
    gate's own product or a need's (``made``, ``stands_for``: another gate's makes the
    observation incomplete); a name removed in the run is not in the key either, so a tree
    that holds it misses; one removed and made again is new, left out, and so misses too; a
    name whose birth is unknown is kept (a miss at worst), and so is one made just after
    ``since`` that a file system's coarser clock stamped before it."""

    root: Path
    since: int | None = None

    def _entries(self, folder: str) -> list[tuple[str, bool]]:
        """(name, made since the run began) of each entry of ``folder``; OSError: none."""
        with os.scandir(self.root / folder) as entries:
            return [(e.name, self._new(e)) for e in entries]

    def _new(self, entry: os.DirEntry[str]) -> bool:
        """Whether ``entry`` was made since the run began.  Its change time is never before
        its birth: one before ``since`` proves it older without asking for its birth time
        (an open and a statx), and all but what the run made are older."""
        if self.since is None:
            return False
        try:
            if entry.stat(follow_symlinks=False).st_ctime_ns < self.since:
                return False
        except OSError:  # gone by now: what its birth says (unknown: kept)
            pass
        return (made := born_at(entry.path)) is not None and made >= self.since

    def __call__(self, folder: str) -> str | None:
        try:
            found = sorted(name for name, new in self._entries(folder) if not new)
        except OSError:
            return None
        return blob_id("\0".join(found).encode("utf-8", "surrogateescape"))

    def made(self, folder: str) -> list[str]:
        """The paths (in the tree) of the names made in ``folder`` since the run began."""
        try:
            return [f"{folder}/{n}" if folder else n for n, new in self._entries(folder) if new]
        except OSError:
            return []


def listing(root: Path, since: int | None = None) -> Listing:
    """``Listing``: a listed folder's names (those before the run, given ``since``)."""
    return Listing(root, since)
