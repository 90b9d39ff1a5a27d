"""Holm's step-down over a wave's p-values and the wave's decision (`optimizer.stats.decision.holm`,
`decide_wave`), against an independent statement of the procedure."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from optimizer.stats.decision import AdaptiveTest, Decision, decide_wave, holm


def holm_by_definition(ps: list[float], alpha: float, m: int) -> list[bool]:
    """Holm (1979): sort ascending; reject H(1..j) for the largest j with p(i) < alpha/(m-i+1) for every i <= j."""
    order = sorted(range(len(ps)), key=lambda i: (ps[i], i))
    rejected = [False] * len(ps)
    for rank, i in enumerate(order, start=1):
        if Fraction(ps[i]) >= Fraction(str(alpha)) / (m - rank + 1):
            break
        rejected[i] = True
    return rejected


def test_holm_matches_the_definition_on_random_and_tied_p_values() -> None:
    rng = random.Random(7)
    for _ in range(500):
        k = rng.randint(1, 8)
        ps = [
            rng.choice([0.001, 0.01, 0.0125, 0.02, 0.025, 0.05, 0.2, 1.0, rng.random() / 5]) for _ in range(k)
        ]
        m = k + rng.randint(0, 3)
        assert [r.rejected for r in holm(ps, 0.1, m)] == holm_by_definition(ps, 0.1, m)


def test_holm_levels_by_rank_and_missing_tests_count_as_p_one() -> None:
    ranks = holm([0.04, 0.01, None], 0.1, family=4)
    assert [(r.rank, r.level) for r in ranks] == [
        (2, Fraction(1, 30)),
        (1, Fraction(1, 40)),
        (3, Fraction(1, 20)),
    ]
    assert [r.rejected for r in ranks] == [False, True, False]  # 0.04 ≥ 0.1/3: Holm stops at rank 2
    # A single candidate in a wave of 1 is tested at alpha itself, as one at a time.
    assert holm([0.099], 0.1)[0].rejected and not holm([0.1], 0.1)[0].rejected


def decision(p: float, keep: bool, gain: float, *, early: bool = False) -> Decision:
    test = AdaptiveTest(
        first_pass=1, rejudge=2, alpha=0.1, statistic=gain, p_value=p, seed=0, draws=0, mcnemar_p=p, items=[]
    )
    return Decision(
        keep=keep,
        reason="alone: kept" if keep else "alone: rolled back",
        literal_keep=keep,
        paired_keep=keep,
        p_value=p,
        policy="adaptive",
        alpha=0.1,
        test=test,
        early_stopped=early,
    )


def test_the_wave_keeps_the_largest_gain_among_the_holm_rejected_that_pass_the_fpr_veto() -> None:
    wave = [
        decision(0.001, True, 5.0),
        decision(0.002, True, 9.0),
        decision(0.0001, False, 12.0),
        decision(0.05, True, 20.0),
        None,
    ]
    out = decide_wave(wave, 0.1, 5, [f"experiment {i}" for i in range(5)])
    assert [d.keep if d else None for d in out] == [False, True, False, False, None]
    kept = out[1]
    assert kept is not None and kept.alpha == pytest.approx(0.1 / 3)  # rank 3 of a family of 5
    assert "rank 3, level 0.0333" in kept.reason and kept.reason.endswith("— alone at 0.1: alone: kept")
    first = out[0]
    assert first is not None and "experiment 1 of the wave has the larger gain" in first.reason
    vetoed = out[2]
    assert vetoed is not None and "not the kappa/FPR rule" in vetoed.reason
    late = out[3]
    assert late is not None and "not below its Holm level" in late.reason


def test_early_stopped_candidates_count_as_p_one_and_at_most_one_keep_in_any_wave() -> None:
    early = decision(0.0, False, 0.0, early=True)
    out = decide_wave([early, decision(0.01, True, 1.0)], 0.1, 2, ["a", "b"])
    assert out[0] is not None and not out[0].keep and "no full test (counted as p=1)" in out[0].reason
    assert out[1] is not None and out[1].keep and out[1].alpha == pytest.approx(0.05)
    for ps in itertools.product([0.001, 0.01, 0.3], repeat=3):
        got = decide_wave([decision(p, True, i) for i, p in enumerate(ps)], 0.1, 3, ["x", "y", "z"])
        assert sum(bool(d and d.keep) for d in got) <= 1


def test_a_skipped_re_judging_bound_is_not_read_as_a_p_value() -> None:
    # The adaptive bound that skips re-judging reports "p ≥ 0.001" (a bound) without a test: read as a
    # p-value it would take rank 1 and leave the real candidate a looser level (alpha/1 instead of alpha/2).
    skipped = decision(0.001, False, 0.0).model_copy(update={"test": None})
    real = decision(0.07, True, 3.0)
    out = decide_wave([skipped, real], 0.1, 2, ["a", "b"])
    assert out[1] is not None and not out[1].keep  # 0.07 ≥ 0.1/2: rank 1 of 2
    assert "rank 1, level 0.05" in out[1].reason
    assert out[0] is not None and "rank 2" in out[0].reason and "no full test" in out[0].reason


def test_a_futility_stop_in_a_wave_never_makes_holm_reject_more() -> None:
    """Futility turns a candidate's p-value into None (p = 1). Holm is monotone: raising p-values never
    adds a rejection, so a wave keeps a candidate with futility only if it would keep one without."""
    rng = random.Random(11)
    for _ in range(2000):
        k = rng.randint(2, 8)
        ps: list[float | None] = [
            rng.choice([0.001, 0.005, 0.01, 0.02, 0.03, rng.random() / 4]) for _ in range(k)
        ]
        stopped = [None if rng.random() < 0.4 else p for p in ps]
        without = {i for i, r in enumerate(holm(ps, 0.1, k)) if r.rejected}
        with_it = {i for i, r in enumerate(holm(stopped, 0.1, k)) if r.rejected}
        assert with_it <= without, (ps, stopped)
