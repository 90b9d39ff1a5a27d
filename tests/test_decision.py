"""The keep/rollback decision: both policies on every combination, and exact early stopping."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from optimizer.models import Label
from optimizer.stats.decision import (
    Counts,
    decide,
    decide_counts,
    fpr_provably_rose,
    kappa_provably_cannot_beat,
    stopped_decision,
)
from optimizer.stats.metrics import Answer, flip_table, score
from optimizer.workspace.config import LoopSection

PAIRED = LoopSection(policy="paired")  # alpha 0.1, no deltas
LITERAL = LoopSection(policy="literal")


def pos(tid: str) -> Label:
    return Label(trajectory_id=tid, label="positive", original_id=tid)


def neg(tid: str) -> Label:
    return Label(trajectory_id=tid, label="negative", original_id=tid)


def kappa_po_pe(c: Counts) -> Fraction | None:
    """Kappa by the textbook (po − pe)/(1 − pe) definition, exactly — independent of the code's identity."""
    n = c.tp + c.fn + c.tn + c.fp
    po = Fraction(c.tp + c.tn, n)
    pe = Fraction((c.tp + c.fp) * (c.tp + c.fn) + (c.tn + c.fn) * (c.tn + c.fp), n * n)
    return None if pe == 1 else (po - pe) / (1 - pe)


# --- the policies ---------------------------------------------------------------------------------


def test_reason_is_a_sentence_with_the_numbers_and_the_outcome() -> None:
    # 62 positives / 100 negatives. Incumbent tp 45, tn 86; candidate tp 48, tn 87.
    inc, cand = Counts(45, 17, 86, 14), Counts(48, 17 - 3, 87, 13)
    d = decide_counts(inc, cand, improved=6, worsened=2, loop=PAIRED)
    k_i, k_c = float(kappa_po_pe(inc)), float(kappa_po_pe(cand))  # type: ignore[arg-type]
    # P(X≥6 | n=8) = (28+8+1)/256 = 37/256 = 0.1445 ≥ 0.1 ⇒ the paired policy rolls back
    assert d.p_value == pytest.approx(37 / 256)
    assert d.literal_keep and not d.paired_keep and not d.keep
    assert d.reason.startswith(
        f"kappa {k_i:.3f} → {k_c:.3f} ({k_c - k_i:+.3f}), FPR 0.140 → 0.130, flips +6/−2"
    )
    assert (
        "p=0.145 ≥ 0.1: rolled back (the gain is not significant); the literal policy would have kept it"
        in d.reason
    )
    kept = decide_counts(inc, cand, improved=5, worsened=0, loop=PAIRED)  # p = 1/32
    assert kept.keep and kept.reason.endswith("p=0.031 < 0.1: kept")


def test_tie_is_rolled_back_under_both_policies() -> None:
    same = Counts(45, 17, 86, 14)
    d = decide_counts(same, same, improved=9, worsened=0, loop=LITERAL)  # flips swapped within a class
    assert not d.literal_keep and not d.paired_keep and not d.keep
    assert "kappa did not rise" in d.reason


def test_fpr_rise_rolls_back_even_when_kappa_rises_a_lot() -> None:
    d = decide_counts(Counts(30, 32, 90, 10), Counts(60, 2, 89, 11), improved=31, worsened=1, loop=LITERAL)
    assert not d.keep and not d.literal_keep and not d.paired_keep
    assert "FPR rose" in d.reason and "FPR 0.100 → 0.110" in d.reason


def test_thresholds_are_read_as_the_decimals_written() -> None:
    # FPR 0.7 → 0.8 with tolerance 0.1 is allowed; in floats 0.7 + 0.1 = 0.7999999999999999 < 0.8.
    loop = LoopSection(policy="literal", fpr_tolerance=0.1)
    d = decide_counts(Counts(3, 7, 3, 7), Counts(10, 0, 2, 8), improved=7, worsened=1, loop=loop)
    assert d.literal_keep, d.reason
    assert not decide_counts(Counts(3, 7, 3, 7), Counts(10, 0, 1, 9), 7, 2, loop).literal_keep
    # min_kappa_delta: needs more than the delta, not just a rise.
    strict = LoopSection(policy="literal", min_kappa_delta=0.05)
    small = decide_counts(Counts(45, 17, 86, 14), Counts(46, 16, 86, 14), 1, 0, strict)
    assert not small.keep and "did not rise by more than 0.05" in small.reason


