"""The CLI's handlers: release-check, graph, cache, doctor, worktrees, the integration
queue and reports.

Each handler takes the parsed arguments, calls one library function, prints
text or one JSON object (``--json``) and returns an exit code; ``cli.py``
builds the parser and turns errors into codes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from dagrunner.cli.console import Progress, summary_table
from dagrunner.cli.output import emit_json
from dagrunner.engine.graph import (
    build_graph,
    describe,
    expected_durations,
    render_dot,
    render_text,
)
from dagrunner.engine.graph import select as select_gates
from dagrunner.engine.plan import RunOptions
from dagrunner.engine.steps import load_step
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.manifest.load import Manifest
from dagrunner.records.run import RunStatus
from dagrunner.report.ci import commands_off, publish

if TYPE_CHECKING:
    from dagrunner.worktrees.seedstores import Pruned
from dagrunner.swarm.release import release_check
from dagrunner.units import format_duration


def cmd_release_check(args: argparse.Namespace) -> int:
    options = RunOptions(
        repo=args.repo,
        manifest=args.manifest,
        report_dir=args.report_dir,
        jobs=args.jobs,
        only=tuple(args.only or ()),
        fail_fast=args.fail_fast,
        no_cache=args.no_cache,
        executor=args.executor,
        reuse_landed=args.reuse_landed,
        target=args.target,
    )
    if args.dry_run:
        return _dry_run(options, as_json=args.json)
    repo, manifest = load_step(options)  # loaded once: the run gets it
    progress = None if args.quiet else _progress(repo, manifest, options)
    options = replace(options, loaded=manifest, listener=progress)
    try:
        record, run_dir = release_check(options)
    finally:
        if progress is not None:
            progress.close()
    publish(record, run_dir, os.environ, sys.stderr if args.json else sys.stdout)
    if args.json:
        body = record.to_json()
        body["run_dir"] = str(run_dir)
        body.pop("governor", None)  # samples belong in run.json, not on an orchestrator's stdout
        emit_json(body)
    else:
        with commands_off(os.environ, sys.stdout):  # the summary quotes gates' logs
            print(summary_table(record, str(run_dir), tail_lines=100 if args.verbose else 20))
    if record.status is RunStatus.INTERRUPTED:
        return ExitCode.INTERRUPTED
    return ExitCode.OK if record.status is RunStatus.PASSED else ExitCode.FAILED


def _progress(repo: Path, manifest: Manifest, options: RunOptions) -> Progress:
    """Live progress, with each gate's expected duration for the ETA (as the plan sees it)."""
    from dagrunner.engine import shards
    from dagrunner.engine.governor import resolve_capacity
    from dagrunner.engine.history import history_path, read_history

    graph = build_graph(manifest)
    if options.only:
        graph = select_gates(graph, shards.only(options.only, manifest), where=str(manifest.path))
    expected = expected_durations(graph, read_history(history_path(repo, manifest.name)))
    slots = resolve_capacity(manifest.governor, jobs=options.jobs).cpu
    return Progress(total=graph.number_of_nodes(), expected=expected, slots=slots)


def _dry_run(options: RunOptions, *, as_json: bool) -> int:
    from dagrunner.engine.dry_run import dry_run

    body = dry_run(options)
    if as_json:
        emit_json(body)
        return ExitCode.OK
    width = max([len(g) for g in body["gates"]] + [4])
    print(f"{'gate':<{width}}  {'would':<7} {'expected':>9}  needs")
    for gate in body["order"]:
        info = body["gates"][gate]
        needs = ", ".join(info["needs"]) or "-"
        print(
            f"{gate:<{width}}  {info['action']:<7} {format_duration(info['expected']):>9}  {needs}"
        )
    crit = body["critical_path"]
    print(
        f"\ndry run: {body['would_run']} would run, {body['cached']} cached; expected critical "
        f"path {format_duration(crit['expected'])}: {' -> '.join(crit['gates']) or '-'}"
    )
    return ExitCode.OK


