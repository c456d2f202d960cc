"""Terminal output: live progress while gates run, and the final summary table.

On a TTY a status line is redrawn in place under the finished gates, every half second;
in CI (no TTY, or ``CI`` set) every start and end is a plain line.  Progress goes to stderr so that
``--json`` keeps stdout for the one JSON object.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from dagrunner.cli.output import printable
from dagrunner.records.evidence import Speed
from dagrunner.records.run import GateResult, RunRecord, Status, failures_first
from dagrunner.report.logtail import read_log, strip_ansi
from dagrunner.units import format_duration, format_size

_MARK = {
    Status.PASSED: "PASS",
    Status.FLAKY: "FLAKY",
    Status.CACHED: "CACHED",
    Status.FAILED: "FAIL",
    Status.TIMED_OUT: "TIMEOUT",
    Status.SKIPPED: "SKIP",
    Status.CANCELLED: "CANCEL",
    Status.INTERRUPTED: "INTR",
}


class Progress:
    """A scheduler listener that prints each gate's start and end.

    On a terminal (``live``: the stream is a TTY and ``CI`` is not set) finished gates print
    as lines and one status line stays at the bottom, repainted in place every ``tick``
    seconds: ``[done/total] running: tests 1m02s, types 12s · waiting 3 · ETA 40s`` (the
    ETA from each gate's expected duration: its history, else its estimate).  Elsewhere
    every start and end is a plain line, and nothing is repainted."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        live: bool | None = None,
        *,
        expected: Mapping[str, float] | None = None,
        slots: float = 1.0,
        tick: float = 0.5,
    ) -> None:
        self.stream = stream or sys.stderr
        if live is None:
            live = self.stream.isatty() and not os.environ.get("CI")
        self.live = live
        self.total = total
        self.done = 0
        self.running: dict[str, float] = {}
        self.finished: set[str] = set()
        self.expected = dict(expected or {})
        self.slots = max(slots, 1.0)
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None
        if self.live:
            self.ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True)
            self.ticker.start()

    def __call__(self, event: str, result: GateResult) -> None:
        with self.lock:
            now = time.monotonic() - self.t0
            if event == "start":
                self.running[result.id] = now
                if not self.live:
                    self._line(f"[{now:7.1f}s] {'start':<7} {result.id}")
            else:
                self.running.pop(result.id, None)
                self.finished.add(result.id)
                self.done += 1
                took = f" ({format_duration(result.duration)})" if result.attempts else ""
                why = f"  {result.reason}" if result.reason and not result.status.ok else ""
                self._line(f"[{now:7.1f}s] {_MARK[result.status]:<7} {result.id}{took}{why}")
            if self.live:
                self._paint()

    def status(self) -> str:
        """The status line's text (without the escape sequences that repaint it)."""
        now = time.monotonic() - self.t0
        running = sorted(self.running.items(), key=lambda item: item[1])
        names = ", ".join(f"{gate} {_clock(now - began)}" for gate, began in running)
        waiting = max(0, self.total - self.done - len(running))
        parts = [f"[{self.done}/{self.total}] running: {names or '-'}", f"waiting {waiting}"]
        eta = self._eta(now)
        if eta is not None:
            parts.append(f"ETA {_clock(eta + 0.999)}")  # rounded up: never "0s" while running
        return " · ".join(parts)

    def _eta(self, now: float) -> float | None:
        """Seconds left: the longest running gate's rest, or all work left over the slots."""
        if not self.expected:
            return None
        rests = [max(self.expected.get(g, 0.0) - (now - b), 0.0) for g, b in self.running.items()]
        waiting = [
            seconds
            for gate, seconds in self.expected.items()
            if gate not in self.running and gate not in self.finished
        ]
        return max([*rests, (sum(rests) + sum(waiting)) / self.slots, 0.0])

    def _paint(self) -> None:
        width = shutil.get_terminal_size((100, 24)).columns - 1
        self.stream.write("\r\x1b[K" + self.status()[:width])
        self.stream.flush()

    def _tick(self, every: float) -> None:
        while not self.stop.wait(every):
            with self.lock:
                self._paint()

    def _line(self, text: str) -> None:
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(f"{prefix}{text}\n")
        self.stream.flush()

    def close(self) -> None:
        """Stop repainting and leave a clean line (also after Ctrl-C)."""
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
        if self.live:
            with self.lock:
                self.stream.write("\r\x1b[K")
                self.stream.flush()


