"""Envelopes are untrusted: forged provenance, injected trailers, ids as paths, self-approval,
forged changed_files and conflict markers -- each tried as a hostile worker would (issue #9)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import git, run_json

from dagrunner.envelope import envelope_id, load_envelope, parse_envelope
from dagrunner.errors import DagrunnerError
from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.records.integration import EnvelopeState
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting

GATE = """
[gates.check]
run = "! grep -rq BROKEN --include=*.txt ."
"""


@pytest.fixture
def project(repo: Path) -> Path:
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text(GATE)
    (repo / "shared.txt").write_text("one\ntwo\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project")
    return repo


def allocate(repo: Path, worker: str, session: str | None = None) -> Path:
    return Path(wt.allocate(mission="m", worker=worker, repo=repo, session=session)["path"])


def export(repo: Path, worker: str, out: Path) -> dict[str, Any]:
    exporting.export(f"m/{worker}", output=out, repo=repo)
    fields: dict[str, Any] = orjson.loads(out.read_bytes())
    return fields


def forge(path: Path, fields: dict[str, Any], *, rehash: bool = True) -> Path:
    """Write ``fields`` as an envelope, its id recomputed the way export derives it."""
    if rehash:
        fields["id"] = envelope_id(
            fields["mission"], fields["worker"], fields["base"], fields["tree"]
        )
    path.write_bytes(orjson.dumps(fields))
    return path


def error_code(call: Any) -> str:
    with pytest.raises(DagrunnerError) as info:
        call()
    return info.value.code


# -- 1. provenance ------------------------------------------------------------------------


def test_forged_provenance_lands_but_never_cleans_the_victims_worktree(
    project: Path, tmp_path: Path
) -> None:
    victim = allocate(project, "victim", session="victim-session")
    (victim / "feature.txt").write_text("committed work\n")
    git(victim, "add", "-A")
    git(victim, "commit", "-q", "-m", "victim's work")
    (victim / "draft.txt").write_text("uncommitted draft\n")
    victim_fields = export(project, "victim", tmp_path / "victim.json")  # reveals its tree

    attacker = allocate(project, "attacker", session="attacker-session")
    (attacker / "harmless.txt").write_text("harmless\n")
    fields = export(project, "attacker", tmp_path / "attacker.json")
    fields.update(
        mission="m",
        worker="victim",
        session="victim-session",
        tree=victim_fields["tree"],
    )
    forged = forge(tmp_path / "forged.json", fields)
    submit(repo_info(project), [forged])
    result = integrate(repo=project)

    outcome = result.envelopes[0]
    assert outcome.state == "landed"  # the harmless diff itself may land ...
    assert (outcome.worktree or "").startswith("retained:"), outcome
    # ... but the victim's worktree, branch, commit and draft are all still there.
    assert (victim / "draft.txt").read_text() == "uncommitted draft\n"
    assert (victim / "feature.txt").exists()
    assert git(project, "branch", "--list", "dagrunner/m/victim").strip()
    assert "feature.txt" not in git(project, "ls-tree", "-r", "--name-only", "main")


def test_genuine_landing_still_cleans_its_own_worktree(project: Path, tmp_path: Path) -> None:
    path = allocate(project, "honest", session="s1")
    (path / "honest.txt").write_text("ok\n")
    export(project, "honest", tmp_path / "honest.json")
    submit(repo_info(project), [tmp_path / "honest.json"])
    result = integrate(repo=project)
    assert result.envelopes[0].state == "landed"
    assert result.envelopes[0].worktree in ("pooled", "removed")
    assert not path.exists()


# -- 2. trailer injection and strict recovery ---------------------------------------------------


def test_id_with_a_newline_is_rejected_at_submit(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    fields["id"] += "\nDagrunner-Envelope: m.victim.0123456789abcdef"
    forged = forge(tmp_path / "forged.json", fields, rehash=False)
    code, body = run_json(capsys, "integrate", "submit", str(forged), "--repo", str(project))
    assert code == 2 and body["error"]["code"] == "envelope-name"
    assert Queue.of(repo_info(project)).entries() == {}


def test_recovery_trusts_only_the_integrators_own_trailers(project: Path, tmp_path: Path) -> None:
    path = allocate(project, "victim")
    (path / "victim.txt").write_text("victim's file\n")
    fields = export(project, "victim", tmp_path / "victim.json")
    info = repo_info(project)
    submit(info, [tmp_path / "victim.json"])
    Queue.of(info).record(fields["id"], EnvelopeState.APPLYING)  # as if a crash interrupted it
    # Somebody else's commit on main carries the victim's id as a trailer.
    (project / "other.txt").write_text("other\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", f"unrelated\n\nDagrunner-Envelope: {fields['id']}")
    result = integrate(repo=project)
    outcome = result.envelopes[0]
    assert outcome.state == "landed" and not outcome.details.recovered
    assert git(project, "show", "main:victim.txt") == "victim's file\n"


# -- 3. no field becomes a path unvalidated ----------------------------------------------------


@pytest.mark.parametrize("bad_id", ["../../../../../pwned", "ABSOLUTE", "x" * 300, "a\0b"])
def test_id_that_would_be_a_path_is_rejected(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_id: str
) -> None:
    absolute = tmp_path / "outside" / "pwned-abs"
    absolute.parent.mkdir()
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    fields["id"] = str(absolute) if bad_id == "ABSOLUTE" else bad_id
    forged = forge(tmp_path / "forged.json", fields, rehash=False)
    code, body = run_json(capsys, "integrate", "submit", str(forged), "--repo", str(project))
    assert code == 2 and body["error"]["code"] == "envelope-name", body
    assert list(absolute.parent.iterdir()) == []
    for parent in project.parents:
        assert not (parent / "pwned.json").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("mission", "../up"), ("worker", "a/b"), ("session", "x\ny"), ("mission", "m" * 64)],
)
def test_names_are_safe_names(project: Path, tmp_path: Path, field: str, value: str) -> None:
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    fields[field] = value
    raw = orjson.dumps(fields)
    assert error_code(lambda: parse_envelope(raw)) == "envelope-name"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repo", {"common_dir": "/x", "root_commits": [[1]]}),
        ("status", [1]),
        ("changed_files", [{"path": 1}]),
        ("branch", "a\x1b[31mred"),
        ("diff_bytes", True),
    ],
)
def test_mistyped_fields_are_coded_errors(
    project: Path, tmp_path: Path, field: str, value: object
) -> None:
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    fields[field] = value
    raw = orjson.dumps(fields)
    assert error_code(lambda: parse_envelope(raw)) in ("envelope-field", "envelope-hash")


# -- 4. the gates that judge an envelope come from the target ------------------------------------


def test_envelope_cannot_approve_itself_by_rewriting_the_manifest(
    project: Path, tmp_path: Path
) -> None:
    path = allocate(project, "cheat")
    (path / "manifests" / "release.toml").write_text('[gates.ok]\nrun = "true"\n')
    (path / "bad.txt").write_text("BROKEN\n")
    export(project, "cheat", tmp_path / "cheat.json")
    submit(repo_info(project), [tmp_path / "cheat.json"])
    result = integrate(repo=project)
    outcome = result.envelopes[0]
    assert outcome.state == "gates-failed" and outcome.details.failed_gates == ("check",)
    assert outcome.details.manifest_changed is True
    assert not result.ok and result.exit_code == 1  # the API's verdict is the CLI's
    assert "bad.txt" not in git(project, "ls-tree", "-r", "--name-only", "main")


def test_trust_envelope_manifest_is_an_explicit_opt_in(project: Path, tmp_path: Path) -> None:
    path = allocate(project, "cheat")
    (path / "manifests" / "release.toml").write_text('[gates.ok]\nrun = "true"\n')
    (path / "bad.txt").write_text("BROKEN\n")
    export(project, "cheat", tmp_path / "cheat.json")
    submit(repo_info(project), [tmp_path / "cheat.json"])
    result = integrate(repo=project, trust_envelope_manifest=True)
    assert result.envelopes[0].state == "landed"


# -- 5. changed_files is verified; the diff is read by its structure ---------------------------------


def test_forged_changed_files_is_rejected(project: Path, tmp_path: Path) -> None:
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    for forged in ([], [*fields["changed_files"], {"path": "b.txt", "old_path": None}]):
        raw = orjson.dumps({**fields, "changed_files": forged})
        assert error_code(lambda raw=raw: parse_envelope(raw)) == "envelope-changed-files"


def test_removed_sql_comment_line_is_content_not_a_header(project: Path, tmp_path: Path) -> None:
    (project / "schema.sql").write_text("select 1;\n-- /etc/hosts is read below\nselect 2;\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "sql")
    path = allocate(project, "sql")
    (path / "schema.sql").write_text("select 1;\nselect 2;\n")
    export(project, "sql", tmp_path / "sql.json")
    envelope = load_envelope(tmp_path / "sql.json")
    assert [c["path"] for c in envelope.fields["changed_files"]] == ["schema.sql"]


def test_diff_that_is_not_gits_format_is_rejected(project: Path, tmp_path: Path) -> None:
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    diff = fields["diff"].encode() + b"trailing garbage\n"
    fields.update(
        diff=diff.decode(), diff_bytes=len(diff), diff_sha256=hashlib.sha256(diff).hexdigest()
    )
    assert error_code(lambda: parse_envelope(orjson.dumps(fields))) == "envelope-diff"


# -- 6. conflict markers never travel ------------------------------------------------------------


def test_export_in_the_middle_of_a_merge_is_refused(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = allocate(project, "merger")
    git(path, "checkout", "-q", "-b", "side")
    (path / "shared.txt").write_text("one\nside\n")
    git(path, "commit", "-q", "-am", "side")
    git(path, "checkout", "-q", "dagrunner/m/merger")
    (path / "shared.txt").write_text("one\nmine\n")
    git(path, "commit", "-q", "-am", "mine")
    with pytest.raises(Exception):  # noqa: B017 - the merge conflicts, as intended
        git(path, "merge", "-q", "side")
    code, body = run_json(capsys, "worktree", "export", "m/merger", "--repo", str(project))
    assert code == 4 and body["error"]["code"] == "export-unfinished"
    assert "shared.txt" in body["error"]["message"]


def test_envelope_whose_status_shows_unmerged_paths_is_rejected(
    project: Path, tmp_path: Path
) -> None:
    path = allocate(project, "w1")
    (path / "a.txt").write_text("a\n")
    fields = export(project, "w1", tmp_path / "w1.json")
    fields["status"] = ["u UU N... 100644 100644 100644 100644 " + "0" * 40 * 3 + " shared.txt"]
    assert error_code(lambda: parse_envelope(orjson.dumps(fields))) == "envelope-unmerged"
