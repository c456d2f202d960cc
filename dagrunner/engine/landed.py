"""Landed proofs: what the integrator proved about a commit it landed, and CI answering from it.

When ``integrate run`` lands a commit it writes, as a git note in ``refs/notes/dagrunner``
on that commit, the tree, the manifest's digest and, for each gate that passed on exactly
that tree, its key, verdict and duration, with facts about the runner.  With an SSH key
(``DAGRUNNER_SIGNING_KEY`` or ``[integrate] signing_key``) the proof is signed by
``ssh-keygen -Y sign`` under the namespace :data:`NAMESPACE`, the mechanism git uses for its
own SSH signatures.

``release-check --reuse-landed`` reads the note on HEAD and trusts it only when its signature
verifies against allowed signers (git's ``allowed_signers`` format) from
``DAGRUNNER_ALLOWED_SIGNERS`` or from ``.dagrunner/allowed_signers`` on the target branch's
tip -- never from the commit under test, which could add its own key -- and when it is about
this very commit and tree, checked out clean.  It then answers each gate whose key this run
computes identically; everything else runs.  A proof that is missing, unsigned, tampered or
unverifiable is ignored with one warning: never an error, never a pass (docs/cache.md).
``integrate prune`` removes the proofs of the items it drops, never one on a tip
(``drop_notes``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagrunner.git.command import IDENTITY, git
from dagrunner.units import format_duration
from dagrunner.version import VERSION

NOTES_REF = "refs/notes/dagrunner"
NAMESPACE = "dagrunner-landed-proof"
FORMAT = "dagrunner-landed-proof/1"
SIGNERS_PATH = ".dagrunner/allowed_signers"
MAX_NOTE = 1 << 20  # a note beyond this is not read
SSH_TIMEOUT = 30.0
VERDICTS = frozenset({"passed", "cached"})


@dataclass(frozen=True, kw_only=True)
class GateProof:
    key: str
    verdict: str  # "passed", or "cached" (answered on that tree from an earlier pass)
    duration: float


@dataclass(frozen=True, kw_only=True)
class Proof:
    commit: str
    tree: str
    target: str
    manifest_digest: str
    gates: Mapping[str, GateProof]
    runner: Mapping[str, str]
    landed_at: str

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "commit": self.commit,
            "tree": self.tree,
            "target": self.target,
            "manifest_digest": self.manifest_digest,
            "gates": {
                gate: {"key": g.key, "verdict": g.verdict, "duration": g.duration}
                for gate, g in sorted(self.gates.items())
            },
            "runner": dict(self.runner),
            "landed_at": self.landed_at,
        }

    def signed_bytes(self) -> bytes:
        """What the signature covers: the body, canonical (sorted keys, no spaces)."""
        return orjson.dumps(self.body(), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_body(cls, body: Any) -> Proof:
        """The proof in a note's body; ValueError when any field is not what it must be."""
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} proof")
        texts = ("commit", "tree", "target", "manifest_digest", "landed_at")
        if not all(isinstance(body.get(name), str) for name in texts):
            raise ValueError("a field of the proof is missing or not a string")
        gates, runner = body.get("gates"), body.get("runner")
        if not isinstance(gates, dict) or not isinstance(runner, dict):
            raise ValueError("the proof's gates or runner is not a table")
        proven: dict[str, GateProof] = {}
        for gate, entry in gates.items():
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("key"), str)
                and entry.get("verdict") in VERDICTS
                and isinstance(entry.get("duration"), int | float)
            ):
                raise ValueError(f"the proof's entry for gate {gate!r} is malformed")
            proven[str(gate)] = GateProof(
                key=entry["key"], verdict=entry["verdict"], duration=float(entry["duration"])
            )
        return cls(
            commit=body["commit"],
            tree=body["tree"],
            target=body["target"],
            manifest_digest=body["manifest_digest"],
            gates=proven,
            runner={str(k): str(v) for k, v in runner.items()},
            landed_at=body["landed_at"],
        )


@dataclass(frozen=True, kw_only=True)
class Verified:
    """A proof whose signature verified against trusted allowed signers."""

    proof: Proof
    signer: str  # the principal in allowed_signers


@dataclass(frozen=True, kw_only=True)
class LandedAnswer:
    """A gate answered by a verified landed proof: the one line for its record, what its
    run took then, and whose proof it is (``CacheProof.landed``)."""

    reason: str
    saved: float
    landed: dict[str, Any]


