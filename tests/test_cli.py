"""The CLI surface: graph formats, --json output, report re-rendering, usage errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import CLI, check, commit_release_manifest, run_json, write_manifest

from dagrunner.cli.main import run_cli
from dagrunner.report.rundir import default_runs

DIAMOND = """
    [gates.a]
    run = ["true"]
    estimate = "1s"
    [gates.b]
    run = ["true"]
    needs = ["a"]
    estimate = "3s"
    [gates.c]
    run = ["true"]
    needs = ["a"]
    [gates.d]
    run = ["true"]
    needs = ["b", "c"]
"""


def test_graph_json(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_manifest(repo, DIAMOND)
    code, body = run_json(capsys, "graph", str(path))
    assert code == 0
    assert body["levels"] == [["a"], ["b", "c"], ["d"]]
    assert body["critical_path"] == {"gates": ["a", "b", "d"], "duration": 5.0}
    assert body["order"][0] == "a" and body["order"][-1] == "d"


def test_graph_text_and_dot(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_manifest(repo, DIAMOND)
    assert run_cli(["graph", str(path)]) == 0
    text = capsys.readouterr().out
    assert "critical path (5.0s expected): a -> b -> d" in text
    assert run_cli(["graph", str(path), "--format", "dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph") and '"a" -> "b" [color=red' in dot


def test_graph_runs_nothing(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_manifest(repo, '[gates.a]\nrun = ["touch", "ran"]\n')
    assert run_cli(["graph", str(path)]) == 0
    assert not (repo / "ran").exists()


def test_release_check_json_summary(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body, run_dir = check(capsys, repo, DIAMOND)
    assert code == 0
    assert body["status"] == "passed"
    assert body["counts"] == {"passed": 4}
    assert set(body["speed"]) >= {"wall", "serial_sum", "speedup", "critical_path", "lower_bound"}
    run = orjson.loads((run_dir / "run.json").read_bytes())
    assert run["manifest"]["digest"] and run["git"]["commit"]
    assert run["governor"]["capacity"]["cpu"] >= 1
    for name in ("a", "b", "c", "d"):
        assert (run_dir / "gates" / f"{name}.json").exists()
        assert (run_dir / "logs" / f"{name}.log").exists()


def test_a_gate_whose_program_is_missing_stops_the_run_before_any_gate_starts(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = """
[gates.first]
run = "touch ran-first"

