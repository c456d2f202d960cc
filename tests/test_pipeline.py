"""The speculative pipeline on real repositories and processes: order, blame, flakes,
conflicts, crashes, and the event stream orchestrators wait on."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from conftest import CLI, git
from test_integration import (
    breaks_gate,
    expected_tree,
    same_lines,
    states,
    trailers,
    worker,
)

from dagrunner import wait_for, watch
from dagrunner.git.repo import repo_info
from dagrunner.integration.queue import Queue
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.worktrees import allocate as wt

ROOT = Path(__file__).resolve().parents[1]
EVENT_SCHEMA = orjson.loads((ROOT / "docs" / "integration-event.schema.json").read_bytes())


def recording(tmp: Path, check: str, *, before: str = "", name: str = "recording") -> Path:
    """A manifest of one gate that writes the tree it judged (to ``gated.txt``), after
    ``before``, then runs ``check``, its verdict (shell strings)."""
    manifest = tmp / f"{name}.toml"
    gated = tmp / "gated.txt"
    manifest.write_text(
        f"""
[sandbox]
writable = ["{tmp}"]

[gates.check]
run = "{before}git rev-parse 'HEAD^{{tree}}' >> '{gated}'; {check}"
"""
    )
    return manifest


def recording_gate(tmp: Path, seconds: float = 0.3) -> Path:
    """A gate that writes the tree it judged, then fails on BROKEN, after ``seconds``."""
    return recording(tmp, "! grep -rq BROKEN --include=*.txt .", before=f"sleep {seconds}; ")


def numbered(project: Path, count: int, bad: set[int] = frozenset()) -> list[Path]:  # type: ignore[assignment]
    return [
        worker(
            project,
            f"n{i:02d}",
            breaks_gate
            if i in bad
            else (lambda p, i=i: (p / f"n{i:02d}.txt").write_text(f"{i}\n")),
        )
        for i in range(1, count + 1)
    ]


def landed_chain(project: Path, base: str) -> list[str]:
    return git(project, "rev-list", "--reverse", f"{base}..main").split()


def test_ten_envelopes_window_four_land_in_order_each_tree_gated(
    project: Path, tmp_path: Path
) -> None:
    base = git(project, "rev-parse", "HEAD").strip()
    envelopes = numbered(project, 10)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=recording_gate(tmp_path), window=4, batch=1)
    assert result.ok and result.window == 4
    assert set(states(project).values()) == {"landed"}
    # strictly in queue order, one commit each
    assert [t.split(".")[1] for t in trailers(project)][::-1] == [f"n{i:02d}" for i in range(1, 11)]
    gated = set((tmp_path / "gated.txt").read_text().split())
    for commit in landed_chain(project, base):
        assert git(project, "rev-parse", f"{commit}^{{tree}}").strip() in gated
    assert git(project, "rev-parse", "main^{tree}").strip() == expected_tree(
        project, base, envelopes, tmp_path
    )
    # several items were gated at once, on speculative heads behind the front
    runs = result.pipeline
    assert max(r.position for r in runs) >= 1
    assert any(a.start < b.end and b.start < a.end for a in runs for b in runs if a is not b)
    assert result.gate_runs == 10 and result.confirm_runs == 0
    # each run reports its own governor samples, on its own clock (the governor is shared)
    for run_json in Path(result.report_dir).glob("gates-*/run.json"):
        samples = orjson.loads(run_json.read_bytes())["governor"]["samples"]
        assert [s["t"] for s in samples].count(0.0) == 1, run_json


def test_culprit_at_position_three_is_blamed_and_the_rest_land_without_it(
    project: Path, tmp_path: Path
) -> None:
    base = git(project, "rev-parse", "HEAD").strip()
    envelopes = numbered(project, 10, bad={3})
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.2), window=4, batch=1)
    assert states(project) == {
        f"n{i:02d}": "gates-failed" if i == 3 else "landed" for i in range(1, 11)
    }
    assert [t.split(".")[1] for t in trailers(project)][::-1] == [
        f"n{i:02d}" for i in range(1, 11) if i != 3
    ]
    good = [e for i, e in enumerate(envelopes, 1) if i != 3]
    assert git(project, "rev-parse", "main^{tree}").strip() == expected_tree(
        project, base, good, tmp_path
    )
    culprit = next(e for e in result.envelopes if e.worker == "n03")
    assert culprit.details.failed_gates == ("check",)
    assert result.confirm_runs == 1 and result.resets >= 1, [r.to_json() for r in result.pipeline]
    assert any(r.verdict == "confirmed" for r in result.pipeline)
    gated = set((tmp_path / "gated.txt").read_text().split())
    for commit in landed_chain(project, base):
        assert git(project, "rev-parse", f"{commit}^{{tree}}").strip() in gated


def test_blame_without_waiting_the_item_behind_a_suspect_is_gated_without_it_meanwhile(
    project: Path, tmp_path: Path
) -> None:
    """n01 fails; while its failure is confirmed, n02 (built on n01, so failing too) is built
    again on the head without n01 and gated beside the confirmation.  Once n01 is blamed,
    n02 goes on from that run, not from a rebuild; n02 passed takes no place in the window
    while the confirmation runs: n03 and n04 are gated in the slot it leaves free."""
    base = git(project, "rev-parse", "HEAD").strip()
    envelopes = numbered(project, 4, bad={1})
    submit(repo_info(project), envelopes)
    gated = tmp_path / "gated.txt"
    manifest = tmp_path / "slow-confirm.toml"  # a tree's second run (the confirmation) is slow
    manifest.write_text(
        f"""
