"""The ``dagrunner`` command: argparse in front of library functions.

Each subcommand parses, calls one API function, prints (text, or one JSON
object with ``--json``) and returns an exit code.  ``run_cli`` turns a
DagrunnerError into its code and message, an interrupt into 130, and anything
else into an "unexpected error" report with the traceback saved to a file.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import io
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dagrunner.cli.output import emit_json
from dagrunner.cli.parsing import Parser, duration, positive_int
from dagrunner.cli.swarm_args import add_integrate, add_worktree
from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.version import VERSION

Handler = Callable[[argparse.Namespace], int]


MANIFEST_HELP = "default: manifests/release.toml, else dagrunner.toml (dagrunner init)"


def _handler(name: str) -> Handler:
    """A command's handler, imported only when that command runs: ``--version`` and ``--help``
    load none of the machinery (networkx, trio, the report)."""
    if name == "cmd_completion":  # it needs the parser, which lives here
        return _completion
    if name in ("cmd_doctor", "cmd_worktree", "cmd_integrate"):
        from dagrunner.cli import swarm as module
    elif name in ("cmd_mcp", "cmd_agents_md"):
        from dagrunner.cli import agents as module  # type: ignore[no-redef]
    else:
        from dagrunner.cli import checks as module  # type: ignore[no-redef]
    found: Handler = getattr(module, name)
    return found


# -- completion ------------------------------------------------------------------


def _completion(args: argparse.Namespace) -> int:
    """A completion script generated from the parser itself (shtab), so it never drifts:
    ``eval "$(dagrunner completion bash)"`` or save it where the shell loads completions."""
    import shtab

    parser = build_parser()
    _paths_complete_as_files(parser, shtab)
    print(shtab.complete(parser, shell=args.shell))
    return ExitCode.OK


def _paths_complete_as_files(parser: argparse.ArgumentParser, shtab: Any) -> None:
    """Every argument typed ``Path`` completes file names."""
    for action in parser._actions:  # argparse keeps no public view of them
        if action.type is Path:
            action.complete = shtab.FILE  # type: ignore[attr-defined]
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _paths_complete_as_files(child, shtab)


# -- parser ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dagrunner",
        description="Run a repository's release gates as a DAG, and integrate parallel work safely.",
    )
    parser.add_argument("--version", action="version", version=f"dagrunner {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    loud = common.add_mutually_exclusive_group()
    loud.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="say less: no output on success (release-check: no progress lines; its final "
        "table still prints); errors always print",
    )
    loud.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say more: an error's details; release-check: longer log tails of failed gates",
    )

    rc = sub.add_parser("release-check", parents=[common], help="run the release gates")
    rc.add_argument("manifest", nargs="?", type=Path, help=MANIFEST_HELP)
    rc.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    rc.add_argument("--jobs", type=positive_int, help="run at most N gates at once")
    rc.add_argument("--report-dir", type=Path, help="the run directory (default reports/<run-id>)")
    rc.add_argument("--no-cache", action="store_true", help="ignore stored gate results")
    rc.add_argument("--only", action="append", metavar="GATE", help="run GATE and what it needs")
    rc.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    rc.add_argument("--executor", default="local", help="local (default) or dask://HOST:PORT")
    rc.add_argument("--dry-run", action="store_true", help="say what would run, what is cached "
                    "(with proof), in which order; run nothing")  # fmt: skip
    rc.add_argument("--reuse-landed", action="store_true", help="answer from HEAD's landed proof")
    rc.add_argument("--target", default="main", help="trust the signers on its tip (main)")
    rc.set_defaults(handler="cmd_release_check")

    it = sub.add_parser("init", parents=[common], help="write a manifest from the project's checks")
    it.add_argument("-o", "--output", type=Path, help="where (default: dagrunner.toml at the root)")
    it.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    it.add_argument("--dry-run", action="store_true", help="print the manifest; write nothing")
    it.set_defaults(handler="cmd_init")

    gr = sub.add_parser("graph", parents=[common], help="show order, levels, critical path")
    gr.add_argument("manifest", nargs="?", type=Path, help=MANIFEST_HELP)
    gr.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    gr.add_argument("--only", action="append", metavar="GATE", help="GATE and what it needs")
    gr.add_argument("--format", choices=["text", "json", "dot"], default="text", help="(text)")
    gr.set_defaults(handler="cmd_graph")

    mc = sub.add_parser("mcp", parents=[common], help="the agents' tools over MCP (stdio)")
    mc.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    mc.add_argument("--worker", metavar="M/W", help="bind the server to this one worktree")
    mc.add_argument(
        "--no-drive",
        action="store_true",
        help="never start an integrator after a submit (one runs as a service)",
    )
    mc.add_argument(
        "--allow-urgent",
        action="store_true",
        help="let dagrunner_submit take priority urgent (unbound servers only; the caller's say)",
    )
    mc.set_defaults(handler="cmd_mcp")
    am = sub.add_parser("agents-md", parents=[common], help="a section for AGENTS.md")
    am.set_defaults(handler="cmd_agents_md")

    dr = sub.add_parser("doctor", parents=[common], help="check git, worktree support and the root")
    dr.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    dr.add_argument(
        "--executor",
        default="local",
        help="also check a cluster: dask://HOST:PORT (its workers, resources and versions)",
    )
    dr.add_argument(
        "--prove",
        action="store_true",
        help="run the sandbox's escape suite as a real gate: each line held or LEAKED (exit 1)",
    )
    dr.set_defaults(handler="cmd_doctor")

    add_worktree(sub, common)
    add_integrate(sub, common)

    ca = sub.add_parser("cache", help="explain or prune the gate cache")
    ca_sub = ca.add_subparsers(dest="cache_command", required=True)
    ex = ca_sub.add_parser("explain", parents=[common], help="why GATE hits or misses")
    ex.add_argument("gate", help="the gate to explain")
    ex.add_argument("manifest", nargs="?", type=Path, help=MANIFEST_HELP)
    ex.add_argument("--repo", type=Path, help="repository (default: the one containing cwd)")
    ex.set_defaults(handler="cmd_cache_explain")
    pr = ca_sub.add_parser("prune", parents=[common], help="bound the cache by size (LRU)")
    pr.add_argument("--max-size", help="e.g. 500M, 2G (needed for the local cache)")
    pr.add_argument("--executor", help="dask://...: bound every worker's store of sources instead")
    pr.add_argument("--max-age", type=duration, help="with --executor: unused this long goes")
    pr.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    pr.set_defaults(handler="cmd_cache_prune")

    rp = sub.add_parser("report", help="re-render a run's report")
    rp_sub = rp.add_subparsers(dest="report_command", required=True)
    html = rp_sub.add_parser("html", parents=[common], help="re-render RUN_DIR/index.html")
    html.add_argument("run_dir", type=Path, help="a run directory (reports/<run-id>)")
    html.set_defaults(handler="cmd_report_html")

    co = sub.add_parser("completion", help="print a shell completion script")
    co.add_argument(
        "shell", choices=["bash", "zsh", "fish", "tcsh"], help="the shell to complete for"
    )
    co.set_defaults(handler="cmd_completion")
    return parser


def wants_json(argv: Sequence[str]) -> bool:
    return "--json" in argv


def _carried(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error a user acts on inside a trio exception group (a coded error, Ctrl-C, a
    full disk), else the group itself (a bug)."""
    wanted = (DagrunnerError, KeyboardInterrupt, OSError)
    found: BaseException | None = group.subgroup(lambda e: isinstance(e, wanted))
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found if found is not None else group