[gates.lint]
run = ["no-such-linter-here", "."]
needs = ["first"]
"""
    code, body, _ = check(capsys, repo, manifest)
    assert code == 3, body
    assert body["error"]["code"] == "gate-program-missing"
    assert "no-such-linter-here" in body["error"]["message"] and "lint" in body["error"]["message"]
    assert not (repo / "ran-first").exists()


WALKER = """
[gates.walk]
run = "! find . -path ./.git -prune -o -type f -print | grep -E 'run[.]json|index[.]html|[.]log$|junit'"
"""


def test_a_gate_that_walks_the_tree_never_meets_dagrunners_output_run_after_run(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """codespell, prettier --check . and the like walk the tree without reading nested
    .gitignore files: the run's own log, an earlier run's pages must not be there."""
    for _ in range(2):
        code, body, _ = check(capsys, repo, WALKER, "--no-cache")
        assert code == 0, body


def test_default_report_dir_is_out_of_the_tree_and_report_dir_keeps_one_in_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _code, _body, run_dir = check(capsys, repo, DIAMOND)
    runs = repo / ".git" / "dagrunner" / "reports"
    assert run_dir.parent == runs and not (repo / "reports").exists()
    assert (runs / "latest").resolve() == run_dir.resolve()
    _, _, second = check(capsys, repo, DIAMOND)
    assert (runs / "latest" / "run.json").resolve() == (second / "run.json").resolve()
    _, _, kept = check(capsys, repo, '[report]\ndir = "reports"\n' + DIAMOND)
    assert kept.parent == repo / "reports" and (repo / "reports" / "latest").is_symlink()


def test_report_dir_refuses_foreign_files(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    code, body, _ = check(capsys, repo, DIAMOND, "--report-dir", str(target))
    assert code == 2
    assert body["error"]["code"] == "report-dir-not-empty"
    assert (target / "notes.txt").read_text() == "keep me"


def test_report_html_rerenders(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, run_dir = check(capsys, repo, DIAMOND)
    (run_dir / "index.html").unlink()
    code, _body = run_json(capsys, "report", "html", str(run_dir))
    assert code == 0
    assert (run_dir / "index.html").exists()


def test_report_html_on_a_non_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body = run_json(capsys, "report", "html", str(tmp_path))
    assert code == 2
    assert body["error"]["code"] == "run-dir-invalid"


def test_bad_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["release-check", "--jobs", "0"]) == 2
    assert run_cli(["no-such-command"]) == 2


def test_python_dash_m_works(repo: Path) -> None:
    write_manifest(repo, DIAMOND)
    proc = subprocess.run(
        [*CLI, "graph", "m.toml", "--json"],
        cwd=repo,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0
    assert orjson.loads(proc.stdout)["critical_path"]["gates"] == ["a", "b", "d"]


def test_closed_pipe_is_not_a_crash(repo: Path) -> None:
    write_manifest(repo, DIAMOND)
    proc = subprocess.Popen(
        [*CLI, "graph", "m.toml"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away before dagrunner writes
    _, err = proc.communicate(timeout=30)
    assert b"unexpected error" not in err and b"Traceback" not in err


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_load_none_of_the_machinery(flag: str) -> None:
    """Start-up cost is imports: --version and --help must not pull in networkx, trio,
    jinja2 or psutil (measured: 0.41 s before, 0.10 s after; the figure is in
    docs/benchmarks.md, not asserted here)."""
    probe = (
        "import sys\n"
        "from dagrunner.cli.main import run_cli\n"
        f"code = run_cli([{flag!r}])\n"
        "heavy = sorted(m for m in ('networkx', 'trio', 'jinja2', 'psutil') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


def test_reports_and_the_cache_never_show_in_git_status(tmp_path: Path) -> None:
    repo = tmp_path / "fresh"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "README").write_text("x\n")
    (repo / "m.toml").write_text('[gates.a]\nrun = ["true"]\ninputs = ["README"]\n')
    proc = subprocess.run(
        [*CLI, "release-check", "m.toml", "--quiet"], cwd=repo, capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert status.split() == ["??", "README", "??", "m.toml"], status
    runs = default_runs(repo)
    assert (runs / "CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f59")
    cache = Path(os.environ["DAGRUNNER_CACHE_DIR"])
    assert (cache / "CACHEDIR.TAG").exists() and (cache / ".gitignore").exists()


def test_failed_gate_summary_shows_its_log_tail_and_path(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_manifest(
        repo,
        """
        [gates.unit]
        run = "for i in $(seq 1 30); do echo line $i; done; echo 'AssertionError: 2 != 3'; exit 1"
        [gates.tool]
        run = "nosuchtool --flag"
        [gates.fine]
        run = ["true"]
        """,
    )
    assert run_cli(["release-check", str(path), "--repo", str(repo)]) == 1
    out = capsys.readouterr().out
    unit = out[out.index("--- unit (failed): exit code 1") :]
    assert "    AssertionError: 2 != 3" in unit and "    line 30" in unit
    assert "    line 10\n" not in unit  # bounded: the last 20 lines
    assert "    log: " in unit and unit.split("    log: ")[1].split("\n")[0].endswith("unit.log")
    assert "--- tool (failed): exit code 127; command not found: nosuchtool" in out
    assert "--- fine" not in out


def test_usage_errors_keep_their_message_and_name_the_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, body = run_json(capsys, "worktree", "list", "--bogus")
    assert code == 2 and body["error"]["code"] == "bad-usage"
    assert body["error"]["message"] == "unrecognized arguments: --bogus"
    assert body["error"]["hint"].startswith("usage: dagrunner worktree list ")
    assert run_cli(["relase-check"]) == 2
    err = capsys.readouterr().err
    assert "error[bad-usage]" in err and "did you mean 'release-check'?" in err
    assert "Traceback" not in err


def test_summary_figures_say_what_they_are(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_manifest(
        repo,
        """
        [governor]
        cpu = 2
        max_load = 1000
        [gates.a]
        run = ["sleep", "0.3"]
        cpu = 2
        [gates.b]
        run = ["sleep", "0.3"]
        cpu = 2
        [gates.c]
        run = ["true"]
        inputs = ["README"]
        """,
    )
    assert run_cli(["release-check", str(path), "--repo", str(repo), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "/ 2 cpu)" in out  # the lower bound is the work here, not the critical path
    assert "summed over gates, longest" in out  # a sum is called a sum
    only = ["--only", "c"]
    assert run_cli(["release-check", str(path), "--repo", str(repo), "--quiet", *only]) == 0
    out = capsys.readouterr().out
    assert "nothing ran (no speedup to measure)" in out and "speedup 0.00x" not in out
    assert "cache: 1 hit(s)" in out


def test_dry_run_says_what_would_run_and_what_is_cached_and_runs_nothing(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_manifest(
        repo,
        """
        [gates.a]
        run = ["touch", "ran-a"]
        inputs = ["README"]
        [gates.b]
        run = ["touch", "ran-b"]
        needs = ["a"]
        """,
    )
    code, body = run_json(capsys, "release-check", str(path), "--repo", str(repo), "--dry-run")
    assert code == 0 and body["dry_run"] is True
    assert {g: i["action"] for g, i in body["gates"].items()} == {"a": "run", "b": "run"}
    assert body["order"] == ["a", "b"] and body["critical_path"]["gates"] == ["a", "b"]
    assert not (repo / "ran-a").exists() and not default_runs(repo).exists()
    assert run_cli(["release-check", str(path), "--repo", str(repo), "--quiet"]) == 0
    capsys.readouterr()
    (repo / "ran-a").unlink()
    code, body = run_json(capsys, "release-check", str(path), "--repo", str(repo), "--dry-run")
    assert body["gates"]["a"]["action"] == "cached" and body["gates"]["a"]["cache"]["hit"] is True
    assert body["gates"]["b"]["cache"]["cacheable"] is False  # no inputs: always runs
    assert body["would_run"] == 1 and body["cached"] == 1 and not (repo / "ran-a").exists()


def test_progress_lines_keep_the_mark_and_the_gate_apart() -> None:
    import io

    from dagrunner.cli.console import Progress
    from dagrunner.records.run import GateResult, Status

    out = io.StringIO()
    progress = Progress(total=1, stream=out, live=False)
    progress("start", GateResult(id="esc", status=Status.PASSED))
    progress("end", GateResult(id="esc", status=Status.TIMED_OUT, reason="timed out"))
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("] start   esc") and "] TIMEOUT esc" in lines[1]


def test_every_option_and_argument_has_help_text() -> None:
    import argparse

    from dagrunner.cli.main import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}")
            elif not action.help:
                missing.append(f"{name} {(action.option_strings or [action.dest])[-1]}")

    walk(build_parser(), "dagrunner")
    assert not missing, missing


def test_human_output_shows_words_not_python_values(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run_cli(["worktree", "allocate", "--mission", "m", "--worker", "w", "--repo", str(repo)])
        == 0
    )
    out = capsys.readouterr().out
    assert "None" not in out and "[]" not in out and "False" not in out
    assert "session              -" in out and "copied               none" in out


def _complete(words: list[str]) -> list[str]:
    """What bash offers after ``words`` with dagrunner's generated completion loaded."""
    script = subprocess.run(
        [*CLI, "completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    line = " ".join(words)
    probe = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; "
        'COMP_POINT=${#COMP_LINE}; _shtab_dagrunner; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_bash_completion_offers_commands_options_and_choices() -> None:
    assert "release-check" in _complete(["dagrunner", "rel"])
    assert "--fail-fast" in _complete(["dagrunner", "release-check", "--fa"])
    assert _complete(["dagrunner", "graph", "--format", ""]) == ["text", "json", "dot"]
    assert "allocate" in _complete(["dagrunner", "worktree", "al"])


def test_every_shell_gets_a_script_naming_the_commands() -> None:
    for shell in ("bash", "zsh", "fish", "tcsh"):
        out = subprocess.run(
            [*CLI, "completion", shell], capture_output=True, text=True, check=True
        ).stdout
        assert "release-check" in out and "integrate" in out, shell


def test_integrate_says_when_the_cache_answered_every_gate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_release_manifest(
        repo, '[gates.readme]\nrun = "grep -q hello README"\ninputs = ["README"]\n'
    )
    base = ["--repo", str(repo)]
    lines = []
    for worker in ("a", "b"):
        _, made = run_json(
            capsys, "worktree", "allocate", "--mission", "m", "--worker", worker, *base
        )
        (Path(made["path"]) / f"{worker}.txt").write_text("x\n")
        out = str(repo.parent / f"{worker}.json")
        run_json(capsys, "worktree", "export", f"m/{worker}", "-o", out, *base)
        run_json(capsys, "integrate", "submit", out, *base)
        assert run_cli(["integrate", "run", *base]) == 0
        lines.append(capsys.readouterr().out)
    assert "1 gate run;" in lines[0] and "cache" not in lines[0]
    assert "1 gate run, every gate answered from the cache;" in lines[1]


def test_quiet_and_verbose_on_every_command(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--repo", str(repo)]
    assert run_cli(["worktree", "allocate", "--mission", "m", "--worker", "w", "-q", *base]) == 0
    assert capsys.readouterr().out == ""  # success says nothing with -q
    take = ["worktree", "claim", "m/w", "--session", "other", *base]
    run_cli(["worktree", "claim", "m/w", "--session", "mine", *base])
    capsys.readouterr()
    assert run_cli([*take, "-q"]) == 4
    quiet = capsys.readouterr()
    assert quiet.out == "" and "error[claimed]" in quiet.err and "owner:" not in quiet.err
    assert run_cli([*take, "-v"]) == 4
    assert "  owner: mine" in capsys.readouterr().err  # -v: the error's details
    noisy = write_manifest(repo, '[gates.noisy]\nrun = "seq 1 60; exit 1"\n')
    assert run_cli(["release-check", str(noisy), *base, "-q"]) == 1
    short = capsys.readouterr().out
    assert run_cli(["release-check", str(noisy), *base, "-q", "-v"]) == 2  # one or the other
    capsys.readouterr()
    assert run_cli(["release-check", str(noisy), *base, "-v"]) == 1
    long = capsys.readouterr().out
    assert "    41\n" in short and "    40\n" not in short  # the last 20 lines
    assert "    1\n" in long and "    60\n" in long  # -v: up to 100


def test_a_swarms_small_calls_load_none_of_the_machinery(repo: Path, tmp_path: Path) -> None:
    """allocate, export and submit are what an orchestrator calls hundreds of times: none of
    them imports networkx, trio, jinja2 or the report (psutil is allowed: lifecycle reads
    processes)."""
    envelope = tmp_path / "e.json"
    calls = [
        ["worktree", "allocate", "--mission", "m", "--worker", "w", "--repo", str(repo)],
        ["worktree", "export", "m/w", "-o", str(envelope), "--repo", str(repo)],
        ["integrate", "submit", str(envelope), "--repo", str(repo)],
    ]
    for argv in calls:
        probe = (
            "import sys\n"
            "from dagrunner.cli.main import run_cli\n"
            f"code = run_cli({argv!r})\n"
            "heavy = sorted(m for m in ('networkx', 'trio', 'jinja2', 'dagrunner.report.html') "
            "if m in sys.modules)\n"
            "print(code, heavy)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )
        assert proc.stdout.strip().splitlines()[-1] == "0 []", (argv, proc.stdout, proc.stderr)


def test_python_m_dagrunner_from_a_python_without_its_dependencies_says_so(tmp_path: Path) -> None:
    """``python -m dagrunner`` with another environment's Python (a project's venv first on
    PATH) that finds the package but not its dependencies: a coded error naming the missing
    module and the interpreter, not a traceback.  ``-S``: no site-packages, so no orjson."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-S", "-m", "dagrunner", "--version"],
        cwd=root,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("error[dependency-missing]: ") and sys.executable in first
    assert "orjson" in first or "trio" in first or "networkx" in first
