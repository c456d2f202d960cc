"""Which live work would collide, seen on the content before anyone's turn comes.

The *sides* are every live worktree (its full current state -- commits, staged, unstaged
and untracked work -- as export sees it, without writing an envelope), every envelope
queued for the target, and the target's tip.  Each side is a commit whose tree is its
state and whose history reaches its base.  Two sides *overlap* when they touch a common
path (the prefilter: nothing else is merged); then ``git merge-tree --write-tree`` merges
them on their content, and the pair is a conflict when the merge is not clean.

Worker worktrees and envelopes are not trusted: their paths and ids are data only, the
merges run in an empty work tree of their own (no worktree's ``.gitattributes`` is read),
and nothing is written but objects: no ref, no index, no file of any worktree.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.git.command import git, split_z
from dagrunner.git.link import pin_gitfile
from dagrunner.git.merge import commit_tree, merge_commits
from dagrunner.git.statetree import state_tree

THREADS = 4  # worktree states computed at once (each is a few git processes)


@dataclass(frozen=True, kw_only=True)
class Side:
    name: str  # a worktree id (mission/worker), an envelope id, or the target branch
    kind: str  # "worktree", "envelope" or "target"
    commit: str  # its state as a commit on top of its base
    base: str
    touched: frozenset[str]  # the paths it changes from its base


@dataclass(frozen=True, kw_only=True)
class Overlap:
    a: Side
    b: Side
    conflict: bool
    paths: tuple[str, ...]  # the conflicting paths; when clean, the paths both touch

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.name,
            "a_kind": self.a.kind,
            "b": self.b.name,
            "b_kind": self.b.kind,
            "conflict": self.conflict,
            "paths": list(self.paths),
        }


@dataclass(frozen=True, kw_only=True)
class Overlaps:
    target: str
    tip: str
    sides: tuple[Side, ...]
    pairs: tuple[Overlap, ...]
    merges: int  # merge computations made (the prefilter spared the rest)
    skipped: tuple[str, ...] = ()  # sides that could not be read, and why

    @property
    def conflict(self) -> bool:
        return any(p.conflict for p in self.pairs)

    def conflicts_with(self, name: str) -> list[str]:
        return sorted(
            (p.b.name if p.a.name == name else p.a.name)
            for p in self.pairs
            if p.conflict and name in (p.a.name, p.b.name)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "tip": self.tip,
            "sides": {
                kind: sum(1 for s in self.sides if s.kind == kind)
                for kind in ("worktree", "envelope", "target")
            },
            "pairs": [p.to_json() for p in self.pairs],
            "conflicts": sum(1 for p in self.pairs if p.conflict),
            "merges": self.merges,
            "skipped": list(self.skipped),
        }


def _touched(repo: Path, old: str, new: str) -> frozenset[str]:
    names = git(["diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", old, new], cwd=repo)
    return frozenset(split_z(names.stdout))


def worktree_side(repo: Path, common: Path, name: str, path: Path, base: str) -> Side:
    """A live worktree's full state as a commit on its HEAD (blobs written, nothing else)."""
    pin_gitfile(common, path)  # a worker may have pointed its .git elsewhere
    head = git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=path).text
    commit = commit_tree(
        repo, state_tree(path), head, f"dagrunner overlaps: state of {name}\n".encode()
    )
    return Side(
        name=name, kind="worktree", commit=commit, base=base, touched=_touched(repo, base, commit)
    )


