"""The swarm's commands on the command line: ``worktree`` and ``integrate`` (their handlers
are in ``swarm.py``, imported only when one runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dagrunner.cli.parsing import Parser, batch, count, duration, priority, window

Subparsers = Any  # argparse's _SubParsersAction, which has no public name


def add_worktree(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    wt = sub.add_parser("worktree", help="worker worktrees under the cache root")
    wt_sub = wt.add_subparsers(dest="worktree_command", required=True)
    repo_opt = Parser(add_help=False)
    repo_opt.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    target_opt = Parser(add_help=False)
    target_opt.add_argument(
        "--target", help="branch that counts as landed (default: the checked-out one)"
    )
    al = wt_sub.add_parser(
        "allocate", parents=[common, repo_opt], help="create (or return) a worktree"
    )
    al.add_argument("--mission", required=True, help="the mission (a safe name)")
    al.add_argument("--worker", required=True, help="the worker (a safe name)")
    al.add_argument("--base", default="HEAD", help="commit to start from (default HEAD)")
    al.add_argument("--session", help="claim it for this session")
    al.add_argument(
        "--setup", action="append", metavar="CMD", help="command to run in the new worktree"
    )
    al.add_argument(
        "--setup-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="per setup step (default 300)",
    )
    wt_sub.add_parser(
        "list", parents=[common, repo_opt, target_opt], help="every recorded worktree"
    )
    st = wt_sub.add_parser("status", parents=[common, repo_opt, target_opt], help="one worktree")
    st.add_argument("id", help="MISSION/WORKER")
    sy = wt_sub.add_parser(
        "sync",
        parents=[common, repo_opt, target_opt],
        help="onto the target's tip, its commits, staged, unstaged and untracked work carried",
    )
    sy.add_argument("id", help="MISSION/WORKER")
    sy.add_argument(
        "--markers",
        action="store_true",
        help="on a conflict, merge anyway and leave markers (landed / yours) in the files",
    )
    wt_sub.add_parser(
        "overlaps",
        parents=[common, repo_opt, target_opt],
        help="which live work would conflict (exit 1 when any does)",
    )
    for name, text in (("claim", "claim for a session"), ("release", "release a session's claim")):
        cl = wt_sub.add_parser(name, parents=[common, repo_opt], help=text)
        cl.add_argument("id", help="MISSION/WORKER")
        cl.add_argument("--session", required=True, help="the session that claims or releases")
        cl.add_argument("--force", action="store_true", help="even when another session holds it")
    cu = wt_sub.add_parser(
        "cleanup", parents=[common, repo_opt, target_opt], help="remove if clean and landed"
    )
    cu.add_argument("id", help="MISSION/WORKER")
    cu.add_argument(
        "--force", action="store_true", help="remove even with work (saved on a backup ref)"
    )
    exp = wt_sub.add_parser("export", parents=[common, repo_opt], help="write its patch envelope")
    exp.add_argument("id", help="MISSION/WORKER")
    exp.add_argument("-o", "--output", type=Path, help="default: .git/dagrunner/exports/<id>.json")
    pn = wt_sub.add_parser(
        "prune", parents=[common, repo_opt, target_opt], help="drop stale worktrees"
    )
    pn.add_argument(
        "--idle", type=float, metavar="DAYS", help="also clean unclaimed worktrees idle this long"
    )
    pn.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    pn.add_argument(
        "--to-budget",
        action="store_true",
        help="then clean landed or idle worktrees, oldest first, until under max_disk",
    )
    wt.set_defaults(handler="cmd_worktree")
    for parser_ in wt_sub.choices.values():
        parser_.set_defaults(handler="cmd_worktree")


def add_integrate(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    repo_opt = Parser(add_help=False)
    repo_opt.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    ig = sub.add_parser("integrate", help="the integration queue")
    ig_sub = ig.add_subparsers(dest="integrate_command", required=True)
    sb = ig_sub.add_parser("submit", parents=[common, repo_opt], help="queue patch envelopes")
    sb.add_argument("envelopes", nargs="+", type=Path, metavar="ENVELOPE", help="files to queue")
    sb.add_argument("--target", metavar="BRANCH", help="the branch they are for (default: HEAD's)")
    sb.add_argument("--allow-protected", action="store_true", help="may touch protected paths")
    sb.add_argument(
        "--requeue",
        action="store_true",
        help="queue again an envelope whose item ended gates-failed, rejected or withdrawn (a "
        "new item; "
        "the old one keeps its verdict)",
    )
    sb.add_argument(
        "--priority",
        type=priority,
        default=0,
        metavar="N|urgent",
        help="higher first (default 0, stable within a priority); urgent: before all, and "
        "what gates behind it is reset",
    )
    sb.add_argument(
        "--wait",
        action="store_true",
        help="return when every envelope reached a final state (whoever runs the integrator); "
        "exit 0 landed, 1 gates-failed, 4 conflict, 2 rejected",
    )
    sb.add_argument("--timeout", type=duration, metavar="DUR", help="with --wait: exit 124 after")
    wa = ig_sub.add_parser(
        "watch", parents=[common, repo_opt], help="follow the queue's events (JSON Lines)"
    )
    wa.add_argument(
        "--since",
        type=count,
        default=0,
        metavar="CURSOR",
        help="start after the event with this cursor (default: from the first event)",
    )
    wa.add_argument("--once", action="store_true", help="print what happened so far, then stop")
    wa.add_argument("--timeout", type=duration, metavar="DUR", help="stop following after DUR")
    ir = ig_sub.add_parser("run", parents=[common, repo_opt], help="apply, gate and land the queue")
    ir.add_argument("--target", help="branch to land on (default: the main checkout's branch)")
    ir.add_argument(
        "--manifest",
        type=Path,
        help="gates to run: a path in the target's head (default manifests/release.toml), "
        "or an absolute path to your own file; never read from the tree under test",
    )
    ir.add_argument(
        "--executor",
        default="local",
        help="where the gates run: local (default; dask:// is refused until remote gates get "
        "the tree's environment: docs/distributed.md)",
    )
    ir.add_argument(
        "--trust-envelope-manifest",
        action="store_true",
        help="single-user set-ups only: read the manifest from the tree under test",
    )
    ir.add_argument(
        "--batch",
        type=batch,
        help="envelopes gated together, bisected on failure: N, or auto (sized from the "
        "queue's recent outcomes); default: the manifest's [integrate] batch, else auto",
    )
    ir.add_argument(
        "--window",
        type=window,
        help="queue items gated at once, each on the speculative head of those ahead "
        "(default: the manifest's [integrate] window, else adaptive: what the governor holds)",
    )
    ir.add_argument(
        "--confirm-failures",
        type=count,
        metavar="N",
        help="re-runs of failed gates on the same tree before an item is blamed (default 1)",
    )
    ir.add_argument(
        "--no-wait", action="store_true", help="fail instead of waiting for another integrator"
    )
    sv = ig_sub.add_parser(
        "serve", parents=[common, repo_opt], help="the integrator as a service (until SIGTERM)"
    )
    sv.add_argument("--target", metavar="BRANCH", help="the branch to land on (default: HEAD's)")
    sv.add_argument("--executor", default="local", help="where gates run (local only, for now)")
    sv.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and the MCP tools at /mcp (loopback unless HOST says)",
    )
    sv.add_argument(
        "--token-file",
        type=Path,
        metavar="F",
        help="/mcp answers only 'Authorization: Bearer <F's content>' (no file: no /mcp)",
    )
    sv.add_argument(
        "--prune-every",
        type=duration,
        metavar="DUR",
        help="prune the queue's state (integrate prune) whenever idle and DUR has passed",
    )
    sv.add_argument(
        "--prune-keep",
        type=duration,
        metavar="DUR",
        help="with --prune-every: final items younger than DUR are kept (default 7d)",
    )
    pr = ig_sub.add_parser(
        "prune", parents=[common, repo_opt], help="compact the journal; drop old final items"
    )
    pr.add_argument(
        "--keep", type=duration, metavar="DUR", help="keep final items younger than DUR (7d)"
    )
    pr.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    ig_sub.add_parser("status", parents=[common, repo_opt], help="every envelope's state")
    wd = ig_sub.add_parser(
        "withdraw", parents=[common, repo_opt], help="take a queue item back before it lands"
    )
    wd.add_argument("item", metavar="ID", help="the queue item (as submit answered it)")
    stats = ig_sub.add_parser("stats", parents=[common, repo_opt], help="how the queue does")
    stats.add_argument("--since", type=duration, metavar="DUR", help="only the last DUR (1h, 7d)")
    stats.add_argument("--format", choices=["text", "prometheus"], default="text", help="(text)")
    for parser_ in ig_sub.choices.values():
        parser_.set_defaults(handler="cmd_integrate")
