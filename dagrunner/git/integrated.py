"""Whether a branch's work is on a target, by exactly the same bytes.

A worktree whose work reads "landed" may be pruned, its branch deleted: a lookalike must
never pass.  ``git cherry`` and ``patch-id --stable`` ignore whitespace, so a re-indented
copy of another worker's commit (other Python behaviour) made the victim's work read
landed, and prune deleted it (issue 36).  Here patches are compared with
``patch-id --verbatim`` (whitespace kept; line numbers still ignored, so a rebased commit
matches); where git lacks it, only the exact checks count.  ``unheld`` says whether a
commit would be lost with its branch.
"""

from __future__ import annotations

from pathlib import Path

from dagrunner.git.command import GitResult, git


def integrated(path: Path, head: str, base: str, target: str) -> tuple[bool, str]:
    """Whether ``head``'s work is on ``target``, and why (so a landed branch reads as landed)."""

    def run(*args: str) -> GitResult:
        return git(list(args), cwd=path, check=False)

    if run("rev-parse", "--verify", "-q", f"{target}^{{commit}}").returncode != 0:
        return False, f"target {target!r} does not exist"
    if run("rev-parse", head).text == run("rev-parse", base).text:
        # nothing of its own to land (its uncommitted work, if any, is `clean: false`)
        return True, "nothing committed: its head is its base"
    if run("merge-base", "--is-ancestor", head, target).returncode == 0:
        return True, "ancestor of the target"
    if run("rev-parse", f"{head}^{{tree}}").text == run("rev-parse", f"{target}^{{tree}}").text:
        return True, "same tree as the target"
    mine = _patch_ids(_log(path, f"{base}..{head}"), path)
    theirs = _patch_ids(_log(path, f"{base}..{target}"), path)
    if mine and set(mine.values()) <= set(theirs.values()):
        return True, "same patches already on the target (rebased)"
    diff = ["diff", "--no-ext-diff", "--no-textconv", "--binary", "--full-index", base, head]
    squashed = set(_patch_ids(run(*diff).stdout, path).values())
    for commit, patch in theirs.items():
        if patch in squashed:
            return True, f"squashed onto the target as {commit[:12]}"
    ahead = len([c for c, p in mine.items() if p not in set(theirs.values())])
    return False, f"{ahead or len(mine)} commit(s) not on the target"


def state_integrated(path: Path, base: str, tree: str, target: str) -> tuple[bool, str]:
    """Whether the worktree's full state ``tree`` (uncommitted work included) is on
    ``target`` as one commit of the same patch: an envelope the integrator landed."""
    diff = ["diff", "--no-ext-diff", "--no-textconv", "--binary", "--full-index", base, tree]
    mine = set(_patch_ids(git(diff, cwd=path, check=False).stdout, path).values())
    if not mine:
        return False, "its full state could not be read as a patch"
    for commit, patch in _patch_ids(_log(path, f"{base}..{target}"), path).items():
        if patch in mine:
            return True, f"its full state landed on the target as {commit[:12]}"
    return False, "its full state is not on the target"


def _log(path: Path, span: str) -> bytes:
    """Each commit of ``span`` (merges left out) as ``commit <id>`` and its patch."""
    return git(
        [
            "log",
            "-p",
            "--no-merges",
            "--no-ext-diff",
            "--no-textconv",
            "--binary",
            "--full-index",
            "--format=commit %H",
            span,
        ],
        cwd=path,
        check=False,
    ).stdout


def _patch_ids(data: bytes, path: Path) -> dict[str, str]:
    """commit -> its verbatim patch id (a commit with an empty patch has none)."""
    if not data.strip():
        return {}
    done = git(["patch-id", "--verbatim"], cwd=path, input=data, check=False)
    if done.returncode != 0:
        return {}  # git before 2.39: no verbatim ids, so no patch reads as landed
    return {line.split()[1]: line.split()[0] for line in done.text.splitlines() if " " in line}


def unheld(repo: Path, commit: str, branch: str) -> bool:
    """Whether ``commit`` is reachable from no ref but ``refs/heads/<branch>`` (deleting the
    branch would leave it to garbage collection)."""
    listed = git(
        ["for-each-ref", "--contains", commit, "--format=%(refname)"], cwd=repo, check=False
    ).text.splitlines()
    return not [ref for ref in listed if ref != f"refs/heads/{branch}"]