[sandbox]
writable = ["{tmp_path}"]

[gates.check]
run = "t=$(git rev-parse 'HEAD^{{tree}}'); if grep -qs $t '{gated}'; then sleep 2; fi; echo $t >> '{gated}'; sleep 0.4; ! grep -rq BROKEN --include=*.txt ."
"""
    )
    result = integrate(repo=project, manifest=manifest, window=2, batch=1)
    assert states(project) == {"n01": "gates-failed", "n02": "landed", "n03": "landed",
                               "n04": "landed"}  # fmt: skip
    runs = result.pipeline
    confirm = next(r for r in runs if r.confirm)
    twin = next(
        (r for r in runs if r.envelopes and ".n02." in r.envelopes[0] and r.head == base),
        [r.to_json() for r in runs],
    )
    assert not isinstance(twin, list), twin
    assert twin.start < confirm.end and twin.verdict == "passed", [r.to_json() for r in runs]
    n02 = next(e for e in result.envelopes if e.worker == "n02")
    assert (
        git(project, "rev-parse", f"{n02.details.commit}^{{tree}}").strip()
        in (tmp_path / "gated.txt").read_text().split()
    )
    # n02 was never rebuilt after the blame: its only runs are the first and the twin
    ran = [r for r in runs if r.envelopes]  # and once the target's head: does it fail too?
    assert [r.head for r in ran if ".n02." in r.envelopes[0]].count(base) == 1
    # n02 passed takes no place in the window: n03 and n04 are gated in the slot the slow
    # confirmation leaves free, before n01 is blamed (they waited for it)
    n03, n04 = (next(r for r in ran if f".n0{i}." in r.envelopes[0]) for i in (3, 4))
    assert n03.start < n04.start < confirm.end, [r.to_json() for r in runs]
    assert git(project, "rev-parse", "main^{tree}").strip() == expected_tree(
        project, base, envelopes[1:], tmp_path
    )


def flaky_gate(tmp: Path) -> Path:
    """A gate whose first run anywhere fails (mkdir is atomic: exactly one run fails)."""
    marker = tmp / "failed-once"
    manifest = tmp / "flaky.toml"
    manifest.write_text(
        f"""
[sandbox]
writable = ["{tmp}"]

