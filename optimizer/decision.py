"""Keep or roll back a candidate: the two policies and the exact early-stopping bounds. Pure.

Policies (both always computed; ``[loop] policy`` picks the one that decides):

- ``literal``: keep iff kappa_c > kappa_i + min_kappa_delta and FPR_c ≤ FPR_i + fpr_tolerance.
- ``paired``: literal, and the exact one-sided McNemar p-value on the discordant items < alpha.

Ties are rolled back (the kappa comparison is strict). Comparisons are done on exact fractions
computed from the confusion counts, and the config's float thresholds are read as the decimals
they were written as, so a tie is a tie and no decision depends on float rounding. A kappa that
is undefined (0/0, only on one-class splits) can never be shown to improve: rolled back. With no
negatives the FPR guard is vacuous.

Early stopping. The loop evaluates negatives first, then positives. Write the candidate's final
counts as (tp, tn) with the class sizes P, N fixed. With P, N > 0,

    kappa = 2(N·tp + P·tn − P·N) / ((N − P)(tp − tn) + N² + P²),

whose partial derivatives are 2(N+P)(N² − (N−P)·tn)/D² ≥ 2(N+P)·N·min(N, P)/D² > 0 for tp and
the mirror image for tn (as tn ≤ N and tp ≤ P) — kappa strictly increases with every additional
correct answer. FP can only fall, and the McNemar tail P(Bin(i+w, ½) ≥ i) falls when i rises or w
falls; an unjudged item answered correctly never adds to w and may add to i. So the completion in
which every unjudged item is answered correctly dominates every other completion on all three
criteria at once: if it is rolled back, every completion is. `kappa_provably_cannot_beat` decides
exactly that completion with `decide` itself, so the bound and the full decision cannot disagree.
On a one-class split kappa is 0 or undefined and the argument fails; the kappa bound then never
stops (the FPR bound, which only counts false positives, still holds).
Nothing here assumes an order: the bounds hold whatever subset of items has completed, so
concurrent evaluation may finish items out of order.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from optimizer.config import LoopSection
from optimizer.metrics import (
    Answer,
    FlipTable,
    Metrics,
    flip_table,
    is_correct,
    kappa_fraction,
    mcnemar_exact_one_sided,
    score,
)
from optimizer.models import Label

Policy = Literal["paired", "literal"]


class Counts(NamedTuple):
    """Confusion counts of one verdict set."""

    tp: int
    fn: int
    tn: int
    fp: int

    @classmethod
    def of(cls, m: Metrics) -> Counts:
        return cls(m.tp, m.fn, m.tn, m.fp)


class Decision(BaseModel):
    """The outcome for one candidate under both policies, and the one that decided."""

    model_config = ConfigDict(frozen=True)

    keep: bool
    reason: str
    literal_keep: bool
    paired_keep: bool
    p_value: float
    policy: Policy
    # True when the candidate was stopped by an early-stopping bound; its metrics are partial.
    early_stopped: bool = False


def _exact(value: float) -> Fraction:
    """A config threshold as the decimal the user wrote (0.1 means 1/10, not its binary neighbour)."""
    return Fraction(repr(float(value)))


def _kappa_clears(candidate: Counts, incumbent: Counts, min_kappa_delta: float) -> bool:
    k_c, k_i = kappa_fraction(*candidate), kappa_fraction(*incumbent)
    if k_c is None or k_i is None:
        return False
    return k_c > k_i + _exact(min_kappa_delta)


def _fpr_within(candidate_fp: int, incumbent_fp: int, negatives: int, fpr_tolerance: float) -> bool:
    if negatives == 0:
        return True
    return Fraction(candidate_fp, negatives) <= Fraction(incumbent_fp, negatives) + _exact(fpr_tolerance)


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _fmt_rate(x: Fraction | None, digits: int) -> str:
    return "undefined" if x is None else f"{float(x):.{digits}f}"


def decide_counts(
    incumbent: Counts, candidate: Counts, improved: int, worsened: int, loop: LoopSection
) -> Decision:
    """Apply both policies to confusion counts and the flip counts (see module docstring)."""
    P, N = incumbent.tp + incumbent.fn, incumbent.tn + incumbent.fp
    if (candidate.tp + candidate.fn, candidate.tn + candidate.fp) != (P, N):
        raise ValueError(
            f"incumbent and candidate were scored on different items: {incumbent} vs {candidate}"
        )
    kappa_ok = _kappa_clears(candidate, incumbent, loop.min_kappa_delta)
    fpr_ok = _fpr_within(candidate.fp, incumbent.fp, N, loop.fpr_tolerance)
    p_value = mcnemar_exact_one_sided(improved, worsened)
    significant = p_value < loop.alpha
    literal_keep = kappa_ok and fpr_ok
    paired_keep = literal_keep and significant
    keep = paired_keep if loop.policy == "paired" else literal_keep

    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*candidate)
    if k_i is None or k_c is None:
        kappa_part = f"kappa {_fmt_rate(k_i, 3)} → {_fmt_rate(k_c, 3)}"
    else:
        kappa_part = f"kappa {float(k_i):.3f} → {float(k_c):.3f} ({float(k_c - k_i):+.3f})"
    if N:
        fpr_part = f"FPR {incumbent.fp / N:.3f} → {candidate.fp / N:.3f}"
    else:
        fpr_part = "FPR undefined (no negatives)"
    p_part = f"p={_fmt_p(p_value)} {'<' if significant else '≥'} {loop.alpha:g}"
    why: list[str] = []
    if not kappa_ok:
        if k_i is None or k_c is None:
            why.append("kappa is undefined on this split")
        elif loop.min_kappa_delta:
            why.append(f"kappa did not rise by more than {loop.min_kappa_delta:g}")
        else:
            why.append("kappa did not rise")
    if not fpr_ok:
        why.append("FPR rose" if not loop.fpr_tolerance else f"FPR rose by more than {loop.fpr_tolerance:g}")
    if loop.policy == "paired" and literal_keep and not significant:
        why.append("the gain is not significant")
    outcome = "kept" if keep else "rolled back (" + "; ".join(why) + ")"
    if loop.policy == "paired" and literal_keep and not paired_keep:
        outcome += "; the literal policy would have kept it"
    if loop.policy == "literal" and literal_keep and not paired_keep:
        outcome += "; the paired policy would have rolled it back"
    reason = f"{kappa_part}, {fpr_part}, flips +{improved}/−{worsened}, {p_part}: {outcome}"
    return Decision(
        keep=keep,
        reason=reason,
        literal_keep=literal_keep,
        paired_keep=paired_keep,
        p_value=p_value,
        policy=loop.policy,
    )


def min_fixes_to_keep(broken: int, alpha: float) -> int:
    """The fewest items a candidate must newly get right, while newly getting ``broken`` wrong, for
    the paired policy's exact McNemar p-value to fall below ``alpha`` (the literal rule aside)."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    fixed = 0
    while mcnemar_exact_one_sided(fixed, broken) >= alpha:
        fixed += 1
    return fixed


