"""What a run produces: each gate's result and the run's own record.

Times are seconds relative to the run's start (``started``/``finished``),
so a report can draw a timeline without clock arithmetic.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagrunner.records.evidence import Budget, Speed
from dagrunner.records.summary import RunIntegration


class Status(enum.StrEnum):
    PASSED = "passed"
    FLAKY = "flaky"  # failed at first, passed on a retry
    CACHED = "cached"  # a stored pass with the same key; proof in ``cache``
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    SKIPPED = "skipped"  # an upstream gate did not pass, or the run stopped first
    CANCELLED = "cancelled"  # stopped by --fail-fast after another gate failed
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C or SIGTERM

    @property
    def ok(self) -> bool:
        return self in (Status.PASSED, Status.FLAKY, Status.CACHED)

    @property
    def failed(self) -> bool:
        """It ran and failed (not skipped, cancelled or interrupted: those did not judge)."""
        return self in (Status.FAILED, Status.TIMED_OUT)


# Reports list gates failures first: what needs a person's eyes, then what did not run, then passes.
REPORT_ORDER = {
    Status.FAILED: 0,
    Status.TIMED_OUT: 1,
    Status.INTERRUPTED: 2,
    Status.CANCELLED: 3,
    Status.SKIPPED: 4,
    Status.FLAKY: 5,
    Status.PASSED: 6,
    Status.CACHED: 7,
}


class RunStatus(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, kw_only=True)
class Attempt:
    number: int
    started: float
    finished: float
    exit_code: int | None
    timed_out: bool = False
    error: str = ""
    peak_rss: int = 0
    cpu_seconds: float = 0.0
    log_bytes: int = 0
    log_elided: int = 0
    leftover_killed: int = 0
    survivors: tuple[int, ...] = ()
    log: str = ""  # path relative to the run directory
    worker: str = ""  # the Dask worker that ran it ("" on this machine)

    @property
    def duration(self) -> float:
        return self.finished - self.started


@dataclass(frozen=True, kw_only=True)
class TestCase:
    """One test case that did not pass, from a gate's JUnit file."""

    __test__ = False  # not a pytest class

    suite: str
    name: str
    outcome: str  # failed | error | skipped
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class TestRun:
    """What a gate's JUnit file says (``testresults.py``): counts, and the cases that did not
    pass; or why it could not be read (``problem``).  ``source`` "output": a gate without a
    JUnit file whose failing tests were read from its log (``report/testnames.py``): names
    for people, never a complete list (a baseline judges such a gate as a whole)."""

    __test__ = False  # not a pytest class

    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    cases: tuple[TestCase, ...] = ()
    problem: str = ""
    # seconds per test file (a case's ``file``, else its ``classname``): how a split is balanced
    seconds: Mapping[str, float] = field(default_factory=dict)
    source: str = "junit"  # junit | output

    @property
    def failed(self) -> tuple[TestCase, ...]:
        return tuple(c for c in self.cases if c.outcome in ("failed", "error"))

    @classmethod
    def from_json(cls, body: Any) -> TestRun | None:
        if not isinstance(body, dict):
            return None
        cases = tuple(
            TestCase(**{k: str(c.get(k, "")) for k in ("suite", "name", "outcome", "message")})
            for c in body.get("cases", ())
            if isinstance(c, dict)
        )

        def count(key: str) -> int:
            value = body.get(key)
            return value if isinstance(value, int) else 0

        return cls(
            tests=count("tests"),
            failures=count("failures"),
            errors=count("errors"),
            skipped=count("skipped"),
            cases=cases,
            problem=str(body.get("problem", "")),
            source="output" if body.get("source") == "output" else "junit",
            seconds={
                str(k): float(v)
                for k, v in (body.get("seconds") or {}).items()
                if isinstance(v, int | float)
            },
        )


