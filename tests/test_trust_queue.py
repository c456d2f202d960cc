"""Trust boundary II, items 2 and 3: a queue item is known by its content, never by an id
anyone can recompute, and every item belongs to one target -- each tried as a hostile worker
(or a careless second integrator) would, with the CLI, on real repositories."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
from conftest import CLI, commit_release_manifest, git
from test_integration import worker
from test_pipeline import numbered

from dagrunner.envelope import envelope_id
from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit


def cli(repo: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([*CLI, *args, "--json"], cwd=repo, capture_output=True, check=False)
    return done.returncode, orjson.loads(done.stdout)


def impersonating(project: Path, victim: Path, tmp_path: Path) -> Path:
    """The attacker's own change, re-labelled as the victim's work: worker, tree and a
    recomputed id taken from the victim's envelope."""
    mine = worker(project, "attacker", lambda p: (p / "attacker.txt").write_text("evil\n"))
    fields = orjson.loads(mine.read_bytes())
    theirs = orjson.loads(victim.read_bytes())
    fields["worker"], fields["tree"] = theirs["worker"], theirs["tree"]
    fields["id"] = envelope_id(fields["mission"], fields["worker"], fields["base"], fields["tree"])
    assert fields["id"] == theirs["id"]  # the id is public: anyone can make it
    forged = tmp_path / "forged.json"
    forged.write_bytes(orjson.dumps(fields))
    return forged


def test_an_envelope_that_takes_a_victims_id_never_answers_for_the_victim(
    project: Path, tmp_path: Path
) -> None:
    victim = worker(project, "victim", lambda p: (p / "victim.txt").write_text("mine\n"))
    forged = impersonating(project, victim, tmp_path)
    code, first = cli(project, "integrate", "submit", str(forged))
    assert code == 0
    code, second = cli(project, "integrate", "submit", str(victim))
    assert code == 0
    [taken], [queued] = first["submitted"], second["submitted"]
    assert queued["duplicate"] is False and queued["id"] != taken["id"]
    assert queued["envelope"] == taken["envelope"]  # the same envelope id, two items
    assert queued["provenance"] == "ledger"
    assert taken["provenance"].startswith("unproven")
    result = integrate(repo=project, window=1)
    assert result.ok
    outcomes = {o.id: o for o in result.envelopes}
    assert (outcomes[taken["id"]].provenance or "").startswith("unproven")
    code, waited = cli(project, "integrate", "submit", str(victim), "--wait", "--timeout", "30s")
    assert code == 0, waited
    [answer] = waited["outcomes"]
    assert answer["id"] == queued["id"] and answer["state"] == "landed"
    # the victim's work is really on main, in the commit the answer names
    assert git(project, "show", "main:victim.txt") == "mine\n"
    assert "victim.txt" in git(project, "show", "--name-only", "--format=", answer["commit"])


def test_the_same_envelope_submitted_twice_is_one_item(project: Path) -> None:
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    once = submit(repo_info(project), [envelope])
    again = submit(repo_info(project), [envelope])
    assert [s.id for s in once] == [s.id for s in again] and again[0].duplicate
    assert len(Queue.of(repo_info(project)).entries()) == 1


def test_two_integrators_of_two_targets_never_share_an_item(project: Path, tmp_path: Path) -> None:
    """The issue's reproduction: ten items for main, then integrators of main and of rel
    (whose manifest fails) at once; rel takes none, main lands all ten, each once."""
    git(project, "branch", "rel")
    failing = tmp_path / "failing.toml"
    failing.write_text('[gates.no]\nrun = "false"\n')
    envelopes = numbered(project, 10)
    submitted = submit(repo_info(project), envelopes)
    assert {s.target for s in submitted} == {"main"}
    main = subprocess.Popen(
        [*CLI, "integrate", "run", "--target", "main", "--json"],
        cwd=project,
        stdout=subprocess.PIPE,
    )
    rel = subprocess.Popen(
        [*CLI, "integrate", "run", "--target", "rel", "--manifest", str(failing), "--json"],
        cwd=project,
        stdout=subprocess.PIPE,
    )
    main_out, _ = main.communicate(timeout=300)
    rel_out, _ = rel.communicate(timeout=300)
    assert main.returncode == 0 and rel.returncode == 0, (main_out, rel_out)
    assert orjson.loads(rel_out)["envelopes"] == []
    entries = Queue.of(repo_info(project)).entries()
    assert {e.state for e in entries.values()} == {"landed"}
    # no line of rel's is about any of them, and every final line is main's
    journal = [
        orjson.loads(line)
        for line in Queue.of(repo_info(project)).journal.read_bytes().splitlines()
    ]
    assert not [line for line in journal if line.get("target") == "rel"]
    assert git(project, "rev-parse", "rel").strip() != git(project, "rev-parse", "main").strip()