def test_undefined_kappa_is_never_kept() -> None:
    # A one-class split (no positives): a perfect candidate has kappa 0/0.
    d = decide_counts(Counts(0, 0, 8, 2), Counts(0, 0, 10, 0), improved=2, worsened=0, loop=LITERAL)
    assert not d.keep and "kappa is undefined" in d.reason


def test_decide_refuses_metrics_over_different_items() -> None:
    with pytest.raises(ValueError, match="different items"):
        decide_counts(Counts(1, 1, 1, 1), Counts(1, 1, 1, 2), 0, 0, PAIRED)


@pytest.mark.slow
def test_policies_follow_their_definitions_on_every_small_combination() -> None:
    """Every (incumbent, candidate) confusion pair on 4 positives / 5 negatives, flips consistent."""
    P, N = 4, 5
    loops = [
        LoopSection(policy=policy, alpha=alpha, min_kappa_delta=delta, fpr_tolerance=tol)
        for policy in ("paired", "literal")
        for alpha in (0.1, 0.5)
        for delta in (0.0, 0.1)
        for tol in (0.0, 0.2)
    ]
    seen = {"literal_only": 0, "both": 0, "neither": 0}
    for tp_i, tn_i, tp_c, tn_c in itertools.product(range(P + 1), range(N + 1), range(P + 1), range(N + 1)):
        inc, cand = Counts(tp_i, P - tp_i, tn_i, N - tn_i), Counts(tp_c, P - tp_c, tn_c, N - tn_c)
        # The fewest flips consistent with the counts, and the same plus one swap in each class.
        dp, dn = tp_c - tp_i, tn_c - tn_i
        minimal = (max(dp, 0) + max(dn, 0), max(-dp, 0) + max(-dn, 0))
        for improved, worsened in (minimal, (minimal[0] + 1, minimal[1] + 1)):
            k_i, k_c = kappa_po_pe(inc), kappa_po_pe(cand)
            n_disc = improved + worsened
            p = Fraction(sum(math.comb(n_disc, k) for k in range(improved, n_disc + 1)), 2**n_disc)
            for loop in loops:
                d = decide_counts(inc, cand, improved, worsened, loop)
                kappa_ok = (
                    k_i is not None and k_c is not None and k_c > k_i + Fraction(str(loop.min_kappa_delta))
                )
                fpr_ok = Fraction(cand.fp, N) <= Fraction(inc.fp, N) + Fraction(str(loop.fpr_tolerance))
                assert d.literal_keep == (kappa_ok and fpr_ok)
                assert d.paired_keep == (kappa_ok and fpr_ok and p < Fraction(str(loop.alpha)))
                assert d.keep == (d.paired_keep if loop.policy == "paired" else d.literal_keep)
                assert d.p_value == pytest.approx(float(p))
                if d.literal_keep:
                    assert (
                        cand.fp <= inc.fp + loop.fpr_tolerance * N
                    )  # no kept candidate raised FPR beyond tol
                seen["both" if d.paired_keep else "literal_only" if d.literal_keep else "neither"] += 1
    assert all(seen.values()), seen  # every branch was exercised


def test_decide_on_metrics_and_flip_table_agrees_with_counts() -> None:
    labels = {t: pos(t) for t in ("p1", "p2", "p3")} | {t: neg(t) for t in ("n1", "n2", "n3")}
    yes, no = Answer(success=True), Answer(success=False)
    inc = {"p1": yes, "p2": no, "p3": no, "n1": no, "n2": yes, "n3": yes}
    cand = {"p1": yes, "p2": yes, "p3": yes, "n1": no, "n2": no, "n3": no}
    flips = flip_table(labels, inc, cand)
    d = decide(score(labels, inc), score(labels, cand), flips, PAIRED)
    assert (flips.improved, flips.worsened) == (4, 0)
    assert d.keep and d.p_value == pytest.approx(1 / 16)