def landed_answer(verified: Verified, gate: str, key: str, log: Path) -> LandedAnswer | None:
    """When the verified proof holds ``gate`` under exactly ``key``: the answer, and a log
    saying where the verdict came from (the gate did not run here)."""
    proven = verified.proof.gates.get(gate)
    if proven is None or proven.key != key:
        return None
    commit = verified.proof.commit
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        f"[dagrunner: answered by the landed proof on {commit} (signed by "
        f"{verified.signer}); the gate did not run here]\n"
    )
    return LandedAnswer(
        reason=f"cached (landed proof {commit[:12]}): key {key[:12]} {proven.verdict} when it "
        f"landed, signed by {verified.signer}; saved {format_duration(proven.duration)}",
        saved=proven.duration,
        landed={
            "commit": commit,
            "signer": verified.signer,
            "verdict": proven.verdict,
            "landed_at": verified.proof.landed_at,
            "runner": dict(verified.proof.runner),
        },
    )


def manifest_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def clean_tree(repo: Path) -> str | None:
    """HEAD's tree id when the checkout is exactly HEAD (no change, no untracked file)."""
    tree = git(["rev-parse", "--verify", "-q", "HEAD^{tree}"], cwd=repo, check=False)
    status = git(["status", "--porcelain", "-z", "--untracked-files=all"], cwd=repo, check=False)
    if tree.returncode != 0 or status.returncode != 0 or status.stdout:
        return None
    return tree.text


def head_tree(repo: Path) -> str | None:
    """HEAD's tree, for a tree the integrator has just reset to exactly its commit (an
    integration slot: ``reset --hard`` and ``clean -ffdx``), so no status is needed."""
    done = git(["rev-parse", "--verify", "-q", "HEAD^{tree}"], cwd=repo, check=False)
    return done.text if done.returncode == 0 else None


def runner_facts(executor: str) -> dict[str, str]:
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "dagrunner": VERSION,
        "executor": executor,
    }


def new_proof(
    *,
    commit: str,
    tree: str,
    target: str,
    manifest: str,
    gates: Mapping[str, GateProof],
    executor: str,
) -> Proof:
    return Proof(
        commit=commit,
        tree=tree,
        target=target,
        manifest_digest=manifest,
        gates=gates,
        runner=runner_facts(executor),
        landed_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


# -- ssh-keygen ------------------------------------------------------------------------------


def _ssh_keygen(args: list[str], data: bytes, home: Path) -> subprocess.CompletedProcess[bytes]:
    """``ssh-keygen args`` with ``data`` on stdin, reading no agent and no user's ~/.ssh."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LC_ALL": "C"}
    return subprocess.run(
        ["ssh-keygen", *args],
        input=data,
        capture_output=True,
        env=env,
        timeout=SSH_TIMEOUT,
        check=False,
    )


def sign(data: bytes, key: Path) -> str:
    """An armored SSH signature of ``data``; OSError saying why when it cannot be made."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-sign-") as home:
        try:
            done = _ssh_keygen(
                ["-Y", "sign", "-q", "-f", str(key), "-n", NAMESPACE], data, Path(home)
            )
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise OSError(f"ssh-keygen could not sign: {exc}") from None
    if done.returncode != 0 or b"BEGIN SSH SIGNATURE" not in done.stdout:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OSError(f"ssh-keygen could not sign with {key}: {said[-1] if said else 'no message'}")
    return done.stdout.decode("ascii", "replace")


def verify(data: bytes, signature: str, allowed: bytes) -> str | None:
    """The principal of ``allowed`` whose key made ``signature`` over ``data``; None if none."""
    with tempfile.TemporaryDirectory(prefix="dagrunner-verify-") as home:
        signers, sig = Path(home) / "allowed_signers", Path(home) / "proof.sig"
        signers.write_bytes(allowed)
        sig.write_text(signature)
        try:
            found = _ssh_keygen(
                ["-Y", "find-principals", "-s", str(sig), "-f", str(signers)], b"", Path(home)
            )
            principals = found.stdout.decode("utf-8", "replace").split()
            for principal in principals if found.returncode == 0 else []:
                check = ["-Y", "verify", "-f", str(signers), "-I", principal, "-n", NAMESPACE]
                checked = _ssh_keygen([*check, "-s", str(sig)], data, Path(home))
                if checked.returncode == 0:
                    return principal
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return None
    return None


# -- the note --------------------------------------------------------------------------------


def write_note(repo: Path, proof: Proof, key: Path | None) -> str | None:
    """Attach ``proof`` (signed with ``key`` when given) to its commit; a warning, or None."""
    signature = None
    problem = None
    if key is not None:
        try:
            signature = sign(proof.signed_bytes(), key)
        except OSError as exc:
            problem = f"the landed proof on {proof.commit[:12]} is unsigned: {exc}"
    note = orjson.dumps({"proof": proof.body(), "signature": signature}, option=orjson.OPT_INDENT_2)
    for _ in range(5):  # another integrator (another target) may be writing a note right now
        done = git(
            ["notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", proof.commit],
            cwd=repo,
            input=note,
            env=IDENTITY,
            check=False,
        )
        if done.returncode == 0:
            return problem
    return f"could not write the landed proof on {proof.commit[:12]}: {done.message}"


