"""Submit's foresight, kept per target so that a submit costs about the same with 300 items
queued as with 3.

Which items queued ahead a new envelope conflicts with, on content: merged pairwise, that
was one merge per item ahead touching a common path, and every queued envelope read and
applied again at every submit -- quadratic over a long queue of edits to one file.  Kept
instead, per target, in a small state file of the queue folder
(``foresight/<target>.json``, a cache: whatever cannot be read is rebuilt from the queue):

- each queued item's paths, read once, and its *side* (its diff applied on its base, as a
  commit: ``overlaps.envelope_side``), computed once -- when a later envelope first touches
  a path it touches (before that, nothing needs it);
- the *combined* commits: the first is the merge of every side that merged cleanly into
  it (its *members*); a side that conflicts with it joins the next one it merges cleanly
  into, or starts one of its own, so every side is a member of one.  A combined commit's
  parents are its members' bases (a flat history: merge-tree finds the merge base at once)
  and ``refs/dagrunner/foresight/<target>/<n>`` holds it, so its objects stay.

A new envelope that touches a path of some item ahead is merged once with each combined
commit that has such an item (usually one).  Clean: it conflicts with none of its members.
Not clean: only then is it merged with each of its members that touches a common path, to
name the culprits.  It joins the first combined commit it merges cleanly into.  What is
reported is always what that pairwise merge (``overlaps.merge_sides``) says, with an item
still queued ahead.  Members that left the queue stay in their combined commit (their
conflicts are never reported: the culprits are looked for among queued items only); all is
built again from the queued items when more than half of the members have left (amortised:
a departure pays for about one merge), when a combined commit is missing or the state
cannot be read.  A side whose commit is missing (``git gc`` pruned it) is computed again.

Envelopes are untrusted: their paths and ids are data only, the merges run as
``overlaps.merge`` runs them, and nothing is written but objects, the state file and the
refs.  All of it runs under the queue lock that ``submit`` holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.envelope import Envelope
from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write
from dagrunner.git.command import IDENTITY, git
from dagrunner.git.merge import merge_commits
from dagrunner.names import is_object_id, is_safe_id
from dagrunner.worktrees.overlaps import envelope_side, merge_sides, shared

VERSION = 1
REFS = "refs/dagrunner/foresight/"


def key(target: str) -> str:
    """``target`` as one file name and one ref component (``feature/x`` -> ``feature%2Fx``):
    targets ``a`` and ``a/b`` never clash; a name too long for a file ends in a hash."""
    name = target.replace("%", "%25").replace("/", "%2F")
    if len(name) <= 120:
        return name
    return f"{name[:80]}%%{hashlib.sha256(target.encode()).hexdigest()[:32]}"  # never encoded


def _ids(value: object, check: Callable[[object], bool]) -> list[str] | None:
    if not isinstance(value, list) or not all(check(v) for v in value):
        return None
    return [str(v) for v in value]


@dataclass(frozen=True, kw_only=True)
class Known:
    """What foresight knows of one queued item."""

    paths: frozenset[str]  # the paths its envelope changes (``Envelope.paths``)
    side: str | None = None  # its side's commit; None until a later envelope needs it
    base: str | None = None  # its side's parent
    why_not: str = ""  # why it has no side: no foresight for it

    def to_json(self) -> dict[str, Any]:
        return {
            "paths": sorted(self.paths),
            "side": self.side,
            "base": self.base,
            "why_not": self.why_not,
        }

    @classmethod
    def from_json(cls, data: object) -> Known | None:
        if not isinstance(data, dict) or not isinstance(why := data.get("why_not"), str):
            return None
        paths = data.get("paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            return None
        side, base = data.get("side"), data.get("base")
        if (side is None) != (base is None) or not all(
            v is None or is_object_id(v) for v in (side, base)
        ):
            return None
        return cls(paths=frozenset(paths), side=side, base=base, why_not=why)


@dataclass(frozen=True, kw_only=True)
class Combined:
    """The merge of its members' sides, on their bases."""

    commit: str
    members: tuple[str, ...]
    bases: tuple[str, ...]  # its commit's parents

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "members": self.members, "bases": self.bases}

    @classmethod
    def from_json(cls, data: object) -> Combined | None:
        if not isinstance(data, dict) or not is_object_id(commit := data.get("commit")):
            return None
        members, bases = (
            _ids(data.get("members"), is_safe_id),
            _ids(data.get("bases"), is_object_id),
        )
        if members is None or bases is None:
            return None
        return cls(commit=str(commit), members=tuple(members), bases=tuple(bases))


