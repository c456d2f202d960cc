"""Patch envelopes from real worktrees: every kind of change travels; every bad envelope is refused."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import git, run_json

from dagrunner.envelope import SCHEMA, load_envelope, parse_envelope
from dagrunner.errors import DagrunnerError
from dagrunner.git.statetree import indexed_state, state_tree
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting


@pytest.fixture
def worker(repo: Path) -> Path:
    (repo / "src").mkdir()
    (repo / "src" / "keep.txt").write_text("keep\n")
    (repo / "src" / "gone.txt").write_text("delete me\n")
    (repo / "src" / "move me.txt").write_text("moving\n" * 20)
    (repo / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "blob.bin").write_bytes(bytes(range(256)))
    (repo / ".gitignore").write_text("reports/\n*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    return Path(wt.allocate(mission="m", worker="w", repo=repo)["path"])


def make_every_change(path: Path) -> None:
    (path / "committed.txt").write_text("committed\n")
    git(path, "add", "committed.txt")
    git(path, "commit", "-q", "-m", "worker commit")
    (path / "staged.txt").write_text("staged\n")
    git(path, "add", "staged.txt")
    (path / "src" / "keep.txt").write_text("keep, edited\n")  # unstaged
    (path / "src" / "gone.txt").unlink()
    git(path, "mv", "src/move me.txt", "src/moved é.txt")
    os.chmod(path / "tool.sh", 0o755)
    (path / "link").symlink_to("src/keep.txt")
    (path / "blob.bin").write_bytes(bytes(reversed(range(256))) + b"\x00\xff")
    (path / "untracked dir").mkdir()
    (path / "untracked dir" / "new ü.txt").write_text("untracked\n")
    (path / "noise.log").write_text("ignored\n")


def export(repo: Path, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    summary = exporting.export("m/w", output=tmp_path / "env.json", repo=repo)
    return summary, orjson.loads((tmp_path / "env.json").read_bytes())


def test_every_kind_of_change_travels(repo: Path, worker: Path, tmp_path: Path) -> None:
    make_every_change(worker)
    backdate(worker)
    status_before = git(worker, "status", "--porcelain=v2")
    index = Path(git(worker, "rev-parse", "--path-format=absolute", "--git-path", "index").strip())
    index_before = index.read_bytes()
    summary, fields = export(repo, tmp_path)
    assert git(worker, "status", "--porcelain=v2") == status_before, "export must be read-only"
    assert index.read_bytes() == index_before, "export must not touch the worker's index"
    assert fields["schema"] == SCHEMA and not fields["empty"]
    kinds = {c["path"]: c for c in fields["changed_files"]}
    assert kinds["committed.txt"]["kind"] == "added"
    assert kinds["staged.txt"]["kind"] == "added"
    assert kinds["src/keep.txt"]["kind"] == "modified"
    assert kinds["src/gone.txt"]["kind"] == "deleted"
    assert kinds["src/moved é.txt"]["kind"] == "renamed"
    assert kinds["src/moved é.txt"]["old_path"] == "src/move me.txt"
    assert kinds["tool.sh"]["mode"] == "100755" and kinds["tool.sh"]["old_mode"] == "100644"
    assert kinds["link"]["symlink"] is True
    assert kinds["blob.bin"]["binary"] is True
    assert "untracked dir/new ü.txt" in kinds
    assert "noise.log" not in kinds  # gitignored files stay behind
    diff = (
        fields["diff"].encode()
        if fields["diff_encoding"] == "utf-8"
        else base64.b64decode(fields["diff"])
    )
    assert hashlib.sha256(diff).hexdigest() == fields["diff_sha256"] == summary["diff_sha256"]
    assert b"GIT binary patch" in diff and b"index " in diff
    # the full state applies onto the base and reproduces the worker's tree exactly
    check = tmp_path / "check"
    git(repo, "worktree", "add", "-q", "--detach", str(check), fields["base"])
    (tmp_path / "p.diff").write_bytes(diff)
    git(check, "apply", "--index", str(tmp_path / "p.diff"))
    assert git(check, "write-tree").strip() == fields["tree"]
    assert any(e["event"] == "exported" for e in wt.open_context(repo).ledger.events())
    # the tree export hashed without writing is the one `git add -A` writes (cleanup's proof)
    assert state_tree(worker) == fields["tree"]


def backdate(worktree: Path) -> None:
    """Every file an hour old: no index entry written now is "racily clean" (git would
    re-read it), which is what a worker whose last edit was seconds ago sees."""
    past = time.time() - 3600
    for path in worktree.rglob("*"):
        if ".git" not in path.parts:
            os.utime(path, (past, past), follow_symlinks=False)


def test_line_ending_attributes_give_the_tree_git_add_gives(
    repo: Path, worker: Path, tmp_path: Path
) -> None:
    (worker / ".gitattributes").write_text("*.txt text\n*.dat -text\n")
    (worker / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (worker / "raw.dat").write_bytes(b"one\r\n")
    (worker / "src" / "keep.txt").write_bytes(b"keep\r\nedited\r\n")
    (worker / "link").symlink_to("crlf.txt")
    backdate(worker)
    _, fields = export(repo, tmp_path)
    assert state_tree(worker) == fields["tree"]
    check = tmp_path / "check"
    git(repo, "worktree", "add", "-q", "--detach", str(check), fields["base"])
    (tmp_path / "p.diff").write_bytes(fields["diff"].encode())
    git(check, "apply", "--index", str(tmp_path / "p.diff"))
    assert git(check, "write-tree").strip() == fields["tree"]
    assert git(check, "show", ":crlf.txt") == "one\ntwo\n"  # normalised, as git add does


def test_large_diff_is_never_truncated(repo: Path, worker: Path, tmp_path: Path) -> None:
    (worker / "big.txt").write_text("".join(f"line {i} of a large change\n" for i in range(60_000)))
    _, fields = export(repo, tmp_path)
    assert fields["diff_bytes"] > 1_300_000
    assert len(fields["diff"].encode()) == fields["diff_bytes"]
    load_envelope(tmp_path / "env.json")


def test_untouched_worktree_exports_an_empty_envelope(
    repo: Path, worker: Path, tmp_path: Path
) -> None:
    summary, fields = export(repo, tmp_path)
    assert summary["empty"] is True and fields["changed_files"] == [] and fields["diff"] == ""


def tamper(path: Path, **changes: Any) -> Path:
    fields = orjson.loads(path.read_bytes())
    fields.update(changes)
    path.write_bytes(orjson.dumps(fields))
    return path


def rehash(path: Path, diff: bytes) -> Path:
    """A forged envelope whose hash is consistent with its (malicious) diff."""
    return tamper(
        path,
        diff=diff.decode(),
        diff_encoding="utf-8",
        diff_bytes=len(diff),
        diff_sha256=hashlib.sha256(diff).hexdigest(),
    )


EVIL = {
    "outside": b"diff --git a/../escape.txt b/../escape.txt\nnew file mode 100644\n--- /dev/null\n+++ b/../escape.txt\n@@ -0,0 +1 @@\n+x\n",
    "absolute": b"diff --git a//etc/passwd b//etc/passwd\n--- a//etc/passwd\n+++ b//etc/passwd\n@@ -1 +1 @@\n-a\n+b\n",
    "dotgit": b"diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n",
    "dotgit-nested": b'diff --git "a/sub/.GIT/hooks/post" "b/sub/.GIT/hooks/post"\nnew file mode 100755\n--- /dev/null\n+++ "b/sub/.GIT/hooks/post"\n@@ -0,0 +1 @@\n+x\n',
}


@pytest.mark.parametrize("case", sorted(EVIL))
def test_paths_that_escape_are_rejected(
    repo: Path, worker: Path, tmp_path: Path, case: str
) -> None:
    (worker / "x.txt").write_text("x\n")
    export(repo, tmp_path)
    with pytest.raises(DagrunnerError) as info:
        load_envelope(rehash(tmp_path / "env.json", EVIL[case]))
    assert info.value.code == "envelope-path"


def test_path_through_a_created_symlink_is_rejected(
    repo: Path, worker: Path, tmp_path: Path
) -> None:
    (worker / "out").symlink_to("/tmp")
    export(repo, tmp_path)
    fields = orjson.loads((tmp_path / "env.json").read_bytes())
    fields["changed_files"].append({"path": "out/evil.txt", "kind": "added", "symlink": False})
    (tmp_path / "env.json").write_bytes(orjson.dumps(fields))
    with pytest.raises(DagrunnerError) as info:
        load_envelope(tmp_path / "env.json")
    assert info.value.code == "envelope-symlink"


def test_each_rejection_has_its_code(
    repo: Path, worker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (worker / "x.txt").write_text("x\n")
    export(repo, tmp_path)
    good = (tmp_path / "env.json").read_bytes()

    def cut(path: Path) -> None:
        path.write_bytes(good[: len(good) // 2])

    cases: dict[str, Callable[[Path], object]] = {
        "envelope-hash": lambda p: tamper(p, diff=orjson.loads(good)["diff"].replace("+x", "+y")),
        "envelope-schema": lambda p: tamper(p, schema="other/9"),
        "envelope-field": lambda p: tamper(p, base="not-a-sha"),
        "envelope-unreadable": cut,
    }
    for code, damage in cases.items():
        path = tmp_path / f"{code}.json"
        path.write_bytes(good)
        damage(path)
        exit_code, body = run_json(capsys, "integrate", "submit", str(path), "--repo", str(repo))
        assert exit_code == 2 and body["error"]["code"] == code, (code, body)
    with pytest.raises(DagrunnerError) as info:
        parse_envelope(good, limit=10)
    assert info.value.code == "envelope-too-large"
    _, status = run_json(capsys, "integrate", "status", "--repo", str(repo))
    assert status["envelopes"] == [], "a rejected envelope must not be queued"


def test_same_size_edit_right_after_allocation_is_exported(repo: Path, tmp_path: Path) -> None:
    """Racy git: an edit of the same size in the checkout's second, exported a second later."""
    import time

    (repo / "settings.txt").write_text("threads = 4\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "settings")
    for i in range(3):
        path = Path(wt.allocate(mission="m", worker=f"racy{i}", repo=repo)["path"])
        (path / "settings.txt").write_text("threads = 8\n")  # same size, same second
        time.sleep(1.05 - time.time() % 1)  # export in a later second than the checkout
        summary = exporting.export(f"m/racy{i}", output=tmp_path / f"r{i}.json", repo=repo)
        assert summary["empty"] is False and summary["changed_files"] == 1


def test_a_worktree_that_changes_under_a_second_hashing_is_refused(worker: Path) -> None:
    (worker / "link").symlink_to("src/keep.txt")
    backdate(worker)
    status = git(worker, "status", "--porcelain=v2", "-z", "--untracked-files=all").split("\0")
    with indexed_state(worker, status) as state:
        (worker / "late.txt").write_text("written while the export read the tree\n")
        with pytest.raises(DagrunnerError) as info:
            state.write_objects()
    assert info.value.code == "export-unstable"
    assert info.value.exit_code == 4


def test_a_textconv_driver_the_worker_selects_never_shapes_the_diff(
    repo: Path, worker: Path, tmp_path: Path
) -> None:
    """A user's ``diff.<driver>.textconv`` (for images, office files) turns a file into text
    for people to read; a worker's ``.gitattributes`` can point any file at it.  The envelope's
    diff must carry the file's bytes, or it neither applies nor reproduces the tree."""
    upper = tmp_path / "upper"
    upper.write_text('#!/bin/sh\ntr a-z A-Z < "$1"\n')
    upper.chmod(0o755)
    Path(os.environ["HOME"], ".gitconfig").write_text(f'[diff "upper"]\n\ttextconv = {upper}\n')
    (worker / ".gitattributes").write_text("*.txt diff=upper\n")
    (worker / "src" / "keep.txt").write_text("keep\nedited\n")
    backdate(worker)
    _, fields = export(repo, tmp_path)
    check = tmp_path / "check"
    git(repo, "worktree", "add", "-q", "--detach", str(check), fields["base"])
    (tmp_path / "p.diff").write_bytes(fields["diff"].encode())
    git(check, "apply", "--index", str(tmp_path / "p.diff"))
    assert git(check, "write-tree").strip() == fields["tree"]
    assert (check / "src" / "keep.txt").read_text() == "keep\nedited\n"