# -- init ----------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from dagrunner.git.repo import resolve_repo
    from dagrunner.starter.write import init

    # --json without -o answers with the gates and writes nothing (README: init).
    preview = args.dry_run or (args.json and args.output is None)
    started = init(resolve_repo(args.repo), args.output, dry_run=preview)
    if args.json:
        emit_json(started.to_json())
    elif args.dry_run:
        print(started.text, end="")
    elif not args.quiet:
        gates = ", ".join(c.id for c in started.found.checks)
        print(f"wrote {started.path}: {len(started.found.checks)} gates ({gates})")
        if started.found.skipped:
            print(
                f"left out (why: at the end of the manifest): {', '.join(s.id for s in started.found.skipped)}"
            )
        if started.missing:
            print(
                f"not on PATH here (those gates fail until installed): {', '.join(started.missing)}"
            )
        said = started.to_json()["gates"]
        if online := [g["id"] for g in said if g["network"] and not g["commented_out"]]:
            print(
                f'needs the network: {", ".join(online)} (network = "host"): where gates run '
                "offline, comment them out -- every tree fails them there, and nothing lands"
            )
        for check in started.found.checks:
            if check.junit and ".gitignore" in check.note:  # the edit its comment asks for
                print(f"{check.note} (gate {check.id})")
        for seed in started.found.seeds:
            if not seed.ignored or seed.why_off:  # written commented out: the edit is theirs
                why = seed.why_off or f"no committed ignore rule covers {seed.path}/"
                print(f"seed {seed.path} written commented out (its comment says more): {why}")
        print("next: dagrunner release-check --dry-run, then dagrunner release-check")
    return ExitCode.OK


# -- graph ---------------------------------------------------------------------


def cmd_graph(args: argparse.Namespace) -> int:
    _, manifest = load_step(RunOptions(repo=args.repo, manifest=args.manifest))
    graph = build_graph(manifest)
    if args.only:
        graph = select_gates(graph, args.only, where=str(manifest.path))
    durations = expected_durations(graph, {})
    if args.format == "json" or args.json:
        emit_json(describe(graph, durations))
    elif args.format == "dot":
        print(render_dot(graph, durations))
    else:
        print(render_text(graph, durations))
    return ExitCode.OK


# -- cache -----------------------------------------------------------------------


def cmd_cache_explain(args: argparse.Namespace) -> int:
    from dagrunner.engine.dry_run import explain_gate
    from dagrunner.engine.steps import plan_step

    options = RunOptions(repo=args.repo, manifest=args.manifest)
    repo, manifest = load_step(options)
    plan = plan_step(repo, manifest, options)
    if args.gate not in plan.graph:
        select_gates(plan.graph, [args.gate], where=str(manifest.path))  # raises unknown-gate
    body = explain_gate(
        manifest=manifest, graph=plan.graph, repo=repo, envs=plan.envs, gate=args.gate
    )
    if args.json:
        emit_json(body)
    else:
        state = "hit" if body["hit"] else "miss"
        print(f"{args.gate}: {state}; key {body['key'] or '-'}")
        for line in body["changes"]:
            print(f"  {line}")
        landed = body["landed"]
        whose = f" on {landed['commit'][:12]} by {landed['signer']}" if "signer" in landed else ""
        answers = "answers" if landed["answers"] else "does not answer"
        print(f"  landed proof{whose}: {answers} it with --reuse-landed ({landed['why']})")
    return ExitCode.OK