[gates.check]
run = "if mkdir '{marker}' 2>/dev/null; then exit 1; fi"
"""
    )
    return manifest


@pytest.mark.parametrize("batch", [1, 3])
def test_a_gate_that_fails_once_is_flaky_and_blames_nobody(
    project: Path, tmp_path: Path, batch: int
) -> None:
    envelopes = numbered(project, 3)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=flaky_gate(tmp_path), batch=batch, window=1)
    assert result.ok
    assert set(states(project).values()) == {"landed"}
    flaky = [e for e in result.envelopes if e.details.flaky_gates]
    assert flaky and all(e.details.flaky_gates == ("check",) for e in flaky)
    # A failed batch is split at once, not confirmed: [n01] passes, [n02 n03] on it is the
    # tree that failed (not gated) and is split again, [n02] passes, and [n03] on it -- that
    # tree once more -- is the one envelope confirmed: it passes, and only it is flaky.
    assert len(flaky) == 1
    assert result.confirm_runs == 1
    assert result.gate_runs == 5  # and the target's head, once: does it fail too? (no)
    assert [str(r.verdict) for r in result.pipeline].count("flaky") == 1
    events = [e for e in watch(repo=project, follow=False) if e.event == "flaky"]
    assert {e.id for e in events} == {e.id for e in flaky}


def test_conflicts_cost_no_gate_run(project: Path, tmp_path: Path) -> None:
    def first_edit(path: Path) -> None:
        (path / "shared.txt").write_text("one\nTWO from a\nthree\n")

    envelopes = [
        worker(project, "c1", first_edit),
        worker(project, "c2", same_lines),  # the same line as c1: conflicts once c1 lands
        worker(project, "c3", lambda p: (p / "c3.txt").write_text("3\n")),
        worker(project, "c4", lambda p: (p / "c4.txt").write_text("4\n")),
    ]
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=recording_gate(tmp_path, 0.2), window=4, batch=1)
    assert states(project) == {"c1": "landed", "c2": "conflict", "c3": "landed", "c4": "landed"}
    assert result.gate_runs == 3
    assert len((tmp_path / "gated.txt").read_text().split()) == 3


def test_manifest_integrate_table_sets_the_window(project: Path) -> None:
    body = (project / "manifests" / "release.toml").read_text()
    (project / "manifests" / "release.toml").write_text(
        "[integrate]\nwindow = 1\nconfirm_failures = 0\n" + body
    )
    git(project, "commit", "-qam", "window 1")
    submit(repo_info(project), numbered(project, 2, bad={1}))
    result = integrate(repo=project)
    assert result.window == 1 and result.confirm_runs == 0
    assert states(project) == {"n01": "gates-failed", "n02": "landed"}


def run_cli(project: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [*CLI, *args],
        cwd=project,
        env={**os.environ, **(env or {})},
        capture_output=True,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", ["speculating", "confirming", "speculation-reset", "landing"])
def test_sigkill_in_the_pipeline_then_rerun(project: Path, tmp_path: Path, point: str) -> None:
    base = git(project, "rev-parse", "HEAD").strip()
    envelopes = numbered(project, 5, bad={2})
    submit(repo_info(project), envelopes)
    manifest = recording_gate(tmp_path, 0.2)
    args = (
        "integrate",
        "run",
        "--json",
        "--window",
        "3",
        "--batch",
        "1",
        "--manifest",
        str(manifest),
    )
    crashed = run_cli(project, *args, env={"DAGRUNNER_CRASH_AT": point})
    assert crashed.returncode == -9, crashed.stderr.decode()
    rerun = run_cli(project, *args)
    assert rerun.returncode == 1, rerun.stderr.decode()  # n02: gates failed
    assert states(project) == {
        f"n{i:02d}": "gates-failed" if i == 2 else "landed" for i in range(1, 6)
    }
    ids = trailers(project)
    assert len(ids) == len(set(ids)) == 4, f"duplicated or missing commits: {ids}"
    good = [e for i, e in enumerate(envelopes, 1) if i != 2]
    assert git(project, "rev-parse", "main^{tree}").strip() == expected_tree(
        project, base, good, tmp_path
    )
    assert git(project, "status", "--porcelain") == ""


def test_sigint_ends_the_pipeline_and_queues_what_was_in_flight(
    project: Path, tmp_path: Path
) -> None:
    submit(repo_info(project), numbered(project, 3))
    manifest = recording_gate(tmp_path, 30)
    proc = subprocess.Popen(
        [
            *CLI,
            "integrate",
            "run",
            "--json",
            "--window",
            "2",
            "--batch",
            "1",
            "--manifest",
            str(manifest),
        ],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and list(states(project).values()).count("gating") < 2:
        time.sleep(0.1)
    assert list(states(project).values()).count("gating") == 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert orjson.loads(out)["interrupted"] is True
    assert set(states(project).values()) == {"queued"}
    assert not (tmp_path / "gated.txt").exists()  # no gate got to judge anything
    assert integrate(repo=project, manifest=recording_gate(tmp_path, 0)).ok
    assert set(states(project).values()) == {"landed"}


# -- waiting and watching -----------------------------------------------------------------


def test_submit_wait_returns_each_final_state_while_another_process_integrates(
    project: Path, tmp_path: Path
) -> None:
    def first_edit(path: Path) -> None:
        (path / "shared.txt").write_text("one\nTWO from a\nthree\n")

    files = {
        "good": worker(project, "good", lambda p: (p / "good.txt").write_text("g\n")),
        "first": worker(project, "first", first_edit),
        "second": worker(project, "second", same_lines),
        "bad": worker(project, "bad", breaks_gate),
        "evil": worker(project, "evil", lambda p: (p / "evil.txt").write_text("e\n")),
    }
    entries = {e.id.split(".")[1]: e for e in submit(repo_info(project), list(files.values()))}
    stored = Queue.of(repo_info(project)).envelope_path(entries["evil"].id)
    tampered = orjson.loads(stored.read_bytes())
    tampered["diff"] = tampered["diff"].replace("+e", "+x")
    stored.write_bytes(orjson.dumps(tampered))
    waiters = {
        name: subprocess.Popen(
            [*CLI, "integrate", "submit", str(files[name]), "--wait", "--json"],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name in ("good", "second", "bad", "evil")
    }
    time.sleep(0.5)  # the waiters wait before anyone integrates
    assert all(w.poll() is None for w in waiters.values())
    integrator = run_cli(project, "integrate", "run", "--manifest", str(recording_gate(tmp_path)))
    assert integrator.returncode == 1, integrator.stderr.decode()
    expected = {"good": (0, "landed"), "second": (4, "conflict"), "bad": (1, "gates-failed")}
    # the genuine bytes submitted again are not the tampered copy on the queue: their own
    # item, which lands, while the tampered one is rejected (--wait reports on what it sent)
    expected["evil"] = (0, "landed")
    for name, proc in waiters.items():
        out, err = proc.communicate(timeout=60)
        body = orjson.loads(out)
        assert (proc.returncode, body["outcomes"][0]["state"]) == expected[name], err.decode()
        assert (body["outcomes"][0]["id"] == entries[name].id) is (name != "evil")
    tampered_outcome = Queue.of(repo_info(project)).entries()[entries["evil"].id]
    assert tampered_outcome.state == "rejected"
    assert [e.event for e in wait_for(entries["good"].id, repo=project)][-1] == "landed"


def test_submit_wait_times_out_with_a_documented_code(project: Path) -> None:
    envelope = worker(project, "w1", lambda p: (p / "w.txt").write_text("w\n"))
    waited = run_cli(
        project, "integrate", "submit", str(envelope), "--wait", "--timeout", "0.3s", "--json"
    )
    assert waited.returncode == 124
    assert orjson.loads(waited.stdout)["error"]["code"] == "wait-timeout"
    assert set(states(project).values()) == {"queued"}  # still queued: nothing undone


def test_watch_resumed_after_restarts_misses_no_event(project: Path, tmp_path: Path) -> None:
    submit(repo_info(project), numbered(project, 4, bad={2}))
    manifest = recording_gate(tmp_path, 0.2)
    args = ("integrate", "run", "--window", "2", "--batch", "1", "--manifest", str(manifest))
    follower = subprocess.Popen(
        [*CLI, "integrate", "watch", "--json"], cwd=project, stdout=subprocess.PIPE
    )
    crashed = run_cli(project, *args, env={"DAGRUNNER_CRASH_AT": "speculating"})
    assert crashed.returncode == -9
    time.sleep(0.5)  # the follower reads on while the integrator is gone, then it stops too
    follower.kill()
    seen = [orjson.loads(line) for line in follower.communicate()[0].splitlines()]
    assert seen and seen[-1]["event"] == "gating"
    rerun = run_cli(project, *args)
    assert rerun.returncode == 1
    resumed = run_cli(
        project, "integrate", "watch", "--json", "--once", "--since", str(seen[-1]["cursor"])
    )
    assert resumed.returncode == 0
    rest = [orjson.loads(line) for line in resumed.stdout.splitlines()]
    everything = [e.to_json() for e in watch(repo=project, follow=False)]
    assert seen + rest == everything
    cursors = [e["cursor"] for e in everything]
    assert cursors == sorted(set(cursors))
    for event in everything:
        jsonschema.validate(event, EVENT_SCHEMA)
    names = {e["event"] for e in everything}
    assert {"submitted", "applying", "gating", "gates-failed", "landed"} <= names
    assert {"speculation-reset", "queued"} & names  # the crash's and the failure's rebuilds
    finals = {
        e["worker"]: e["event"] for e in everything if e["event"] in ("landed", "gates-failed")
    }
    assert finals == {"n01": "landed", "n02": "gates-failed", "n03": "landed", "n04": "landed"}
    assert all(e["target"] == "main" for e in everything if e["event"] == "landed")


def test_a_cursor_that_is_not_a_line_end_is_a_clear_error(project: Path) -> None:
    submit(repo_info(project), numbered(project, 1))
    bad = run_cli(project, "integrate", "watch", "--json", "--once", "--since", "3")
    assert bad.returncode == 2
    assert orjson.loads(bad.stdout)["error"]["code"] == "watch-cursor"


def test_the_report_draws_the_pipeline_with_flaky_runs_marked(
    project: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright
    from test_report import _chromium

    submit(repo_info(project), numbered(project, 3))
    result = integrate(repo=project, manifest=flaky_gate(tmp_path), window=2, batch=1)
    assert result.ok
    html = sorted(Path(result.report_dir).glob("gates-*/index.html"))
    assert html
    page_file = max(
        (p for p in html if 'id="pipeline-svg"' in p.read_text()),
        key=lambda p: int(p.parent.name.removeprefix("gates-")),
    )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1300, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        bars = page.locator("#pipeline-svg g.bar")
        assert bars.count() == len(result.pipeline)
        flaky = page.locator('#pipeline-svg g.bar[data-verdict="flaky"]')
        assert flaky.count() == 1 and flaky.first.is_visible()
        label = flaky.first.text_content() or ""
        assert "(re-run)" in label and "landed" in label
        table = page.locator("#integration + table").inner_text()
        assert "flaky: check" in table
        assert not errors
        browser.close()


def test_an_envelopes_gates_cannot_write_the_repository_or_other_worktrees(
    project: Path, tmp_path: Path
) -> None:
    """Where read-only views are available (``detect().views``), a hostile envelope's gate
    can neither move a ref, nor write the queue or the user's checkout, nor touch another
    worker's worktree; its own integration worktree stays writable."""
    from dagrunner.process.contain import detect

    if not detect().views:
        pytest.skip("this machine gives no read-only views: docs/security.md, out of scope")
    other = Path(wt.allocate(mission="swarm", worker="bystander", repo=project)["path"])
    (other / "work.txt").write_text("the bystander's uncommitted work\n")
    envelope = worker(project, "w1", lambda p: (p / "one.txt").write_text("1\n"))
    journal = Queue.of(repo_info(project)).journal
    said = tmp_path / "said"  # the only place outside its tree the manifest lets it write
    said.mkdir()
    attempts = said / "attempts"
    tries = {
        "ref": f"git -C '{project}' update-ref refs/heads/main HEAD~0",
        "journal": f"echo '{{}}' >> '{journal}'",
        "checkout": f"touch '{project}/planted.txt'",
        "sees": f"test -e '{project}/shared.txt'",  # the checkout is concealed outright
        "bystander": f"echo gone > '{other}/work.txt'",
        "own": "touch own-tree.txt",
    }
    run = "; ".join(
        f"if {c} 2>/dev/null; then echo {n}:ok; else echo {n}:no; fi" for n, c in tries.items()
    )
    manifest = tmp_path / "hostile.toml"
    manifest.write_text(
        f'[sandbox]\nwritable = ["{said}"]\n'
        + '[gates.hostile]\nrun = """{ '
        + run
        + f"; }} > '{attempts}'"
        + '"""\n'
    )
    submit(repo_info(project), [envelope])
    before = journal.read_bytes()
    result = integrate(repo=project, manifest=manifest, window=1, batch=1)
    assert result.ok, result.to_json()
    verdicts = dict(line.split(":") for line in attempts.read_text().split())
    # a checkout under /tmp is concealed inside the gate's own private /tmp, where the touch
    # lands (and goes with the gate): what counts is that the user's checkout has no file
    verdicts.pop("checkout")
    assert verdicts == {
        "ref": "no",
        "journal": "no",
        "sees": "no",
        "bystander": "no",
        "own": "ok",
    }
    assert not (project / "planted.txt").exists()
    assert (other / "work.txt").read_text() == "the bystander's uncommitted work\n"
    assert journal.read_bytes().startswith(before) and b"{}\n" not in journal.read_bytes()