def run_cli(argv: Sequence[str] | None = None, *, program: bool = False) -> int:
    """Run one command; ``program``: this process is the command (``entry``), whose cyclic
    collector is paused until the command's modules are imported."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else ExitCode.BAD_INPUT
    except DagrunnerError as exc:  # a usage error (Parser.error)
        if wants_json(argv):
            emit_json({"error": exc.to_json()})
        else:
            print(exc.render(), file=sys.stderr)
        return exc.exit_code
    hushed = (
        getattr(args, "quiet", False)
        and not getattr(args, "json", False)
        and args.handler != "cmd_release_check"
    )
    try:
        handler = _handler(args.handler)  # a Ctrl-C while it loads is an interrupt too
        if program:  # what the imports made stays, out of the collector's way from now on
            gc.freeze()
            gc.enable()
        with contextlib.redirect_stdout(io.StringIO()) if hushed else contextlib.nullcontext():
            try:
                return handler(args)
            except BaseExceptionGroup as group:  # from a trio nursery: what it carries
                raise _carried(group) from None
    except DagrunnerError as exc:
        if getattr(args, "json", False):
            emit_json({"error": exc.to_json()})
        else:
            print(exc.render(verbose=getattr(args, "verbose", False)), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`dagrunner graph | head`): stop quietly, as shell tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return _crash(argv, args)
        error = DagrunnerError(
            "disk-full",
            f"{exc.strerror}: nothing more could be written",
            where=exc.filename,
            exit_code=ExitCode.ENVIRONMENT,
            hint="free disk space there, then run the command again; "
            "what was journaled before is kept and the rerun resumes",
        )
        if getattr(args, "json", False):
            emit_json({"error": error.to_json()})
        else:
            print(error.render(), file=sys.stderr)
        return error.exit_code
    except Exception:
        return _crash(argv, args)


def _crash(argv: Sequence[str], args: argparse.Namespace) -> int:
    """An unexpected error: a one-line message, and the traceback saved to a file."""
    fd, path = tempfile.mkstemp(prefix="dagrunner-crash-", suffix=".log")
    with os.fdopen(fd, "w") as handle:
        handle.write(f"dagrunner {VERSION}, python {sys.version}\nargv: {argv}\n\n")
        handle.write(traceback.format_exc())
    message = f"unexpected error (a dagrunner bug): {sys.exc_info()[1]!r}; details in {path}"
    if getattr(args, "json", False):
        emit_json({"error": {"code": "internal-error", "message": message, "hint": "report it"}})
    else:
        print(message, file=sys.stderr)
    return 70


def entry() -> None:
    # A command is a process that imports a great deal (networkx, trio, jinja2) and then
    # often does little: the collector, run again and again over the objects the imports
    # make, cost a fully cached run 0.1-0.2 s of its 0.6 s. It is paused while they load.
    gc.disable()
    raise SystemExit(run_cli(program=True))
