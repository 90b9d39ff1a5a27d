"""The exact early-stopping bounds of the literal and paired policies (the proof is in
`optimizer.stats.decision`'s docstring), and the rollbacks they give. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from optimizer.models import Label
from optimizer.stats.metrics import (
    Answer,
    FlipTable,
    Metrics,
    flip_table,
    is_correct,
    kappa_fraction,
    score,
)
from optimizer.stats.policies import policy_for
from optimizer.stats.rules import (
    Counts,
    Decision,
    Policy,
    Reason,
    decide,
    fpr_within,
    kappa_clears,
    p_text,
    rate_text,
)
from optimizer.workspace.config import LoopSection


def unjudged_ids(labels: Mapping[str, Label], candidate_so_far: Mapping[str, object]) -> list[str]:
    """The ids of ``labels`` not judged yet; ValueError if the partial results name an id outside them."""
    extra = [tid for tid in candidate_so_far if tid not in labels]
    if extra:
        raise ValueError(f"partial results name {len(extra)} id(s) outside the labels, e.g. {extra[0]!r}")
    return [tid for tid in labels if tid not in candidate_so_far]


def fpr_provably_rose(
    labels: Mapping[str, Label],
    candidate_so_far: Mapping[str, Answer],
    incumbent: Mapping[str, Answer],
    loop: LoopSection,
) -> bool:
    """True when the candidate's FPR already exceeds incumbent FPR + tolerance whatever comes next.

    ``labels``: every item of the split; ``candidate_so_far``: the candidate's answers on the items
    judged so far (an unusable answer on a negative is a false positive); ``incumbent``: the
    incumbent's answers on the full split. Unjudged items are the labelled ids not in
    ``candidate_so_far``; in the best case they are all answered correctly, which adds no false
    positive, so the final FP count is at least today's and both policies must roll back.
    """
    unjudged_ids(labels, candidate_so_far)
    negatives = [tid for tid, label in labels.items() if not label.is_positive]
    if not negatives:
        return False
    fp_so_far = sum(
        1
        for tid in negatives
        if tid in candidate_so_far and not is_correct(labels[tid], candidate_so_far[tid])
    )
    fp_incumbent = sum(1 for tid in negatives if not is_correct(labels[tid], incumbent.get(tid)))
    return not fpr_within(fp_so_far, fp_incumbent, len(negatives), loop.fpr_tolerance)


def best_completion(
    labels: Mapping[str, Label], candidate_so_far: Mapping[str, Answer], incumbent: Mapping[str, Answer]
) -> tuple[Metrics, FlipTable]:
    """The candidate's metrics and flips if every unjudged item were answered correctly."""
    completed = dict(candidate_so_far)
    for tid in unjudged_ids(labels, candidate_so_far):
        label = labels[tid]
        completed[tid] = Answer(success=label.is_positive, mistake_type=label.mistake_type)
    return score(labels, completed), flip_table(labels, incumbent, completed)


def _best_case_decision(
    labels: Mapping[str, Label],
    candidate_so_far: Mapping[str, Answer],
    incumbent: Mapping[str, Answer],
    loop: LoopSection,
    alpha: float | None = None,
) -> Decision | None:
    """`decide` on the dominating completion; None when the dominance argument does not hold."""
    positives = sum(1 for label in labels.values() if label.is_positive)
    if positives in (0, len(labels)):
        return None  # one-class split: kappa is 0 or undefined, not monotone (see module docstring)
    best_metrics, best_flips = best_completion(labels, candidate_so_far, incumbent)
    return decide(score(labels, incumbent), best_metrics, best_flips, loop, alpha=alpha)


def kappa_provably_cannot_beat(
    labels: Mapping[str, Label],
    candidate_so_far: Mapping[str, Answer],
    incumbent: Mapping[str, Answer],
    loop: LoopSection,
    *,
    policy: Policy | None = None,
) -> bool:
    """True when no completion of the unjudged items can be kept under ``policy`` (default: loop's).

    Same inputs as `fpr_provably_rose`. Even if every unjudged item were answered correctly — the
    completion that maximises kappa, minimises FPR and minimises the McNemar p-value at once (see
    the module docstring) — kappa would not clear incumbent + min_kappa_delta (or, for ``paired``,
    the paired test would not pass, or FPR would not stay within tolerance). Exact: it never stops
    a candidate that a full evaluation would keep.
    """
    best = _best_case_decision(labels, candidate_so_far, incumbent, loop)
    if best is None:
        return False
    return not policy_for(policy or loop).bound_keeps(best)


