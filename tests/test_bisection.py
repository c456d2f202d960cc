"""What finding the culprits of a failed batch costs, counted in gate runs, for failures
that name the culprit's file and failures that name nothing (on real repositories and
gate processes), and the batch sizes of generalized binary splitting that bring the
second near the bound of adaptive group testing: about d*log2(n/d) + d runs for d
culprits among n, plus one confirmation each."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import commit_release_manifest, git, skip_unless_reads_observed
from test_integration import states, worker
from test_pipeline import recording
from test_queue_volume import assert_every_landing_was_gated, breaking, naming_gate

from dagrunner import watch
from dagrunner.git.repo import repo_info
from dagrunner.integration.batching import FIRST, Sizer, group_size
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.records.integration import Speculation


@pytest.fixture
def observable() -> None:
    """Blame from reads needs gates' reads observed (inside a gate, say, they are not)."""
    skip_unless_reads_observed()


def anonymous_gate(tmp: Path) -> Path:
    """Fails on BROKEN and says nothing of where: a crash, an exit 1."""
    return recording(tmp, "! grep -rq BROKEN --include=*.txt .", before="sleep 0.1; ")


def halving(n: int, d: int) -> int:
    """Runs to find d culprits in one failed batch of n by halving: the batch's, one per
    level down to each culprit, one confirmation each (none when its pair's other half
    passed beside it: the pair's failure corroborates), and one run of what is left after
    each: about log2(n) + 2 per culprit, where generalized binary splitting's batches of
    about n/d take log2(n/d) + 2 (``batching.group_size`` sizes batches so)."""
    return (d + 1) + d * (math.ceil(math.log2(n)) + 1)


def naming(d: int) -> int:
    """Runs for d culprits that a failure names, whatever n: the batch's; per culprit its
    own and its confirmation (one culprit: the run of the rest beside it, which
    corroborates it; more: a rest built without the others corroborates none, so each is
    re-run); for each but the last the run of what lies between it and the next; what is
    queued ahead of the first (carried while the first might pass and land it, gated alone
    once it failed); and the rest's.  4 for one culprit, 3d + 2 for more (3 + 3d before
    an envelope put aside or carried cost no run of its own)."""
    return 4 if d == 1 else 3 * d + 2


def spent_behind(pipeline: list[Speculation], culprits: set[str]) -> list[Speculation]:
    """Failed runs of items holding no culprit: they failed only for one ahead of them in
    their tree (a speculation on a culprit not found yet), a run spent for nothing."""
    return [
        run
        for run in pipeline
        if str(run.verdict) == "failed" and not {e.split(".")[1] for e in run.envelopes} & culprits
    ]


def trace(pipeline: list[Speculation], *, times: bool = False) -> str:
    """The runs, one a line: which envelopes, how it ended (``times``: and when)."""
    return "\n".join(
        f"{r.envelopes[0].split('.')[1]}..{r.envelopes[-1].split('.')[1]} {r.verdict}"
        f"{' (confirm)' if r.confirm else ''}"
        f"{f' {r.start:.2f}-{r.end:.2f}' if times else ''}"
        for r in pipeline
        if r.envelopes
    )


@pytest.mark.parametrize(
    ("n", "bad", "named"),
    [
        (16, {11}, False),
        (24, {5, 18}, False),
        (16, {4, 13}, True),
        (16, {9}, True),
    ],
    ids=["16-1-anonymous", "24-2-anonymous", "16-2-named", "16-1-named"],
)
def test_culprits_are_found_within_the_bound(
    project: Path, tmp_path: Path, n: int, bad: set[int], named: bool
) -> None:
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, n, dict.fromkeys(bad, "BROKEN\n")))
    gate = naming_gate(tmp_path, "-n") if named else anonymous_gate(tmp_path)
    result = integrate(repo=project, manifest=gate, batch=n, window=2)
    final = states(project)
    culprits = {f"n{i:02d}" for i in bad}
    assert {k for k, v in final.items() if v == "gates-failed"} == culprits, final
    assert {v for k, v in final.items() if k not in culprits} == {"landed"}, final
    runs = len([r for r in result.pipeline if r.envelopes])  # not the target head's own
    # one run of the whole batch, then the narrowing: never more than the bound
    bound = naming(len(bad)) if named else halving(n, len(bad))
    assert runs <= bound, trace(result.pipeline)
    if not named:  # nothing behind an unlocated culprit is gated: it would fail with it
        wasted = spent_behind(result.pipeline, culprits)
        assert wasted == [], [r.to_json() for r in wasted]
    assert_every_landing_was_gated(project, base, tmp_path)


