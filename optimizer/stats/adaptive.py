"""The adaptive policy: re-judge the disagreements, then the literal rule on majorities and the sign-flip
test on the per-item differences (`decide_adaptive`), and its early-stopping bound
(`adaptive_stopped_decision`). Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction

from optimizer.models import Label
from optimizer.stats.bounds import (
    Observed,
    unjudged_ids,
)
from optimizer.stats.evidence import AdaptiveTest, ItemShares, adaptive_test, evidence
from optimizer.stats.metrics import (
    Answer,
    flip_table,
    is_correct,
    kappa_fraction,
    majority_answer,
    outcome,
    score,
)
from optimizer.stats.policies import policy_for
from optimizer.stats.rules import (
    Counts,
    Decision,
    Reason,
    decide,
    exact_fraction,
    fpr_within,
    kappa_clears,
    p_text,
    rate_text,
)
from optimizer.stats.signflip import (
    MAX_EXACT_BITS,
    exact_bits,
)
from optimizer.workspace.config import LoopSection

# --- the adaptive policy ----------------------------------------------------------------------------
#
# First pass: every item judged ``replicates`` = k times under the candidate (the incumbent's first
# pass is on record). The items whose first-pass verdicts differ (majority outcome True / False /
# no usable verdict — label-free) are judged ``rejudge`` = r more times under each prompt (replicate
# indices k … k+r−1, so the incumbent's extra judgements are cached and paid once). Per item, the
# share of its judgements that are correct (an unusable judgement is wrong); d_i = candidate share −
# incumbent share (0 for an item both prompts judged alike with k = 1). Keep iff
#   · the literal rule holds on per-item majorities over all judgements, and
#   · the one-sided sign-flip test (`optimizer.stats.signflip`) on the d_i gives p < alpha.
# The test's statistic is Σ d_i·|d_i| (`evidence`): each item's difference weighted by its own size,
# so an item judged right every time under the candidate and wrong every time under the incumbent
# (d = 1) counts 9 times one judged 2/3 against 1/3 (d = 1/3). Re-judging noise lives mostly in the
# small differences, a real fix mostly in the large ones; on the decision-power benchmark this keeps
# 8-item fixes ~74% of the time instead of ~62% for the plain sum, with the same false-keep bound
# (any odd, increasing score of the d_i keeps the sign-flip test exact at alpha). The plain sum Σ d_i
# is what is reported as the gain in items.
# With ``--replicates k`` the first pass is k judgements per item and re-judged items end with k + r;
# the literal and paired policies still read the first pass.
#
# Early stopping under adaptive. A judgement not made yet can be anything, and re-judging can
# overturn a first-pass verdict, so the bound is an over-approximation: per item, the largest d_i any
# outcome could give, with the candidate's majority right and the incumbent's wrong wherever either
# could still change (an item not judged yet, or judged and disagreeing when r > 0). Items judged
# alike are fixed. Kappa rises with every item the candidate gets right or the incumbent gets wrong
# (the monotonicity argument above, applied to each side), FP falls likewise, and the exact sign-flip
# p-value never rises when a score rises (`optimizer.stats.signflip`), nor so when a d_i rises, the score
# d·|d| being increasing in d. So if this vector, which is at least
# every real outcome in each coordinate, is rolled back, every real outcome is. Applied after each
# first-pass item and once more before re-judging (when nothing re-judging could bring would make
# it a keep, the re-judging calls are not made). Only where the p-value is exact; never on a
# one-class split.


Judgements = Mapping[str, Sequence[Answer]]


def disagreements(incumbent: Mapping[str, Answer], candidate: Mapping[str, Answer]) -> list[str]:
    """Ids (in ``candidate``'s order) whose verdicts differ: True vs False, or usable vs not.
    Label-free: the same rule picks the items to re-judge whoever runs it."""
    return [
        tid
        for tid, answer in candidate.items()
        if tid in incumbent and outcome(answer) != outcome(incumbent[tid])
    ]


def counts_from_correct(labels: Mapping[str, Label], correct: Mapping[str, bool]) -> Counts:
    """Confusion counts from whether each item's verdict (e.g. its majority) is right."""
    tp = sum(1 for t, lab in labels.items() if lab.is_positive and correct[t])
    fn = sum(1 for t, lab in labels.items() if lab.is_positive and not correct[t])
    tn = sum(1 for t, lab in labels.items() if not lab.is_positive and correct[t])
    return Counts(tp, fn, tn, len(labels) - tp - fn - tn)


def _rates(incumbent: Counts, candidate: Counts) -> tuple[str, str]:
    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*candidate)
    if k_i is None or k_c is None:
        kappa_part = f"kappa {rate_text(k_i, 3)} → {rate_text(k_c, 3)}"
    else:
        kappa_part = f"kappa {float(k_i):.3f} → {float(k_c):.3f} ({float(k_c - k_i):+.3f})"
    n = incumbent.tn + incumbent.fp
    fpr_part = f"FPR {incumbent.fp / n:.3f} → {candidate.fp / n:.3f}" if n else "FPR undefined (no negatives)"
    return kappa_part, fpr_part


