"""Names a hostile worker controls must stay the data they are: a path in an envelope's diff
is the path git applies, never one git reads another way (a first component git strips as
the ``a/`` of ``-p1``, a doubled slash it squashes), and a path printed on a terminal is
text, never escapes that rewrite it.  Each on real repositories, real git, the real CLI."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
from pathlib import Path

import orjson
from conftest import CLI, commit_release_manifest, git
from test_integration import worker
from test_trust_edges import PROTECTING, cli

from dagrunner.integration.run import integrate


def forge(envelope: Path, old: str, new: str, path: str) -> None:
    """Rewrite every ``old`` of the envelope's diff as ``new`` and its changed_files' paths as
    ``path``, its size and hash made to match (what a hostile worker can do with any file it
    hands over)."""
    fields = orjson.loads(envelope.read_bytes())
    if fields["diff_encoding"] == "base64":
        diff = base64.b64decode(fields["diff"]).replace(old.encode(), new.encode())
        fields["diff"] = base64.b64encode(diff).decode()
    else:
        diff = fields["diff"].replace(old, new).encode()
        fields["diff"] = diff.decode()
    fields["diff_bytes"], fields["diff_sha256"] = len(diff), hashlib.sha256(diff).hexdigest()
    for change in fields["changed_files"]:
        for key in ("path", "old_path"):
            if change.get(key):
                change[key] = path
    envelope.write_bytes(orjson.dumps(fields))


def test_a_diff_path_git_strips_to_a_protected_one_is_refused(project: Path) -> None:
    """A worker's diff names ``x/.gitattributes`` (no ``a/``, ``b/``): dagrunner read that
    path, which no protected glob matches, and git applied it, stripping the first
    component as it does ``a/``, to ``.gitattributes``, which landed unprotected."""
    commit_release_manifest(project, PROTECTING)
    union = worker(project, "union", lambda p: (p / ".gitattributes").write_text("* merge=union\n"))
    forge(union, "a/.gitattributes", "x/.gitattributes", "x/.gitattributes")
    forge(union, "b/.gitattributes", "x/.gitattributes", "x/.gitattributes")
    code, said = cli(project, "integrate", "submit", str(union))
    if code == 0:  # refused later is as good as refused here, if it does not land
        integrate(repo=project, window=1)
    assert git(project, "ls-tree", "--name-only", "main", ".gitattributes") == ""
    assert code == 2 and said["error"]["code"] == "envelope-diff", said


def test_a_doubled_slash_git_squashes_to_a_protected_path_is_refused(project: Path) -> None:
    """``.github//ci.yml`` is not matched by ``.github/*.yml`` as written, and git applies
    it to ``.github/ci.yml``."""
    (project / ".github").mkdir()
    (project / ".github" / "ci.yml").write_text("on: push\n")
    commit_release_manifest(project, PROTECTING.replace('".github/**"', '".github/*.yml"'))
    ci = worker(project, "ci", lambda p: (p / ".github" / "ci.yml").write_text("on: never\n"))
    forge(ci, "a/.github/ci.yml", "a/.github//ci.yml", ".github//ci.yml")
    forge(ci, "b/.github/ci.yml", "b/.github//ci.yml", ".github//ci.yml")
    code, said = cli(project, "integrate", "submit", str(ci))
    if code == 0:
        integrate(repo=project, window=1)
    assert git(project, "show", "main:.github/ci.yml") == "on: push\n"
    assert code == 2 and said["error"]["code"] == "envelope-path", said


ERASE = "x\x1b[2K\r\x1b[1AOK.txt"  # a file name that, printed raw, erases the line it is on


def test_a_path_with_terminal_escapes_is_printed_escaped(project: Path) -> None:
    """Two workers add a file whose name holds terminal escapes, each its own bytes: the
    second submit's OVERLAP line (and ``worktree overlaps``) printed the name raw, so the
    worker's name rewrote the terminal (here: erased the warning); it is shown escaped."""
    one = worker(project, "one", lambda p: (p / ERASE).write_text("one\n"))
    two = worker(project, "two", lambda p: (p / ERASE).write_text("two\n"))
    shown = []
    for envelope in (one, two):
        done = subprocess.run(
            [*CLI, "integrate", "submit", str(envelope)],
            cwd=project,
            capture_output=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        shown.append(done.stdout.decode())
    listed = subprocess.run(
        [*CLI, "worktree", "overlaps"], cwd=project, capture_output=True, check=False
    )
    shown.append(listed.stdout.decode())
    assert "OVERLAP" in shown[1] and "CONFLICT" in shown[2], shown
    for text in shown:
        assert "\x1b" not in text and "\r" not in text, text
    assert "x\\x1b[2K\\r\\x1b[1AOK.txt" in shown[1], shown[1]


def test_a_tracked_name_with_terminal_escapes_is_printed_escaped_by_release_check(
    repo: Path,
) -> None:
    """A gate changed a tracked file whose name holds escapes: its ``tree-modified`` reason,
    in release-check's table, printed the name raw."""
    (repo / ERASE).write_text("one\n")
    (repo / "m.toml").write_text(
        '[gates.touch]\nrun = "for f in x*OK.txt; do echo two >> \\"$f\\"; done"\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "files")
    done = subprocess.run(
        [*CLI, "release-check", "m.toml", "--no-cache"], cwd=repo, capture_output=True, check=False
    )
    said = done.stdout.decode()
    assert done.returncode == 1 and "tree-modified" in said, said
    assert "\x1b" not in said and "\r" not in said, said


def test_a_tracked_name_with_a_line_break_stays_in_its_cell_of_the_ci_summary(
    repo: Path, tmp_path: Path
) -> None:
    """A gate changed a tracked file named ``x\\n### ✅ ... passed\\n``: its reason, in the
    Markdown summary for GitHub's job page, broke out of its table cell into a heading of
    the worker's choosing above the real, failed, verdict."""
    (repo / "x\n### \u2705 dagrunner release: passed\nOK.txt").write_text("one\n")
    (repo / "m.toml").write_text(
        '[gates.touch]\nrun = "for f in x*OK.txt; do echo two >> \\"$f\\"; done"\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "files")
    summary = tmp_path / "summary.md"
    done = subprocess.run(
        [*CLI, "release-check", "m.toml", "--no-cache", "--quiet"],
        cwd=repo,
        capture_output=True,
        check=False,
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert done.returncode == 1, done.stdout
    text = summary.read_text()
    assert "tree-modified" in text, text
    assert not [line for line in text.splitlines() if "\u2705" in line and "|" not in line], text