def test_batches_are_sized_by_generalized_binary_splitting() -> None:
    """Sizes from the rate of culprits among the envelopes judged: 4 at the start (the
    prior: one in 8), doubling as batches land, 8 again after a culprit found by halving
    among 16; a culprit its failure named shrinks nothing (it costs the same few runs in
    a batch of any size)."""
    assert [group_size(r) for r in (1 / 8, 1 / 12, 1 / 20, 1 / 36, 1 / 2, 0.9)] == [
        4,
        8,
        16,
        32,
        1,
        1,
    ]
    sizer = Sizer()
    seen = [sizer.size]
    for landed in (4, 8, 16):
        sizer.judged(landed=landed)
        seen.append(sizer.size)
    assert seen == [FIRST, 8, 16, 32]
    named = Sizer()
    named.judged(landed=15)
    named.judged(blamed=1, named=True)
    assert named.size == 16
    halved = Sizer()
    halved.judged(landed=15)
    halved.judged(blamed=1)
    assert (
        halved.size == 8 and halved.why == "shrank: 1 culprits among the last 16 envelopes judged"
    )
    fixed = Sizer(fixed=3)
    fixed.judged(blamed=5)
    assert fixed.size == 3


def test_a_failure_seen_whole_suspects_only_the_envelopes_that_changed_what_it_read(
    project: Path, tmp_path: Path, observable: None
) -> None:
    """Issue 46's blame from reads: a batch of 8 fails a check that names nothing; it was
    seen to read ``.txt`` files only, so the four envelopes editing a page under ``docs/``
    are no suspects: the suspects are gated apart at once (``named``), as named envelopes
    are, and only they are narrowed; every envelope but the culprit lands."""
    (project / "docs").mkdir()
    for i in range(1, 9):
        (project / f"n{i:02d}.txt").write_text(f"{i}\n")
        (project / "docs" / f"d{i:02d}.md").write_text(f"# {i}\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "files to edit")
    base = git(project, "rev-parse", "main").strip()
    pages = {2, 4, 5, 7}

    def edit(i: int) -> Callable[[Path], None]:
        def change(path: Path) -> None:
            page, text = path / "docs" / f"d{i:02d}.md", f"# {i}, edited\n"
            (page if i in pages else path / f"n{i:02d}.txt").write_text(
                "BROKEN\n" if i == 6 else text
            )

        return change

    submit(repo_info(project), [worker(project, f"n{i:02d}", edit(i)) for i in range(1, 9)])
    gate = tmp_path / "seen.toml"  # keyed by the tree: observed; nothing kept between runs
    gate.write_text(
        '[gates.check]\ninputs = ["**"]\nobserve = true\n'
        'run = "sleep 0.1; ! grep -rq BROKEN --include=*.txt ."\n'
    )
    integrate(repo=project, manifest=gate, batch=8, window=2)
    final = states(project)
    assert {k for k, v in final.items() if v != "landed"} == {"n06"}, final
    assert final["n06"] == "gates-failed", final
    # grep -q stops at the first BROKEN: what it had read by then is what it read
    named = {e.worker for e in watch(repo=project, follow=False) if e.event == "named"}
    assert "n06" in named and named <= {"n01", "n03", "n06", "n08"}, named
    landed = git(project, "rev-list", "--count", f"{base}..main").strip()
    assert landed != "0"


def eight_edits(project: Path, mark: str) -> None:
    """Eight envelopes queued, each editing a file of its own; n06 writes ``mark`` in its."""
    for i in range(1, 9):
        (project / f"n{i:02d}.txt").write_text(f"{i}\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "files to edit")

    def edit(i: int) -> Callable[[Path], None]:
        def change(path: Path) -> None:
            (path / f"n{i:02d}.txt").write_text(f"{mark}\n" if i == 6 else f"{i}, edited\n")

        return change

    submit(repo_info(project), [worker(project, f"n{i:02d}", edit(i)) for i in range(1, 9)])


def test_a_gate_that_changed_a_tracked_file_names_the_envelope_that_changed_it(
    project: Path, tmp_path: Path
) -> None:
    """Found on python-humanize/humanize: its ruff gate (``fix = true``) rewrote one
    envelope's new ``tests/conftest.py``; the gate failed ``tree-modified`` naming that file,
    yet the batch was halved like a failure that names nothing: ``named`` read the logs and
    test cases only.  The file the guard saw changed (dagrunner's own words) names it."""
    eight_edits(project, "FIXME")
    gate = tmp_path / "fixer.toml"  # a fixer: says nothing, rewrites what it fixes
    gate.write_text(
        '[gates.fix]\ninputs = ["**"]\n'
        'run = "for f in n*.txt; do grep -q FIXME $f && echo fixed > $f; done; true"\n'
    )
    integrate(repo=project, manifest=gate, batch=8, window=1)
    final = states(project)
    assert {k for k, v in final.items() if v != "landed"} == {"n06"}, final
    named = {e.worker for e in watch(repo=project, follow=False) if e.event == "named"}
    assert named == {"n06"}, named


@pytest.mark.parametrize(
    "says", ["would reformat {f}", "Would reformat: {f}"], ids=["black", "ruff-format"]
)
def test_a_formatter_check_names_the_envelope_whose_file_it_would_reformat(
    project: Path, tmp_path: Path, says: str
) -> None:
    """Found on Textualize/rich (round 16): ``black --check .`` failed a batch of four
    saying ``would reformat rich/errors.py`` (ruff format: ``Would reformat: x.py``), one
    envelope's file, yet the batch was halved like a failure that names nothing: the line
    was not one that says what failed (``failing_lines``)."""
    eight_edits(project, "UNFORMATTED")
    check = (
        f'for f in n*.txt; do grep -q UNFORMATTED $f && echo "{says.format(f="$f")}" && bad=1; '
        'done; [ -z "$bad" ] || { echo "Oh no!"; '
        'echo "1 file would be reformatted, 7 files would be left unchanged."; exit 1; }'
    )
    gate = tmp_path / "format.toml"  # black's and ruff's words, the summary last
    gate.write_text(f"[gates.format]\ninputs = [\"**\"]\nrun = '''{check}'''\n")
    integrate(repo=project, manifest=gate, batch=8, window=1)
    final = states(project)
    assert {k for k, v in final.items() if v != "landed"} == {"n06"}, final
    named = {e.worker for e in watch(repo=project, follow=False) if e.event == "named"}
    assert named == {"n06"}, named


def builds_on(
    project: Path, tmp_path: Path, said: dict[int, str], culprit: str, named: set[str]
) -> None:
    """Six envelopes, ``said[i]`` what n{i}'s file says: ``NEEDS nK`` (its check fails
    unless nK's says ``good``), ``BROKEN nK.txt`` (it breaks, and its failure's one line
    names its own file and nK's, as a traceback through nK's test would).  Only the
    ``culprit`` is blamed, after a failure that ``named`` these."""
    base = git(project, "rev-parse", "main").strip()
    check = (
        "for f in n*.txt; do "
        'grep -q BROKEN $f && echo "error: ./$f broke ./$(sed -n "s/^BROKEN //p" $f)" && bad=1; '
        'd=$(sed -n "s/^NEEDS //p" $f); '
        '[ -n "$d" ] && ! grep -q "^good" $d.txt && bad=1; '
        'done; [ -z "$bad" ]'
    )
    submit(repo_info(project), breaking(project, 6, said))
    gate = tmp_path / "needs.toml"
    record = f"git rev-parse 'HEAD^{{tree}}' >> '{tmp_path / 'gated.txt'}'"
    gate.write_text(
        f'[sandbox]\nwritable = ["{tmp_path}"]\n\n'
        f"[gates.check]\nrun = '''sleep 0.1; {record}; {check}'''\n"
    )
    result = integrate(repo=project, manifest=gate, batch=6, window=2)
    final = states(project)
    assert final.pop(culprit) == "gates-failed", final
    assert set(final.values()) == {"landed"}, (final, trace(result.pipeline))
    seen = {e.worker for e in watch(repo=project, follow=False) if e.event == "named"}
    assert seen == named, seen
    assert_every_landing_was_gated(project, base, tmp_path)


def test_an_envelope_named_beside_a_culprit_is_judged_on_what_is_queued_ahead_of_it(
    project: Path, tmp_path: Path
) -> None:
    """Found by the pipeline fuzzer (seed 117): n02 builds on n01, queued right before it
    (its check fails without n01's work).  n03 breaks, and its failure's one line names
    n03's file and n02's (a traceback through n02's test, say).  Gated apart on the batch's
    base alone, n02 lacked n01 -- queued ahead of it, in the rest -- failed, was confirmed
    there, and was blamed: the serial loop would have landed it.  What a named envelope is
    judged on holds every envelope queued ahead of it: only n03 is blamed."""
    said = {1: "good\n", 2: "NEEDS n01\n", 3: "BROKEN n02.txt\n"}
    builds_on(project, tmp_path, said, "n03", {"n02", "n03"})


def test_an_envelope_between_two_named_ones_is_judged_after_the_first(
    project: Path, tmp_path: Path
) -> None:
    """n03 builds on n02, queued right before it; n05 breaks, and its failure names n05's
    file and n02's.  What is queued ahead of the last named (n05) but not named -- n01, n03,
    n04 -- was gated as one piece ahead of n02: n03 without n02, which the serial loop lands
    before it, failed, and was blamed.  The pieces keep the queue's order: only n05 is
    blamed."""
    said = {2: "good\n", 3: "NEEDS n02\n", 5: "BROKEN n02.txt\n"}
    builds_on(project, tmp_path, said, "n05", {"n02", "n05"})


def test_a_named_envelope_is_not_corroborated_by_a_rest_without_another_named_one(
    project: Path, tmp_path: Path
) -> None:
    """n01 breaks its batch of 4, and its failure names n01's file and n03's.  n03, the
    last named, is gated apart on n02 without n01, the rest (n04) on that without n03 --
    and n03's first run there flakes.  The rest passing without n01 and n03 says nothing
    of n03 (the batch's failure was n01's): n03 is re-run, not blamed (it was, on one
    flake, where the serial loop re-runs it and lands it)."""
    marker = tmp_path / "flaked"
    check = (
        f"if [ -e n03.txt ] && [ ! -e n01.txt ] && mkdir '{marker}' 2>/dev/null; then "
        "echo flaked; exit 1; fi; for f in n*.txt; do grep -q BROKEN $f && "
        'echo "error: ./$f broke ./$(sed -n "s/^BROKEN //p" $f)" && bad=1; done; [ -z "$bad" ]'
    )
    submit(repo_info(project), breaking(project, 4, {1: "BROKEN n03.txt\n"}))
    gate = tmp_path / "flaky.toml"
    gate.write_text(
        f"[sandbox]\nwritable = [\"{tmp_path}\"]\n\n[gates.check]\nrun = '''sleep 0.1; {check}'''\n"
    )
    result = integrate(repo=project, manifest=gate, batch=4, window=4)
    assert marker.is_dir()  # n03's tree without n01 did flake
    final = states(project)
    assert final == {"n01": "gates-failed", "n02": "landed", "n03": "landed", "n04": "landed"}, (
        final,
        trace(result.pipeline),
    )


def test_what_is_behind_a_named_split_is_gated_beside_what_was_queued_ahead_of_the_culprit(
    project: Path, tmp_path: Path
) -> None:
    """Found on the swarm round's timeline: n05 breaks the first of two batches of 8, and
    its failure names it.  n05 fails apart, its rest (n06..n08) passes without it: n05 is
    corroborated, and n01..n04 (carried) are gated alone.  Decided items ran no gate and
    still took the window's places, and the suspect waited for n01..n04 to be corroborated:
    the second batch (n09..n16, built on n01..n04 + the rest) waited a whole gate run
    for a slot that was free.  It is gated beside n01..n04 now."""
    submit(repo_info(project), breaking(project, 16, {5: "BROKEN\n"}))
    gate = naming_gate(tmp_path, "-n")
    gate.write_text(gate.read_text().replace("sleep 0.2", "sleep 0.6"))
    result = integrate(repo=project, manifest=gate, batch=8, window=2)
    final = states(project)
    assert final.pop("n05") == "gates-failed" and set(final.values()) == {"landed"}, final
    passed = [r for r in result.pipeline if r.envelopes and str(r.verdict) == "passed"]
    ahead = next(r for r in passed if len(r.envelopes) == 4)
    behind = next(r for r in passed if r.envelopes[0].split(".")[1] == "n09")
    assert behind.start < ahead.end, trace(result.pipeline, times=True)


def test_a_culprit_narrowed_down_to_a_pair_is_gated_beside_all_that_is_left_of_its_batch(
    project: Path, tmp_path: Path
) -> None:
    """n11 breaks a batch of 16 and its failure names nothing: halving narrows it down to
    the pair n11, n12.  n11 is gated apart, and beside it not n12 alone (then n13..n16 in a
    run of their own, once n11 was blamed) but everything left of the batch (n12..n16)
    without it: its pass corroborates n11 (two failing trees, the batch's and n11's, whose
    one common change is n11) and lands them.  Six runs, where it took seven, one after
    another."""
    base = git(project, "rev-parse", "main").strip()
    submit(repo_info(project), breaking(project, 16, {11: "BROKEN\n"}))
    result = integrate(repo=project, manifest=anonymous_gate(tmp_path), batch=16, window=2)
    final = states(project)
    assert final.pop("n11") == "gates-failed" and set(final.values()) == {"landed"}, final
    runs = [r for r in result.pipeline if r.envelopes]
    assert len(runs) == 6 and result.confirm_runs == 0, trace(runs)
    culprit = next(r for r in runs if r.envelopes[0].split(".")[1] == "n11")
    rest = next(r for r in runs if r.envelopes[0].split(".")[1] == "n12")
    assert len(rest.envelopes) == 5 and str(rest.verdict) == "passed", trace(runs)
    assert rest.start < culprit.end and rest.head == culprit.head, trace(runs, times=True)
    assert_every_landing_was_gated(project, base, tmp_path)


def launches(project: Path, name: str) -> int:
    """How many gate runs of trees holding worker ``name`` were started."""
    return sum(
        1
        for e in watch(repo=project, follow=False)
        if e.worker == name and e.event != "gate-run" and e.details.gate_run is not None
    )


def mover(repo: Path, stop: threading.Event) -> None:
    """Somebody else lands a fix on the target (fix.txt) once n1 and the rest, the third
    runs of trees holding each, gate."""
    while not stop.is_set():
        if launches(repo, "n1") >= 3 and launches(repo, "n2") >= 3:
            (repo / "fix.txt").write_text("fixed\n")
            git(repo, "add", "fix.txt")
            git(repo, "-c", "user.name=m", "-c", "user.email=m@m", "commit", "-q", "-m", "fix")
            return
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_batch_failure_on_a_head_moved_since_corroborates_nothing(
    project: Path, tmp_path: Path
) -> None:
    """n2 fails until somebody else lands fix.txt on the target.  The batch n1..n4 fails on
    the old head and is halved down to the pair n1, n2 (the rest: n2..n4); meanwhile the
    target moves to the fix, and both are built again on it.  There n1 flakes once and the
    rest passes: the batch's failure, on a head without the fix, says nothing of n1 (n2 was
    its cause there), yet it corroborated n1, and one flake got it blamed (before 6f54429
    too: the pair's failure did).  The serial loop judges n1 on the new head: its flake is
    confirmed as one, and it lands."""
    sync = tmp_path / "sync"
    sync.mkdir()
    script = tmp_path / "check.sh"
    script.write_text(
        f"S='{sync}'\n"  # a1..a4 gate until n1 and the rest gate on the old head
        "if [ -e a1.txt ] && ! [ -e n1.txt ] && ! [ -e n2.txt ] && ! [ -e fix.txt ]; then\n"
        "  sleep 4; exit 0\n"
        "fi\n"
        "if [ -e n2.txt ] && ! [ -e fix.txt ] && ! [ -e n1.txt ]; then sleep 20; exit 1; fi\n"
        "if [ -e n2.txt ] && ! [ -e fix.txt ]; then exit 1; fi\n"
        "if [ -e n1.txt ] && ! [ -e n2.txt ] && ! [ -e fix.txt ]; then sleep 20; exit 0; fi\n"
        'if [ -e n1.txt ] && ! [ -e n2.txt ] && mkdir "$S/n1-flaked" 2>/dev/null; then exit 1; fi\n'
    )
    names = ["a1", "a2", "a3", "a4", "n1", "n2", "n3", "n4"]
    envelopes = [
        worker(project, name, lambda p, name=name: (p / f"{name}.txt").write_text(f"{name}\n"))
        for name in names
    ]
    submit(repo_info(project), envelopes)
    stop = threading.Event()
    moving = threading.Thread(target=mover, args=(project, stop))
    moving.start()
    try:
        gate = recording(tmp_path, f"sh '{script}'")
        result = integrate(repo=project, manifest=gate, batch=4, window=16)
    finally:
        stop.set()
        moving.join()
    assert (sync / "n1-flaked").is_dir() and result.rebuilds == 1, trace(result.pipeline)
    assert set(states(project).values()) == {"landed"}, trace(result.pipeline)


def manifest_changed_ahead(project: Path, tmp_path: Path, script: Path) -> None:
    """The target's check runs ``script`` with v0; a1..a3, then m (which changes the
    manifest: v1), then n1..n4 are submitted, each adding its own file."""

    def manifest(version: str) -> str:
        return f"[sandbox]\nwritable = ['{tmp_path}']\n\n[gates.check]\nrun = \"sh '{script}' {version}\"\n"

    commit_release_manifest(project, manifest("v0"))

    def write(name: str) -> Callable[[Path], None]:
        def change(path: Path) -> None:
            if name == "m":
                (path / "manifests" / "release.toml").write_text(manifest("v1"))
            else:
                (path / f"{name}.txt").write_text(f"{name}\n")

        return change

    names = ["a1", "a2", "a3", "m", "n1", "n2", "n3", "n4"]
    submit(repo_info(project), [worker(project, name, write(name)) for name in names])


@pytest.mark.timeout(120)
def test_a_batch_failure_under_a_manifest_since_changed_corroborates_nothing(
    project: Path, tmp_path: Path
) -> None:
    """m (queued ahead, in a batch of its own) changes the target's manifest: its check no
    longer fails n2.  The batch n1..n4, gated under the old one meanwhile, fails and is
    halved down to the pair n1, n2 (the rest: n2..n4); m lands, and both are judged again
    by the new manifest.  There n1 flakes once and the rest passes: the batch's failure,
    under a manifest that no longer holds, says nothing of n1, yet it corroborated n1.  The
    serial loop judges n1 by the new manifest: a flake, confirmed as one; it lands."""
    sync = tmp_path / "sync"
    sync.mkdir()
    script = tmp_path / "check.sh"
    script.write_text(
        f"S='{sync}'; v=$1\n"  # a1..a3, m gate until n1 and the rest gate under v0
        'if [ -e a1.txt ] && ! [ -e n1.txt ] && ! [ -e n2.txt ] && [ "$v" = v0 ]; then\n'
        "  sleep 4; exit 0\n"
        "fi\n"
        'if [ -e n2.txt ] && [ "$v" = v0 ] && ! [ -e n1.txt ]; then sleep 20; exit 1; fi\n'
        'if [ -e n2.txt ] && [ "$v" = v0 ]; then exit 1; fi\n'
        'if [ -e n1.txt ] && ! [ -e n2.txt ] && [ "$v" = v0 ]; then sleep 20; exit 0; fi\n'
        'if [ -e n1.txt ] && ! [ -e n2.txt ] && mkdir "$S/n1-flaked" 2>/dev/null; then exit 1; fi\n'
    )

    manifest_changed_ahead(project, tmp_path, script)
    base = git(project, "rev-parse", "main").strip()  # the v0 manifest committed
    result = integrate(repo=project, batch=4, window=16)
    assert (sync / "n1-flaked").is_dir(), trace(result.pipeline)
    assert set(states(project).values()) == {"landed"}, trace(result.pipeline)
    assert git(project, "rev-parse", "main").strip() != base


@pytest.mark.timeout(120)
def test_a_tree_failed_under_a_manifest_since_changed_is_not_known_failed(
    project: Path, tmp_path: Path
) -> None:
    """m (queued ahead) changes the target's manifest: its check no longer fails n2.  The
    batch n1..n4 fails under the old one; n3+n4, built on n1+n2, is that very tree, but
    the window has no room to gate it before m lands.  Under the new manifest n1+n2
    passes, and n3+n4 on it -- the tree that failed under the old one -- was taken as
    failed without a run: split, n3 flaked once and n4 passed, and n3 was blamed off a
    verdict of a manifest that no longer holds.  The serial loop lands all of them."""
    sync = tmp_path / "sync"
    sync.mkdir()
    script = tmp_path / "check.sh"
    script.write_text(
        f"S='{sync}'; v=$1\n"
        'if [ -e a1.txt ] && ! [ -e n1.txt ] && [ "$v" = v0 ]; then sleep 4; exit 0; fi\n'
        'if [ -e n2.txt ] && ! [ -e n3.txt ] && [ "$v" = v0 ]; then sleep 20; exit 1; fi\n'
        'if [ -e n2.txt ] && [ "$v" = v0 ]; then exit 1; fi\n'
        'if [ -e n3.txt ] && ! [ -e n4.txt ] && mkdir "$S/n3-flaked" 2>/dev/null; then exit 1; fi\n'
    )

    manifest_changed_ahead(project, tmp_path, script)
    result = integrate(repo=project, batch=4, window=2)
    assert set(states(project).values()) == {"landed"}, trace(result.pipeline)
    ran = [r.envelopes for r in result.pipeline if str(r.verdict) == "passed"]
    assert [e.split(".")[1] for e in ran[-1]] == ["n3", "n4"], trace(result.pipeline)


def test_what_is_left_of_a_batch_failing_beside_its_culprit_is_a_bisection_of_its_own(
    project: Path, tmp_path: Path
) -> None:
    """Found by review 13: n03 and n11 break a batch of 16 that names nothing.  Halving
    narrows it to the pair n03, n04; n04..n16 (all that is left) fails beside n03 -- n11 is
    in it -- and is halved in turn.  Its pieces took the first batch as the one whose
    failure corroborates: n11's rest never held n03 (blamed), so n11 was re-run.  What is
    left failed on its own: its pieces are corroborated by its failure, and n11 is not
    re-run (n03 is: its rest failed)."""
    submit(repo_info(project), breaking(project, 16, {3: "BROKEN\n", 11: "BROKEN\n"}))
    result = integrate(repo=project, manifest=anonymous_gate(tmp_path), batch=16, window=2)
    final = states(project)
    assert {k for k, v in final.items() if v != "landed"} == {"n03", "n11"}, final
    runs = [r for r in result.pipeline if r.envelopes]
    assert result.confirm_runs == 1 and len(runs) <= 12, trace(runs)


def test_a_rest_mended_by_an_envelope_behind_its_batch_corroborates_nothing(
    project: Path, tmp_path: Path
) -> None:
    """Batches of 2: n01, n02, then n03, n04.  n02 builds on n03, queued after it (its
    check fails without n03), and its failure names n01's file (a traceback through n01's
    code); n01's own tree flakes once.  n01 is gated apart beside its rest (n02): were the
    rest to take the batch behind (n03, n04), it would pass for n03's sake and corroborate
    n01's flake (review 14, on a change that let it: reverted).  The serial loop re-runs
    n01 and lands it."""
    sync = tmp_path / "sync"
    sync.mkdir()
    check = tmp_path / "check.sh"
    check.write_text(
        f"S='{sync}'\n"
        "if grep -q NEEDS n02.txt 2>/dev/null && [ ! -e n03.txt ]; then "
        "echo 'error: ./n01.txt:1: broken'; exit 1; fi\n"
        'if [ -e n01.txt ] && [ ! -e n02.txt ] && mkdir "$S/n01-flaked" 2>/dev/null; then '
        "echo flaked; exit 1; fi\n"
    )
    texts = {"n01": "1\n", "n02": "NEEDS n03\n", "n03": "3\n", "n04": "4\n"}
    envelopes = [
        worker(project, n, lambda p, n=n, t=t: (p / f"{n}.txt").write_text(t))
        for n, t in texts.items()
    ]
    submit(repo_info(project), envelopes)
    result = integrate(
        repo=project, manifest=recording(tmp_path, f"sh '{check}'"), batch=2, window=2
    )
    assert (sync / "n01-flaked").is_dir(), trace(result.pipeline)
    final = states(project)
    assert final["n01"] == "landed", (final, trace(result.pipeline))