class QueueStatus:
    """While ``integrate run`` drains the queue, on a terminal (as ``Progress`` decides): one
    status line repainted in place, ``[done/total] gating: w1 12s, w2 3s · queued 3``, read
    from the queue's journal (``read``: each item's state) every ``tick`` seconds."""

    ACTIVE = frozenset({"applying", "applied", "gating", "landing"})
    FINAL = frozenset({"landed", "conflict", "gates-failed", "rejected", "withdrawn"})

    def __init__(
        self, read: Callable[[], Mapping[str, str]], stream: TextIO | None = None, tick: float = 0.5
    ) -> None:
        self.read = read
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() and not os.environ.get("CI")
        self.ours = {i for i, state in read().items() if state not in self.FINAL}
        self.since: dict[str, float] = {}
        self.stop = threading.Event()
        self.ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True)
        if self.live:
            self.ticker.start()

    def status(self) -> str:
        states = self.read()
        now = time.monotonic()
        self.ours |= {i for i, state in states.items() if state not in self.FINAL}
        active = [i for i in self.ours if states.get(i) in self.ACTIVE]
        for item in active:
            self.since.setdefault(item, now)
        active.sort(key=lambda item: (self.since[item], item))
        done = sum(states.get(i) in self.FINAL for i in self.ours)
        queued = sum(states.get(i) == "queued" for i in self.ours)
        names = ", ".join(f"{i} {_clock(now - self.since[i])}" for i in active) or "-"
        return f"[{done}/{len(self.ours)}] gating: {names} · queued {queued}"

    def _tick(self, every: float) -> None:
        while not self.stop.wait(every):
            with contextlib.suppress(Exception):  # a journal read mid-write: next time
                width = shutil.get_terminal_size((100, 24)).columns - 1
                self.stream.write("\r\x1b[K" + self.status()[:width])
                self.stream.flush()

    def close(self) -> None:
        self.stop.set()
        if self.live:
            self.ticker.join()
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _clock(seconds: float) -> str:
    """Whole seconds as a terminal shows a running clock: 12s, 1m02s."""
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def summary_table(record: RunRecord, run_dir: str, *, tail_lines: int = 20) -> str:
    """The final table, failures first, the speed evidence, and each failed gate's log tail
    (``tail_lines`` of it)."""
    gates = failures_first(record.gates)

    width = max([len(g.id) for g in gates] + [4])
    lines = [f"{'gate':<{width}}  {'status':<11} {'time':>8} {'peak mem':>9}  note"]
    for gate in gates:
        mem = format_size(gate.peak_rss) if gate.attempts else "-"
        took = format_duration(gate.duration) if gate.attempts else "-"
        lines.append(
            f"{gate.id:<{width}}  {gate.status!s:<11} {took:>8} {mem:>9}  {printable(gate.reason)}"[
                :220
            ]
        )
    speed = record.speed
    lines.append("")
    verdict = (
        f"{record.status.upper()}: {', '.join(f'{n} {k}' for k, n in sorted(record.counts().items()))}"
        f" in {format_duration(record.wall)}"
    )
    counted = [g.tests for g in record.gates if g.tests is not None and not g.tests.problem]
    if counted:
        verdict += (
            f"; tests: {sum(t.tests for t in counted)} run, "
            f"{sum(t.failures + t.errors for t in counted)} failed, "
            f"{sum(t.skipped for t in counted)} skipped"
        )
    envelopes = record.integration.envelopes if record.integration else []
    states = [str(e.state) for e in envelopes]
    if any(state != "landed" for state in states):  # a green run can still leave work behind
        verdict += "; envelopes: " + ", ".join(
            f"{states.count(s)} {s}" for s in sorted(set(states), key=lambda s: (s != "landed", s))
        )
    lines.append(verdict)
    ran = [g for g in record.gates if g.attempts]
    if not ran:
        lines.append(f"nothing ran (no speedup to measure): wall {format_duration(speed.wall)}")
    else:
        lines += speed_lines(speed, [g.waited for g in record.gates])
    if speed.cache_hits:
        lines.append(
            f"cache: {speed.cache_hits} hit(s), {format_duration(speed.cache_saved)} saved"
        )
    for miss in record.budget.misses:
        lines.append(f"BUDGET MISSED: {miss.message}")
    for envelope in envelopes:
        said = envelope.details
        detail = said.commit or ", ".join(said.conflicts or said.failed_gates or ())
        detail = printable(detail or said.reason or "")
        lines.append(f"envelope {envelope.state:<12} {envelope.id}  {detail}")
    lines += failure_tails(record, Path(run_dir), tail_lines=tail_lines)
    # the run's warnings (a gate that read outside its inputs, a cache entry damaged...)
    lines += [f"warning: {printable(warning)}"[:400] for warning in record.warnings]
    lines.append(f"report: {run_dir}/index.html")
    return "\n".join(lines)