def decide_adaptive(
    labels: Mapping[str, Label],
    incumbent: Judgements,
    candidate: Judgements,
    loop: LoopSection,
    *,
    first_pass: int,
    rejudged: Collection[str] = (),
    alpha: float | None = None,
    seed: int = 0,
) -> Decision:
    """All three policies on every judgement of both prompts (see "the adaptive policy" above).

    ``incumbent``/``candidate``: every labelled id → its judgements, the first ``first_pass`` of
    them the first pass; ``rejudged``: the ids judged again. ``alpha`` overrides ``loop.alpha``;
    ``seed`` drives the Monte Carlo p-value if the exact one is out of reach.
    """
    missing = [t for t in labels if not incumbent.get(t) or not candidate.get(t)]
    if missing:
        raise ValueError(f"decide_adaptive: {len(missing)} item(s) without judgements, e.g. {missing[0]!r}")
    level = loop.alpha if alpha is None else alpha
    rejudged = set(rejudged)
    first_i = {t: majority_answer(incumbent[t][:first_pass]) for t in labels}
    first_c = {t: majority_answer(candidate[t][:first_pass]) for t in labels}
    base = decide(
        score(labels, first_i),
        score(labels, first_c),
        flip_table(labels, first_i, first_c),
        loop,
        alpha=level,
    )

    all_i = {t: is_correct(labels[t], majority_answer(incumbent[t])) for t in labels}
    all_c = {t: is_correct(labels[t], majority_answer(candidate[t])) for t in labels}
    counts_i, counts_c = counts_from_correct(labels, all_i), counts_from_correct(labels, all_c)
    kappa_ok = kappa_clears(counts_c, counts_i, loop.min_kappa_delta)
    n_neg = counts_i.tn + counts_i.fp
    fpr_ok = fpr_within(counts_c.fp, counts_i.fp, n_neg, loop.fpr_tolerance)

    items: list[ItemShares] = []
    for tid in sorted(labels):
        share = ItemShares(
            trajectory_id=tid,
            incumbent_correct=sum(1 for a in incumbent[tid] if is_correct(labels[tid], a)),
            incumbent_total=len(incumbent[tid]),
            candidate_correct=sum(1 for a in candidate[tid] if is_correct(labels[tid], a)),
            candidate_total=len(candidate[tid]),
            rejudged=tid in rejudged,
        )
        if share.rejudged or share.difference:
            items.append(share)
    result = adaptive_test([item.difference for item in items], seed=seed)
    gain = float(sum((item.difference for item in items), Fraction(0)))
    significant = result.below(exact_fraction(level))
    adaptive_keep = kappa_ok and fpr_ok and significant
    test = AdaptiveTest(
        first_pass=first_pass,
        rejudge=loop.rejudge,
        alpha=level,
        statistic=gain,
        p_value=result.p_value,
        seed=seed,
        draws=result.draws,
        mcnemar_p=base.p_value,
        items=items,
    )
    if not policy_for(loop).rejudges:  # decided on the first pass: the adaptive rule's outcome is shown only
        return base.model_copy(
            update={
                "adaptive_keep": adaptive_keep,
                "test": test,
                "majority_literal_keep": kappa_ok and fpr_ok,
            }
        )

    kappa_part, fpr_part = _rates(counts_i, counts_c)
    unmet: list[str] = []
    if not kappa_ok:
        unmet.append(
            "kappa did not rise" + (f" by more than {loop.min_kappa_delta:g}" if loop.min_kappa_delta else "")
        )
    if not fpr_ok:
        unmet.append("FPR rose" + (f" by more than {loop.fpr_tolerance:g}" if loop.fpr_tolerance else ""))
    if kappa_ok and fpr_ok and not significant:
        unmet.append("the gain is not significant")
    n_re = len(rejudged)
    rejudge_part = (
        f"re-judged {n_re} item(s) {loop.rejudge} more time(s) under each prompt, "
        if n_re
        else "no item to re-judge, "
    )
    why = Reason(
        rule="adaptive",
        kept=adaptive_keep,
        evidence=(
            f"{kappa_part}, {fpr_part} (majority over all judgements), {rejudge_part}"
            f"gain {gain:+.2f} items, sign-flip p={p_text(result.p_value)} "
            f"{'<' if significant else '≥'} {level:.3g}"
        ),
        unmet=() if adaptive_keep else tuple(unmet),
        after=(
            f"; the paired policy would have {'kept' if base.paired_keep else 'rolled back'} it"
            if adaptive_keep != base.paired_keep
            else ""
        ),
    )
    return Decision(
        keep=adaptive_keep,
        reason=why.text(),
        why=why,
        literal_keep=base.literal_keep,
        paired_keep=base.paired_keep,
        p_value=result.p_value,
        policy=loop.policy,
        adaptive_keep=adaptive_keep,
        alpha=level,
        test=test,
        majority_literal_keep=kappa_ok and fpr_ok,
    )


