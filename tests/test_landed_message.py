"""``[integrate] message``: a landed commit's message from the target's template, with the
worker's own subject line (untrusted: one bounded line that can never forge a trailer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from conftest import BROKEN_GATE, commit_release_manifest, git, run_json, write_manifest
from test_integration import states, worker

from dagrunner.git.repo import repo_info
from dagrunner.integration.landing import TRAILER, landed_on_target
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit


def committing(subject: str, name: str = "w1") -> Callable[[Path], None]:
    """A worker change that commits with ``subject``."""

    def change(path: Path) -> None:
        (path / f"{name}.txt").write_text(f"{name}\n")
        git(path, "add", f"{name}.txt")
        git(path, "commit", "-q", "-m", subject)

    return change


def subjects(project: Path) -> list[str]:
    return git(project, "log", "--format=%s", "main").splitlines()


def test_the_template_makes_a_conventional_commit_of_the_workers_subject(project: Path) -> None:
    commit_release_manifest(
        project, '[integrate]\nmessage = "feat({mission}): {subject} [{worker}]"\n' + BROKEN_GATE
    )
    envelope = worker(project, "w1", committing("add the widget"))
    submit(repo_info(project), [envelope])
    integrate(repo=project)
    assert states(project) == {"w1": "landed"}
    assert subjects(project)[0] == "feat(swarm): add the widget [w1]"
    assert list(landed_on_target(project, "main")) == [orjson.loads(envelope.read_bytes())["id"]]


def test_without_a_template_the_message_is_as_before(project: Path) -> None:
    submit(repo_info(project), [worker(project, "w1", committing("anything"))])
    integrate(repo=project)
    assert subjects(project)[0] == "dagrunner: integrate swarm/w1"


def test_a_hostile_subject_is_one_bounded_line_and_forges_no_trailer(
    project: Path, tmp_path: Path
) -> None:
    commit_release_manifest(project, '[integrate]\nmessage = "fix: {subject}"\n' + BROKEN_GATE)
    envelope = worker(project, "w1", committing("honest"))
    victim = "swarm.victim.0123456789abcdef"
    forged = (
        "x\n\n" + f"{TRAILER}: {victim}\nDagrunner-Envelope-Sha256: {'0' * 64}\n"
        "\x1b]8;;http://evil\x07click\x1b]8;;\x07\u2028" + "A" * 5000
    )
    body = orjson.loads(envelope.read_bytes())
    body["subject"] = forged
    envelope.write_bytes(orjson.dumps(body))
    submit(repo_info(project), [envelope])
    integrate(repo=project)
    assert states(project) == {"w1": "landed"}
    message = git(project, "log", "-1", "--format=%B", "main")
    first = message.split("\n", 1)[0]
    assert first.startswith("fix: x Dagrunner-Envelope: swarm.victim")
    assert "\x1b" not in message and "\x07" not in message and "\u2028" not in message
    assert len(first) <= len("fix: ") + 200
    ids = git(project, "log", "-1", f"--format=%(trailers:key={TRAILER},valueonly)", "main")
    assert ids.split() == [body["id"]]  # exactly its own trailer, no forged one
    assert victim not in landed_on_target(project, "main")


def test_a_subject_that_is_not_a_string_is_refused(project: Path) -> None:
    envelope = worker(project, "w1", committing("fine"))
    body = orjson.loads(envelope.read_bytes())
    body["subject"] = ["not", "text"]
    envelope.write_bytes(orjson.dumps(body))
    with pytest.raises(Exception) as raised:
        submit(repo_info(project), [envelope])
    assert getattr(raised.value, "code", "") == "envelope-field"


@pytest.mark.parametrize(
    "template",
    ["{scope}: {subject}", "{subject!r}", "{subject.upper}", "{0}", "feat: {", ""],
)
def test_a_template_with_an_unknown_placeholder_is_a_coded_error(
    repo: Path, capsys: pytest.CaptureFixture[str], template: str
) -> None:
    text = f'[integrate]\nmessage = "{template}"\n\n[gates.a]\nrun = ["touch", "ran"]\n'
    path = write_manifest(repo, text)
    code, body = run_json(capsys, "release-check", str(path), "--repo", str(repo))
    assert code == 2
    assert body["error"]["code"] == "manifest-value"
    assert body["error"]["file"] == str(path)
    assert body["error"]["key"] == "integrate.message"
    assert not (repo / "ran").exists()


def test_the_exported_envelope_carries_the_workers_subject(project: Path) -> None:
    envelope = worker(project, "w1", committing("first"))
    assert orjson.loads(envelope.read_bytes())["subject"] == "first"
    plain = worker(project, "w2", lambda p: (p / "w2.txt").write_text("2\n"))
    assert orjson.loads(plain.read_bytes())["subject"] == ""
