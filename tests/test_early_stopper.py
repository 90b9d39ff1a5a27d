"""The incremental early-stopping bound (`EarlyStopper`) against the full recomputation it replaces in the
loop (`stopped_decision`, `adaptive_stopped_decision`): the same answer — None or an equal `Decision` —
after every judged item, over random splits, judgements, orders and configurations."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest

from optimizer.models import Label
from optimizer.stats import adaptive, incremental
from optimizer.stats.decision import (
    Decision,
    EarlyStopper,
    adaptive_stopped_decision,
    evidence,
    stopped_decision,
)
from optimizer.stats.metrics import Answer, majority_answer
from optimizer.stats.signflip import sign_flip_test, sign_flip_test_grouped, sign_flip_upper_bound
from optimizer.workspace.config import LoopSection

YES, NO = Answer(success=True), Answer(success=False)
BAD = Answer(success=None, status="invalid")
LOST = Answer(success=None, status="infra_error")


def _labels(rng: random.Random) -> dict[str, Label]:
    n = rng.randint(1, 12)
    # Now and then a one-class split (where the kappa bound must never fire).
    n_pos = rng.choice((0, n)) if rng.random() < 0.1 else rng.randint(0, n)
    ids = [f"t{i}" for i in range(n)]
    rng.shuffle(ids)
    return {
        tid: Label(trajectory_id=tid, label="positive" if j < n_pos else "negative", original_id=tid)
        for j, tid in enumerate(ids)
    }


def _judgement(rng: random.Random, label: Label, p_right: float) -> Answer:
    u = rng.random()
    if u < 0.08:
        return BAD  # a parse failure: no usable verdict
    if u < 0.1:
        return LOST
    right = rng.random() < p_right
    if label.is_positive == right:
        return YES
    return Answer(success=False, mistake_type=rng.choice((None, "Critical Mistake")))


def _kind(d: Decision) -> str:
    if "false positive(s) already" in d.reason:
        return "fpr"
    return "not re-judged" if d.reason.startswith("not re-judged") else "best case"


def _loop(rng: random.Random, policy: str) -> LoopSection:
    return LoopSection(
        policy=policy,  # type: ignore[arg-type]
        alpha=rng.choice((0.05, 0.1, 0.1, 0.3, 0.6, 1.0)),
        rejudge=rng.choice((0, 1, 2, 2, 3)),
        min_kappa_delta=rng.choice((0.0, 0.0, 0.02, -0.05)),
        fpr_tolerance=rng.choice((0.0, 0.0, 0.1, 0.25)),
    )


def _replay(rng: random.Random, policy: str) -> tuple[list[Decision | None], list[Decision | None]]:
    """One random candidate judged item by item: (the reference's answers, the stopper's)."""
    labels = _labels(rng)
    k_inc = rng.choice((1, 1, 2, 3))
    k_cand = k_inc if rng.random() < 0.85 else rng.choice((1, 2, 3))
    p_inc = rng.uniform(0.3, 0.95)
    inc_judgements = {t: [_judgement(rng, lab, p_inc) for _ in range(k_inc)] for t, lab in labels.items()}
    # The incumbent's answers, as the ledger keeps them (now and then one absent: a wrong answer).
    inc_answers = {t: majority_answer(js) for t, js in inc_judgements.items() if rng.random() < 0.95}
    share = rng.uniform(0.3, 1.0)  # a candidate that mostly repeats the incumbent, so keeps happen
    p_cand = min(1.0, p_inc + rng.uniform(-0.2, 0.4))
    cand = {
        t: list(inc_judgements[t][:k_cand])
        if rng.random() < share and k_cand <= k_inc
        else [_judgement(rng, lab, p_cand) for _ in range(k_cand)]
        for t, lab in labels.items()
    }
    order = list(labels)
    rng.shuffle(order)
    if order and rng.random() < 0.2:  # an item judged again replaces its earlier result
        order.insert(rng.randrange(len(order) + 1), rng.choice(order))
    loop = _loop(rng, policy)
    alpha = rng.choice((None, None, 0.02, 0.5))
    stopper = EarlyStopper(labels, inc_answers, inc_judgements, loop, alpha=alpha)
    so_far: dict[str, Answer] = {}
    so_far_judgements: dict[str, list[Answer]] = {}
    expected: list[Decision | None] = []
    got: list[Decision | None] = []
    for tid in order:
        js = cand[tid] if tid not in so_far else [_judgement(rng, labels[tid], p_cand) for _ in range(k_cand)]
        answer = majority_answer(js)
        so_far[tid], so_far_judgements[tid] = answer, js
        if policy == "adaptive":
            expected.append(
                adaptive_stopped_decision(labels, so_far_judgements, inc_judgements, loop, alpha=alpha)
            )
        else:
            expected.append(stopped_decision(labels, so_far, inc_answers, loop, alpha=alpha))
        # Past the first stop too: the loop stops there, but the stopper's state must stay right.
        got.append(stopper.add(tid, answer, js))
    return expected, got


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["paired", "literal", "adaptive"])
def test_the_incremental_bound_decides_as_the_full_recomputation_after_every_item(policy: str) -> None:
    rng = random.Random(f"early-stopper-{policy}")
    fired, silent, reasons = 0, 0, Counter[str]()
    for case in range(260):
        expected, got = _replay(rng, policy)
        for step, (want, have) in enumerate(zip(expected, got, strict=True)):
            assert have == want, (case, step, want, have)
        fired += sum(d is not None for d in expected)
        silent += sum(d is None for d in expected)
        reasons.update(_kind(d) for d in expected if d is not None)
    # Not vacuous: both answers were compared, and each kind of stop happened.
    assert fired > 100 and silent > 100, (fired, silent)
    assert set(reasons) == (
        {"best case", "not re-judged"} if policy == "adaptive" else {"fpr", "best case"}
    ), reasons
    assert min(reasons.values()) > 10, reasons


def test_the_incremental_bound_gives_up_where_the_exact_p_value_is_out_of_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over the exact test's size limit the bound never stops a candidate, incremental or not."""
    within = [_replay(random.Random(f"limit-{case}"), "adaptive")[0] for case in range(120)]
    # The limit as the pure bound (adaptive) and the incremental one (incremental) read it.
    monkeypatch.setattr(adaptive, "MAX_EXACT_BITS", 16)
    monkeypatch.setattr(incremental, "MAX_EXACT_BITS", 16)
    gave_up = 0
    for case in range(120):
        expected, got = _replay(random.Random(f"limit-{case}"), "adaptive")
        assert got == expected, case
        gave_up += sum(w is not None and d is None for w, d in zip(within[case], expected, strict=True))
    assert gave_up > 10, gave_up  # stops the limit took away


