"""The live status line, under a real pseudo-terminal: ``release-check`` repaints one line
in place while gates run (what runs and for how long, what waits, an ETA), prints finished
gates above it, and leaves a clean line at the end and after Ctrl-C; with ``CI`` set the
same terminal gets today's plain lines."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import CLI, commit_release_manifest, run_json, write_manifest

MANIFEST = """
[gates.short]
run = "sleep 1.5"
estimate = "2s"
[gates.long]
run = "sleep 3"
estimate = "4s"
[gates.after]
run = ["true"]
needs = ["short", "long"]
"""
REPAINT = "\r\x1b[K"


def under_pty(
    repo: Path,
    argv: list[str] | None = None,
    *,
    ci: bool = False,
    interrupt: bool = False,
) -> tuple[int, str]:
    """The CLI's exit code and everything it wrote to the terminal (default: release-check
    of ``MANIFEST``); ``interrupt``: a Ctrl-C once a status line is on the terminal (not
    after a fixed time: on a loaded machine the command may still be loading then)."""
    if argv is None:
        write_manifest(repo, MANIFEST)
        argv = ["release-check", "m.toml", "--repo", str(repo), "--no-cache"]
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS")}
    if ci:
        env["CI"] = "true"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, *argv],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=repo, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    out = bytearray()
    began = time.monotonic()
    sent = False
    while True:
        if interrupt and not sent and statuses(out.decode("utf-8", "replace")):
            proc.send_signal(signal.SIGINT)
            sent = True
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
        assert time.monotonic() - began < 60, "the run did not end"
    os.close(master)
    return proc.wait(timeout=30), out.decode("utf-8", "replace")


def statuses(text: str) -> list[str]:
    """Each repainted status line's text."""
    return [m.group(1) for m in re.finditer(r"\r\x1b\[K(\[\d+/\d+\] running:[^\r\n]*)", text)]


def test_the_status_line_is_repainted_while_gates_run(repo: Path) -> None:
    code, text = under_pty(repo)
    assert code == 0, text
    seen = statuses(text)
    assert len(set(seen)) >= 4, seen  # repainted on its own, not only when a gate ends
    # both gates shown running at once, their times counted up while they ran (whenever
    # the second one started: the release check's own load can delay it by a second)
    both = [m for s in seen if (m := re.match(r"\[0/3\] running: long (\d+)s, short (\d+)s", s))]
    assert len({m.groups() for m in both}) >= 2, seen
    assert any("waiting 1" in s and "ETA" in s for s in seen), seen
    assert any(s.startswith("[1/3] running: long") for s in seen), seen
    finished = text.index("PASS    short")
    assert text.rfind(REPAINT, 0, finished) > text.rfind("\n", 0, finished)  # above the line
    before_summary = text[: text.index("gate ")]
    assert before_summary.rstrip("\r\n").endswith(REPAINT.rstrip()), before_summary[-200:]


def test_ctrl_c_leaves_a_clean_terminal(repo: Path) -> None:
    code, text = under_pty(repo, interrupt=True)
    assert code == 130, text
    assert statuses(text)
    last = text.rfind("running:")
    assert REPAINT in text[last:], text[last:]  # the status line was erased after its last paint


def test_ci_keeps_plain_lines_on_a_terminal(repo: Path) -> None:
    code, text = under_pty(repo, ci=True)
    assert code == 0
    assert statuses(text) == [] and "\x1b[K" not in text
    assert re.search(r"\[\s*\d+\.\ds\] start   short", text)


def test_integrate_run_shows_what_it_gates(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commit_release_manifest(repo, '[gates.check]\nrun = "sleep 1.5"\n')
    base = ["--repo", str(repo)]
    files = []
    for name in ("w1", "w2"):
        _, made = run_json(
            capsys, "worktree", "allocate", "--mission", "m", "--worker", name, *base
        )
        (Path(made["path"]) / f"{name}.txt").write_text(f"{name}\n")
        out = str(repo.parent / f"{name}.json")
        run_json(capsys, "worktree", "export", f"m/{name}", "-o", out, *base)
        files.append(out)
    run_json(capsys, "integrate", "submit", *files, *base)
    code, text = under_pty(repo, ["integrate", "run", "--window", "1", "--batch", "1", *base])
    assert code == 0, text
    seen = [m.group(1) for m in re.finditer(r"\r\x1b\[K(\[\d/2\] gating:[^\r\n]*)", text)]
    assert any(re.match(r"\[0/2\] gating: .*m\.w1\.\w+ \ds", s) for s in seen), seen
    assert any(re.match(r"\[1/2\] gating: m\.w2\.\w+ \ds · queued 0$", s) for s in seen), seen
    assert "landed" in text.rsplit("\r\x1b[K", 1)[1]  # the result prints under a clean line


def test_ctrl_c_while_the_command_loads_exits_130_without_a_traceback(
    repo: Path, tmp_path: Path
) -> None:
    """A Ctrl-C that comes while the command's modules are still importing (a loaded
    machine: CI saw one a second in): ``interrupted`` and 130, as during the run.  The
    SIGINT is sent by the process to itself as the release check's module loads (with
    Python's own handler, as a terminal's process has it: a gate of dagrunner's own
    release check inherits SIGINT ignored)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'dagrunner.cli.checks':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "sys.meta_path.insert(0, Interrupt())\n"
    )
    write_manifest(repo, MANIFEST)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [*CLI, "release-check", "m.toml", "--repo", str(repo), "--no-cache"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "interrupted" in done.stderr, done.stderr
