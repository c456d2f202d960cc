"""The --json shapes orchestrators depend on stay as they were when records became typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git, run_json

ALLOCATE_KEYS = [
    "id", "path", "branch", "base", "root", "session", "created", "reused", "pooled", "copied",
    "main_checkout_dirty",
]  # fmt: skip
REALLOCATE_KEYS = [
    "id", "path", "branch", "base", "root", "session", "created", "reused", "main_checkout_dirty",
]  # fmt: skip
STATUS_KEYS = [
    "id", "path", "branch", "base", "session", "created", "last_activity", "target", "retained",
    "missing", "head", "clean", "staged", "unstaged", "untracked", "unmerged", "ahead", "behind",
    "diffstat", "rebase_in_progress", "merge_in_progress", "integrated", "integrated_reason",
]  # fmt: skip
EXPORT_KEYS = [
    "id", "file", "worktree", "empty", "base", "head", "tree", "changed_files", "diff_bytes",
    "diff_sha256",
]  # fmt: skip
INTEGRATE_KEYS = [
    "target", "start", "end", "envelopes", "gate_runs", "rebuilds", "land_blocked",
    "target_moving", "checkout_stale", "report_dir", "counts",
]  # fmt: skip


def test_status_export_and_integrate_json_keep_their_shapes(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text('[gates.ok]\nrun = ["true"]\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "manifest")
    base = ["--repo", str(repo)]
    _, allocated = run_json(
        capsys, "worktree", "allocate", "--mission", "m", "--worker", "w", *base
    )
    (Path(allocated["path"]) / "new.txt").write_text("x\n")
    _, status = run_json(capsys, "worktree", "status", "m/w", *base)
    assert list(status) == STATUS_KEYS
    _, listing = run_json(capsys, "worktree", "list", *base)
    assert [list(item) for item in listing["worktrees"]] == [STATUS_KEYS]
    out = repo.parent / "env.json"
    _, exported = run_json(capsys, "worktree", "export", "m/w", "-o", str(out), *base)
    assert list(exported) == EXPORT_KEYS
    run_json(capsys, "integrate", "submit", str(out), *base)
    _, result = run_json(capsys, "integrate", "run", *base)
    assert list(result) == INTEGRATE_KEYS
    assert result["counts"] == {"landed": 1}
