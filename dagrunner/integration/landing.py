"""Landing: move the target with a compare-and-swap from the head the gates saw.

The ref moves only from ``old`` (what was gated) to the integration head; a
target checkout follows with ``git read-tree -m -u``.  When somebody else
moved the target first the outcome is ``moved`` (the integrator rebuilds);
when the checkout is dirty, the ref cannot be written, or the checkout
cannot follow, landing is ``blocked`` and ``IntegrationResult.land_blocked``
says why -- the envelopes stay queued and no user file is touched.

The trailers the integrator writes on each commit, and reading them back strictly.

``Dagrunner-Envelope`` names the envelope and ``Dagrunner-Envelope-Sha256`` its
diff's hash.  They are always the message's last paragraph, after the target's
``[integrate] message`` template; the worker's own subject line it may hold (``{subject}``)
is the envelope's, so untrusted: one line of printable text, bounded (``subject_of``),
which can never become a paragraph of its own, let alone the trailers'.  Recovery after a crash counts an envelope as landed only when a
commit on the target carries exactly one of each and the hash matches the
queued envelope: text that anyone else wrote into a message proves nothing.

The target branch's checkout after a landing: synced, repaired, or named with its fix.

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
import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from dagrunner.files import atomic_write, crash_point
from dagrunner.git.command import git, is_dirty, split_z
from dagrunner.integration.items import Item, Stage, forget_failures
from dagrunner.manifest.fields import DEFAULT_MESSAGE
from dagrunner.names import is_safe_id
from dagrunner.records.integration import (
    Details,
    EnvelopeState,
    LandBlocked,
    Landing,
    LandOutcome,
    StaleCheckout,
)

if TYPE_CHECKING:
    from dagrunner.envelope import Envelope
    from dagrunner.integration.needs import IntegratorLike as Integrator
    from dagrunner.integration.trees import Trees

Applied = list[tuple["Envelope", str]]


def land(
    it: Integrator,
    old: str,
    applied: Applied,
    new: str | None = None,
    *,
    flaky: tuple[str, ...] = (),
) -> Landing:
    """Move the target from ``old`` to ``new`` (default: the integration worktree's head):
    landed, moved, or blocked.  ``flaky``: gates that passed only when re-run on that tree.
    The envelopes' states are journaled here; the run's result is the integrator's to set."""
    new = new or git(["rev-parse", "HEAD"], cwd=it.wt).text
    checkout = it.target_checkout()
    if checkout is not None and is_dirty(checkout):
        return block(
            it,
            applied,
            checkout,
            "target-checkout-dirty",
            "the target branch is checked out there with uncommitted changes",
        )
    # Under the queue's lock, as ``withdraw`` decides: an envelope withdrawn before this
    # line never lands, and one journaled ``landing`` can no longer be withdrawn.
    with it.queue.lock():
        entries = it.queue.entries()
        if any(entries[e.id].state is EnvelopeState.WITHDRAWN for e, _ in applied):
            return Landing(outcome=LandOutcome.WITHDRAWN)
        for envelope, _ in applied:
            it.queue.record(envelope.id, EnvelopeState.LANDING, Details(old=old, new=new))
    crash_point("landing")
    moved = git(
        ["update-ref", "-m", f"dagrunner: land {len(applied)} envelope(s)", it.ref, new, old],
        cwd=it.repo,
        check=False,
    )
    if moved.returncode != 0:
        if it.head() != old:
            return Landing(outcome=LandOutcome.MOVED)
        # Not moved by anyone: the ref itself cannot be written (a lock, a full disk).
        return block(it, applied, Path(it.repo), "target-ref-unwritable", moved.message)
    crash_point("landed-ref")
    if checkout is not None:
        synced = git(["read-tree", "-m", "-u", old, new], cwd=checkout, check=False)
        if synced.returncode != 0:
            return failed_sync(it, applied, checkout, old, new, synced.message)
    it.landed(applied, old, new, flaky)
    crash_point("landed")  # journaled landed, its workers' worktrees not yet cleaned
    return Landing(outcome=LandOutcome.LANDED)


def remains(it: Integrator, trees: Trees, front: Item) -> list[Item]:
    """``front`` had envelopes withdrawn while it gated: it never lands.  What of it was not
    withdrawn, as an item to build again (none when nothing); its slot is given back."""
    trees.give(front.reset())
    entries = it.queue.entries()
    kept = [e for e in front.envelopes if entries[e.id].state is not EnvelopeState.WITHDRAWN]
    return [Item(kept, priority=front.priority)] if kept else []


def stale(it: Integrator, head: str, items: list[Item], landed: Item) -> int | None:
    """The first of ``items`` built under a manifest other than the one the target holds at
    ``head`` (one that landed changed it), so that it is judged again by this one, as the
    serial loop judges it; None: none is (or the manifest is not the target's: the caller's
    file, or each tree's own).  When ``landed`` changed it, a batch's failure under the old
    one is no evidence any more: it corroborates nothing (``forget_failures``)."""
    now = it.trusted_manifest(head)
    if not now.is_relative_to(it.reports):
        return None
    said = now.read_bytes()
    if landed.manifest and landed.manifest.read_bytes() != said:
        forget_failures(items)
    built = (Stage.WAITING, Stage.DEFERRED)
    return next(
        (
            index
            for index, item in enumerate(items)
            if item.stage not in built and item.manifest and item.manifest.read_bytes() != said
        ),
        None,
    )


def failed_sync(
    it: Integrator, applied: Applied, where: Path, old: str, new: str, why: str
) -> Landing:
    """The ref moved but its checkout could not follow: move the ref back and restore the
    checkout, or -- when the ref cannot move back -- say that the envelopes landed."""
    back = git(["update-ref", it.ref, old, new], cwd=it.repo, check=False)
    to = old if back.returncode == 0 else new
    stale = StaleCheckout(
        checkout=str(where), target=it.target, old=old, new=new, to=to, reason=why
    )
    restored = repair(where, old, new, to)
    left = None
    if not restored:
        remember(it.ctx.info.state_dir, stale)
        left = stale
    try:
        if to == old:
            note = "the target was moved back" + (
                "; its checkout was restored" if restored else f"; restore it: {stale.command}"
            )
            refused = block(it, applied, where, "target-checkout-blocked", f"{why} ({note})")
            return dataclasses.replace(refused, stale=left)
        it.landed(applied, old, new)  # the truth: the target holds them
        return Landing(outcome=LandOutcome.LANDED, stale=left, stops=True)
    except OSError as exc:  # a full disk: the journal cannot say it, the result still does
        disk = LandBlocked(
            "disk-full", str(where), f"{why}; then {exc.strerror}: the target is at {to[:12]}"
        )
        return Landing(outcome=LandOutcome.BLOCKED, blocked=disk, stale=left, stops=True)


REFUSED_HINTS = {  # what is done about a refused landing: the operator's, never the item's
    "target-checkout-dirty": "the operator commits, stashes or discards the uncommitted "
    "changes in the target's checkout; it is gated and lands then, nothing for its worker to do",
    "target-ref-unwritable": "the operator frees the target's ref (a stale lock, a full disk)",
}


def block(it: Integrator, applied: Applied, checkout: Path, code: str, why: str) -> Landing:
    """Landing refused: leave the envelopes queued, saying why; the run stops."""
    hint = REFUSED_HINTS.get(code, "the operator must fix it; the item lands then") + (
        f" ({checkout})"
    )
    said = Details(stuck=code, note=why, hint=hint)
    for envelope, _ in applied:
        it.queue.record(envelope.id, EnvelopeState.QUEUED, said, event="stuck")
        it.outcome(
            envelope.id, EnvelopeState.QUEUED, Details(reason=f"landing refused ({code}): {why}")
        )
    blocked = LandBlocked(code, str(checkout), why)
    return Landing(outcome=LandOutcome.BLOCKED, blocked=blocked, stops=True)


TRAILER = "Dagrunner-Envelope"
SHA_TRAILER = "Dagrunner-Envelope-Sha256"


MAX_SUBJECT = 200  # characters of a worker's subject line kept in a landed commit's message
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")  # newlines, escapes


def subject_of(envelope: Envelope) -> str:
    """The worker's own subject line (the envelope's ``subject``), as one line: control
    characters and line breaks each a space, blanks collapsed, at most ``MAX_SUBJECT``
    characters; ``mission/worker`` when it has none."""
    raw = envelope.fields.get("subject")
    text = " ".join(_UNPRINTABLE.sub(" ", raw).split()) if isinstance(raw, str) else ""
    if len(text) > MAX_SUBJECT:
        text = text[: MAX_SUBJECT - 1].rstrip() + "\u2026"
    return text or f"{envelope.mission}/{envelope.worker}"


def commit_message(envelope: Envelope, template: str = DEFAULT_MESSAGE) -> str:
    """The integrator's commit message for a (validated) envelope: the target's template
    (validated at manifest load: only these three placeholders), then the trailers."""
    said = (template or DEFAULT_MESSAGE).format(
        mission=envelope.mission, worker=envelope.worker, subject=subject_of(envelope)
    )
    return (
        f"{said.strip()}\n\n"
        f"{TRAILER}: {envelope.id}\nDagrunner-Mission: {envelope.mission}\n"
        f"Dagrunner-Worker: {envelope.worker}\nDagrunner-Base: {envelope.base}\n"
        f"{SHA_TRAILER}: {envelope.diff_sha256}\n"
    )


def landed_on_target(repo: Path, ref: str) -> dict[str, tuple[str, str]]:
    """Envelope id -> (commit, diff sha256) for commits on the target that carry both trailers.

    Parsed strictly: a commit counts only with exactly one id and one hash,
    as the integrator writes them; anything else is somebody else's text.
    """
    fmt = "%H%x1f" + "%x1f".join(
        f"%(trailers:key={key},valueonly,separator=%x1e)" for key in (TRAILER, SHA_TRAILER)
    )
    log = git(["log", f"--format={fmt}%x1d", "-n", "5000", ref], cwd=repo).stdout.decode(
        "utf-8", "replace"
    )
    found: dict[str, tuple[str, str]] = {}
    for entry in log.split("\x1d"):
        parts = entry.strip().split("\x1f")
        if len(parts) != 3:
            continue
        commit, ids, shas = parts
        ids_list, sha_list = ids.strip().split("\x1e"), shas.strip().split("\x1e")
        if len(ids_list) == 1 and len(sha_list) == 1 and is_safe_id(ids_list[0].strip()):
            found.setdefault(ids_list[0].strip(), (commit, sha_list[0].strip()))
    return found


async def clean(it: Integrator, ids: list[str]) -> None:
    """The landed envelopes' worker worktrees go (when provably theirs), in a thread."""

    def clean() -> dict[str, str]:
        with it.git_lock:
            return it.clean_workers(ids)

    import trio  # here: the module's trailers and checkout reads serve processes without a run

    it.note_workers(await trio.to_thread.run_sync(clean))


# -- the target's checkout ------------------------------------------------------------------


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