@dataclass
class Foresight:
    """One target's foresight, read by ``open``, used by ``foresee``, written by ``save``."""

    repo: Path
    common: Path
    state: Path  # the state file
    target: str
    load: Callable[[str], Envelope]  # a queued item's envelope
    items: dict[str, Known] = dataclasses.field(default_factory=dict)
    combined: list[Combined] = dataclasses.field(default_factory=list)
    merges: int = 0  # merges run, for the tests and the benchmark
    sides: int = 0  # sides computed
    refs: dict[str, str] = dataclasses.field(default_factory=dict)  # as last read or written

    @classmethod
    def open(
        cls,
        *,
        repo: Path,
        common: Path,
        queue_dir: Path,
        target: str,
        load: Callable[[str], Envelope],
    ) -> Foresight:
        """The foresight of ``target``'s queue in ``queue_dir`` (empty when its state file is
        missing or unreadable: it is rebuilt as submits need it)."""
        seer = cls(repo, common, queue_dir / "foresight" / f"{key(target)}.json", target, load)
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            seer._read(orjson.loads(seer.state.read_bytes()))
        seer.refs = {seer._ref(i): c.commit for i, c in enumerate(seer.combined)}
        return seer

    def _read(self, data: object) -> None:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return
        items, combined = data.get("items"), data.get("combined")
        if not isinstance(items, dict) or not isinstance(combined, list):
            return
        known = {item: Known.from_json(entry) for item, entry in items.items()}
        layers = [Combined.from_json(entry) for entry in combined]
        if not all(is_safe_id(item) and entry for item, entry in known.items()):
            return
        if not all(layers):
            return
        self.items = {item: entry for item, entry in known.items() if entry is not None}
        self.combined = [layer for layer in layers if layer is not None]

    def _ref(self, index: int) -> str:
        return f"{REFS}{key(self.target)}/{index}"

    def _listed_refs(self) -> dict[str, str]:
        listed = git(
            ["for-each-ref", "--format=%(refname) %(objectname)", f"{REFS}{key(self.target)}/"],
            cwd=self.repo,
        )
        return dict(line.split(" ", 1) for line in listed.text.splitlines())

    def save(self) -> None:
        """Point the refs at the combined commits, then write the state file (atomically; not
        fsynced: a state a crash damaged is rebuilt).  Raises OSError or DagrunnerError."""
        wanted = {self._ref(i): c.commit for i, c in enumerate(self.combined)}
        lines = [
            f"update {ref} {oid}\n" for ref, oid in wanted.items() if self.refs.get(ref) != oid
        ]
        lines += [f"delete {ref}\n" for ref in self.refs if ref not in wanted]
        if lines:
            git(["update-ref", "--stdin"], cwd=self.repo, input="".join(lines).encode())
            self.refs = wanted
        body = {
            "version": VERSION,
            "target": self.target,
            "combined": [c.to_json() for c in self.combined],
            "items": {item: known.to_json() for item, known in self.items.items()},
        }
        atomic_write(self.state, orjson.dumps(body), durable=False)

    def foresee(
        self, item: str, envelope: Envelope, ahead: Sequence[str]
    ) -> list[tuple[str, tuple[str, ...]]]:
        """The items ``ahead`` (still queued for this target, in submission order) whose
        content conflicts with ``envelope``'s, each with the conflicting paths, as the
        pairwise merge gives them; ``envelope`` is then known as queue item ``item``.
        Never raises DagrunnerError: what git could not do is foresight not had (and the
        state starts again)."""
        try:
            return self._foresee(item, envelope, ahead)
        except DagrunnerError:
            self.items, self.combined = {}, []
            return []

    def _foresee(
        self, item: str, envelope: Envelope, ahead: Sequence[str]
    ) -> list[tuple[str, tuple[str, ...]]]:
        queued = set(ahead)
        self.items = {i: known for i, known in self.items.items() if i in queued}
        for other in ahead:
            if other not in self.items:  # queued before this state was kept, or it was lost
                self.items[other] = self._paths_of(other)
        mine = Known(paths=frozenset(envelope.paths))
        self.items[item] = mine
        near = [
            other
            for other in ahead
            if not self.items[other].why_not and shared(mine.paths, self.items[other].paths)
        ]
        if not near:
            return []  # nothing to merge with: its side waits until an envelope needs it
        self._check(queued)
        side = self._side(item, envelope)
        if side is None:
            return []
        for other in near:  # sides first needed now join a combined commit, in queue order
            if self.items[other].side is None and self._side(other) is not None:
                self._join(other)
        suspects = self._join(item, near)
        self._recompute_missing(suspects)
        found = []
        for other in near:
            theirs = self.items[other].side
            if other in suspects and theirs is not None:
                self.merges += 1
                conflict, paths = merge_sides(self.common, side, theirs)
                if conflict:
                    found.append((other, paths))
        return found

    def _paths_of(self, item: str) -> Known:
        try:
            return Known(paths=frozenset(self.load(item).paths))
        except DagrunnerError as exc:  # a damaged stored envelope is integrate's to reject
            return Known(paths=frozenset(), why_not=exc.message)

    def _side(self, item: str, envelope: Envelope | None = None) -> str | None:
        """``item``'s side commit, computed the first time it is needed; None without one."""
        known = self.items[item]
        if known.side is not None or known.why_not:
            return known.side
        self.sides += 1
        try:
            side = envelope_side(self.repo, envelope or self.load(item))
        except DagrunnerError as exc:  # unreadable, or its base is not in this repository
            side = exc.message
        if isinstance(side, str):
            self.items[item] = dataclasses.replace(known, why_not=side)
            return None
        self.items[item] = dataclasses.replace(known, side=side.commit, base=side.base)
        return side.commit

    def _join(self, item: str, near: Sequence[str] = ()) -> set[str]:
        """Merge ``item``'s side with the combined commits, and join the first it merges
        cleanly into (or start one).  Each commit that holds one of ``near`` is merged with;
        the others only until ``item`` has joined.  The items of ``near`` in a commit that
        ``item`` conflicts with, or in none: the suspects."""
        known = self.items[item]
        assert known.side is not None and known.base is not None
        holds = {m: i for i, c in enumerate(self.combined) for m in c.members}
        cleared: set[str] = set()
        joined = False
        for index, combined in enumerate(self.combined):
            mates = {o for o in near if holds.get(o) == index}
            if joined and not mates:
                continue
            self.merges += 1
            merged = merge_commits(self.common, combined.commit, known.side)
            if merged.tree is None:
                continue
            cleared |= mates
            if not joined:
                bases = tuple(dict.fromkeys((*combined.bases, known.base)))
                argv = ["commit-tree", "--no-gpg-sign", merged.tree]
                message = f"dagrunner foresight: {self.target}\n".encode()
                commit = git(
                    [*argv, *(arg for base in bases for arg in ("-p", base))],
                    cwd=self.repo,
                    input=message,
                    env=IDENTITY,
                ).text
                members = (*combined.members, item)
                self.combined[index] = Combined(commit=commit, members=members, bases=bases)
                joined = True
        if not joined:
            self.combined.append(Combined(commit=known.side, members=(item,), bases=(known.base,)))
        return {o for o in near if o not in cleared}

    def _check(self, queued: set[str]) -> None:
        """Read where the refs point; build the combined commits again when one is missing
        or more than half of their members have left the queue."""
        refs = [self._ref(i) for i in range(len(self.combined))]
        found = _commits(self.repo, [*refs, *(c.commit for c in self.combined)])
        self.refs = {ref: found[ref] for ref in refs if ref in found}
        if not self.combined:  # a state lost or new: the refs an older one left, to delete
            self.refs = self._listed_refs()
        members = [m for c in self.combined for m in c.members]
        left = sum(1 for m in members if m not in queued)
        if 2 * left > len(members) or any(c.commit not in found for c in self.combined):
            self._rebuild()

    def _rebuild(self) -> None:
        """The combined commits of the queued items whose sides are kept and present (in
        queue order); the others are computed again, and join, when an envelope needs them."""
        self.combined = []
        kept = {i: k.side for i, k in self.items.items() if k.side is not None}
        present = _commits(self.repo, kept.values())
        for item, side in kept.items():
            if side in present:
                self._join(item)
            else:
                self.items[item] = dataclasses.replace(self.items[item], side=None, base=None)

    def _recompute_missing(self, suspects: Iterable[str]) -> None:
        """The suspects' sides whose commits are gone, computed again (they stay members)."""
        sides = {o: s for o in suspects if (s := self.items[o].side) is not None}
        present = _commits(self.repo, sides.values())
        for other, side in sides.items():
            if side not in present:
                self.items[other] = dataclasses.replace(self.items[other], side=None, base=None)
                self._side(other)


def _commits(repo: Path, names: Iterable[str]) -> dict[str, str]:
    """Those of ``names`` (object ids, or refs) that name a commit here, and its id."""
    asked = list(names)
    if not asked:
        return {}
    found = git(
        ["cat-file", "--batch-check=%(objectname) %(objecttype)"],
        cwd=repo,
        input="".join(f"{name}\n" for name in asked).encode(),
    ).text.splitlines()
    lines = (line.partition(" ") for line in found)
    return {
        name: oid for name, (oid, _, kind) in zip(asked, lines, strict=False) if kind == "commit"
    }
