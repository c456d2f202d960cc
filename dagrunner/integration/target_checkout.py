"""The target branch's checkout after a landing: synced, repaired, or named with its fix.

Landing moves the ref, then updates the checkout that has the target checked
out (``read-tree -m -u``).  That update can fail half-way (a full disk), and
the ref rollback after it can fail too.  What is true is then said, never
guessed: the checkout is repaired when every file that differs is one the
update was writing (so nothing of the user's is touched), and otherwise it
is recorded in ``<state dir>/checkout-stale-<target>.json`` with the exact
command to run; the next ``integrate run`` tries the repair again first.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson

from dagrunner.files import atomic_write
from dagrunner.git.command import git, split_z
from dagrunner.records.integration import StaleCheckout


def checkout_of(repo: Path, ref: str) -> Path | None:
    """The worktree that has ``ref`` checked out, if any."""
    listing = git(["worktree", "list", "--porcelain"], cwd=repo).text
    for block in listing.split("\n\n"):
        lines = block.splitlines()
        if f"branch {ref}" in lines and lines and lines[0].startswith("worktree "):
            return Path(lines[0][len("worktree ") :])
    return None


def _paths(data: bytes) -> set[str]:
    return set(split_z(data))


def _ours(checkout: Path, old: str, new: str) -> tuple[bool, set[str]]:
    """Whether every difference from ``old`` is a path the update from old to new wrote.

    Returns that, and the untracked paths the update created (partial new files).
    """
    changed = _paths(git(["diff", "--name-only", "-z", old, new], cwd=checkout).stdout)
    dirty = _paths(git(["diff-files", "--name-only", "-z"], cwd=checkout).stdout)
    staged = _paths(
        git(["diff-index", "--cached", "--name-only", "-z", old, "--"], cwd=checkout).stdout
    )
    untracked = _paths(
        git(["ls-files", "--others", "--exclude-standard", "-z"], cwd=checkout).stdout
    )
    created = untracked & changed
    for path in created:  # a file of the user's with the same name must not be lost
        blob = git(["cat-file", "blob", f"{new}:{path}"], cwd=checkout, check=False).stdout
        try:
            content = (checkout / path).read_bytes()
        except OSError:
            return False, set()
        if not blob.startswith(content):
            return False, set()
    return (dirty | staged) <= changed, created


def repair(checkout: Path, old: str, new: str, to: str) -> bool:
    """Put a half-updated checkout at ``to`` (old or new) when only our writes differ."""
    safe, created = _ours(checkout, old, new)
    if not safe:
        return False
    if git(["read-tree", "--reset", "-u", to], cwd=checkout, check=False).returncode != 0:
        return False
    wanted = _paths(git(["ls-tree", "-r", "--name-only", "-z", to], cwd=checkout).stdout)
    for path in created - wanted:
        with contextlib.suppress(OSError):
            (checkout / path).unlink()
    return git(["diff-files", "--quiet"], cwd=checkout, check=False).returncode == 0


def marker(state_dir: Path, target: str) -> Path:
    return state_dir / f"checkout-stale-{target.replace('/', '--')}.json"


def remember(state_dir: Path, stale: StaleCheckout) -> bool:
    """Record ``stale`` for the next run; False when even that cannot be written (full disk)."""
    try:
        atomic_write(marker(state_dir, stale.target), orjson.dumps(stale.to_json()))
    except OSError:
        return False
    return True


def at_tree_of(checkout: Path, commit: str) -> bool:
    """Whether the checkout's index holds exactly ``commit``'s tree (as before a landing)."""
    index = git(["write-tree"], cwd=checkout, check=False)
    tree = git(["rev-parse", f"{commit}^{{tree}}"], cwd=checkout, check=False)
    return index.returncode == 0 and index.text == tree.text


def recall(state_dir: Path, target: str) -> StaleCheckout | None:
    try:
        data = orjson.loads(marker(state_dir, target).read_bytes())
        fields = {k: str(data[k]) for k in ("checkout", "target", "old", "new", "to", "reason")}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return StaleCheckout(**fields)


def forget(state_dir: Path, target: str) -> None:
    marker(state_dir, target).unlink(missing_ok=True)
