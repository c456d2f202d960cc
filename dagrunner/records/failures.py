"""What a gate run failed, as a differential baseline compares it
(``integration/baseline``): per gate, its failed JUnit cases, or the gate as a whole."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dagrunner.records.run import RunRecord, Status, TestCase

WHOLE: frozenset[str] = frozenset()  # a gate that failed without cases to compare


@dataclass(frozen=True)
class Failures:
    """What one gate run failed: per gate, its failed test cases (``WHOLE``: no complete
    list of cases, judged as a whole); ``hard``: gates that failed in a way no baseline
    excuses (a timeout, a tracked file changed, an error, skipped or cancelled, an exit
    of 0), whatever their JUnit file says -- the file is the gate's own words."""

    gates: Mapping[str, frozenset[str]] = field(default_factory=dict)
    hard: frozenset[str] = frozenset()
    # for a gate judged whole: the failing tests its output names (``report/testnames``),
    # never a complete list, so never what excuses -- only what tells two wholes apart
    said: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, record: RunRecord) -> Failures:
        gates: dict[str, frozenset[str]] = {}
        hard: set[str] = set()
        said: dict[str, frozenset[str]] = {}
        for gate in record.gates:
            if gate.status.ok:
                continue
            if gate.tests is not None and gate.tests.source == "output" and gate.tests.failed:
                said[gate.id] = frozenset(map(case_name, gate.tests.failed))
            last = gate.attempts[-1] if gate.attempts else None
            plain = (
                gate.status is Status.FAILED
                and last is not None
                and last.exit_code not in (None, 0)
                and not (last.timed_out or last.error or last.survivors)
                and "tree-modified" not in gate.reason
            )
            tests = gate.tests
            if tests is not None and (tests.problem or tests.source != "junit"):
                tests = None  # names read from a log are never a complete list
            failed = tests.failed if tests is not None else ()
            complete = (
                bool(failed) and tests is not None and len(failed) == tests.failures + tests.errors
            )
            gates[gate.id] = frozenset(map(case_name, failed)) if complete and plain else WHOLE
            if not plain:
                hard.add(gate.id)
        return cls(gates, frozenset(hard), said)

    def without(self, gates: Iterable[str]) -> Failures:
        """These failures but for ``gates`` (passed since: a flake)."""
        drop = set(gates)
        kept = {g: c for g, c in self.gates.items() if g not in drop}
        said = {g: c for g, c in self.said.items() if g not in drop}
        return Failures(kept, frozenset(self.hard - drop), said)

    def rerun(self, again: Failures, gates: Iterable[str]) -> Failures:
        """These failures, with ``gates`` as a re-run of them found them (``again``): what
        a tree fails once a re-run of some of its gates passed (a flake's landing)."""
        kept = self.without(gates)
        said = {**kept.said, **again.said}
        return Failures({**kept.gates, **again.gates}, kept.hard | again.hard, said)

    def confirmed_by(self, again: Failures) -> Failures:
        """What failed both here and ``again`` (a re-run): a gate in both, with the cases in
        both (a gate whose cases differ, or that is whole on one side only, is dropped)."""
        kept: dict[str, frozenset[str]] = {}
        for gate, cases in self.gates.items():
            other = again.gates.get(gate)
            if other is None or bool(cases) != bool(other):
                continue
            if not cases or (cases := cases & other):
                kept[gate] = cases
        # what both runs' output named (a test named once only is no known failure)
        said = {g: c & again.said.get(g, c) for g, c in self.said.items() if g in kept}
        hard = frozenset(g for g in self.hard & again.hard if g in kept)
        return Failures(kept, hard, said)

    def names(self) -> tuple[str, ...]:
        """``gate`` or ``gate::suite::case``, sorted."""
        return tuple(
            sorted(
                name
                for gate, cases in self.gates.items()
                for name in ([f"{gate}::{c}" for c in cases] or [gate])
            )
        )

    def beyond(self, base: Failures) -> Failures:
        """What fails here and not at ``base``: a gate that passed there, or failed hard
        on either side; a case that did not fail there; a gate judged as a whole here
        where ``base`` lists its cases; two wholes are the same failure, per gate, unless
        this output names a failing test that ``base``'s does not (then it is new)."""
        new: dict[str, frozenset[str]] = {}
        for gate, cases in self.gates.items():
            theirs = base.gates.get(gate)
            hard = gate in self.hard or gate in base.hard
            named = self.said.get(gate, WHOLE) - base.said.get(gate, WHOLE)
            if theirs is None or hard or (not cases and theirs) or (not cases and named):
                new[gate] = cases
            elif cases and theirs and (extra := cases - theirs):
                new[gate] = extra
        said = {g: c for g, c in self.said.items() if g in new}
        return Failures(new, frozenset(g for g in self.hard if g in new), said)


def rerunnable(record: RunRecord) -> bool:
    """Whether a re-run of ``record``'s failed gates could end otherwise: not when each of
    them failed for a program that is not there (could not start, or the shell's exit 127,
    ``command not found``) -- the same tree, seeds and PATH fail the same way."""
    failed = [g for g in record.gates if g.status.failed]
    return not failed or not all(
        gate.attempts
        and (
            gate.attempts[-1].exit_code == 127
            or gate.attempts[-1].error.startswith("could not start ")
        )
        for gate in failed
    )


def named(record: RunRecord | None, within: Failures | None = None) -> tuple[str, ...]:
    """The failing tests ``record``'s gates name (their JUnit files, or read from their
    output), as ``gate::suite::case`` (``gate::case`` outside a suite), sorted.
    ``within``: only what is there -- the failures a baseline found new: its cases, and
    for a gate it judges whole, the cases its output names (``gate`` itself when none)."""
    out: set[str] = set()
    for gate in record.gates if record is not None else ():
        tests = gate.tests
        if gate.status.ok or tests is None or tests.problem:
            continue
        cases = set(map(case_name, tests.failed))
        if within is not None:
            wanted = within.gates.get(gate.id)
            if wanted is None or (not wanted and tests.source == "junit"):
                continue
            cases = cases & wanted if wanted else cases
        out.update(f"{gate.id}::{c}" for c in cases)
    if within is not None:  # a gate judged whole, unless its cases are named already
        out.update(
            n for n in within.names() if "::" in n or not any(o.startswith(f"{n}::") for o in out)
        )
    return tuple(sorted(out))


def case_name(case: TestCase) -> str:
    """``suite::case``, or ``case`` for a test outside any suite (node's top-level tests)."""
    return f"{case.suite}::{case.name}" if case.suite else case.name
