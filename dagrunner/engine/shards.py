"""A gate's ``split``: its files shared out among shards, balanced by recorded durations.

``expand`` turns each split gate into plain gates ``ID-1`` … ``ID-N`` before the graph is
built, so everything after (the scheduler, the cache, the report) sees ordinary gates:

- Files are the repository's (tracked and untracked, not ignored) that the ``files`` globs
  match.  Each file goes to exactly one shard, longest first, to the shard with the least
  expected work so far (LPT); a file's expected seconds are what its test cases took in
  the last run that recorded them (their JUnit ``file`` or ``classname``), unknown files
  the mean of the known ones.  Adding or removing a file re-balances; the order is stable.
- ``shards = "auto"``: as many as the governor's CPU holds beside the gate's own ``cpu``
  (never more than there are files).
- In each shard, ``{files}`` becomes its files (one argument each, relative to the gate's
  ``cwd``, ``./`` before one starting with ``-`` or ``@``; shell-quoted in a string ``run``), ``{shard}``/``{shards}`` its number and the
  count (in ``run`` and ``junit``).  Its ``inputs`` are the gate's other inputs plus its
  own files, so a shard stays cached when only other shards' files change.
- ``needs = ["ID"]`` (and ``--only ID``) means every shard.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dagrunner.errors import DagrunnerError
from dagrunner.git.command import git, split_z
from dagrunner.manifest.globs import glob_regex
from dagrunner.manifest.load import GateSpec, Manifest


@dataclass(frozen=True)
class Shard:
    """One shard of a split gate: its files and the seconds they are expected to take."""

    gate: str
    number: int
    files: tuple[str, ...]
    expected: float


def shard_id(gate: str, number: int) -> str:
    return f"{gate}-{number}"


def expand(
    manifest: Manifest,
    repo: Path,
    cpu: float,
    cases: Mapping[str, float],
    before: Mapping[str, Mapping[str, int]] | None = None,
    durations: Mapping[str, float] | None = None,
) -> tuple[Manifest, dict[str, list[Shard]]]:
    """The manifest with every split gate replaced by its shards, and the shards per gate.
    ``cpu``: the governor's capacity (``auto``); ``cases``: seconds per JUnit file or
    classname, from the history; ``before``: each gate's last assignment (file -> shard),
    kept while it stays balanced; ``durations``: each gate's last seconds (a shard's expected
    time is its files' plus what a shard took beyond its files' tests last time: start-up,
    collection).  A manifest without ``split`` comes back as it is."""
    split = {g.id: g for g in manifest.gates.values() if g.split is not None}
    if not split:
        return manifest, {}
    files = _repository_files(repo)
    shards: dict[str, list[Shard]] = {}
    gates: dict[str, GateSpec] = {}
    for gate in manifest.gates.values():
        if gate.id not in split:
            gates[gate.id] = gate
            continue
        last = (before or {}).get(gate.id, {})
        planned = plan_shards(gate, files, cpu, cases, where=str(manifest.path), last=last)
        extra = overhead(gate.id, last, cases, durations or {})
        shards[gate.id] = [replace(s, expected=round(s.expected + extra, 3)) for s in planned]
        for shard in shards[gate.id]:
            made = _shard_gate(gate, shard, len(shards[gate.id]))
            if made.id in manifest.gates:
                raise DagrunnerError(
                    "manifest-duplicate-id",
                    f"gate {made.id!r} is defined, and is also shard {shard.number} of {gate.id!r}",
                    where=str(manifest.path),
                    key=f"gates.{made.id}",
                    hint="rename that gate: the shards of a split gate are ID-1 ... ID-N",
                )
            gates[made.id] = made
    gates = {g.id: replace(g, needs=_needs(g.needs, shards)) for g in gates.values()}
    return replace(manifest, gates=gates), shards


def overhead(
    gate: str, last: Mapping[str, int], cases: Mapping[str, float], durations: Mapping[str, float]
) -> float:
    """The median of what each shard of ``gate`` took last time beyond its files' recorded
    test times (0 without that record)."""
    files: dict[int, list[str]] = {}
    for path, number in last.items():
        files.setdefault(number, []).append(path)
    beyond = []
    for number, members in files.items():
        took = durations.get(shard_id(gate, number))
        if took is not None:
            beyond.append(max(0.0, took - sum(file_seconds(members, cases).values())))
    return sorted(beyond)[len(beyond) // 2] if beyond else 0.0


def only(names: Sequence[str], manifest: Manifest) -> tuple[str, ...]:
    """``--only`` names, a split gate's name standing for all its shards."""
    out: list[str] = []
    for name in names:
        out += [g.id for g in manifest.gates.values() if g.shard_of == name] or [name]
    return tuple(out)


# The last assignment is kept while its slowest shard is within this of its fastest: test
# times vary by 10-40% between runs under load, and every re-share changes shards' keys.
REBALANCE = 1.5