def stopped_decision(
    labels: Mapping[str, Label],
    candidate_so_far: Mapping[str, Answer],
    incumbent: Mapping[str, Answer],
    loop: LoopSection,
    *,
    alpha: float | None = None,
) -> Decision | None:
    """The rollback `Decision` if an early-stopping bound fires for the deciding policy (literal or
    paired; ``alpha`` overrides ``loop.alpha``), else None.

    ``literal_keep``/``paired_keep`` are False (neither keep was established); when the paired
    policy stopped the evaluation while the literal one was still open, the reason says so.
    ``p_value`` is the best case (the smallest p-value any completion could reach); 1.0 when the
    FPR bound fired.
    """
    unjudged = unjudged_ids(labels, candidate_so_far)
    level = loop.alpha if alpha is None else alpha
    negatives = [tid for tid, label in labels.items() if not label.is_positive]
    negatives_left = sum(1 for tid in unjudged if not labels[tid].is_positive)
    if fpr_provably_rose(labels, candidate_so_far, incumbent, loop):
        fp_so_far = sum(
            1
            for tid in negatives
            if tid in candidate_so_far and not is_correct(labels[tid], candidate_so_far[tid])
        )
        fp_inc = sum(1 for tid in negatives if not is_correct(labels[tid], incumbent.get(tid)))
        return fpr_stop(
            fp_so_far, fp_inc, len(negatives), negatives_left, len(candidate_so_far), len(labels), loop, level
        )
    best = _best_case_decision(labels, candidate_so_far, incumbent, loop, alpha)
    if best is None or policy_for(loop).bound_keeps(best):
        return None
    best_metrics, best_flips = best_completion(labels, candidate_so_far, incumbent)
    inc_right = {tid: is_correct(labels[tid], incumbent.get(tid)) for tid in labels}
    cand_right = {tid: is_correct(labels[tid], answer) for tid, answer in candidate_so_far.items()}
    observed = Observed(
        judged=len(candidate_so_far),
        total=len(labels),
        fixed=sum(1 for t, right in cand_right.items() if right and not inc_right[t]),
        broken=sum(1 for t, right in cand_right.items() if inc_right[t] and not right),
    )
    return best_case_stop(
        best,
        Counts.of(score(labels, incumbent)),
        Counts.of(best_metrics),
        best_flips.improved,
        best_flips.worsened,
        observed,
        loop,
        level,
    )


class Observed(NamedTuple):
    """What an early-stopped evaluation saw before the bound fired: items judged of the split's, and
    among them the items the candidate newly got right (``fixed``) and newly got wrong (``broken``)."""

    judged: int
    total: int
    fixed: int
    broken: int

    def text(self) -> str:
        return (
            f"stopped early after {self.judged}/{self.total} items: {self.fixed} fixed, {self.broken} broken"
        )


def fpr_stop(
    fp_so_far: int,
    fp_inc: int,
    n_neg: int,
    negatives_left: int,
    judged: int,
    n_items: int,
    loop: LoopSection,
    level: float,
) -> Decision:
    """The rollback when the FPR bound fired (`stopped_decision`, `EarlyStopper`)."""
    why = Reason(
        rule="fpr_bound",
        kept=False,
        evidence=(
            f"stopped early after {judged}/{n_items} items: {fp_so_far} false positive(s) already, so "
            f"FPR ≥ {fp_so_far / n_neg:.3f} > {fp_inc / n_neg:.3f}"
            + (f" + {loop.fpr_tolerance:g}" if loop.fpr_tolerance else "")
            + f" whatever the {negatives_left} of {n_neg} negatives still unjudged get"
        ),
        unmet=("FPR rose",),
    )
    return Decision(
        keep=False,
        reason=why.text(),
        why=why,
        literal_keep=False,
        paired_keep=False,
        p_value=1.0,
        policy=loop.policy,
        early_stopped=True,
        alpha=level,
    )


def best_case_stop(
    best: Decision,
    incumbent: Counts,
    completed: Counts,
    improved: int,
    worsened: int,
    observed: Observed,
    loop: LoopSection,
    level: float,
) -> Decision:
    """The rollback when even the best completion (``best``: its counts ``completed``, its flips) is
    rolled back (`stopped_decision`, `EarlyStopper`). What was observed comes first; the best case's
    figures are labelled as the bound they are."""
    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*completed)
    n_neg = incumbent.tn + incumbent.fp
    bound = [f"kappa ≤ {rate_text(k_c, 3)} vs {rate_text(k_i, 3)}"]
    if n_neg:
        bound.append(f"FPR ≥ {completed.fp / n_neg:.3f} vs {incumbent.fp / n_neg:.3f}")
    bound += [f"flips +{improved}/−{worsened}", f"p ≥ {p_text(best.p_value)}"]
    unmet: list[str] = []
    if not kappa_clears(completed, incumbent, loop.min_kappa_delta):
        unmet.append(
            "kappa could not rise"
            + (f" by more than {loop.min_kappa_delta:g}" if loop.min_kappa_delta else "")
        )
    if n_neg and not fpr_within(completed.fp, incumbent.fp, n_neg, loop.fpr_tolerance):
        unmet.append("FPR would rise")
    if not unmet:
        unmet.append(f"the gain could not be significant at {level:.3g}")
    why = Reason(
        rule="kappa_bound",
        kept=False,
        evidence=f"{observed.text()}; even if every remaining item went its way (bound: {', '.join(bound)})",
        unmet=tuple(unmet),
        after=policy_for(loop).open_note(best),
        bound=True,
    )
    return Decision(
        keep=False,
        reason=why.text(),
        why=why,
        literal_keep=False,
        paired_keep=False,
        p_value=best.p_value,
        policy=loop.policy,
        early_stopped=True,
        alpha=level,
    )