def detectable_gain_line(n_items: int, alpha: float) -> str:
    """One line on what gain the paired policy can see on ``n_items`` items (said when nothing is kept)."""
    clean, one, two = (min_fixes_to_keep(w, alpha) for w in (0, 1, 2))
    return (f"on {n_items} items the paired policy (alpha {alpha:g}) keeps a candidate only if it newly gets "
            f"at least {clean} items right while breaking none ({one} if it breaks one, {two} if two): "
            f"{clean / n_items:.0%} of the split at the least; a smaller real gain cannot be told from the "
            "judge's own noise here")


def decide(incumbent: Metrics, candidate: Metrics, flips: FlipTable, loop: LoopSection) -> Decision:
    """Keep or roll back ``candidate`` against ``incumbent`` (same items); both policies are computed."""
    return decide_counts(Counts.of(incumbent), Counts.of(candidate), flips.improved, flips.worsened, loop)


# --- early stopping -----------------------------------------------------------------------------


def _unjudged(labels: Mapping[str, Label], candidate_so_far: Mapping[str, Answer]) -> list[str]:
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
    _unjudged(labels, candidate_so_far)
    negatives = [tid for tid, label in labels.items() if not label.is_positive]
    if not negatives:
        return False
    fp_so_far = sum(
        1
        for tid in negatives
        if tid in candidate_so_far and not is_correct(labels[tid], candidate_so_far[tid])
    )
    fp_incumbent = sum(1 for tid in negatives if not is_correct(labels[tid], incumbent.get(tid)))
    return not _fpr_within(fp_so_far, fp_incumbent, len(negatives), loop.fpr_tolerance)