def plan_shards(
    gate: GateSpec,
    files: Sequence[str],
    cpu: float,
    cases: Mapping[str, float],
    *,
    where: str,
    last: Mapping[str, int] | None = None,
) -> list[Shard]:
    assert gate.split is not None
    patterns = [glob_regex(p) for p in gate.split.files]
    matched = [f for f in files if any(p.match(f) for p in patterns)]
    if not matched:
        raise DagrunnerError(
            "manifest-split-empty",
            f"split of {gate.id!r}: no file matches {list(gate.split.files)}",
            where=where,
            key=f"gates.{gate.id}.split.files",
            hint="fix the globs (relative to the repository root), or drop split",
        )
    count = gate.split.shards or max(1, math.floor(cpu / max(gate.cpu, 1e-9) + 1e-9))
    count = min(count, len(matched))
    seconds = file_seconds(matched, cases)
    members, loads = _assign(matched, seconds, count, last or {})
    if min(loads) <= 0 or max(loads) > REBALANCE * min(loads):
        members, loads = _assign(matched, seconds, count, {})  # balance again from scratch
    return [
        Shard(gate.id, i + 1, tuple(sorted(members[i])), round(loads[i], 3)) for i in range(count)
    ]


def _assign(
    files: Sequence[str], seconds: Mapping[str, float], count: int, last: Mapping[str, int]
) -> tuple[list[list[str]], list[float]]:
    """Files kept in their last shard (times wobble from run to run: a stable split keeps
    its shards' cache keys), the rest longest first to the least loaded shard (LPT)."""
    loads = [0.0] * count
    members: list[list[str]] = [[] for _ in range(count)]
    rest = []
    for path in files:
        shard = last.get(path)
        if shard is not None and 1 <= shard <= count:
            members[shard - 1].append(path)
            loads[shard - 1] += seconds[path]
        else:
            rest.append(path)
    for path in sorted(rest, key=lambda f: (-seconds[f], f)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        members[lightest].append(path)
        loads[lightest] += seconds[path]
    return members, loads


def assignment(manifest: Manifest) -> dict[str, dict[str, int]]:
    """Each split gate's files and their shard numbers, as the history keeps them."""
    found: dict[str, dict[str, int]] = {}
    for gate in manifest.gates.values():
        if gate.shard_of:
            number = int(gate.id.rsplit("-", 1)[1])
            found.setdefault(gate.shard_of, {}).update(dict.fromkeys(gate.shard_files, number))
    return found


def file_seconds(files: Sequence[str], cases: Mapping[str, float]) -> dict[str, float]:
    """Each file's recorded seconds (its cases' by ``file`` or by ``classname``: a dotted
    module path, maybe with a class after it); unknown files the known ones' mean."""
    known: dict[str, float] = {}
    modules = {f.removesuffix(".py").replace("/", "."): f for f in files}
    for name, took in cases.items():
        path = name if name in files else _module_file(name, modules)
        if path is not None:
            known[path] = known.get(path, 0.0) + took
    mean = sum(known.values()) / len(known) if known else 1.0
    return {f: _coarse(known.get(f, mean)) for f in files}


def _coarse(seconds: float) -> float:
    """Seconds on a grid of about 19% steps: a file whose time wobbles a little between runs
    keeps its place, so shards (and their cache keys) stay the same."""
    if seconds <= 0.001:
        return 0.001
    return float(2 ** (round(math.log2(seconds) * 4) / 4))


def _module_file(classname: str, modules: Mapping[str, str]) -> str | None:
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        found = modules.get(".".join(parts[:cut]))
        if found is not None:
            return found
    return None


def _shard_gate(gate: GateSpec, shard: Shard, count: int) -> GateSpec:
    assert gate.split is not None
    cwd = gate.cwd
    args = [os.path.relpath(f, cwd) if cwd not in ("", ".") else f for f in shard.files]
    # A file's name is the tree's (an envelope's, in integration): never read as an option,
    # nor as an @FILE of more arguments (pytest 8.2+, mypy: ``@x/test_a.py`` read x/test_a.py).
    args = [f"./{a}" if a.startswith(("-", "@")) else a for a in args]

    def fill(word: str) -> str:
        return word.replace("{shard}", str(shard.number)).replace("{shards}", str(count))

    if isinstance(gate.run, str):
        run: tuple[str, ...] | str = fill(gate.run).replace("{files}", shlex.join(args))
    else:
        run = tuple(a for word in gate.run for a in (args if word == "{files}" else [fill(word)]))
    others = tuple(p for p in gate.inputs if p not in gate.split.files)
    return replace(
        gate,
        id=shard_id(gate.id, shard.number),
        run=run,
        junit=fill(gate.junit) if gate.junit else None,
        inputs=(*others, *(_literal(f) for f in shard.files)) if gate.inputs else (),
        estimate=shard.expected if shard.expected else gate.estimate,
        description=f"{gate.description or gate.id}: shard {shard.number} of {count}",
        split=None,
        shard_of=gate.id,
        shard_files=shard.files,
    )


def _needs(needs: tuple[str, ...], shards: Mapping[str, list[Shard]]) -> tuple[str, ...]:
    out: list[str] = []
    for name in needs:
        out += [shard_id(name, s.number) for s in shards[name]] if name in shards else [name]
    return tuple(dict.fromkeys(out))


def _literal(path: str) -> str:
    """``path`` as a glob matching only itself."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def _repository_files(repo: Path) -> list[str]:
    """Tracked and untracked files that git does not ignore, sorted."""
    listed = git(
        ["ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=repo, check=False
    )
    if listed.returncode != 0:  # not a git repository: every file under it
        return sorted(
            (Path(folder) / name).relative_to(repo).as_posix()
            for folder, dirs, names in os.walk(repo)
            if ".git" not in Path(folder).relative_to(repo).parts
            for name in names
        )
    return sorted({f for f in split_z(listed.stdout) if (repo / f).is_file()})
