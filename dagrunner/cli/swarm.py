"""The CLI's handlers for the swarm's calls: doctor, worktrees and the integration queue.

Kept apart from ``commands.py`` (release-check, graph, cache, reports) so that an
orchestrator's many small calls -- allocate, export, submit -- import only what they
use: no networkx, trio, jinja2 or report at start-up (``tests/test_cli.py`` checks).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagrunner.cli.output import emit_json, printable
from dagrunner.errors import ExitCode

if TYPE_CHECKING:
    from dagrunner.cli.console import QueueStatus

# -- doctor and worktrees ------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from dagrunner.doctor import check_cluster, doctor, prove_machine

    report = doctor(args.repo)
    if args.executor != "local":
        check_cluster(report, args.executor)
    proof = prove_machine() if args.prove else None
    if args.json:
        body = {"ok": report.ok, "findings": [f.to_json() for f in report.findings]}
        emit_json({**body, **report.facts, **({"proof": proof.to_json()} if proof else {})})
    else:
        for finding in report.findings:
            print(f"{finding.level:<5} {finding.check:<11} {finding.detail}")
            if finding.hint:
                print(f"{'':<17} -> {finding.hint}")
        if proof is not None:
            print(f"escape suite {proof.suite} as a gate ({proof.containment}):")
            for line in proof.lines:
                print(f"  {'held' if line.held else 'LEAKED':<6} {line.line:<14} {line.detail}")
    if proof is not None and not proof.held:
        return ExitCode.FAILED
    return ExitCode.OK if report.ok else ExitCode.ENVIRONMENT


def _print_pairs(body: dict[str, Any]) -> None:
    """``key  value`` lines, in words rather than Python values (no None, [] or True)."""
    for key, value in body.items():
        print(f"{key:<20} {_human(value)}")


def _human(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(_human(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_human(v)}" for k, v in value.items()) or "none"
    return str(value)


def cmd_worktree(args: argparse.Namespace) -> int:
    from dagrunner.worktrees import allocate as wt
    from dagrunner.worktrees import export as exporting
    from dagrunner.worktrees import lifecycle

    action = args.worktree_command
    body: Any
    if action == "allocate":
        body = wt.allocate(
            mission=args.mission,
            worker=args.worker,
            base=args.base,
            session=args.session,
            repo=args.repo,
            setup=args.setup or (),
            setup_timeout=args.setup_timeout,
        )
    elif action == "list":
        from dagrunner.worktrees.allocate import open_context
        from dagrunner.worktrees.disk import measure

        statuses = lifecycle.list_statuses(repo=args.repo, target=args.target)
        disk = measure(
            open_context(args.repo).root, {s.id: Path(s.path) for s in statuses if not s.missing}
        )
        body = {
            "worktrees": [
                {**s.to_json(), "disk": disk.worktrees[s.id].to_json()}
                if s.id in disk.worktrees
                else s.to_json()
                for s in statuses
            ],
            "disk": disk.to_json(),
            "kept": lifecycle.kept_refs(args.repo),
        }
    elif action == "status":
        from dagrunner.integration.run import overlaps

        body = lifecycle.status(args.id, repo=args.repo, target=args.target)
        found = overlaps(repo=args.repo, target=args.target, only=args.id)
        body["conflicts_with"] = found.conflicts_with(args.id)
    elif action == "overlaps":
        return _overlaps(args)
    elif action == "sync":
        from dagrunner.worktrees.sync import sync

        body = sync(args.id, repo=args.repo, target=args.target, markers=args.markers)
    elif action == "claim":
        body = wt.claim(args.id, session=args.session, force=args.force, repo=args.repo)
    elif action == "release":
        body = wt.release(args.id, session=args.session, force=args.force, repo=args.repo)
    elif action == "cleanup":
        body = lifecycle.cleanup(args.id, force=args.force, repo=args.repo, target=args.target)
    elif action == "prune":
        body = lifecycle.prune(
            idle_days=args.idle,
            dry_run=args.dry_run,
            repo=args.repo,
            target=args.target,
            to_budget=args.to_budget,
        )
    elif action == "export":
        body = exporting.export(args.id, output=args.output, repo=args.repo)
    else:  # pragma: no cover - argparse restricts the choices
        raise AssertionError(action)
    if args.json:
        emit_json(body)
    elif action == "list":
        for status in statuses:
            state = "missing" if status.missing else ("clean" if status.clean else "dirty")
            print(
                f"{status.id:<30} {state:<8} {status.landing:<20} {status.session or '-':<12} "
                f"{status.path}"
            )
        if not statuses:
            print("no worktrees are recorded for this repository (worktree allocate makes one)")
        for kept in body["kept"]:
            print(f"kept on {kept['ref']} ({kept['commit'][:12]}): {kept['restore']}")
    elif action == "prune":
        for item in body["removed"]:
            print(
                f"{'would remove' if body['dry_run'] else 'removed'} {item['id']}: {item['reason']}"
            )
        for item in body["retained"]:
            print(f"retained {item['id']}: {item['reason']}")
    else:
        _print_pairs(body)
    return ExitCode.OK


def _overlaps(args: argparse.Namespace) -> int:
    from dagrunner.integration.run import overlaps

    found = overlaps(repo=args.repo, target=args.target)
    if args.json:
        emit_json(found.to_json())
    else:
        for pair in found.pairs:
            said = "CONFLICT" if pair.conflict else "overlap "
            clean = "" if pair.conflict else "  (merges cleanly)"
            paths = printable(", ".join(pair.paths))
            print(f"{said} {pair.a.name} <-> {pair.b.name}: {paths}{clean}")
        for skipped in found.skipped:
            print(f"not read: {skipped}")
        print(
            f"{len(found.sides) - 1} live side(s) and {found.target}'s tip: "
            f"{len(found.pairs)} overlapping pair(s), "
            f"{sum(p.conflict for p in found.pairs)} conflicting; {found.merges} merge(s)"
        )
    return ExitCode.FAILED if found.conflict else ExitCode.OK


# -- integrate ---------------------------------------------------------------------


def _gate_runs(runs: int, cached: int) -> str:
    """How often the gates ran, in words that do not claim work the cache did."""
    if not runs:
        return "no gate run"
    said = f"{runs} gate run{'s' if runs != 1 else ''}"
    if cached == runs:
        return f"{said}, every gate answered from the cache"
    return f"{said} ({cached} answered wholly from the cache)" if cached else said


def _wait(ids: list[str], submitted: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """``submit --wait``: each envelope's final entry; the exit code of the first in submission
    order that did not land (0 when all landed)."""
    import time

    from dagrunner.integration.events import WAIT_EXIT, final_entry, wait_for

    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    entries = []
    for envelope_id in ids:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        for event in wait_for(envelope_id, repo=args.repo, timeout=left):
            if not args.json:
                print(f"{event.event:<17} {envelope_id}", flush=True)
        entries.append(final_entry(envelope_id, repo=args.repo))
    if args.json:
        emit_json({"submitted": submitted, "outcomes": [e.to_json() for e in entries]})
    codes = [WAIT_EXIT[e.state] for e in entries if e.state in WAIT_EXIT]
    return next((code for code in codes if code != ExitCode.OK), ExitCode.OK)


def _stats(args: argparse.Namespace) -> int:
    from dagrunner.integration.events import queue_stats

    found = queue_stats(repo=args.repo, since=args.since)
    if args.json:
        emit_json(found.to_json())
    elif args.format == "prometheus":
        print(found.to_prometheus(), end="")
    else:
        body = found.to_json()
        waits = body["time_in_queue"]
        outcomes = ", ".join(f"{n} {s}" for s, n in body["outcomes"].items()) or "none ended"
        print(f"{outcomes}; {body['pending']} pending")
        if waits["count"]:
            print(f"time in queue: p50 {waits['p50']}s, p95 {waits['p95']}s ({waits['count']})")
        print(
            f"gate runs: {body['gate_runs']} ({body['gate_runs_per_landed'] or '-'} per landed "
            f"envelope), {body['wasted_gate_runs']} wasted by resets, "
            f"{body['flaky_reruns']} flaky re-runs; {body['overlaps']} overlaps foreseen"
        )
        if body["gate_cpu_seconds"] is not None:
            print(
                f"gate CPU: {body['gate_cpu_seconds']}s "
                f"({body['gate_cpu_per_landed'] or '-'}s per landed envelope)"
            )
    return ExitCode.OK


def cmd_integrate(args: argparse.Namespace) -> int:
    action = args.integrate_command
    if action == "serve":
        from dagrunner.cli.agents import cmd_serve

        return cmd_serve(args)
    if action == "stats":
        return _stats(args)
    if action == "prune":
        from dagrunner.integration.run import DEFAULT_KEEP, prune

        keep = DEFAULT_KEEP if args.keep is None else args.keep
        done = prune(repo=args.repo, dry_run=args.dry_run, keep=keep)
        body = done.to_json()
        if args.json:
            emit_json(body)
        else:
            verb = "would remove" if done.dry_run else "removed"
            print(
                f"{verb} {done.items_before - done.items_after} of {done.items_before} items; "
                f"journal {done.journal_bytes_before} -> {done.journal_bytes_after} bytes; "
                f"{done.envelopes_removed} envelopes, {done.reports_removed} reports, "
                f"{done.inline_removed} inline files, {done.notes_removed} landed proofs; "
                f"ledger {done.ledger_bytes_before} -> {done.ledger_bytes_after} bytes; "
                f"watchers at cursor {done.base} go on"
            )
        return ExitCode.OK
    if action == "submit":
        from dagrunner.git.repo import repo_info
        from dagrunner.integration.submit import submit

        queued = submit(
            repo_info(args.repo),
            args.envelopes,
            target=args.target,
            allow_protected=args.allow_protected,
            priority=args.priority,
            requeue=args.requeue,
        )
        for item in [] if args.json else queued:
            what = "already queued" if item.duplicate else "queued"
            if item.again_of:
                what = f"queued again (after {item.again_of})"
            print(
                f"{what} at position {item.position} for {item.target}: {item.id} "
                f"({item.state}; provenance: {item.provenance})"
            )
            for seen in item.overlaps:
                paths = printable(", ".join(seen.paths))
                print(f"  OVERLAP: conflicts with {seen.other} (queued ahead): {paths}")
        submitted = [item.to_json() for item in queued]
        if not args.wait:
            if args.json:
                emit_json({"submitted": submitted})
            return ExitCode.OK
        return _wait([item.id for item in queued], submitted, args)
    if action == "withdraw":
        from dagrunner.git.repo import repo_info
        from dagrunner.integration.submit import withdraw

        taken = withdraw(repo_info(args.repo), args.item)
        if args.json:
            emit_json(taken)
        else:
            print(f"{taken['id']}: withdrawn" + (" (already)" if taken["already"] else ""))
        return ExitCode.OK
    if action == "watch":
        from dagrunner.integration.events import watch

        for event in watch(
            repo=args.repo, since=args.since, follow=not args.once, timeout=args.timeout
        ):
            if args.json:
                emit_json(event.to_json())
            else:
                print(
                    f"{event.cursor:>8} {event.at or '':<29} {event.event:<17} {event.id}"
                    f"{'  ' + event.details.commit if event.details.commit else ''}",
                    flush=True,
                )
        return ExitCode.OK
    from dagrunner.integration.run import integrate, queue_status

    if action == "status":
        if args.json:
            emit_json(queue_status(repo=args.repo))
            return ExitCode.OK
        from dagrunner.git.repo import repo_info
        from dagrunner.integration.baseline import red_now
        from dagrunner.integration.queue import Queue
        from dagrunner.records.integration import FINAL

        info = repo_info(args.repo)
        queue = Queue.of(info)
        for entry in queue.entries().values():
            said = entry.details  # what failed it, or why it waits
            why = ", ".join(said.failed_gates or ()) if entry.state == "gates-failed" else ""
            tests = said.failed_tests if entry.state == "gates-failed" else None
            why += f" (tests: {', '.join(tests[:5])}{' ...' if tests[5:] else ''})" if tests else ""
            print(f"{entry.id:<50} {entry.state}" + (f"  {printable(why)}" if why else ""))
            if entry.details.stuck and entry.state not in FINAL:
                print(f"  stuck ({entry.details.stuck}): {entry.details.note or ''}")
                print(f"  what to do: {entry.details.hint or ''}")
        for goal, red in red_now(queue, info.root).items():
            line = red.get("said") or f"{goal} itself fails {', '.join(red['fails'])}"
            print(f"target {goal} is red since {str(red['since'])[:12]}: {line}")
        return ExitCode.OK
    shown = None if args.json or args.quiet else _queue_status(args.repo, args.target)
    try:
        result = integrate(
            repo=args.repo,
            target=args.target,
            manifest=args.manifest,
            batch=args.batch,
            wait=not args.no_wait,
            trust_envelope_manifest=args.trust_envelope_manifest,
            executor=args.executor,
            window=args.window,
            confirm_failures=args.confirm_failures,
        )
    finally:
        if shown is not None:
            shown.close()
    if args.json:
        emit_json(result.to_json())
    else:
        for outcome in result.envelopes:
            said = outcome.details
            extra = said.commit or ", ".join(said.conflicts or said.failed_gates or ())
            flaky = said.flaky_gates
            extra = f"{extra or said.reason or ''}" + (
                f"  (flaky: {', '.join(flaky)})" if flaky else ""
            )
            print(f"{outcome.state:<13} {outcome.id}  {printable(extra)}")
            if said.report and said.failed_gates:
                for line in _why_failed(Path(said.report)):
                    print(f"  {line}" if line else "")
        confirmed = f", {result.confirm_runs} re-run to confirm" if result.confirm_runs else ""
        if result.gates_reused and result.cached_runs < result.gate_runs:
            confirmed += f", {result.gates_reused} gate(s) answered from verdicts already computed"
        print(
            f"{result.target}: {result.start[:12]} -> {result.end[:12]}; "
            f"{_gate_runs(result.gate_runs, result.cached_runs)}{confirmed}; "
            f"window {result.window}; report {result.report_dir}"
        )
        for warning in result.warnings:
            print(f"warning: {warning}")
        if result.interrupted:
            print("interrupted: what was in flight is queued again")
        if result.land_blocked:
            blocked = result.land_blocked
            print(f"LANDING REFUSED ({blocked.code}): {blocked.reason} in {blocked.checkout}")
        if result.target_moving:
            print("target-moving: the target kept moving; the rest stays queued")
        if result.checkout_stale:
            stale = result.checkout_stale
            print(
                f"LANDED, BUT THE CHECKOUT {stale.checkout} COULD NOT FOLLOW "
                f"({stale.reason}); restore it with: {stale.command}"
            )
    return result.exit_code


def _queue_status(repo: Path | None, target: str | None) -> QueueStatus:
    """The live line of ``integrate run``: the items of this target, as the journal says."""
    from dagrunner.cli.console import QueueStatus
    from dagrunner.integration.queue import Queue
    from dagrunner.worktrees.allocate import default_target, open_context

    ctx = open_context(repo)
    goal = target or default_target(ctx)
    queue = Queue.of(ctx.info)

    def read() -> dict[str, str]:
        return {i: str(e.state) for i, e in queue.entries().items() if e.target in (None, goal)}

    return QueueStatus(read)


WHY_LINES = 8  # of each failed gate's log, under a gates-failed envelope's line


def _why_failed(run_dir: Path) -> list[str]:
    """Why an envelope's gates failed, as ``release-check`` says it: each failed gate's
    reason, its failed tests and its log's last lines ([] when the run left no record)."""
    from dagrunner.cli.console import failure_tails
    from dagrunner.report.rundir import read_run_dir

    try:
        record = read_run_dir(run_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return failure_tails(record, run_dir, tail_lines=WHY_LINES)