def speed_lines(speed: Speed, waits: list[float]) -> list[str]:
    """The speed evidence in words that do not mislead: the governor wait is a sum over gates
    (the longest is named), and a lower bound above the critical path says it is the work."""
    path = speed.critical_path.duration
    bound = speed.lower_bound
    why = (
        f" (work {format_duration(speed.work)} / {speed.capacity_cpu:g} cpu)"
        if bound > path + 1e-9
        else " (the critical path)"
    )
    wait = speed.governor_wait
    waited = (
        f"governor wait {format_duration(wait)} summed over gates, longest "
        f"{format_duration(max(waits, default=0.0))}"
        if wait
        else "no gate waited for the governor"
    )
    return [
        f"wall {format_duration(speed.wall)}, serial sum {format_duration(speed.serial_sum)}, "
        f"speedup {speed.speedup or 0:.2f}x, lower bound {format_duration(bound)}{why} "
        f"(efficiency {speed.efficiency or 0:.0%}), {waited}",
        f"critical path {format_duration(path)}: {' -> '.join(speed.critical_path.gates)}",
    ]


def _failed_tests(gate: GateResult, most: int = 10) -> list[str]:
    """The failed test cases of a gate that wrote a JUnit file: read before its log."""
    from dagrunner.records.failures import case_name

    tests = gate.tests
    if tests is None:
        return []
    if tests.problem:
        return [f"    tests: {tests.problem}"]
    failed = tests.failed
    counted = f"{len(failed)} of {tests.tests}" if tests.source == "junit" else "from its output"
    lines = [f"    failed tests ({counted}):"] if failed else []
    for case in failed[:most]:
        said = case.message.splitlines()[0] if case.message else case.outcome
        lines.append(f"      {case_name(case)}: {said}"[:300])
    if len(failed) > most:
        lines.append(f"      ... and {len(failed) - most} more (junit.xml, the report)")
    return lines


def failure_tails(
    record: RunRecord, run_dir: Path, *, tail_lines: int = 20, checkout: Path | None = None
) -> list[str]:
    """For each failed or timed-out gate: why (a missing command named, with the seed that
    would bring it; a host it could not reach), the last lines of its log, and the log's
    path -- what an engineer reads first, like pytest's short summary.  ``checkout``: the
    caller's (default: where dagrunner runs), where a missing program may be found."""
    from dagrunner.report.diagnose import why_failed

    said = why_failed(record, run_dir, checkout)
    lines: list[str] = []
    for gate in failures_first(record.gates):
        if gate.status not in (Status.FAILED, Status.TIMED_OUT) or not gate.attempts:
            continue
        rel = gate.attempts[-1].log
        text = strip_ansi(read_log(run_dir, rel, limit=64 * 1024)).rstrip()
        tail = [line for line in text.splitlines() if not line.startswith("[dagrunner: ")]
        lines.append("")
        header = f"--- {gate.id} ({gate.status}): {printable(gate.reason)}"
        if gate.id in said:
            header += f"; {said[gate.id]}"
        lines.append(header)
        lines += _failed_tests(gate)
        lines += [f"    {line}"[:300] for line in tail[-tail_lines:]] or ["    (no output)"]
        lines.append(f"    log: {run_dir / rel}")
    return lines
