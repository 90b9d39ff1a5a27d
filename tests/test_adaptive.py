"""The adaptive policy: the sign-flip test, the decision on all judgements, its exact early-stopping
bound, LORD++ levels, and replay of a stored decision."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from fractions import Fraction
from typing import cast

import pytest

from optimizer.judge.verdicts import majority
from optimizer.models import Label, Verdict
from optimizer.stats.decision import (
    AdaptiveTest,
    adaptive_stopped_decision,
    decide_adaptive,
    disagreements,
    lord_level,
)
from optimizer.stats.metrics import Answer, majority_answer
from optimizer.stats.signflip import sign_flip_test
from optimizer.vocab import MistakeType
from optimizer.workspace.config import LoopSection

ADAPTIVE = LoopSection()  # the default: adaptive, alpha 0.1, rejudge 2
YES, NO, BAD = Answer(success=True), Answer(success=False), Answer(success=None, status="invalid")


def pos(tid: str) -> Label:
    return Label(trajectory_id=tid, label="positive", original_id=tid)


def neg(tid: str) -> Label:
    return Label(trajectory_id=tid, label="negative", original_id=tid)


def right(label: Label) -> Answer:
    return YES if label.is_positive else NO


def wrong(label: Label) -> Answer:
    return NO if label.is_positive else YES


def brute_force_p(differences: list[Fraction]) -> Fraction:
    observed = sum(differences, Fraction(0))
    hits = sum(
        1
        for signs in itertools.product((1, -1), repeat=len(differences))
        if sum((s * abs(d) for s, d in zip(signs, differences, strict=True)), Fraction(0)) >= observed
    )
    return Fraction(hits, 2 ** len(differences))


# --- the sign-flip test ---------------------------------------------------------------------------


@pytest.mark.slow
def test_exact_sign_flip_p_value_equals_brute_force_enumeration() -> None:
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(0, 11)
        diffs = [Fraction(rng.randint(-4, 4), rng.choice((1, 2, 3, 5))) for _ in range(n)]
        result = sign_flip_test(diffs)
        assert result.draws == 0 and result.p_exact == brute_force_p(diffs), diffs
        assert result.p_value == float(result.p_exact)


def test_sign_flip_corner_cases() -> None:
    assert sign_flip_test([]).p_value == 1.0
    assert sign_flip_test([Fraction(0)] * 5).p_value == 1.0  # no evidence either way
    assert sign_flip_test([Fraction(1)] * 4).p_exact == Fraction(1, 16)  # four clean wins
    assert sign_flip_test([Fraction(-1)] * 4).p_exact == Fraction(1)  # all losses: nothing is more extreme
    # Exact even on 162 items with shares of 3 judgements (milliseconds, no sampling).
    big = [Fraction(random.Random(1).randint(-3, 3), 3) for _ in range(162)]
    assert sign_flip_test(big).draws == 0


def test_monte_carlo_p_value_is_close_to_exact_and_replays_from_its_seed() -> None:
    rng = random.Random(3)
    diffs = [Fraction(rng.choice((-2, -1, 1, 1, 2)), 3) for _ in range(40)]
    exact = sign_flip_test(diffs)
    mc = sign_flip_test(diffs, seed=11, draws=20_000, max_exact_bits=-1)
    assert mc.p_exact is None and mc.draws == 20_000
    assert mc.p_value == pytest.approx(exact.p_value, abs=0.01)
    assert sign_flip_test(diffs, seed=11, draws=20_000, max_exact_bits=-1).p_value == mc.p_value
    assert sign_flip_test(diffs, seed=12, draws=20_000, max_exact_bits=-1).p_value != mc.p_value


def test_exact_p_value_never_rises_when_one_difference_rises() -> None:
    rng = random.Random(5)
    for _ in range(300):
        diffs = [Fraction(rng.randint(-3, 3), 3) for _ in range(rng.randint(1, 9))]
        i = rng.randrange(len(diffs))
        higher = list(diffs)
        higher[i] += Fraction(rng.randint(1, 3), 3)
        assert sign_flip_test(higher).p_exact <= sign_flip_test(diffs).p_exact  # type: ignore[operator]


# --- majority and disagreements ---------------------------------------------------------------------


def test_majority_answer_follows_the_replicate_majority_rule() -> None:
    def verdict(a: Answer) -> Verdict | None:
        if not a.usable:
            return None
        return Verdict(
            success=bool(a.success),
            reasoning="r",
            confidence="high",
            mistake_type=None if a.success else cast(MistakeType, a.mistake_type or "Critical Mistake"),
        )

    typed = Answer(success=False, mistake_type="Bad Side Effect")
    for combo in itertools.product((YES, NO, BAD, typed), repeat=4):
        for n in range(1, 5):
            answers = list(combo[:n])
            chosen, _ = majority([verdict(a) for a in answers])
            mine = majority_answer(answers)
            assert mine.usable == (chosen is not None)
            if chosen is not None:
                assert mine.success == chosen.success


def test_disagreements_are_label_free_and_count_an_unusable_verdict_as_different() -> None:
    inc = {"a": YES, "b": NO, "c": YES, "d": BAD}
    cand = {"a": YES, "b": YES, "c": BAD, "d": BAD}
    assert disagreements(inc, cand) == ["b", "c"]


# --- the decision -----------------------------------------------------------------------------------


def _split(n_pos: int, n_neg: int) -> dict[str, Label]:
    return {f"p{i}": pos(f"p{i}") for i in range(n_pos)} | {f"n{i}": neg(f"n{i}") for i in range(n_neg)}


def test_rejudged_items_decide_on_shares_and_majorities_over_all_judgements() -> None:
    labels = _split(6, 6)
    inc = {t: [right(lab)] for t, lab in labels.items()}
    cand = {t: [right(lab)] for t, lab in labels.items()}
    # Four items the incumbent got wrong in its first pass and the candidate right; re-judged twice more.
    fixed = ["p0", "p1", "n0", "n1"]
    for t in fixed:
        inc[t] = [wrong(labels[t]), wrong(labels[t]), right(labels[t])]  # 1/3: a lucky draw on re-judging
        cand[t] = [right(labels[t])] * 3  # 3/3
    d = decide_adaptive(labels, inc, cand, ADAPTIVE, first_pass=1, rejudged=fixed, seed=4)
    assert d.test is not None and d.test.statistic == pytest.approx(4 * 2 / 3)
    assert [i.draws() for i in d.test.rejudged] == ["1/3 → 3/3"] * 4
    assert d.test.p_value == 1 / 16 and d.test.draws == 0 and d.test.seed == 4
    assert d.keep and d.adaptive_keep and d.policy == "adaptive" and d.alpha == 0.1
    assert "re-judged 4 item(s) 2 more time(s)" in d.reason and "p=0.062 < 0.1: kept" in d.reason
    # The same first pass with re-judging that regresses to the middle: noise, not a fix.
    for t in fixed:
        inc[t] = [wrong(labels[t]), right(labels[t]), right(labels[t])]  # 2/3
        cand[t] = [right(labels[t]), wrong(labels[t]), wrong(labels[t])]  # 1/3
    d = decide_adaptive(labels, inc, cand, ADAPTIVE, first_pass=1, rejudged=fixed)
    assert not d.keep and d.test is not None and d.test.statistic < 0
    assert "kappa did not rise" in d.reason
    # The first pass alone looked like +4/−0 (McNemar p = 1/16): the paired policy is fooled.
    assert d.paired_keep is True and "the paired policy would have kept it" in d.reason


def test_the_paired_and_literal_policies_still_decide_on_the_first_pass() -> None:
    labels = _split(5, 5)
    inc = {t: [wrong(lab) if t in ("p0", "n0") else right(lab)] for t, lab in labels.items()}
    cand = {t: [right(lab)] for t, lab in labels.items()}
    for policy in ("paired", "literal"):
        d = decide_adaptive(labels, inc, cand, LoopSection(policy=policy), first_pass=1)
        assert d.policy == policy and d.literal_keep and not d.paired_keep  # +2/−0: p = 1/4
        assert d.keep == (policy == "literal") and d.adaptive_keep is False and d.test is not None


def test_replicates_and_rejudging_combine_into_k_plus_r_judgements() -> None:
    labels = _split(3, 3)
    k = 3
    inc = {t: [right(lab)] * k for t, lab in labels.items()}
    cand = {t: [right(lab)] * k for t, lab in labels.items()}
    inc["p0"] = [wrong(labels["p0"])] * 2 + [right(labels["p0"])] + [wrong(labels["p0"])] * 2  # 1/5
    cand["p0"] = [right(labels["p0"])] * 5  # 5/5
    d = decide_adaptive(labels, inc, cand, ADAPTIVE, first_pass=k, rejudged=["p0"])
    assert d.test is not None and d.test.first_pass == 3
    [item] = d.test.rejudged
    assert (item.incumbent_total, item.candidate_total) == (5, 5) and item.difference == Fraction(4, 5)


def test_a_stored_decision_replays_to_the_same_p_value() -> None:
    labels = _split(8, 8)
    rng = random.Random(2)
    inc = {t: [rng.choice((right(lab), wrong(lab))) for _ in range(3)] for t, lab in labels.items()}
    cand = {t: [rng.choice((right(lab), wrong(lab))) for _ in range(3)] for t, lab in labels.items()}
    d = decide_adaptive(labels, inc, cand, ADAPTIVE, first_pass=1, rejudged=list(labels)[:6], seed=99)
    assert d.test is not None
    stored = AdaptiveTest.model_validate_json(d.test.model_dump_json())
    assert stored.replay().p_value == d.test.p_value == d.p_value
    # A Monte Carlo decision replays from its seed and draw count.
    mc = stored.model_copy(update={"draws": 5_000, "seed": 8})
    assert mc.replay().p_value == AdaptiveTest.model_validate_json(mc.model_dump_json()).replay().p_value


# --- the early-stopping bound ---------------------------------------------------------------------


def _completions(
    labels: dict[str, Label], inc_first: dict[str, list[Answer]], so_far: dict[str, list[Answer]], r: int
) -> Iterator[tuple[dict[str, list[Answer]], dict[str, list[Answer]], list[str]]]:
    """Every way the unjudged first-pass items and the re-judging could come out (k = 1), lazily and the
    ones best for the candidate first (its judgements right, the incumbent's wrong), so that a search for
    a keep usually ends at the first completion; the set of completions is the same in any order."""
    unjudged = [t for t in labels if t not in so_far]
    for firsts in itertools.product((True, False), repeat=len(unjudged)):
        cand = dict(so_far)
        for t, ok in zip(unjudged, firsts, strict=True):
            cand[t] = [right(labels[t]) if ok else wrong(labels[t])]
        dis = disagreements({t: inc_first[t][0] for t in labels}, {t: cand[t][0] for t in labels})
        # Per disagreeing item: how many of the r extra judgements are right for the incumbent, and
        # wrong for the candidate.
        for extras in itertools.product(range(r + 1), repeat=2 * len(dis)):
            inc_all = {t: list(v) for t, v in inc_first.items()}
            cand_all = {t: list(v) for t, v in cand.items()}
            for j, t in enumerate(dis):
                i_ok, c_ok = extras[2 * j], r - extras[2 * j + 1]
                inc_all[t] += [right(labels[t])] * i_ok + [wrong(labels[t])] * (r - i_ok)
                cand_all[t] += [right(labels[t])] * c_ok + [wrong(labels[t])] * (r - c_ok)
            yield inc_all, cand_all, dis


@pytest.mark.parametrize("r", [1, 2])
@pytest.mark.slow
def test_the_adaptive_stopping_bound_never_stops_a_candidate_some_completion_would_keep(r: int) -> None:
    rng = random.Random(10 + r)
    stops = keeps_seen = 0
    for case in range(260):
        n = rng.randint(3, 5 if r == 1 else 4)
        n_pos = rng.randint(1, n - 1)
        labels = {f"i{j}": (pos if j < n_pos else neg)(f"i{j}") for j in range(n)}
        inc_first = {
            t: [rng.choice((right(lab), wrong(lab), BAD if rng.random() < 0.1 else right(lab)))]
            for t, lab in labels.items()
        }
        judged = rng.sample(sorted(labels), rng.randint(0, n))
        so_far = {t: [rng.choice((right(labels[t]), wrong(labels[t])))] for t in judged}
        loop = LoopSection(
            alpha=rng.choice((0.1, 0.3, 0.6)), rejudge=r, fpr_tolerance=rng.choice((0.0, 0.0, 0.25))
        )
        stop = adaptive_stopped_decision(labels, so_far, inc_first, loop)
        if stop is None and keeps_seen > 20:
            continue  # the bound may be loose: a search here would only count keeps, and enough were seen
        any_keep = any(
            decide_adaptive(labels, inc_all, cand_all, loop, first_pass=1, rejudged=dis).keep
            for inc_all, cand_all, dis in _completions(labels, inc_first, so_far, r)
        )
        keeps_seen += any_keep
        if stop is not None:
            stops += 1
            assert not any_keep, (case, labels, inc_first, so_far)
            assert not stop.keep and stop.adaptive_keep is False
    assert stops > 20 and keeps_seen > 20  # both branches exercised


def test_nothing_to_gain_from_rejudging_skips_it() -> None:
    labels = _split(20, 20)
    inc = {t: [right(lab)] for t, lab in labels.items()}
    cand = dict(inc)
    cand["p0"] = [wrong(labels["p0"])]  # one disagreement: at best p = 1/2 with the other items tied
    d = adaptive_stopped_decision(labels, cand, inc, ADAPTIVE)
    assert d is not None and not d.early_stopped and "not re-judged (1 item(s) disagree)" in d.reason


# --- LORD++ ---------------------------------------------------------------------------------------


def test_lord_levels_spend_the_wealth_and_earn_it_back_on_keeps() -> None:
    # No keep: γ_t·W0 with γ_t = 1/(t(t+1)), W0 = α/2; the levels sum to W0 < α.
    levels = [lord_level(0.1, [False] * t) for t in range(200)]
    assert levels[0] == pytest.approx(0.05 * 0.5) and levels[1] == pytest.approx(0.05 / 6)
    assert sum(levels) < 0.05
    # A keep at test 1 gives test 2 the level γ_2·W0 + (α − W0)·γ_1.
    assert lord_level(0.1, [True]) == pytest.approx(0.05 / 6 + 0.05 * 0.5)
    # Later keeps add α·γ_{t−τ}.
    assert lord_level(0.1, [True, True]) == pytest.approx(0.05 / 12 + 0.05 / 6 + 0.1 * 0.5)
    with pytest.raises(ValueError):
        lord_level(1.5, [])


def test_the_adaptive_test_weights_each_difference_by_its_own_size() -> None:
    from optimizer.stats.decision import adaptive_test, evidence

    # One item right on all 3 judgements under the candidate and wrong on all under the incumbent
    # (d = 1) against eight that moved by one judgement the other way (d = −1/3 each): the plain
    # sum says −1.67 items, the evidence says 1 − 8/9 > 0.
    diffs = [Fraction(1)] + [Fraction(-1, 3)] * 8
    assert evidence(Fraction(-1, 3)) == Fraction(-1, 9) and evidence(Fraction(2, 3)) == Fraction(4, 9)
    result = adaptive_test(diffs)
    assert result.statistic == Fraction(1, 9)
    assert result.p_exact == brute_force_p([evidence(d) for d in diffs])
    # The decision reports the plain sum as the gain in items.
    labels = _split(5, 4)
    inc = {t: [right(lab)] * 3 for t, lab in labels.items()}
    cand = {t: [right(lab)] * 3 for t, lab in labels.items()}
    inc["p0"], cand["p0"] = [wrong(labels["p0"])] * 3, [right(labels["p0"])] * 3
    for t in list(labels)[1:]:
        cand[t] = [right(labels[t])] * 2 + [wrong(labels[t])]
    d = decide_adaptive(labels, inc, cand, ADAPTIVE, first_pass=1, rejudged=list(labels))
    assert d.test is not None and d.test.statistic == pytest.approx(1 - 8 / 3)
    assert d.test.p_value == pytest.approx(float(result.p_exact))