def envelope_side(repo: Path, envelope: Envelope) -> Side | str:
    """A queued envelope's tree (its diff applied on its base in an index of its own) as a
    commit on its base; a sentence when the diff does not apply there."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-overlap-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        patch = Path(tmp) / "diff.patch"
        patch.write_bytes(envelope.diff)
        git(["read-tree", envelope.base], cwd=repo, env=env)
        applied = git(
            ["apply", "--cached", "--whitespace=nowarn", str(patch)], cwd=repo, env=env, check=False
        )
        if applied.returncode != 0:
            return f"{envelope.id}: its diff does not apply on its base ({applied.message})"
        tree = git(["write-tree"], cwd=repo, env=env).text
    commit = commit_tree(repo, tree, envelope.base, f"dagrunner overlaps: {envelope.id}\n".encode())
    return Side(
        name=envelope.id,
        kind="envelope",
        commit=commit,
        base=envelope.base,
        touched=frozenset(envelope.paths),
    )


def shared(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """The paths both change, and a file one changes where the other changes what is
    under it as a folder (``a`` against ``a/b``: a file/directory conflict)."""
    found = set(a & b)
    for one, other in ((a, b), (b, a)):
        folders = {"/".join(p.split("/")[:i]) for p in other for i in range(1, p.count("/") + 1)}
        found |= one & folders
    return frozenset(found)


def merge(common: Path, a: Side, b: Side) -> tuple[bool, tuple[str, ...]]:
    """Whether ``a`` and ``b`` merge cleanly on their content; the conflicting paths."""
    return merge_sides(common, a.commit, b.commit)


def merge_sides(common: Path, a: str, b: str) -> tuple[bool, tuple[str, ...]]:
    """``merge`` of two sides' commits (``foresight`` keeps the commits, not the sides)."""
    merged = merge_commits(common, a, b)
    if merged.failed:
        return True, (f"(git merge-tree failed: {merged.failed})",)
    return merged.tree is None, merged.conflicts


def find_overlaps(
    repo: Path,
    common: Path,
    *,
    target: str,
    worktrees: Iterable[tuple[str, Path, str]],
    envelopes: Iterable[Envelope],
    related: Iterable[tuple[str, str]] = (),
    only: str | None = None,
    prefilter: bool = True,
) -> Overlaps:
    """Every overlapping pair among the live ``worktrees`` (id, path, base), the queued
    ``envelopes`` and ``target``'s tip.  ``related``: (worktree, envelope) pairs that are
    one work (the envelope was exported from that worktree), never paired.  ``only``: the
    pairs of that one side.  ``prefilter`` False merges every pair (the benchmark's peer)."""
    tip = git(["rev-parse", "--verify", f"refs/heads/{target}^{{commit}}"], cwd=repo).text
    skipped: list[str] = []
    sides: list[Side] = []

    def read(entry: tuple[str, Path, str]) -> Side | str:
        name, path, base = entry
        try:
            return worktree_side(repo, common, name, path, base)
        except Exception as exc:  # a worktree half gone, a lock: said, never fatal
            return f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    with ThreadPoolExecutor(THREADS) as pool:
        found = list(pool.map(read, list(worktrees)))
    for envelope in envelopes:
        try:
            found.append(envelope_side(repo, envelope))
        except DagrunnerError as exc:  # its base is not in this repository
            found.append(f"{envelope.id}: {exc.message}")
    for side in found:
        if isinstance(side, str):
            skipped.append(side)
        else:
            sides.append(side)
    tip_touched: dict[str, frozenset[str]] = {}
    target_side = Side(name=target, kind="target", commit=tip, base=tip, touched=frozenset())
    candidates: list[tuple[Side, Side, frozenset[str]]] = []
    for i, a in enumerate(sides):
        for b in sides[i + 1 :]:
            candidates.append((a, b, shared(a.touched, b.touched)))
        if a.base not in tip_touched:
            tip_touched[a.base] = _touched(repo, a.base, tip)
        candidates.append((a, target_side, shared(a.touched, tip_touched[a.base])))
    same = {frozenset(pair) for pair in related}
    candidates = [
        c
        for c in candidates
        if frozenset((c[0].name, c[1].name)) not in same
        and (only is None or only in (c[0].name, c[1].name))
    ]
    pairs = []
    merges = 0
    for a, b, common_paths in candidates:
        if prefilter and not common_paths:
            continue
        merges += 1
        conflict, paths = merge(common, a, b)
        if conflict or common_paths:
            pairs.append(
                Overlap(
                    a=a,
                    b=b,
                    conflict=conflict,
                    paths=paths if conflict else tuple(sorted(common_paths)),
                )
            )
    return Overlaps(
        target=target,
        tip=tip,
        sides=(*sides, target_side),
        pairs=tuple(pairs),
        merges=merges,
        skipped=tuple(skipped),
    )