def cmd_cache_prune(args: argparse.Namespace) -> int:
    from dagrunner.engine.cache import Store
    from dagrunner.git.repo import cache_root
    from dagrunner.process import racy
    from dagrunner.units import parse_size

    limit = None
    if args.max_size is not None:
        try:
            limit = parse_size(args.max_size)
        except ValueError as exc:
            raise DagrunnerError(
                "bad-size", str(exc), key="--max-size", hint="use a size such as 500M or 2G"
            ) from None
    if args.executor:
        return _prune_workers(args, limit)
    if limit is None:
        raise DagrunnerError(
            "bad-size",
            "the local cache is bounded by size: --max-size is needed",
            key="--max-size",
            hint="e.g. dagrunner cache prune --max-size 2G (or --executor dask://... for workers)",
        )
    body = Store().prune(limit, dry_run=args.dry_run)
    body["racy_records"] = len(racy.prune(cache_root() / "racy", dry_run=args.dry_run))
    seeds = _prune_seeds(limit, dry_run=args.dry_run)
    if seeds is not None:
        body["seeds"] = seeds.to_json()
    if args.json:
        emit_json(body)
    else:
        verb = "would remove" if args.dry_run else "removed"
        print(
            f"{verb} {len(body['removed'])} entries; {body['entries_left']} left, "
            f"{body['size_after']} bytes; {body['racy_records']} records of trees gone"
        )
        if seeds is not None:
            print(
                f"seeds: {verb} {len(seeds.removed)}, {seeds.in_use_kept} in use kept; "
                f"{seeds.size_after} bytes"
            )
    return ExitCode.OK


def _prune_seeds(limit: int, *, dry_run: bool) -> Pruned | None:
    """This repository's dependency seeds bounded by ``limit`` too (None outside a repository)."""
    from dagrunner.worktrees.allocate import open_context
    from dagrunner.worktrees.seedstores import prune

    try:
        ctx = open_context(None)
    except DagrunnerError:
        return None
    return prune(ctx.root, limit, dry_run=dry_run)


def _prune_workers(args: argparse.Namespace, limit: int | None) -> int:
    """Every worker's store of shipped sources, bounded by age and size (their own bounds
    where none is given)."""
    from dagrunner.executors.dask import DaskExecutor

    if args.dry_run:
        raise DagrunnerError(
            "bad-executor",
            "--dry-run is not offered for workers' stores",
            key="--dry-run",
            hint="run without --dry-run; only unused checkouts and sources are removed",
        )
    executor = DaskExecutor(args.executor)
    try:
        done = executor.prune_stores(args.max_age, limit)
    finally:
        executor.close()
    workers = {
        address: dataclasses.asdict(found) if not isinstance(found, str) else {"problem": found}
        for address, found in done.items()
    }
    if args.json:
        emit_json({"workers": workers})
    else:
        for address, body in workers.items():
            if "problem" in body:
                print(f"{address}: could not prune: {body['problem']}")
                continue
            print(
                f"{address}: removed {len(body['removed'])} checkouts and "
                f"{body['dropped_refs']} sources ({body['busy']} in use kept); "
                f"{body['size_before']} -> {body['size_after']} bytes"
            )
    failed = any("problem" in body for body in workers.values())
    return ExitCode.FAILED if failed else ExitCode.OK


# -- report ----------------------------------------------------------------------


def cmd_report_html(args: argparse.Namespace) -> int:
    from dagrunner.report.html import write_html
    from dagrunner.report.rundir import read_run_dir

    run_dir: Path = args.run_dir
    if not (run_dir / "run.json").is_file():
        raise DagrunnerError(
            "run-dir-invalid",
            "no run.json in this directory",
            where=str(run_dir),
            hint="pass a run directory written by release-check (reports/<run-id>)",
        )
    try:
        record = read_run_dir(run_dir)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DagrunnerError(
            "run-dir-invalid",
            f"run.json cannot be read: {exc}",
            where=str(run_dir / "run.json"),
            hint="re-run release-check to produce a fresh run directory",
        ) from None
    write_html(record, run_dir)
    if args.json:
        emit_json({"html": str(run_dir / "index.html")})
    else:
        print(run_dir / "index.html")
    return ExitCode.OK