def test_watch_with_a_timeout_prints_what_happened_and_stops(project: Path) -> None:
    submit(repo_info(project), numbered(project, 2))
    started = time.monotonic()
    watched = run_cli(project, "integrate", "watch", "--json", "--timeout", "0.5s")
    assert watched.returncode == 0 and time.monotonic() - started < 30
    events = [orjson.loads(line) for line in watched.stdout.splitlines()]
    assert [e["event"] for e in events] == ["submitted", "submitted"]
    assert [e["worker"] for e in events] == ["n01", "n02"]
    text = run_cli(project, "integrate", "watch", "--once")
    assert text.returncode == 0 and text.stdout.decode().count("submitted") == 2


def test_a_gate_that_repoints_its_worktrees_git_file_moves_no_branch(
    project: Path, tmp_path: Path
) -> None:
    """A gate rewrites the ``.git`` of the integration worktree it tests to name the user's
    repository: the integrator's next reset and commit there would land on the user's branch
    behind the compare-and-swap.  The link is restored from git's registry before git runs."""
    base = git(project, "rev-parse", "HEAD").strip()
    manifest = tmp_path / "repoint.toml"
    manifest.write_text(
        f"[gates.repoint]\nrun = \"printf 'gitdir: %s\\\\n' '{project}/.git' > .git\"\n"
    )
    envelopes = numbered(project, 3)
    submit(repo_info(project), envelopes)
    result = integrate(repo=project, manifest=manifest, window=1, batch=1)
    assert result.ok and set(states(project).values()) == {"landed"}
    landings = git(project, "reflog", "--format=%gs", "main").splitlines()
    assert all(s.startswith("dagrunner: land") for s in landings[:3]), landings
    assert git(project, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert git(project, "status", "--porcelain") == ""
    assert git(project, "rev-parse", "main^{tree}").strip() == expected_tree(
        project, base, envelopes, tmp_path
    )


def test_slots_beyond_the_window_are_removed_when_the_run_ends(
    project: Path, tmp_path: Path
) -> None:
    """A window-4 run leaves the slots it used for the next run of that width; a window-1
    run after it removes them all (files and git's registrations)."""

    def slots() -> list[str]:
        listed = git(project, "worktree", "list", "--porcelain").splitlines()
        return [
            line for line in listed if line.startswith("worktree ") and "/.speculative/" in line
        ]

    submit(repo_info(project), numbered(project, 6))
    assert integrate(repo=project, manifest=recording_gate(tmp_path), window=4, batch=1).ok
    wide = slots()
    assert len(wide) >= 2, wide
    submit(
        repo_info(project), [worker(project, "late", lambda p: (p / "late.txt").write_text("1\n"))]
    )
    assert integrate(repo=project, manifest=recording_gate(tmp_path), window=1, batch=1).ok
    assert slots() == []
    assert all(not Path(line.split(" ", 1)[1]).exists() for line in wide)