# --- early stopping -------------------------------------------------------------------------------


def _split(P: int, N: int) -> dict[str, Label]:
    return {f"p{i}": pos(f"p{i}") for i in range(P)} | {f"n{i}": neg(f"n{i}") for i in range(N)}


def test_fpr_bound_fires_once_false_positives_exceed_the_incumbents() -> None:
    labels = _split(2, 10)
    incumbent = {t: Answer(success=t.startswith("p") or t in ("n0", "n1")) for t in labels}  # 2 FP
    so_far = {"n0": Answer(success=True), "n1": Answer(success=True), "n2": Answer(success=False)}
    assert not fpr_provably_rose(labels, so_far, incumbent, PAIRED)  # 2 FP: could still tie
    so_far["n3"] = Answer(success=None, status="invalid")  # an invalid answer on a negative is an FP
    assert fpr_provably_rose(labels, so_far, incumbent, PAIRED)
    assert not fpr_provably_rose(labels, so_far, incumbent, LoopSection(fpr_tolerance=0.1))  # 3 ≤ 2+1
    d = stopped_decision(labels, so_far, incumbent, PAIRED)
    assert d is not None and d.early_stopped and not d.keep and not d.literal_keep
    assert d.reason == (
        "stopped early after 4/12 items: 3 false positive(s) already, so FPR ≥ 0.300 > 0.200 whatever the "
        "6 of 10 negatives still unjudged get: rolled back (FPR rose)"
    )


def test_kappa_bound_uses_the_all_correct_completion() -> None:
    labels = _split(4, 4)
    yes, no = Answer(success=True), Answer(success=False)
    incumbent = {"p0": yes, "p1": yes, "p2": yes, "p3": no, "n0": no, "n1": no, "n2": no, "n3": yes}
    # Candidate: negatives as the incumbent (no FPR change), then two positives wrong.
    so_far = {"n0": no, "n1": no, "n2": no, "n3": yes, "p0": no}
    # Best case: p1..p3 right ⇒ tp 3 = incumbent's: kappa ties at best ⇒ cannot beat.
    assert kappa_provably_cannot_beat(labels, so_far, incumbent, LITERAL)
    # With p0 not yet judged the best case is tp 4 > 3: kappa could still rise, FPR unchanged.
    del so_far["p0"]
    assert not kappa_provably_cannot_beat(labels, so_far, incumbent, LITERAL)
    # ... but the paired test can never pass: best case 1 improvement, 0 worsened ⇒ p = 0.5.
    assert kappa_provably_cannot_beat(labels, so_far, incumbent, PAIRED)
    d = stopped_decision(labels, so_far, incumbent, PAIRED)
    assert d is not None and d.p_value == 0.5
    # What was observed first (4 negatives judged as the incumbent did: nothing fixed or broken), then
    # the best completion as the bound it is: p0..p3 right gives tp 4, fp 1 (kappa (7/8 − 1/2)/(1/2) =
    # 0.75 vs the incumbent's (6/8 − 1/2)/(1/2) = 0.5), one flip (p3), McNemar p = 1/2.
    assert d.reason == (
        "stopped early after 4/8 items: 0 fixed, 0 broken; even if every remaining item went its way "
        "(bound: kappa ≤ 0.750 vs 0.500, FPR ≥ 0.250 vs 0.250, flips +1/−0, p ≥ 0.500) it could not be kept "
        "(the gain could not be significant at 0.1); the literal policy's outcome was still open when "
        "evaluation stopped"
    )