def test_the_grouped_sign_flip_test_equals_the_test_on_the_items() -> None:
    """Differences given as value → count give the exact test on the items they stand for."""
    rng = random.Random(7)
    for _ in range(300):
        values = [Fraction(rng.randint(-6, 6), rng.choice((1, 2, 3, 5, 6))) for _ in range(rng.randint(0, 5))]
        counts = {v: rng.randint(0, 9) for v in values}
        items = [evidence(v) for v, c in counts.items() for _ in range(c)]
        grouped = sign_flip_test_grouped(Counter({evidence(v): c for v, c in counts.items()}))
        assert grouped == sign_flip_test(items)
    assert sign_flip_test_grouped({}) == sign_flip_test([])


def test_the_cheap_upper_bound_is_never_below_the_exact_p_value() -> None:
    """The stopper skips the exact test when this bound is below alpha: it must never undercut it."""
    rng = random.Random(11)
    below = 0
    for _ in range(400):
        counts = Counter(
            {
                evidence(Fraction(rng.randint(-5, 5), rng.choice((1, 3, 5)))): rng.randint(0, 12)
                for _ in range(rng.randint(1, 6))
            }
        )
        exact = sign_flip_test_grouped(counts).p_exact
        assert exact is not None and Fraction(sign_flip_upper_bound(counts)) >= exact, counts
        below += sign_flip_upper_bound(counts) < 0.1
    assert below > 100  # and it is sharp enough to spare the exact test often


def test_a_near_incumbent_candidate_on_a_large_split_is_checked_the_whole_way() -> None:
    """2,000 items, one judgement each: the candidate fixes 4 wrong positives and breaks 1 (paired rolls
    it back near the end; adaptive never stops it). Every check agrees with the reference at the
    points where the reference is affordable here (the first items and the last ones)."""
    n = 2000
    labels = {
        f"t{i:04d}": Label(
            trajectory_id=f"t{i:04d}", label="positive" if i % 3 == 0 else "negative", original_id=f"t{i:04d}"
        )
        for i in range(n)
    }
    rng = random.Random(3)
    inc = {
        t: (YES if lab.is_positive else NO) if rng.random() < 0.8 else (NO if lab.is_positive else YES)
        for t, lab in labels.items()
    }
    cand = dict(inc)
    wrong_pos = [t for t, a in inc.items() if labels[t].is_positive and a == NO]
    right_pos = [t for t, a in inc.items() if labels[t].is_positive and a == YES]
    for t in wrong_pos[:4]:
        cand[t] = YES
    cand[right_pos[0]] = NO
    order = [t for t in labels if not labels[t].is_positive] + [t for t in labels if labels[t].is_positive]
    inc_j = {t: [a] for t, a in inc.items()}
    for policy in ("paired", "adaptive"):
        loop = LoopSection(policy=policy)
        stopper = EarlyStopper(labels, inc, inc_j, loop)
        so_far: dict[str, Answer] = {}
        stopped_at = None
        for step, tid in enumerate(order, 1):
            so_far[tid] = cand[tid]
            got = stopper.add(tid, cand[tid], [cand[tid]])
            if step <= 3 or got is not None or step == n:
                js = {t: [a] for t, a in so_far.items()}
                want = (
                    adaptive_stopped_decision(labels, js, inc_j, loop)
                    if policy == "adaptive"
                    else stopped_decision(labels, so_far, inc, loop)
                )
                assert got == want, (policy, step)
            if got is not None:
                stopped_at = step
                break
        if policy == "paired":
            assert stopped_at is not None and stopped_at > 0.9 * n
        else:
            assert stopped_at is None