@dataclass(frozen=True, kw_only=True)
class Observation:
    """What one gate run was seen to open in its tree, by every process of it (``process/observe``).

    Paths are relative to the tree, posix, never ``..``; ``""`` is the tree's root folder."""

    complete: bool  # False: events lost, git's database read, no observer: keys fall back
    why: str = ""  # why it is incomplete, one line for people ("" when complete)
    read: frozenset[str] = frozenset()  # files opened (to read, write or execute)
    listed: frozenset[str] = frozenset()  # folders opened (listed, or a base of lookups)
    wrote: frozenset[str] = frozenset()  # files closed after an open to write (in ``read``)
    new: frozenset[str] = frozenset()  # files of ``read`` whose inode was made during the run
    # of ``new`` and ``listed``: files made in the run that the gate never closed after a
    # write (another gate's, beside it), folders made in the run holding such a file (or
    # a folder holding none of its files), and bytecode folders holding a file no bytecode
    foreign: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "why": self.why,
            "read": sorted(self.read),
            "listed": sorted(self.listed),
            "wrote": sorted(self.wrote),
            "new": sorted(self.new),
            "foreign": sorted(self.foreign),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Observation:
        """The record ``to_json`` wrote; a stored one comes from a gate's run, so each field
        is checked: a path that is not relative, clean and inside the tree is refused."""
        if not isinstance(data, Mapping):
            raise ValueError("an observation is an object")
        complete, why = data.get("complete"), data.get("why", "")
        if not isinstance(complete, bool) or not isinstance(why, str):
            raise ValueError("an observation's complete is a boolean and its why a string")
        return cls(
            complete=complete,
            why=why,
            read=_tree_paths(data.get("read", ()), "read"),
            listed=_tree_paths(data.get("listed", ()), "listed"),
            wrote=_tree_paths(data.get("wrote", ()), "wrote"),
            new=_tree_paths(data.get("new", ()), "new"),
            foreign=_tree_paths(data.get("foreign", ()), "foreign"),
        )


def _tree_paths(paths: Any, name: str) -> frozenset[str]:
    if not isinstance(paths, list | tuple):
        raise ValueError(f"an observation's {name} is a list of paths")
    for path in paths:
        parts = path.split("/") if isinstance(path, str) else None
        if parts is None or (path and ("" in parts or "." in parts or ".." in parts)):
            raise ValueError(f"an observation's {name} holds {path!r}: not a path in the tree")
        if "\0" in path:
            raise ValueError(f"an observation's {name} holds a NUL byte")
    return frozenset(paths)


@dataclass(frozen=True, kw_only=True)
class GateResult:
    id: str
    status: Status
    reason: str = ""  # one line: why it failed, was skipped or cached
    needs: tuple[str, ...] = ()
    cpu: float = 1.0
    memory: int = 0
    ready: float | None = None  # when all its needs had passed
    started: float | None = None
    finished: float | None = None
    lane: int | None = None  # timeline row, for the report
    attempts: tuple[Attempt, ...] = ()
    memory_exceeded: bool = False
    skipped_because: str | None = None
    cache: CacheProof | None = None
    command: str = ""
    kind: str = "gate"  # gate | worker | integrate | land
    tests: TestRun | None = None  # from the gate's JUnit file (its ``junit`` key)
    shard_of: str = ""  # a shard of a split gate: that gate's id

    @property
    def duration(self) -> float:
        if self.started is None or self.finished is None:
            return 0.0
        return self.finished - self.started

    @property
    def waited(self) -> float:
        """Seconds between becoming ready and starting: time spent waiting on the governor."""
        if self.ready is None or self.started is None:
            return 0.0
        return max(0.0, self.started - self.ready)

    @property
    def exit_code(self) -> int | None:
        return self.attempts[-1].exit_code if self.attempts else None

    @property
    def peak_rss(self) -> int:
        return max((a.peak_rss for a in self.attempts), default=0)

    @property
    def log(self) -> str:
        return self.attempts[-1].log if self.attempts else ""

    def to_json(self) -> dict[str, Any]:
        body = {f: getattr(self, f) for f in self.__dataclass_fields__}
        body["attempts"] = [dict(a.__dict__) for a in self.attempts]
        body["status"] = str(self.status)
        body["duration"] = round(self.duration, 4)
        body["waited"] = round(self.waited, 4)
        body["exit_code"] = self.exit_code
        body["peak_rss"] = self.peak_rss
        body["retries_used"] = max(0, len(self.attempts) - 1)
        body["cache"] = self.cache.to_json() if self.cache else None
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> GateResult:
        fields = {k: v for k, v in body.items() if k in cls.__dataclass_fields__}
        fields["status"] = Status(fields["status"])
        fields["needs"] = tuple(fields.get("needs", ()))
        fields["tests"] = TestRun.from_json(fields.get("tests"))
        fields["cache"] = CacheProof.from_json(fields.get("cache"))
        fields["attempts"] = tuple(
            Attempt(
                **{
                    **{k: v for k, v in a.items() if k in Attempt.__dataclass_fields__},
                    "survivors": tuple(a.get("survivors", ())),
                }
            )
            for a in fields.get("attempts", ())
        )
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class CacheProof:
    """Why a gate was (or was not) answered from the cache: its key and what the key is made
    of, and for a hit which run stored the verdict.  Built once by ``engine/cachestep``."""

    cacheable: bool
    key: str | None = None
    parts: Mapping[str, Any] = field(default_factory=dict)  # counts and digests of the key
    tree_scoped: Mapping[str, Any] | None = None  # reused only for this exact tree, and why
    hit: bool | None = None
    reason: str | None = None  # why not cacheable, or why a miss
    stored_by_run: str | None = None
    stored_at: str | None = None
    saved: float | None = None  # what the cached verdict's run took
    landed: Mapping[str, Any] | None = None  # answered by a verified landed proof: whose
    observed: Mapping[str, Any] | None = None  # what it was seen to read, what it is keyed by

    def to_json(self) -> dict[str, Any]:
        if not self.cacheable:
            return {"cacheable": False, "reason": self.reason}
        body: dict[str, Any] = {"cacheable": True, "key": self.key, **self.parts}
        for name in (
            "tree_scoped",
            "hit",
            "reason",
            "stored_by_run",
            "stored_at",
            "saved",
            "landed",
            "observed",
        ):
            if (value := getattr(self, name)) is not None:
                body[name] = value
        return body

    @classmethod
    def from_json(cls, body: Any) -> CacheProof | None:
        if not isinstance(body, dict):
            return None
        named = {"cacheable", "key", "tree_scoped", "hit", "reason", "stored_by_run"}
        named |= {"stored_at", "saved", "landed", "observed"}
        return cls(
            cacheable=body.get("cacheable") is True,
            key=body.get("key"),
            parts={k: v for k, v in body.items() if k not in named},
            tree_scoped=body.get("tree_scoped"),
            hit=body.get("hit"),
            reason=body.get("reason"),
            stored_by_run=body.get("stored_by_run"),
            stored_at=body.get("stored_at"),
            saved=body.get("saved"),
            landed=body.get("landed"),
            observed=body.get("observed"),
        )