def test_kappa_bound_never_stops_on_a_one_class_split() -> None:
    labels = _split(0, 3)
    so_far = {"n0": Answer(success=True)}
    incumbent = {t: Answer(success=False) for t in labels}
    assert not kappa_provably_cannot_beat(labels, so_far, incumbent, LITERAL)
    assert fpr_provably_rose(labels, so_far, incumbent, LITERAL)  # the FPR bound still holds


def _random_answer(rng: np.random.Generator, label: Label, p_correct: float) -> Answer:
    r = rng.random()
    if r < 0.04:
        return Answer(success=None, status="invalid")
    correct = r < 0.04 + p_correct * 0.96
    return Answer(success=label.is_positive if correct else not label.is_positive)


def _evaluation_orders(rng: np.random.Generator, labels: dict[str, Label], n_orders: int) -> list[list[str]]:
    """``n_orders`` negatives-first orders (each class shuffled), plus one fully mixed order.

    The loop judges negatives first, but concurrent evaluation finishes items in any order, and the
    bounds claim to hold for whatever subset has completed.
    """
    negatives = [t for t, lab in labels.items() if not lab.is_positive]
    positives = [t for t, lab in labels.items() if lab.is_positive]
    orders = []
    for _ in range(n_orders):
        negs, poss = list(negatives), list(positives)
        rng.shuffle(negs)
        rng.shuffle(poss)
        orders.append(negs + poss)
    mixed = negatives + positives
    rng.shuffle(mixed)
    return [*orders, mixed]


@pytest.mark.slow
def test_early_stopping_never_changes_a_decision_on_random_verdict_sets() -> None:
    """Whenever a bound says stop, in any evaluation order, the full evaluation rolls back.

    And the converse at the end: with nothing left to judge, the bounds equal the full decision.
    """
    rng = np.random.default_rng(2024)
    stops = {"fpr": 0, "kappa": 0}
    kept_full = 0
    orders_tried = distinct_orders = 0
    for trial in range(400):
        P, N = int(rng.integers(1, 14)), int(rng.integers(1, 18))
        labels = _split(P, N)
        base = rng.uniform(0.4, 0.95)
        incumbent = {t: _random_answer(rng, lab, base) for t, lab in labels.items()}
        # A candidate that shares most answers with the incumbent (so keeps happen), some redrawn.
        share = rng.uniform(0.3, 0.95)
        cand_p = float(np.clip(base + rng.normal(0, 0.15), 0.05, 1.0))
        candidate = {
            t: incumbent[t] if rng.random() < share else _random_answer(rng, lab, cand_p)
            for t, lab in labels.items()
        }
        loop = LoopSection(
            policy=("paired", "literal")[trial % 2],
            alpha=float(rng.choice([0.05, 0.1, 0.3, 1.0])),
            min_kappa_delta=float(rng.choice([0.0, 0.0, 0.02, -0.03])),
            fpr_tolerance=float(rng.choice([0.0, 0.0, 0.05, 0.2])),
        )
        full = decide(
            score(labels, incumbent), score(labels, candidate), flip_table(labels, incumbent, candidate), loop
        )
        kept_full += full.keep
        orders = _evaluation_orders(rng, labels, n_orders=3)
        orders_tried += len(orders)
        distinct_orders += len({tuple(o) for o in orders})
        for order in orders:
            so_far: dict[str, Answer] = {}
            for tid in order:
                so_far[tid] = candidate[tid]
                if fpr_provably_rose(labels, so_far, incumbent, loop):
                    stops["fpr"] += 1
                    assert not full.literal_keep and not full.paired_keep, (trial, order, full.reason)
                    break
                if kappa_provably_cannot_beat(labels, so_far, incumbent, loop):
                    stops["kappa"] += 1
                    assert not full.keep, (trial, order, full.reason)
                    # The stopped decision is an honest summary of the full one.
                    early = stopped_decision(labels, so_far, incumbent, loop)
                    assert early is not None and not early.keep and early.p_value <= full.p_value
                    break
            else:
                # Everything judged: the bound is exact, not merely safe.
                assert kappa_provably_cannot_beat(labels, so_far, incumbent, loop) == (not full.keep)
                assert (stopped_decision(labels, so_far, incumbent, loop) is None) == full.keep
    # The property is not vacuous: candidates were kept, both bounds fired, and the orders varied.
    print(
        f"kept on full evaluation: {kept_full}/400; stops: {stops}; orders: {distinct_orders}/{orders_tried}"
    )
    assert kept_full > 20 and stops["fpr"] > 20 and stops["kappa"] > 20, (kept_full, stops)
    assert distinct_orders > 0.9 * orders_tried, (distinct_orders, orders_tried)