def test_a_final_state_is_final_whatever_a_later_line_says(project: Path) -> None:
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    [item] = submit(repo_info(project), [envelope])
    assert integrate(repo=project, window=1).ok
    queue = Queue.of(repo_info(project), target="main")
    from dagrunner.records.integration import EnvelopeState

    queue.record(item.id, EnvelopeState.GATES_FAILED)  # a stray line after landing
    Queue(queue.dir, "rel").record(item.id, EnvelopeState.QUEUED)  # another target's line
    assert queue.entries()[item.id].state == "landed"


def test_submit_names_a_target_that_exists(project: Path) -> None:
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    code, said = cli(project, "integrate", "submit", str(envelope), "--target", "no-such")
    assert code == 2 and said["error"]["code"] == "unknown-target"
    assert not Queue.of(repo_info(project)).entries()
    git(project, "branch", "rel")
    code, said = cli(project, "integrate", "submit", str(envelope), "--target", "rel")
    assert code == 0 and said["submitted"][0]["target"] == "rel"
    result = integrate(repo=project, window=1)  # main's integrator: not its item
    assert result.envelopes == [] and Queue.of(repo_info(project)).pending() == [
        said["submitted"][0]["id"]
    ]
    assert integrate(repo=project, target="rel", window=1).ok
    assert git(project, "show", "rel:one.txt") == "1\n"


def test_an_item_queued_without_a_target_is_claimed_once(project: Path) -> None:
    """An item an older dagrunner queued (no target in its line) goes to the first integrator
    that claims it, in the journal; the other target's integrator then leaves it alone."""
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    [item] = submit(repo_info(project), [envelope])
    queue = Queue.of(repo_info(project))
    lines = queue.journal.read_bytes().splitlines()
    legacy = orjson.loads(lines[0])
    del legacy["target"]
    queue.journal.write_bytes(orjson.dumps(legacy) + b"\n")
    git(project, "branch", "rel")
    assert Queue.of(repo_info(project), target="rel").pending() == [item.id]  # claimed
    assert Queue.of(repo_info(project), target="main").pending() == []
    assert queue.entries()[item.id].target == "rel"


POISONABLE = """
[gates.heavy]
run = "sh check.sh"
inputs = ["src/**"]

[gates.other]
run = "test ! -e reject.txt"
"""


def test_an_envelope_cannot_lend_its_pass_to_another_tree_through_an_undeclared_input(
    project: Path,
) -> None:
    """The issue's reproduction (the cache poisoning behind Nx's CREEP advisory): ``heavy``
    reads check.sh, which its inputs do not declare.  ``h`` makes check.sh lenient, sets
    src/a.txt to BAD and fails another gate; ``x`` only sets src/a.txt to BAD.  ``x`` must
    not land on ``h``'s verdict: heavy really fails on x's tree."""
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    (project / "check.sh").write_text("! grep -q BAD src/a.txt\n")
    commit_release_manifest(project, POISONABLE)

    def h(p: Path) -> None:
        (p / "check.sh").write_text("exit 0\n")
        (p / "src" / "a.txt").write_text("BAD\n")
        (p / "reject.txt").write_text("the other gate rejects this\n")

    first = worker(project, "h", h)
    second = worker(project, "x", lambda p: (p / "src" / "a.txt").write_text("BAD\n"))
    submit(repo_info(project), [first, second])
    result = integrate(repo=project, window=2)
    final = {o.worker: str(o.state) for o in result.envelopes}
    assert final == {"h": "gates-failed", "x": "gates-failed"}, result.to_json()
    assert git(project, "show", "main:src/a.txt") == "GOOD\n"
    x_outcome = next(o for o in result.envelopes if o.worker == "x")
    assert "heavy" in (x_outcome.details.failed_gates or ())


def test_a_verdict_on_a_tree_equal_to_the_target_outside_the_inputs_is_reused(
    project: Path,
) -> None:
    """The rule's other side: an envelope that changes only a gate's declared inputs lends
    its pass by key -- a later tree with the same inputs is answered from it, with proof."""
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("GOOD\n")
    (project / "check.sh").write_text("! grep -q BAD src/a.txt\n")
    commit_release_manifest(project, POISONABLE)
    one = worker(project, "one", lambda p: (p / "src" / "a.txt").write_text("GOOD too\n"))
    submit(repo_info(project), [one])
    assert integrate(repo=project, window=1).ok
    two = worker(project, "two", lambda p: (p / "README").write_text("changed\n"))
    submit(repo_info(project), [two])
    result = integrate(repo=project, window=1)
    assert result.ok
    heavy = orjson.loads((Path(result.pipeline[-1].report) / "gates" / "heavy.json").read_bytes())
    assert heavy["status"] == "cached", heavy