@dataclass(frozen=True, kw_only=True)
class GovernorSample:
    t: float
    cpu_percent: float
    load1: float
    runnable: float  # tasks runnable at the moment of the sample
    memory_available: int
    declared_cpu: float
    declared_memory: int
    running: int
    pressured: bool


@dataclass(kw_only=True)
class RunRecord:
    """Everything ``run.json`` says; the report renders from this alone."""

    run_id: str
    status: RunStatus
    started_at: str
    wall: float
    manifest: dict[str, Any]
    git: dict[str, Any]
    machine: dict[str, Any]
    governor: dict[str, Any]
    gates: list[GateResult]
    speed: Speed = field(default_factory=Speed)
    budget: Budget = field(default_factory=Budget)
    cache: dict[str, Any] = field(default_factory=dict)
    integration: RunIntegration | None = None  # what its integrations did (records/summary)
    options: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        result: dict[str, int] = {}
        for gate in self.gates:
            result[str(gate.status)] = result.get(str(gate.status), 0) + 1
        return result

    def to_json(self, gates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The run.json body; ``gates`` passes the gates' bodies when already made."""
        body = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "gates"}
        body["status"] = str(self.status)
        body["speed"] = self.speed.to_json()
        body["budget"] = self.budget.to_json()
        body["gates"] = gates if gates is not None else [g.to_json() for g in self.gates]
        body["counts"] = self.counts()
        body["integration"] = self.integration.to_json() if self.integration else None
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RunRecord:
        fields = {k: v for k, v in body.items() if k in cls.__dataclass_fields__}
        fields["status"] = RunStatus(fields["status"])
        fields["gates"] = [GateResult.from_json(g) for g in fields["gates"]]
        fields["speed"] = Speed.from_json(fields.get("speed"))
        fields["budget"] = Budget.from_json(fields.get("budget"))
        fields["integration"] = RunIntegration.from_json(fields.get("integration"))
        return cls(**fields)


def failures_first(gates: list[GateResult]) -> list[GateResult]:
    """Gates in report order: by status (``REPORT_ORDER``), then start time, then id."""
    return sorted(
        gates,
        key=lambda g: (REPORT_ORDER[g.status], g.started if g.started is not None else 1e18, g.id),
    )