def test_bounds_refuse_results_for_items_outside_the_split() -> None:
    with pytest.raises(ValueError, match="outside the labels"):
        fpr_provably_rose(_split(1, 1), {"zz": Answer(success=True)}, {}, PAIRED)


def test_kappa_bound_is_exact_against_every_completion_on_small_splits() -> None:
    """Brute force: the bound says stop iff *every* way of answering the unjudged items rolls back.

    When it stops, the stopped decision's p-value is the best any completion reaches.
    """
    rng = np.random.default_rng(11)
    stopped = continued = stopped_with_items_left = 0
    for trial in range(150):
        P, N = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        labels = _split(P, N)
        incumbent = {t: _random_answer(rng, lab, 0.6) for t, lab in labels.items()}
        ids = list(labels)
        judged = [t for t in ids if rng.random() < 0.5]
        so_far = {t: _random_answer(rng, labels[t], 0.7) for t in judged}
        unjudged = [t for t in ids if t not in so_far]
        loop = LoopSection(
            policy=("paired", "literal")[trial % 2],
            alpha=float(rng.choice([0.1, 0.3, 0.6])),
            min_kappa_delta=float(rng.choice([0.0, -0.1])),
            fpr_tolerance=float(rng.choice([0.0, 0.25])),
        )
        inc_metrics = score(labels, incumbent)
        completions = []
        for bits in itertools.product((True, False), repeat=len(unjudged)):
            completed = dict(so_far)
            for tid, right in zip(unjudged, bits, strict=True):
                completed[tid] = Answer(success=labels[tid].is_positive == right)
            completions.append(
                decide(inc_metrics, score(labels, completed), flip_table(labels, incumbent, completed), loop)
            )
        any_kept = any(d.keep for d in completions)
        stop = kappa_provably_cannot_beat(labels, so_far, incumbent, loop)
        assert stop == (not any_kept), trial
        if stop:
            stopped += 1
            stopped_with_items_left += bool(unjudged)
            if not fpr_provably_rose(labels, so_far, incumbent, loop):
                early = stopped_decision(labels, so_far, incumbent, loop)
                assert early is not None and not early.keep, trial
                assert early.p_value == min(d.p_value for d in completions), trial
        else:
            continued += 1
    # Both answers of the bound were checked, and it stopped with items still unjudged (its use).
    assert stopped > 20 and continued > 20 and stopped_with_items_left > 10, (
        stopped,
        continued,
        stopped_with_items_left,
    )


def test_min_fixes_to_keep_matches_the_binomial_tail_by_hand() -> None:
    from optimizer.stats.decision import detectable_gain_line, min_fixes_to_keep

    # P(X >= k | n, 1/2): 4 of 4 = 1/16 < 0.1 <= 3 of 3 = 1/8; 6 of 7 = 8/128 < 0.1 <= 5 of 6 = 7/64;
    # 7 of 9 = 46/512 < 0.1 <= 6 of 8 = 37/256.
    assert [min_fixes_to_keep(w, 0.1) for w in (0, 1, 2)] == [4, 6, 7]
    assert min_fixes_to_keep(0, 0.05) == 5  # 1/32 < 0.05 <= 1/16
    line = detectable_gain_line(24, 0.1)
    assert "at least 4 items right while breaking none (6 if it breaks one, 7 if two)" in line
    assert "17% of the split" in line  # 4 / 24