def allowed_signers(repo: Path, target: str, environ: Mapping[str, str]) -> bytes | str:
    """Trusted allowed signers: ``DAGRUNNER_ALLOWED_SIGNERS``'s file, else the target tip's
    ``.dagrunner/allowed_signers``; a sentence saying why there are none."""
    named = environ.get("DAGRUNNER_ALLOWED_SIGNERS")
    if named:
        try:
            return Path(named).expanduser().read_bytes()[:MAX_NOTE]
        except OSError as exc:
            return f"DAGRUNNER_ALLOWED_SIGNERS ({named}) cannot be read: {exc.strerror}"
    if (
        target.startswith("-")
        or git(["check-ref-format", "--branch", target], cwd=repo, check=False).returncode
    ):
        return f"--target {target[:80]!r} is not a branch name"
    for ref in (f"refs/heads/{target}", f"refs/remotes/origin/{target}"):
        shown = git(["show", f"{ref}:{SIGNERS_PATH}"], cwd=repo, check=False)
        if shown.returncode == 0:
            return shown.stdout[:MAX_NOTE]
    return f"no {SIGNERS_PATH} on the tip of {target!r} and DAGRUNNER_ALLOWED_SIGNERS is not set"


def read_proof(repo: Path, target: str, environ: Mapping[str, str]) -> Verified | str:
    """HEAD's landed proof, verified; or the one warning saying why it is not used."""
    head = git(["rev-parse", "--verify", "-q", "HEAD^{commit}"], cwd=repo, check=False).text
    shown = git(["notes", f"--ref={NOTES_REF}", "show", head or "HEAD"], cwd=repo, check=False)
    where = f"{NOTES_REF} on HEAD ({head[:12]})"
    if shown.returncode != 0 or not shown.stdout:
        return (
            f"no landed proof in {where} (fetch it: git fetch origin 'refs/notes/*:refs/notes/*')"
        )
    try:
        if len(shown.stdout) > MAX_NOTE:
            raise ValueError("the note is too large")
        note = orjson.loads(shown.stdout)
        proof = Proof.from_body(note.get("proof") if isinstance(note, dict) else None)
        signature = note.get("signature")
    except (orjson.JSONDecodeError, ValueError) as exc:
        return f"the landed proof in {where} is not readable ({exc}); every gate runs"
    if not isinstance(signature, str) or not signature:
        return f"the landed proof in {where} is unsigned; every gate runs"
    if proof.commit != head:
        return f"the landed proof in {where} is about another commit; every gate runs"
    tree = clean_tree(repo)
    if tree != proof.tree:
        return (
            f"the checkout differs from the tree the landed proof in {where} is about "
            "(changes or untracked files); every gate runs"
        )
    allowed = allowed_signers(repo, target, environ)
    if isinstance(allowed, str):
        return f"the landed proof in {where} cannot be verified: {allowed}; every gate runs"
    signer = verify(proof.signed_bytes(), signature, allowed)
    if signer is None:
        return (
            f"the landed proof in {where} does not verify against the allowed signers "
            "(tampered, or signed by a key they do not list); every gate runs"
        )
    return Verified(proof=proof, signer=signer)


def drop_notes(root: Path, commits: tuple[str, ...], *, dry_run: bool) -> int:
    """Remove the landed proofs (``refs/notes/dagrunner``) on ``commits``, in one notes
    commit, except one on the tip of a branch or tag: ``release-check --reuse-landed``
    answers from the proof on the commit it checks, which is a tip.  Another commit's CI
    without its proof runs every gate: slower, never a wrong pass.  How many (would) go."""
    if not commits:
        return 0
    listed = git(["notes", f"--ref={NOTES_REF}", "list"], cwd=root, check=False)
    noted = {line.split()[1] for line in listed.text.splitlines() if len(line.split()) == 2}
    tips = git(
        ["for-each-ref", "--format=%(objectname) %(*objectname)", "refs/heads", "refs/remotes",
         "refs/tags"],
        cwd=root,
    ).text.split()  # fmt: skip
    drop = sorted((set(commits) & noted) - set(tips))
    if drop and not dry_run:
        git(
            ["notes", f"--ref={NOTES_REF}", "remove", "--ignore-missing", "--stdin"],
            cwd=root,
            input="\n".join(drop).encode() + b"\n",
            env=IDENTITY,
        )
    return len(drop)