def adaptive_stopped_decision(
    labels: Mapping[str, Label],
    candidate_so_far: Judgements,
    incumbent: Judgements,
    loop: LoopSection,
    *,
    alpha: float | None = None,
) -> Decision | None:
    """The rollback `Decision` when no outcome of the judgements still to come (the unjudged items'
    first pass and every re-judging) can make the candidate an adaptive keep; else None.

    ``candidate_so_far``: the candidate's first-pass judgements of the items judged so far;
    ``incumbent``: the incumbent's first-pass judgements of every item. See "Early stopping under
    adaptive" above for why this is exact.
    """
    unjudged_ids(labels, candidate_so_far)
    positives = sum(1 for label in labels.values() if label.is_positive)
    if positives in (0, len(labels)):
        return None
    level = loop.alpha if alpha is None else alpha
    r = loop.rejudge
    diffs: list[Fraction] = []
    best_c: dict[str, bool] = {}
    best_i: dict[str, bool] = {}
    unjudged = disagreeing = fixed = broken = 0
    for tid in sorted(labels):
        label, inc = labels[tid], incumbent[tid]
        i_k, n_i = sum(1 for a in inc if is_correct(label, a)), len(inc)
        inc_right = is_correct(label, majority_answer(inc))
        cand = candidate_so_far.get(tid)
        if cand is not None:
            cand_right = is_correct(label, majority_answer(cand))
            fixed += cand_right and not inc_right
            broken += inc_right and not cand_right
        if cand is None:
            unjudged += 1
            k = n_i
            d = Fraction(k - i_k, k) if r == 0 else max(Fraction(k - i_k, k), Fraction(k + r - i_k, k + r))
            diffs.append(d)
            best_c[tid], best_i[tid] = True, inc_right if r == 0 else False
            continue
        c_k, n_c = sum(1 for a in cand if is_correct(label, a)), len(cand)
        cand_major = majority_answer(cand)
        if r > 0 and outcome(cand_major) != outcome(majority_answer(inc)):
            disagreeing += 1
            diffs.append(Fraction(c_k + r, n_c + r) - Fraction(i_k, n_i + r))
            best_c[tid], best_i[tid] = True, False
        else:
            diffs.append(Fraction(c_k, n_c) - Fraction(i_k, n_i))
            best_c[tid], best_i[tid] = is_correct(label, cand_major), inc_right
    if exact_bits([evidence(d) for d in diffs]) > MAX_EXACT_BITS:
        return None  # the bound's proof needs the exact p-value
    counts_c, counts_i = counts_from_correct(labels, best_c), counts_from_correct(labels, best_i)
    kappa_ok = kappa_clears(counts_c, counts_i, loop.min_kappa_delta)
    fpr_ok = fpr_within(counts_c.fp, counts_i.fp, counts_i.tn + counts_i.fp, loop.fpr_tolerance)
    best = adaptive_test(diffs)
    if kappa_ok and fpr_ok and best.below(exact_fraction(level)):
        return None
    observed = Observed(judged=len(labels) - unjudged, total=len(labels), fixed=fixed, broken=broken)
    return adaptive_stop(kappa_ok, fpr_ok, best.p_value, observed, disagreeing, loop, level)


def adaptive_stop(
    kappa_ok: bool,
    fpr_ok: bool,
    p_value: float,
    observed: Observed,
    disagreeing: int,
    loop: LoopSection,
    level: float,
) -> Decision:
    """The rollback when the adaptive bound fired (`adaptive_stopped_decision`, `EarlyStopper`).
    ``observed``: fixed and broken on first-pass majorities."""
    unmet = [] if kappa_ok else ["kappa could not rise"]
    if not fpr_ok:
        unmet.append("FPR would rise")
    if kappa_ok and fpr_ok:
        unmet.append(f"the gain could not be significant at {level:.3g}")
    unjudged = observed.total - observed.judged
    if unjudged:
        evidence = (
            f"{observed.text()}; even if every judgement still to come went the candidate's way "
            f"(bound: sign-flip p ≥ {p_text(p_value)})"
        )
    else:
        evidence = (
            f"not re-judged ({disagreeing} item(s) disagree): judged all {observed.total} items, "
            f"{observed.fixed} fixed, {observed.broken} broken; even if every re-judgement went the "
            f"candidate's way (bound: sign-flip p ≥ {p_text(p_value)})"
        )
    why = Reason(rule="adaptive_bound", kept=False, evidence=evidence, unmet=tuple(unmet), bound=True)
    return Decision(
        keep=False,
        reason=why.text(),
        why=why,
        literal_keep=False,
        paired_keep=False,
        p_value=p_value,
        policy=loop.policy,
        early_stopped=bool(unjudged),
        adaptive_keep=False,
        alpha=level,
        short_of_significance=kappa_ok and fpr_ok and observed.fixed > observed.broken,
    )
