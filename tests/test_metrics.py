"""Protocol metrics: hand-computed cases, scikit-learn agreement, bootstrap, flips and McNemar."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from optimizer.models import Label
from optimizer.stats.metrics import (
    PROTOCOL_KEYS,
    Answer,
    Metrics,
    bootstrap_intervals,
    flip_table,
    mcnemar_exact_one_sided,
    predicted_success,
    score,
)
from optimizer.vocab import MistakeType

CM: MistakeType = "Critical Mistake"
BSE: MistakeType = "Bad Side Effect"
MIS: MistakeType = "Misunderstanding of the Instruction"


def pos(tid: str) -> Label:
    return Label(trajectory_id=tid, label="positive", original_id=tid)


def neg(tid: str, mistake_type: MistakeType | None = None) -> Label:
    return Label(trajectory_id=tid, label="negative", original_id=tid, mistake_type=mistake_type)


def ok(success: bool, mistake_type: str | None = None) -> Answer:
    return Answer(success=success, mistake_type=mistake_type)


def labels_of(*items: Label) -> dict[str, Label]:
    return {label.trajectory_id: label for label in items}


# Four positives; six negatives typed CM, CM, BSE, BSE, MIS and one untyped.
LABELS = labels_of(
    pos("p1"), pos("p2"), pos("p3"), pos("p4"),
    neg("n1", CM), neg("n2", CM), neg("n3", BSE), neg("n4", BSE), neg("n5", MIS), neg("n6"),
)  # fmt: skip


def test_score_hand_computed_case_with_wrong_answer_kinds() -> None:
    answers = {
        "p1": ok(True),  # TP
        "p2": ok(True),  # TP
        "p3": ok(False),  # FN
        "p4": Answer(success=None, status="invalid"),  # invalid on a positive ⇒ scored FN
        "n1": ok(False, CM),  # TN, type recalled
        "n2": ok(False, BSE),  # TN, wrong type ⇒ not recalled
        "n3": ok(True),  # FP
        "n4": Answer(success=None, status="infra_error"),  # no reply on a negative ⇒ scored FP
        "n5": ok(False, "Misunderstanding of the Instructions"),  # TN; plural spelling folds ⇒ recalled
        # n6 absent ⇒ missing ⇒ scored FP
    }
    m = score(LABELS, answers)
    # tp=2, fn=2 (p3, p4); tn=3 (n1, n2, n5), fp=3 (n3, n4, n6)
    assert (m.tp, m.fn, m.tn, m.fp) == (2, 2, 3, 3)
    assert m.n == 10 and m.invalid == 1 and m.missing == 2 and m.infra_errors == 1
    assert m.tpr == pytest.approx(2 / 4) and m.fnr == pytest.approx(2 / 4)
    assert m.tnr == pytest.approx(3 / 6) and m.fpr == pytest.approx(3 / 6)
    assert m.balanced_accuracy == pytest.approx((0.5 + 0.5) / 2)
    # po = 5/10; predicted positive = tp+fp = 5, labelled positive = 4:
    # pe = (5·4 + 5·6)/100 = 0.5 ⇒ kappa = (0.5 − 0.5)/(1 − 0.5) = 0
    assert m.kappa == pytest.approx(0.0)
    # recall: CM 1/2 (n1), BSE 0/2 (n2 wrong type, n4 no reply), MIS 1/1 (n5); overall 2/5 (n6 untyped)
    assert m.mistake_type_recall == {CM: 0.5, BSE: 0.0, MIS: 1.0, "overall": pytest.approx(2 / 5)}


def test_protocol_dict_has_exactly_the_score_json_keys() -> None:
    d = score(LABELS, {}).protocol_dict()
    assert tuple(d) == PROTOCOL_KEYS
    assert set(d) == {"n", "balanced_accuracy", "tpr", "tnr", "fpr", "fnr", "kappa", "invalid", "missing",
                      "mistake_type_recall"}  # fmt: skip


def test_no_answers_at_all_is_every_item_wrong_not_a_smaller_denominator() -> None:
    m = score(LABELS, {})
    assert m.n == 10 and m.missing == 10
    assert (m.tp, m.fn, m.tn, m.fp) == (0, 4, 0, 6)
    assert m.tpr == 0.0 and m.fpr == 1.0
    # po = 0, pe = (6·6 + 4·4)... predicted positive = 6 (all negatives), labelled positive = 4:
    # pe = (6·4 + 4·6)/100 = 0.48 ⇒ kappa = −0.48/0.52
    assert m.kappa == pytest.approx(-0.48 / 0.52)


def test_success_true_on_a_negative_never_counts_as_type_recall() -> None:
    m = score(labels_of(neg("n1", CM)), {"n1": ok(True, CM)})
    assert m.mistake_type_recall[CM] == 0.0


def test_answers_outside_the_labels_are_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="outside the labels"):
        score(LABELS, {"zzz": ok(True)})


@pytest.mark.slow
def test_kappa_equals_sklearn_on_random_verdict_sets() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        n_pos, n_neg = int(rng.integers(1, 30)), int(rng.integers(1, 30))
        labels = labels_of(*(pos(f"p{i}") for i in range(n_pos)), *(neg(f"n{i}") for i in range(n_neg)))
        answers: dict[str, Answer] = {}
        for tid in labels:
            r = rng.random()
            if r < 0.1:
                continue  # missing
            answers[tid] = (
                Answer(success=None, status="invalid") if r < 0.15 else ok(bool(rng.random() < 0.6))
            )
        m = score(labels, answers)
        y_true = [label.is_positive for label in labels.values()]
        y_pred = [predicted_success(labels[tid], answers.get(tid)) for tid in labels]
        expected = cohen_kappa_score(y_true, y_pred)
        if math.isnan(expected):
            assert m.kappa is None
        else:
            assert m.kappa == pytest.approx(expected, abs=1e-12)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_degenerate_splits_give_none_rates_and_documented_kappa() -> None:
    only_neg = labels_of(neg("a"), neg("b"))
    perfect = score(only_neg, {"a": ok(False), "b": ok(False)})
    assert perfect.tpr is None and perfect.fnr is None and perfect.balanced_accuracy is None
    assert perfect.kappa is None  # 0/0: sklearn gives NaN here
    assert math.isnan(cohen_kappa_score([0, 0], [0, 0]))
    imperfect = score(only_neg, {"a": ok(True), "b": ok(False)})
    assert imperfect.kappa == 0.0 == cohen_kappa_score([0, 0], [1, 0])
    assert imperfect.fpr == 0.5
    untyped = score(only_neg, {})
    assert untyped.mistake_type_recall == {CM: None, BSE: None, MIS: None, "overall": None}


def _ahd_like(kappa_target_correct: tuple[int, int]) -> tuple[dict[str, Label], dict[str, Answer]]:
    tp, tn = kappa_target_correct
    labels = labels_of(*(pos(f"p{i}") for i in range(62)), *(neg(f"n{i}") for i in range(100)))
    answers = {f"p{i}": ok(i < tp) for i in range(62)} | {f"n{i}": ok(i >= tn) for i in range(100)}
    return labels, answers


def test_bootstrap_is_seeded_contains_the_estimate_and_matches_the_design_doc_width() -> None:
    labels, answers = _ahd_like((53, 88))  # tp 53/62, tn 88/100 ⇒ kappa ≈ 0.72
    m = score(labels, answers)
    a = bootstrap_intervals(labels, answers, seed=3)
    assert a == bootstrap_intervals(labels, answers, seed=3)
    assert a != bootstrap_intervals(labels, answers, seed=4)
    assert set(a) == {"balanced_accuracy", "tpr", "tnr", "fpr", "fnr", "kappa"}
    for key, (lo, hi) in a.items():
        assert lo <= getattr(m, key) <= hi, key
    lo, hi = a["kappa"]
    # DESIGN.md: the 95% interval of kappa near 0.7 on 162 items is about ±0.11.
    assert 0.08 < (hi - lo) / 2 < 0.14
    lo, hi = a["fpr"]
    assert lo == pytest.approx(1 - a["tnr"][1]) and hi == pytest.approx(1 - a["tnr"][0])


def test_bootstrap_of_a_perfect_judge_is_a_point_and_one_class_omits_kappa() -> None:
    labels, answers = _ahd_like((62, 100))
    assert bootstrap_intervals(labels, answers)["kappa"] == (1.0, 1.0)
    only_neg = labels_of(neg("a"), neg("b"))
    assert set(bootstrap_intervals(only_neg, {"a": ok(True)})) == {"tnr", "fpr"}


def test_flip_table_sorts_changed_items_by_direction() -> None:
    labels = labels_of(pos("p1"), pos("p2"), pos("p3"), neg("n1"), neg("n2"), neg("n3"))
    incumbent = {
        "p1": ok(True),
        "p2": ok(False),
        "p3": ok(True),
        "n1": ok(False),
        "n2": ok(True),
        "n3": ok(True),
    }
    candidate = {"p1": ok(False), "p2": ok(True), "n1": ok(True), "n2": ok(False), "n3": ok(True)}
    flips = flip_table(labels, incumbent, candidate)
    assert flips.tp_to_fn == ["p1", "p3"]  # p3: candidate missing ⇒ wrong
    assert flips.fn_to_tp == ["p2"]
    assert flips.tn_to_fp == ["n1"]
    assert flips.fp_to_tn == ["n2"]  # n3 stays FP: not a flip
    assert (flips.improved, flips.worsened) == (2, 3)
    assert flips.model_dump()["improved"] == 2  # stored with the ledger row


@pytest.mark.parametrize(
    ("improved", "worsened", "expected"),
    [
        (0, 0, 1.0),  # no discordant items: no evidence
        (3, 0, 1 / 8),  # P(X≥3 | n=3) = 1/2³
        (5, 1, 7 / 64),  # P(X≥5 | n=6) = (C(6,5)+C(6,6))/2⁶ = (6+1)/64
        (1, 5, 63 / 64),  # P(X≥1 | n=6) = 1 − 1/64
        (7, 2, 46 / 512),  # P(X≥7 | n=9) = (36+9+1)/512
        (0, 4, 1.0),  # P(X≥0) = 1
        (10, 10, 0.5 + math.comb(20, 10) / 2**21),  # symmetric: ½ + P(X=10)/2
    ],
)
def test_mcnemar_exact_one_sided_matches_hand_computed_binomial_tails(
    improved: int, worsened: int, expected: float
) -> None:
    assert mcnemar_exact_one_sided(improved, worsened) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_matches_scipy_binomtest() -> None:
    stats = pytest.importorskip("scipy.stats")
    for improved in range(0, 40, 3):
        for worsened in range(0, 40, 4):
            if improved + worsened == 0:
                continue
            ref = stats.binomtest(improved, improved + worsened, 0.5, alternative="greater").pvalue
            assert mcnemar_exact_one_sided(improved, worsened) == pytest.approx(ref, rel=1e-9)


def test_metrics_from_counts_round_trips_through_score() -> None:
    labels, answers = _ahd_like((50, 80))
    m = score(labels, answers)
    again = Metrics.from_counts(m.tp, m.fn, m.tn, m.fp, mistake_type_recall=m.mistake_type_recall)
    assert again == m


def test_false_positives_by_type_count_wrong_and_unusable_answers_on_negatives() -> None:
    from optimizer.stats.metrics import false_positives_by_type

    cm: MistakeType = "Critical Mistake"
    bse: MistakeType = "Bad Side Effect"
    mis: MistakeType = "Misunderstanding of the Instruction"
    labels = {
        "p": Label(trajectory_id="p", original_id="p", label="positive"),
        "c1": Label(trajectory_id="c1", original_id="c1", label="negative", mistake_type=cm),
        "c2": Label(trajectory_id="c2", original_id="c2", label="negative", mistake_type=cm),
        "b1": Label(trajectory_id="b1", original_id="b1", label="negative", mistake_type=bse),
        "m1": Label(trajectory_id="m1", original_id="m1", label="negative", mistake_type=mis),
        "u1": Label(trajectory_id="u1", original_id="u1", label="negative"),
    }
    answers = {
        "p": Answer(success=True),  # a true positive is no false positive
        "c1": Answer(success=True),  # let through: FP
        "c2": Answer(success=None, status="invalid"),  # unusable on a negative: scored as FP, as score() does
        "b1": Answer(success=False),  # caught
        # m1 missing: scored as FP
        "u1": Answer(success=True),
    }
    counts = false_positives_by_type(labels, answers)
    assert counts == {cm: 2, bse: 0, mis: 1, "untyped": 1}
    assert sum(counts.values()) == score(labels, answers).fp