def best_completion(
    labels: Mapping[str, Label], candidate_so_far: Mapping[str, Answer], incumbent: Mapping[str, Answer]
) -> tuple[Metrics, FlipTable]:
    """The candidate's metrics and flips if every unjudged item were answered correctly."""
    completed = dict(candidate_so_far)
    for tid in _unjudged(labels, candidate_so_far):
        label = labels[tid]
        completed[tid] = Answer(success=label.is_positive, mistake_type=label.mistake_type)
    return score(labels, completed), flip_table(labels, incumbent, completed)


def _best_case_decision(
    labels: Mapping[str, Label],
    candidate_so_far: Mapping[str, Answer],
    incumbent: Mapping[str, Answer],
    loop: LoopSection,
) -> Decision | None:
    """`decide` on the dominating completion; None when the dominance argument does not hold."""
    positives = sum(1 for label in labels.values() if label.is_positive)
    if positives in (0, len(labels)):
        return None  # one-class split: kappa is 0 or undefined, not monotone (see module docstring)
    best_metrics, best_flips = best_completion(labels, candidate_so_far, incumbent)
    return decide(score(labels, incumbent), best_metrics, best_flips, loop)


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
    chosen = policy or loop.policy
    return not (best.paired_keep if chosen == "paired" else best.literal_keep)


def stopped_decision(
    labels: Mapping[str, Label],
    candidate_so_far: Mapping[str, Answer],
    incumbent: Mapping[str, Answer],
    loop: LoopSection,
) -> Decision | None:
    """The rollback `Decision` if an early-stopping bound fires for the deciding policy, else None.

    ``literal_keep``/``paired_keep`` are False (neither keep was established); when the paired
    policy stopped the evaluation while the literal one was still open, the reason says so.
    ``p_value`` is the best case (the smallest p-value any completion could reach); 1.0 when the
    FPR bound fired.
    """
    unjudged = _unjudged(labels, candidate_so_far)
    negatives = [tid for tid, label in labels.items() if not label.is_positive]
    negatives_left = sum(1 for tid in unjudged if not labels[tid].is_positive)
    if fpr_provably_rose(labels, candidate_so_far, incumbent, loop):
        fp_so_far = sum(
            1
            for tid in negatives
            if tid in candidate_so_far and not is_correct(labels[tid], candidate_so_far[tid])
        )
        fp_inc = sum(1 for tid in negatives if not is_correct(labels[tid], incumbent.get(tid)))
        n_neg = len(negatives)
        reason = (
            f"stopped early with {negatives_left} of {n_neg} negatives unjudged: {fp_so_far} false positives "
            f"already give FPR ≥ {fp_so_far / n_neg:.3f} > {fp_inc / n_neg:.3f}"
            + (f" + {loop.fpr_tolerance:g}" if loop.fpr_tolerance else "")
            + ": rolled back (FPR rose)"
        )
        return Decision(
            keep=False,
            reason=reason,
            literal_keep=False,
            paired_keep=False,
            p_value=1.0,
            policy=loop.policy,
            early_stopped=True,
        )
    best = _best_case_decision(labels, candidate_so_far, incumbent, loop)
    if best is None or (best.paired_keep if loop.policy == "paired" else best.literal_keep):
        return None
    best_reason, open_note = best.reason, ""
    if loop.policy == "paired" and best.literal_keep:
        # Said once: in the best case the literal policy keeps it, so its outcome was still open.
        best_reason = best_reason.replace("; the literal policy would have kept it", "")
        open_note = "; the literal policy's outcome was still open when evaluation stopped"
    reason = (
        f"stopped early with {len(unjudged)} of {len(labels)} items unjudged; even if all were answered "
        f"correctly: {best_reason}{open_note}"
    )
    return Decision(
        keep=False,
        reason=reason,
        literal_keep=False,
        paired_keep=False,
        p_value=best.p_value,
        policy=loop.policy,
        early_stopped=True,
    )
