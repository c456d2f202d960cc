"""The pipeline fuzzer's fixed seeds (``tests/fuzzing.py``): the whole queue on real
repositories, each scenario checked against the landing invariant by an oracle.  The
seeds that once found a broken invariant are kept here with what they found;
``scripts/fuzz_pipeline.py`` runs thousands more."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzing import Scenario, run

# Chosen to cover every feature at least once (checked below) ...
SEEDS = [4, 6, 212, 240, 318]
# ... and the seeds that found something, each with what it found (fixed since):
FOUND = [
    # a hostile envelope's check planted a passing hook in the tool cache its gate shared
    # with every envelope: a later BROKEN envelope passed and landed (absolute baseline)
    39,
    # the same under the differential baseline on a red target: the target's head run read
    # the planted hook too
    32,
    # a planted failing hook: three innocent envelopes after it ended gates-failed
    2055,
    # a conflicting front went while a suspect behind it was waiting for its confirmation,
    # which was never launched: the integrator waited for a run that never came (a hang)
    80,
    # a relay gate beside the check copied the tree's files into a new file the check read
    # instead: the check's reads were keyed by nothing, and a BROKEN edit landed (observed)
    6103,
    # a worker needing the good one before it, the pair of them failing by a flake: the
    # second was blamed for its run on the pair's base, without the first that passed there
    11428,
    # a pair's first twin breaking the check, the second put aside behind the front: the
    # worker behind it needing its line was gated ahead of it, without it, and blamed, once
    # the second applied at the front after all (the scenario's clash)
    160,
    # lint flaked (its need skipped the check), and the confirmation ran the check for the
    # first time, which flaked: a page worker that passes alone was blamed (no gate had
    # failed twice)
    467,
    # the same two flakes on the target's head under the differential baseline (lint, then
    # the check running for the first time in the head's confirmation): the head "failed"
    # the check, and a hostile worker's real failure of it was excused -- a BROKEN tree landed
    5216,
    # a pair split by a flake: the second, gated without the first, failed its need; rebuilt
    # on the first, its tree known failed, confirmed by a pass (the flake) -- and landed with
    # the failures of its run without the first as the target's own: the target was "red"
    # on check, and under the differential baseline two BROKEN trees behind it landed
    432,
    # a pair's first twin breaking the check for sure (exit 127: never re-run), the second
    # put aside in their batch: it went back behind the worker needing its line, which was
    # gated without it and blamed (the scenario's certain)
    43,
]
# Scenarios drawn with the early kind (a worker queued ahead of the good one it needs); the
# seeds above keep the scenarios they were pinned with (``early=False``)
EARLY = [6060, 6086, 6128]  # 6128: the early one lands, mended by its batch


def test_the_fixed_seeds_cover_every_feature_of_a_scenario() -> None:
    scenarios = [Scenario.of(seed, early=False) for seed in SEEDS]
    kinds = {w.kind for s in scenarios for w in s.workers}
    assert kinds >= {"good", "broken", "lintbad", "pair", "plant-pass", "plant-fail"}
    assert {s.baseline for s in scenarios} == {"absolute", "differential"}
    assert {s.batch for s in scenarios} >= {"1", "auto"} and len({s.batch for s in scenarios}) >= 3
    for feature in ("named", "chain", "slow", "red", "hostile"):
        assert any(getattr(s, feature) for s in scenarios), feature
        assert not all(getattr(s, feature) for s in scenarios), feature
    assert {g for s in scenarios for g in s.flaky} == {"lint", "check"}
    assert {s.window for s in scenarios} >= {1, 2, 4}
    assert {(s.observed, s.relay) for s in scenarios if s.observed} == {(True, True), (True, False)}
    assert any(s.certain for s in scenarios)
    early = [Scenario.of(seed) for seed in EARLY]
    assert all(s.early and s.batch == "auto" for s in early)
    assert not any(s.early for s in scenarios)


def test_the_pinned_seeds_keep_the_scenarios_they_were_found_with() -> None:
    """The early kind is drawn last: without it, a seed is drawn exactly as before; with
    it, at most one worker is added (the early one), the others unchanged."""
    for seed in SEEDS + FOUND + EARLY:
        before, now = Scenario.of(seed, early=False), Scenario.of(seed)
        assert [w for w in now.workers if w.kind != "early"] == list(before.workers)
        assert now.early == (len(now.workers) == len(before.workers) + 1)


@pytest.mark.parametrize(
    ("seed", "early"), [(s, False) for s in SEEDS + FOUND] + [(s, True) for s in EARLY]
)
def test_a_seeded_scenario_keeps_the_landing_invariant(
    seed: int, early: bool, tmp_path: Path
) -> None:
    outcome = run(seed, tmp_path, early=early)
    assert outcome.ok, (outcome.broken, outcome.states, Scenario.of(seed, early=early))
