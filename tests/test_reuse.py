"""Never gate the same thing twice: verdicts reused across the pipeline's speculative trees
and rebuilds (identical keys in flight run once), on real repositories and processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import orjson
from conftest import CLI, commit_release_manifest, git
from test_integration import worker

from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit


def heavy_manifest(tmp: Path) -> str:
    """``heavy`` (1 s, inputs src/**) counts its runs in runs.txt; ``other`` fails on reject.txt."""
    return f"""
[sandbox]
writable = ["{tmp}"]

[gates.heavy]
run = "sleep 1; echo ran >> '{tmp / "runs.txt"}'; ! grep -q BAD src/a.txt"
inputs = ["src/**"]

[gates.other]
run = "test ! -e reject.txt"
"""


def four_with_a_culprit(project: Path, tmp: Path) -> list[Path]:
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(project, heavy_manifest(tmp))
    return [
        worker(project, "w1", lambda p: (p / "src" / "a.txt").write_text("GOOD too\n")),
        worker(project, "w2", lambda p: (p / "reject.txt").write_text("culprit\n")),
        worker(project, "w3", lambda p: (p / "three.txt").write_text("3\n")),
        worker(project, "w4", lambda p: (p / "four.txt").write_text("4\n")),
    ]


def test_a_key_in_flight_runs_once_across_speculative_trees_and_rebuilds(
    project: Path, tmp_path: Path
) -> None:
    """The issue's case: 4 envelopes, window 4, the second a culprit; ``heavy``'s inputs are
    the same in every tree after the first.  It runs once: the other trees wait for the key
    in flight, and the rebuilds behind the culprit are answered from it."""
    envelopes = four_with_a_culprit(project, tmp_path)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, window=4, batch=1)
    final = {o.worker: str(o.state) for o in result.envelopes}
    assert final == {"w1": "landed", "w2": "gates-failed", "w3": "landed", "w4": "landed"}
    assert (tmp_path / "runs.txt").read_text().count("ran") == 1
    # w3 and w4, rebuilt behind the culprit, at least (the culprit's own tree stops at its
    # failing check, so its heavy may never be asked for)
    assert result.gates_reused >= 2, result.to_json()
    assert git(project, "show", "main:three.txt") == "3\n"


def test_trees_ahead_in_the_speculation_lend_their_verdicts_to_the_trees_built_on_them(
    project: Path, tmp_path: Path
) -> None:
    """Every envelope changes a file outside heavy's inputs, so each tree's verdict is scoped
    to that tree (the reuse rule).  A tree built on the trees ahead lands only after they
    do, so their verdicts answer it: heavy runs once for three trees gated at once."""
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(project, heavy_manifest(tmp_path))
    envelopes = [
        worker(project, f"w{i}", lambda p, i=i: (p / f"own{i}.txt").write_text(f"{i}\n"))
        for i in range(1, 4)
    ]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, window=3, batch=1)
    assert {str(o.state) for o in result.envelopes} == {"landed"}, result.to_json()
    assert (tmp_path / "runs.txt").read_text().count("ran") == 1
    assert result.gates_waited == 2 and result.gates_reused == 2, result.to_json()
    proofs = [
        orjson.loads((Path(run.report) / "gates" / "heavy.json").read_bytes())["cache"]
        for run in result.pipeline
    ]
    assert [p.get("tree_scoped") is not None for p in proofs] == [True, True, True]


def test_a_failed_flight_answers_nobody_and_its_waiters_run_themselves(
    project: Path, tmp_path: Path
) -> None:
    """w1 makes heavy fail; w2's tree (the same inputs) waited for w1's heavy, then runs its
    own -- a failure is never lent -- and rebuilt onto a head without the suspect w1, lands."""
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(project, heavy_manifest(tmp_path))
    first = worker(project, "w1", lambda p: (p / "src" / "a.txt").write_text("BAD\n"))
    second = worker(project, "w2", lambda p: (p / "two.txt").write_text("2\n"))
    submit(repo_info(project), [first, second])
    result = integrate(repo=project, window=2, batch=1)
    final = {o.worker: str(o.state) for o in result.envelopes}
    assert final == {"w1": "gates-failed", "w2": "landed"}, result.to_json()
    assert git(project, "show", "main:src/a.txt") == "GOOD\n"
    heavy = [
        orjson.loads((Path(run.report) / "gates" / "heavy.json").read_bytes())["status"]
        for run in result.pipeline
        if (Path(run.report) / "gates" / "heavy.json").exists()
    ]
    assert "cached" not in heavy[: heavy.count("failed")], heavy
    # w1's run and its confirmation fail; w2, built without the suspect w1, passes
    assert heavy.count("failed") >= 2 and heavy.count("passed") == 1, heavy


# -- landed proofs ----------------------------------------------------------------------------


def keypair(folder: Path, name: str) -> tuple[Path, str]:
    """A real ed25519 key (no passphrase) and its allowed_signers line."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True
    )
    public = (folder / f"{name}.pub").read_text().split()
    return key, f'{name}@example namespaces="dagrunner-landed-proof" {public[0]} {public[1]}\n'


def proof_manifest(tmp: Path) -> str:
    """``heavy`` has inputs; ``whole`` has none (its proof is keyed by the whole tree); both
    count their runs; ``heavy``'s tool reads a version file outside the repository."""
    return f"""
[sandbox]
writable = ["{tmp}"]

[gates.heavy]
run = "echo ran >> '{tmp / "heavy.txt"}'; ! grep -q BAD src/a.txt"
inputs = ["src/**"]
tools = ["cat '{tmp / "tool-version"}'"]

[gates.whole]
run = "echo ran >> '{tmp / "whole.txt"}'"
needs = ["heavy"]
"""


def landed_project(project: Path, tmp: Path) -> tuple[Path, str]:
    """main with the manifest and the integrator's key in .dagrunner/allowed_signers; one
    envelope integrated and landed with DAGRUNNER_SIGNING_KEY.  The key; the landed commit."""
    key, line = keypair(tmp / "keys", "integrator")
    (tmp / "tool-version").write_text("tool 1.0\n")
    (project / ".dagrunner").mkdir()
    (project / ".dagrunner" / "allowed_signers").write_text(line)
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    commit_release_manifest(project, proof_manifest(tmp))
    envelope = worker(project, "w1", lambda p: (p / "src" / "a.txt").write_text("GOOD too\n"))
    submit(repo_info(project), [envelope])
    result = integrate(repo=project, env={**os.environ, "DAGRUNNER_SIGNING_KEY": str(key)})
    assert result.ok and not result.warnings, result.to_json()
    return key, git(project, "rev-parse", "main").strip()


def fresh_clone(project: Path, tmp: Path, name: str = "clone") -> Path:
    clone = tmp / name
    git(tmp, "clone", "-q", str(project), str(clone))
    git(clone, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    return clone


def reuse_landed(clone: Path, tmp: Path, *extra: str, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [*CLI, "release-check", "--reuse-landed", "--json", "--report-dir", str(tmp / "r"), *extra],
        cwd=clone,
        # a cache of its own each time: only the proof can answer
        env={**os.environ, "DAGRUNNER_CACHE_DIR": str(tmp / uuid.uuid4().hex), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = orjson.loads(done.stdout)
    shutil.rmtree(tmp / "r")
    return body


def statuses(body: dict[str, Any]) -> dict[str, str]:
    return {g["id"]: g["status"] for g in body["gates"]}


def test_a_fresh_clone_with_the_notes_runs_no_gate_and_says_whose_proof(
    project: Path, tmp_path: Path
) -> None:
    _, landed = landed_project(project, tmp_path)
    note = orjson.loads(git(project, "notes", "--ref=dagrunner", "show", landed))
    assert note["signature"].startswith("-----BEGIN SSH SIGNATURE-----")
    assert set(note["proof"]["gates"]) == {"heavy", "whole"}
    assert note["proof"]["tree"] == git(project, "rev-parse", "main^{tree}").strip()
    before = [(tmp_path / f).read_text() for f in ("heavy.txt", "whole.txt")]
    clone = fresh_clone(project, tmp_path)
    explained = subprocess.run(
        [*CLI, "cache", "explain", "whole", "--json"], cwd=clone, capture_output=True, timeout=60
    )
    landed_answer = orjson.loads(explained.stdout)["landed"]
    assert landed_answer["answers"] and landed_answer["signer"] == "integrator@example"
    body = reuse_landed(clone, tmp_path)
    assert statuses(body) == {"heavy": "cached", "whole": "cached"}, body["warnings"]
    assert [(tmp_path / f).read_text() for f in ("heavy.txt", "whole.txt")] == before
    reasons = [g["reason"] for g in body["gates"]]
    assert all(f"landed proof {landed[:12]}" in r and "integrator@example" in r for r in reasons)
    assert body["gates"][0]["cache"]["landed"]["commit"] == landed
    assert body["warnings"] == []


def test_a_tampered_proof_a_wrong_signer_or_a_new_tool_version_make_the_gates_run(
    project: Path, tmp_path: Path
) -> None:
    _, landed = landed_project(project, tmp_path)
    clone = fresh_clone(project, tmp_path)
    # a wrong signer: the caller's allowed signers list another key only
    _, other = keypair(tmp_path / "keys", "someone")
    (tmp_path / "signers").write_text(other)
    body = reuse_landed(clone, tmp_path, DAGRUNNER_ALLOWED_SIGNERS=str(tmp_path / "signers"))
    assert statuses(body) == {"heavy": "passed", "whole": "passed"}
    assert any("does not verify" in w for w in body["warnings"]), body["warnings"]
    # a new version of heavy's tool: heavy's key differs, so it runs (and whole, which needs it)
    (tmp_path / "tool-version").write_text("tool 2.0\n")
    body = reuse_landed(clone, tmp_path)
    assert statuses(body) == {"heavy": "passed", "whole": "passed"}, body["warnings"]
    (tmp_path / "tool-version").write_text("tool 1.0\n")
    # a tampered proof: one byte of a duration changed, the signature kept
    note = orjson.loads(git(clone, "notes", "--ref=dagrunner", "show", landed))
    note["proof"]["gates"]["heavy"]["duration"] += 1
    (tmp_path / "note.json").write_bytes(orjson.dumps(note))
    git(clone, "notes", "--ref=dagrunner", "add", "-f", "-F", str(tmp_path / "note.json"), landed)
    body = reuse_landed(clone, tmp_path)
    assert statuses(body) == {"heavy": "passed", "whole": "passed"}
    assert sum("does not verify" in w for w in body["warnings"]) == 1, body["warnings"]


def test_a_commit_that_adds_its_own_key_cannot_vouch_for_itself(
    project: Path, tmp_path: Path
) -> None:
    """The hostile view: the commit under test adds the attacker's key to allowed_signers and
    carries a proof signed by it.  Signers come from main's tip, so the proof is ignored."""
    landed_project(project, tmp_path)
    clone = fresh_clone(project, tmp_path)
    evil, line = keypair(tmp_path / "keys", "attacker")
    git(clone, "checkout", "-q", "-b", "pr")
    with (clone / ".dagrunner" / "allowed_signers").open("a") as signers:
        signers.write(line)
    (clone / "src" / "a.txt").write_text("BAD\n")  # heavy fails on this tree
    git(clone, "commit", "-qam", "trust me")
    head = git(clone, "rev-parse", "HEAD").strip()
    note = orjson.loads(git(clone, "notes", "--ref=dagrunner", "show", "main"))
    proof = note["proof"]
    proof["commit"], proof["tree"] = head, git(clone, "rev-parse", "HEAD^{tree}").strip()
    heavy_key = reuse_landed_keys(clone, tmp_path)
    proof["gates"]["heavy"]["key"] = heavy_key  # a forged pass for this tree's real key
    note["signature"] = sign_as(evil, proof, tmp_path)
    (tmp_path / "note.json").write_bytes(orjson.dumps(note))
    git(clone, "notes", "--ref=dagrunner", "add", "-f", "-F", str(tmp_path / "note.json"), head)
    done = subprocess.run(
        [*CLI, "release-check", "--reuse-landed", "--json"],
        cwd=clone,
        env={**os.environ, "DAGRUNNER_CACHE_DIR": str(tmp_path / "another-cache")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = orjson.loads(done.stdout)
    assert done.returncode == 1 and statuses(body)["heavy"] == "failed", body["warnings"]
    assert any("does not verify" in w for w in body["warnings"]), body["warnings"]


def reuse_landed_keys(clone: Path, tmp: Path) -> str:
    """heavy's key on the clone's HEAD, as a run computes it (its record's cache proof)."""
    done = subprocess.run(
        [*CLI, "release-check", "--dry-run", "--json"],
        cwd=clone,
        env={**os.environ, "DAGRUNNER_CACHE_DIR": str(tmp / "another-cache")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return str(orjson.loads(done.stdout)["gates"]["heavy"]["cache"]["key"])


def sign_as(key: Path, proof: dict[str, Any], tmp: Path) -> str:
    data = orjson.dumps(proof, option=orjson.OPT_SORT_KEYS)
    done = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-q", "-f", str(key), "-n", "dagrunner-landed-proof"],
        input=data,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode()
