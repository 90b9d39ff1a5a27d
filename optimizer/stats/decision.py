"""Keep or roll back a candidate: the three policies and the exact early-stopping bounds. Pure.

Policies (all computed; ``[loop] policy`` picks the one that decides, and its object in
`optimizer.stats.policies` says which flag, bound and words are its own — nothing here tests its name):

- ``literal``: keep iff kappa_c > kappa_i + min_kappa_delta and FPR_c ≤ FPR_i + fpr_tolerance.
- ``paired``: literal, and the exact one-sided McNemar p-value on the discordant items < alpha.
- ``adaptive`` (the default; see "The adaptive policy" below): the items whose verdicts differ
  after the first pass are judged ``rejudge`` more times under each prompt; keep iff the literal
  rule holds on per-item majorities over all judgements and the one-sided sign-flip test on the
  per-item differences in the share of correct judgements gives p < alpha.

The literal and paired rules read the first pass (``replicates`` judgements per item, majority).

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

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from optimizer import fmt
from optimizer.models import Label
from optimizer.stats.metrics import (
    Answer,
    FlipTable,
    Metrics,
    flip_table,
    is_correct,
    kappa_fraction,
    majority_answer,
    mcnemar_exact_one_sided,
    outcome,
    score,
)
from optimizer.stats.policies import FirstPass, policy_for
from optimizer.stats.signflip import (
    DEFAULT_DRAWS,
    MAX_EXACT_BITS,
    SignFlipResult,
    exact_bits,
    exact_bits_grouped,
    sign_flip_test,
    sign_flip_test_grouped,
    sign_flip_upper_bound,
)
from optimizer.vocab import PolicyName
from optimizer.workspace.config import LoopSection

# The decision rules by name (`optimizer.vocab`).
Policy = PolicyName


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
    # The adaptive rule's outcome (None when it was not evaluated, e.g. an early stop under paired).
    adaptive_keep: bool | None = None
    # The level the deciding test was run at (loop.alpha, or the online-FDR level of this candidate).
    alpha: float | None = None
    test: AdaptiveTest | None = None
    # "cheaper" when kept as cheaper-not-worse ([loop] cheaper_margin_items), not as an improvement.
    keep_kind: str | None = None


def exact_fraction(value: float) -> Fraction:
    """A config threshold as the decimal the user wrote (0.1 means 1/10, not its binary neighbour)."""
    return Fraction(repr(float(value)))


def kappa_clears(candidate: Counts, incumbent: Counts, min_kappa_delta: float) -> bool:
    k_c, k_i = kappa_fraction(*candidate), kappa_fraction(*incumbent)
    if k_c is None or k_i is None:
        return False
    return k_c > k_i + exact_fraction(min_kappa_delta)


def fpr_within(candidate_fp: int, incumbent_fp: int, negatives: int, fpr_tolerance: float) -> bool:
    if negatives == 0:
        return True
    return Fraction(candidate_fp, negatives) <= Fraction(incumbent_fp, negatives) + exact_fraction(fpr_tolerance)


def _fmt_p(p: float) -> str:
    return fmt.p_value(p, 3)


def _fmt_rate(x: Fraction | None, digits: int) -> str:
    return fmt.num(None if x is None else float(x), digits, missing="undefined")


def decide_counts(
    incumbent: Counts, candidate: Counts, improved: int, worsened: int, loop: LoopSection,
    *, alpha: float | None = None,
) -> Decision:
    """Apply the literal and paired policies to confusion counts and the flip counts (see module
    docstring); ``alpha`` overrides ``loop.alpha`` (online FDR). Under ``adaptive`` the paired
    outcome is the one reported as ``keep`` here; `decide_adaptive` decides."""
    level = loop.alpha if alpha is None else alpha
    P, N = incumbent.tp + incumbent.fn, incumbent.tn + incumbent.fp
    if (candidate.tp + candidate.fn, candidate.tn + candidate.fp) != (P, N):
        raise ValueError(
            f"incumbent and candidate were scored on different items: {incumbent} vs {candidate}"
        )
    kappa_ok = kappa_clears(candidate, incumbent, loop.min_kappa_delta)
    fpr_ok = fpr_within(candidate.fp, incumbent.fp, N, loop.fpr_tolerance)
    p_value = mcnemar_exact_one_sided(improved, worsened)
    significant = p_value < level
    literal_keep = kappa_ok and fpr_ok
    paired_keep = literal_keep and significant
    policy = policy_for(loop)
    flags = FirstPass(literal_keep, paired_keep)
    keep = policy.keeps(flags)

    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*candidate)
    if k_i is None or k_c is None:
        kappa_part = f"kappa {_fmt_rate(k_i, 3)} → {_fmt_rate(k_c, 3)}"
    else:
        kappa_part = f"kappa {float(k_i):.3f} → {float(k_c):.3f} ({float(k_c - k_i):+.3f})"
    fpr_part = f"FPR {incumbent.fp / N:.3f} → {candidate.fp / N:.3f}" if N else "FPR undefined (no negatives)"
    p_part = f"p={_fmt_p(p_value)} {'<' if significant else '≥'} {level:.3g}"
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
    if policy.tests_at_alpha and literal_keep and not significant:
        why.append("the gain is not significant")
    outcome = "kept" if keep else "rolled back (" + "; ".join(why) + ")"
    outcome += policy.other_policy_note(flags)
    reason = f"{kappa_part}, {fpr_part}, flips +{improved}/−{worsened}, {p_part}: {outcome}"
    return Decision(
        keep=keep,
        reason=reason,
        literal_keep=literal_keep,
        paired_keep=paired_keep,
        p_value=p_value,
        policy=loop.policy,
        alpha=level,
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


def detectable_gain_line(n_items: int, alpha: float, policy: Policy = "paired") -> str:
    """One line on what gain the paired (or adaptive) policy can see on ``n_items`` items (said when
    nothing is kept). Under ``adaptive`` an item counts in full only when every one of its judgements
    went the candidate's way (d = 1); the sign-flip tail of such items is the McNemar tail."""
    clean, one, two = (min_fixes_to_keep(w, alpha) for w in (0, 1, 2))
    items = policy_for(policy).items_right
    return (f"on {n_items} items the {policy} policy (alpha {alpha:g}) keeps a candidate only if it newly gets "
            f"at least {clean} {items} while breaking none ({one} if it breaks one, {two} if two): "
            f"{clean / n_items:.0%} of the split at the least; a smaller real gain cannot be told from the "
            "judge's own noise here")


def decide(
    incumbent: Metrics, candidate: Metrics, flips: FlipTable, loop: LoopSection, *, alpha: float | None = None
) -> Decision:
    """Keep or roll back ``candidate`` against ``incumbent`` (same items) under the literal and
    paired policies (both computed)."""
    return decide_counts(Counts.of(incumbent), Counts.of(candidate), flips.improved, flips.worsened, loop,
                         alpha=alpha)


# --- early stopping -----------------------------------------------------------------------------


def _unjudged(labels: Mapping[str, Label], candidate_so_far: Mapping[str, object]) -> list[str]:
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
    return not fpr_within(fp_so_far, fp_incumbent, len(negatives), loop.fpr_tolerance)


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
    unjudged = _unjudged(labels, candidate_so_far)
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
        return _fpr_stop(fp_so_far, fp_inc, len(negatives), negatives_left, len(candidate_so_far), len(labels),
                         loop, level)
    best = _best_case_decision(labels, candidate_so_far, incumbent, loop, alpha)
    if best is None or policy_for(loop).bound_keeps(best):
        return None
    best_metrics, best_flips = best_completion(labels, candidate_so_far, incumbent)
    inc_right = {tid: is_correct(labels[tid], incumbent.get(tid)) for tid in labels}
    cand_right = {tid: is_correct(labels[tid], answer) for tid, answer in candidate_so_far.items()}
    observed = Observed(judged=len(candidate_so_far), total=len(labels),
                        fixed=sum(1 for t, right in cand_right.items() if right and not inc_right[t]),
                        broken=sum(1 for t, right in cand_right.items() if inc_right[t] and not right))
    return _best_case_stop(best, Counts.of(score(labels, incumbent)), Counts.of(best_metrics), best_flips.improved,
                           best_flips.worsened, observed, loop, level)


class Observed(NamedTuple):
    """What an early-stopped evaluation saw before the bound fired: items judged of the split's, and
    among them the items the candidate newly got right (``fixed``) and newly got wrong (``broken``)."""

    judged: int
    total: int
    fixed: int
    broken: int

    def text(self) -> str:
        return f"stopped early after {self.judged}/{self.total} items: {self.fixed} fixed, {self.broken} broken"


def _fpr_stop(fp_so_far: int, fp_inc: int, n_neg: int, negatives_left: int, judged: int, n_items: int,
              loop: LoopSection, level: float) -> Decision:
    """The rollback when the FPR bound fired (`stopped_decision`, `EarlyStopper`)."""
    reason = (
        f"stopped early after {judged}/{n_items} items: {fp_so_far} false positive(s) already, so "
        f"FPR ≥ {fp_so_far / n_neg:.3f} > {fp_inc / n_neg:.3f}"
        + (f" + {loop.fpr_tolerance:g}" if loop.fpr_tolerance else "")
        + f" whatever the {negatives_left} of {n_neg} negatives still unjudged get: rolled back (FPR rose)"
    )
    return Decision(
        keep=False,
        reason=reason,
        literal_keep=False,
        paired_keep=False,
        p_value=1.0,
        policy=loop.policy,
        early_stopped=True,
        alpha=level,
    )


def _best_case_stop(best: Decision, incumbent: Counts, completed: Counts, improved: int, worsened: int,
                    observed: Observed, loop: LoopSection, level: float) -> Decision:
    """The rollback when even the best completion (``best``: its counts ``completed``, its flips) is
    rolled back (`stopped_decision`, `EarlyStopper`). What was observed comes first; the best case's
    figures are labelled as the bound they are."""
    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*completed)
    n_neg = incumbent.tn + incumbent.fp
    bound = [f"kappa ≤ {_fmt_rate(k_c, 3)} vs {_fmt_rate(k_i, 3)}"]
    if n_neg:
        bound.append(f"FPR ≥ {completed.fp / n_neg:.3f} vs {incumbent.fp / n_neg:.3f}")
    bound += [f"flips +{improved}/−{worsened}", f"p ≥ {_fmt_p(best.p_value)}"]
    why: list[str] = []
    if not kappa_clears(completed, incumbent, loop.min_kappa_delta):
        why.append("kappa could not rise" + (f" by more than {loop.min_kappa_delta:g}" if loop.min_kappa_delta else ""))
    if n_neg and not fpr_within(completed.fp, incumbent.fp, n_neg, loop.fpr_tolerance):
        why.append("FPR would rise")
    if not why:
        why.append(f"the gain could not be significant at {level:.3g}")
    open_note = policy_for(loop).open_note(best)
    reason = (
        f"{observed.text()}; even if every remaining item went its way (bound: {', '.join(bound)}) "
        f"it could not be kept ({'; '.join(why)}){open_note}"
    )
    return Decision(
        keep=False,
        reason=reason,
        literal_keep=False,
        paired_keep=False,
        p_value=best.p_value,
        policy=loop.policy,
        early_stopped=True,
        alpha=level,
    )


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


class ItemShares(BaseModel):
    """One item's judgements in an adaptive decision: correct / total under each prompt."""

    model_config = ConfigDict(frozen=True)

    trajectory_id: str
    incumbent_correct: int
    incumbent_total: int
    candidate_correct: int
    candidate_total: int
    rejudged: bool = False

    @property
    def difference(self) -> Fraction:
        """Candidate share of correct judgements minus the incumbent's (in items, −1 … 1)."""
        return Fraction(self.candidate_correct, self.candidate_total) - Fraction(
            self.incumbent_correct, self.incumbent_total
        )

    def draws(self) -> str:
        """How it reads in a report: "1/3 → 3/3" (incumbent → candidate)."""
        return (f"{self.incumbent_correct}/{self.incumbent_total} → "
                f"{self.candidate_correct}/{self.candidate_total}")


class AdaptiveTest(BaseModel):
    """What an adaptive decision tested, stored with it so it can be shown and replayed.

    ``items``: every item with a non-zero difference or that was re-judged, by id; the rest have
    d = 0. ``statistic``: Σ d_i, the candidate's gain in items. ``draws`` 0 means the p-value was
    enumerated exactly; otherwise it is Monte Carlo from ``seed``.
    """

    model_config = ConfigDict(frozen=True)

    first_pass: int
    rejudge: int
    alpha: float
    statistic: float
    p_value: float
    seed: int
    draws: int
    mcnemar_p: float
    items: list[ItemShares]

    @property
    def rejudged(self) -> list[ItemShares]:
        return [item for item in self.items if item.rejudged]

    def differences(self) -> list[Fraction]:
        return [item.difference for item in self.items]

    def replay(self) -> SignFlipResult:
        """The test again from what was stored: the same p-value, exact or from the same draws."""
        if self.draws == 0:
            return adaptive_test(self.differences(), seed=self.seed)
        return adaptive_test(self.differences(), seed=self.seed, draws=self.draws, max_exact_bits=-1)


Decision.model_rebuild()  # its ``test`` field names AdaptiveTest, defined above


def evidence(difference: Fraction) -> Fraction:
    """An item's score in the adaptive test: its difference weighted by its own size, d·|d| (odd and
    increasing in d, so the sign-flip test stays exact and the p-value monotone in every d)."""
    return difference * abs(difference)


def adaptive_test(
    differences: Sequence[Fraction], *, seed: int = 0, draws: int = DEFAULT_DRAWS, max_exact_bits: int = MAX_EXACT_BITS
) -> SignFlipResult:
    """The adaptive policy's one-sided sign-flip test on per-item differences (statistic Σ d·|d|)."""
    return sign_flip_test([evidence(d) for d in differences], seed=seed, draws=draws, max_exact_bits=max_exact_bits)

Judgements = Mapping[str, Sequence[Answer]]


def disagreements(incumbent: Mapping[str, Answer], candidate: Mapping[str, Answer]) -> list[str]:
    """Ids (in ``candidate``'s order) whose verdicts differ: True vs False, or usable vs not.
    Label-free: the same rule picks the items to re-judge whoever runs it."""
    return [tid for tid, answer in candidate.items()
            if tid in incumbent and outcome(answer) != outcome(incumbent[tid])]


def _counts_from_correct(labels: Mapping[str, Label], correct: Mapping[str, bool]) -> Counts:
    tp = sum(1 for t, lab in labels.items() if lab.is_positive and correct[t])
    fn = sum(1 for t, lab in labels.items() if lab.is_positive and not correct[t])
    tn = sum(1 for t, lab in labels.items() if not lab.is_positive and correct[t])
    return Counts(tp, fn, tn, len(labels) - tp - fn - tn)


def _rates(incumbent: Counts, candidate: Counts) -> tuple[str, str]:
    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*candidate)
    if k_i is None or k_c is None:
        kappa_part = f"kappa {_fmt_rate(k_i, 3)} → {_fmt_rate(k_c, 3)}"
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
    base = decide(score(labels, first_i), score(labels, first_c), flip_table(labels, first_i, first_c), loop,
                  alpha=level)

    all_i = {t: is_correct(labels[t], majority_answer(incumbent[t])) for t in labels}
    all_c = {t: is_correct(labels[t], majority_answer(candidate[t])) for t in labels}
    counts_i, counts_c = _counts_from_correct(labels, all_i), _counts_from_correct(labels, all_c)
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
        first_pass=first_pass, rejudge=loop.rejudge, alpha=level, statistic=gain,
        p_value=result.p_value, seed=seed, draws=result.draws, mcnemar_p=base.p_value, items=items,
    )
    if not policy_for(loop).rejudges:  # decided on the first pass: the adaptive rule's outcome is shown only
        return base.model_copy(update={"adaptive_keep": adaptive_keep, "test": test})

    kappa_part, fpr_part = _rates(counts_i, counts_c)
    why: list[str] = []
    if not kappa_ok:
        why.append("kappa did not rise" + (f" by more than {loop.min_kappa_delta:g}" if loop.min_kappa_delta else ""))
    if not fpr_ok:
        why.append("FPR rose" + (f" by more than {loop.fpr_tolerance:g}" if loop.fpr_tolerance else ""))
    if kappa_ok and fpr_ok and not significant:
        why.append("the gain is not significant")
    outcome_text = "kept" if adaptive_keep else "rolled back (" + "; ".join(why) + ")"
    if adaptive_keep != base.paired_keep:
        outcome_text += f"; the paired policy would have {'kept' if base.paired_keep else 'rolled back'} it"
    n_re = len(rejudged)
    rejudge_part = (f"re-judged {n_re} item(s) {loop.rejudge} more time(s) under each prompt, "
                    if n_re else "no item to re-judge, ")
    reason = (f"{kappa_part}, {fpr_part} (majority over all judgements), {rejudge_part}"
              f"gain {gain:+.2f} items, sign-flip p={_fmt_p(result.p_value)} "
              f"{'<' if significant else '≥'} {level:.3g}: {outcome_text}")
    return Decision(
        keep=adaptive_keep, reason=reason, literal_keep=base.literal_keep, paired_keep=base.paired_keep,
        p_value=result.p_value, policy=loop.policy, adaptive_keep=adaptive_keep, alpha=level, test=test,
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
    _unjudged(labels, candidate_so_far)
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
    counts_c, counts_i = _counts_from_correct(labels, best_c), _counts_from_correct(labels, best_i)
    kappa_ok = kappa_clears(counts_c, counts_i, loop.min_kappa_delta)
    fpr_ok = fpr_within(counts_c.fp, counts_i.fp, counts_i.tn + counts_i.fp, loop.fpr_tolerance)
    best = adaptive_test(diffs)
    if kappa_ok and fpr_ok and best.below(exact_fraction(level)):
        return None
    observed = Observed(judged=len(labels) - unjudged, total=len(labels), fixed=fixed, broken=broken)
    return _adaptive_stop(kappa_ok, fpr_ok, best.p_value, observed, disagreeing, loop, level)


def _adaptive_stop(kappa_ok: bool, fpr_ok: bool, p_value: float, observed: Observed, disagreeing: int,
                   loop: LoopSection, level: float) -> Decision:
    """The rollback when the adaptive bound fired (`adaptive_stopped_decision`, `EarlyStopper`).
    ``observed``: fixed and broken on first-pass majorities."""
    why = [] if kappa_ok else ["kappa could not rise"]
    if not fpr_ok:
        why.append("FPR would rise")
    if kappa_ok and fpr_ok:
        why.append(f"the gain could not be significant at {level:.3g}")
    unjudged = observed.total - observed.judged
    if unjudged:
        reason = (f"{observed.text()}; even if every judgement still to come went the candidate's way "
                  f"(bound: sign-flip p ≥ {_fmt_p(p_value)}) it could not be kept ({'; '.join(why)})")
    else:
        reason = (f"not re-judged ({disagreeing} item(s) disagree): judged all {observed.total} items, "
                  f"{observed.fixed} fixed, {observed.broken} broken; even if every re-judgement went the "
                  f"candidate's way (bound: sign-flip p ≥ {_fmt_p(p_value)}) it could not be kept "
                  f"({'; '.join(why)})")
    return Decision(
        keep=False, reason=reason, literal_keep=False, paired_keep=False, p_value=p_value,
        policy=loop.policy, early_stopped=bool(unjudged), adaptive_keep=False, alpha=level,
    )


# --- the bounds, incrementally -------------------------------------------------------------------
#
# The loop asks after every judged item; recomputing a bound over everything judged so far made
# one candidate's checks quadratic in the split (~200 s at 2,000 items). `EarlyStopper` keeps what
# the bounds read — per-class counts, flip counts, and for the adaptive bound how many items have
# each difference d·|d| — and updates them from the one item that changed. A paired check is then
# `decide_counts` on those counts (its McNemar tail has one term per item newly wrong). An adaptive
# check costs O(distinct differences), a handful (shares of k or k + r judgements): the exact
# sign-flip p-value is needed only where a Chernoff bound (`signflip.sign_flip_upper_bound`, never
# below it) does not already put it under alpha, which is near alpha or when the bound fires — there
# the exact test runs on the counts at the reference's cost at most (O(distinct differences) with
# one judgement per item and re-judging on: no d < 0 then, the tail is 1/2^m). The pure functions
# above remain the definition; tests/test_early_stopper.py checks that both give the same answer
# after every item.


class _PairedBound:
    """`stopped_decision`, kept up to date one item at a time."""

    def __init__(self, labels: Mapping[str, Label], incumbent: Mapping[str, Answer], loop: LoopSection,
                 alpha: float | None) -> None:
        self.labels, self.loop, self.alpha = labels, loop, alpha
        self.level = loop.alpha if alpha is None else alpha
        self.inc_right = {tid: is_correct(label, incumbent.get(tid)) for tid, label in labels.items()}
        self.n_pos = sum(1 for label in labels.values() if label.is_positive)
        self.n_neg = len(labels) - self.n_pos
        tp_i = sum(1 for tid, label in labels.items() if label.is_positive and self.inc_right[tid])
        tn_i = sum(1 for tid, label in labels.items() if not label.is_positive and self.inc_right[tid])
        self.inc_counts = Counts(tp_i, self.n_pos - tp_i, tn_i, self.n_neg - tn_i)
        extra = [tid for tid in incumbent if tid not in labels]
        # Raised where `score` raises it in the reference (which scores the incumbent past the FPR bound).
        self.inc_error = (f"score() has answers for {len(extra)} id(s) outside the labels, "
                          f"e.g. {extra[0]!r}" if extra else None)
        self.judged: dict[str, bool] = {}
        self.wrong_pos = self.wrong_neg = self.judged_neg = self.fixed = 0
        # Flips of the best completion (every unjudged item right): every item the incumbent got wrong
        # is improved until it is judged wrong.
        self.improved, self.worsened = len(labels) - tp_i - tn_i, 0

    def _count(self, tid: str, right: bool, sign: int) -> None:
        positive = self.labels[tid].is_positive
        if not positive:
            self.judged_neg += sign
        if right and not self.inc_right[tid]:
            self.fixed += sign
        if not right:
            if positive:
                self.wrong_pos += sign
            else:
                self.wrong_neg += sign
            if self.inc_right[tid]:
                self.worsened += sign
            else:
                self.improved -= sign

    def add(self, tid: str, answer: Answer) -> Decision | None:
        old = self.judged.get(tid)
        if old is not None:
            self._count(tid, old, -1)
        right = is_correct(self.labels[tid], answer)
        self.judged[tid] = right
        self._count(tid, right, +1)
        loop = self.loop
        fp_inc = self.inc_counts.fp
        n_neg = self.n_neg
        if n_neg and not fpr_within(self.wrong_neg, fp_inc, n_neg, loop.fpr_tolerance):
            return _fpr_stop(self.wrong_neg, fp_inc, n_neg, n_neg - self.judged_neg, len(self.judged),
                             len(self.labels), loop, self.level)
        if self.n_pos in (0, len(self.labels)):
            return None
        if self.inc_error is not None:
            raise ValueError(self.inc_error)
        wrong_pos, wrong_neg = self.wrong_pos, self.wrong_neg
        best_counts = Counts(self.n_pos - wrong_pos, wrong_pos, n_neg - wrong_neg, wrong_neg)
        best = decide_counts(self.inc_counts, best_counts, self.improved, self.worsened, loop,
                             alpha=self.alpha)
        if policy_for(loop).bound_keeps(best):
            return None
        observed = Observed(judged=len(self.judged), total=len(self.labels), fixed=self.fixed, broken=self.worsened)
        return _best_case_stop(best, self.inc_counts, best_counts, self.improved, self.worsened, observed, loop,
                               self.level)


class _ItemBound(NamedTuple):
    """One item's share in the adaptive bound: its largest difference, and whether the candidate /
    the incumbent is right in the completion the bound decides."""

    difference: Fraction
    candidate_right: bool
    incumbent_right: bool
    disagrees: bool


class _AdaptiveBound:
    """`adaptive_stopped_decision`, kept up to date one item at a time."""

    def __init__(self, labels: Mapping[str, Label], incumbent: Judgements, loop: LoopSection,
                 alpha: float | None) -> None:
        self.labels, self.loop = labels, loop
        self.level = loop.alpha if alpha is None else alpha
        self.n_pos = sum(1 for label in labels.values() if label.is_positive)
        self.one_class = self.n_pos in (0, len(labels))
        self.items: dict[str, _ItemBound] = {}
        self.judged: set[str] = set()
        # Per item of the incumbent: (correct judgements, judgements, majority right, majority outcome).
        self.inc: dict[str, tuple[int, int, bool, bool | None]] = {}
        self.evidence: Counter[Fraction] = Counter()  # d·|d| → items, non-zero ones only
        self.right = {True: [0, 0], False: [0, 0]}  # candidate?, then [positives, negatives] right
        self.disagreeing = 0
        # Judged items' first-pass majorities: (candidate right, incumbent right), and the fixed/broken counts.
        self.observed: dict[str, tuple[bool, bool]] = {}
        self.fixed = self.broken = 0
        if self.one_class:
            return  # never stops (module docstring); the incumbent is not read, as in the reference
        r = loop.rejudge
        for tid in sorted(labels):
            label, inc = labels[tid], incumbent[tid]
            i_k, n_i = sum(1 for a in inc if is_correct(label, a)), len(inc)
            major = majority_answer(inc)
            inc_right = is_correct(label, major)
            self.inc[tid] = (i_k, n_i, inc_right, outcome(major))
            k = n_i
            d = Fraction(k - i_k, k) if r == 0 else max(Fraction(k - i_k, k), Fraction(k + r - i_k, k + r))
            self._count(tid, _ItemBound(d, True, inc_right if r == 0 else False, False), +1)

    def _count(self, tid: str, item: _ItemBound, sign: int) -> None:
        if sign > 0:
            self.items[tid] = item
        cls = 0 if self.labels[tid].is_positive else 1
        self.right[True][cls] += sign * item.candidate_right
        self.right[False][cls] += sign * item.incumbent_right
        self.disagreeing += sign * item.disagrees
        if item.difference:
            e = evidence(item.difference)
            self.evidence[e] += sign
            if not self.evidence[e]:
                del self.evidence[e]

    def _observe(self, tid: str, cand_right: bool, inc_right: bool) -> None:
        old = self.observed.get(tid)
        if old is not None:
            self.fixed -= old[0] and not old[1]
            self.broken -= old[1] and not old[0]
        self.fixed += cand_right and not inc_right
        self.broken += inc_right and not cand_right
        self.observed[tid] = (cand_right, inc_right)

    def _counts(self, candidate: bool) -> Counts:
        tp, tn = self.right[candidate]
        n_neg = len(self.labels) - self.n_pos
        return Counts(tp, self.n_pos - tp, tn, n_neg - tn)

    def add(self, tid: str, cand: Sequence[Answer]) -> Decision | None:
        if self.one_class:
            return None
        loop, r = self.loop, self.loop.rejudge
        label = self.labels[tid]
        i_k, n_i, inc_right, inc_outcome = self.inc[tid]
        c_k, n_c = sum(1 for a in cand if is_correct(label, a)), len(cand)
        cand_major = majority_answer(cand)
        if r > 0 and outcome(cand_major) != inc_outcome:
            item = _ItemBound(Fraction(c_k + r, n_c + r) - Fraction(i_k, n_i + r), True, False, True)
        else:
            d = Fraction(c_k, n_c) - Fraction(i_k, n_i)
            item = _ItemBound(d, is_correct(label, cand_major), inc_right, False)
        self._count(tid, self.items[tid], -1)
        self._count(tid, item, +1)
        self.judged.add(tid)
        self._observe(tid, is_correct(label, cand_major), inc_right)
        if exact_bits_grouped(self.evidence) > MAX_EXACT_BITS:
            return None  # the bound's proof needs the exact p-value
        counts_c, counts_i = self._counts(True), self._counts(False)
        kappa_ok = kappa_clears(counts_c, counts_i, loop.min_kappa_delta)
        fpr_ok = fpr_within(counts_c.fp, counts_i.fp, counts_i.tn + counts_i.fp, loop.fpr_tolerance)
        level = exact_fraction(self.level)
        if kappa_ok and fpr_ok and Fraction(sign_flip_upper_bound(self.evidence)) < level:
            return None  # p < alpha for certain; the exact test only where the bound is not sharp enough
        best = sign_flip_test_grouped(self.evidence)
        if kappa_ok and fpr_ok and best.below(level):
            return None
        observed = Observed(judged=len(self.judged), total=len(self.labels), fixed=self.fixed, broken=self.broken)
        return _adaptive_stop(kappa_ok, fpr_ok, best.p_value, observed, self.disagreeing, loop, self.level)


class EarlyStopper:
    """The loop's early-stopping bound for one candidate, fed one judged item at a time: after each
    `add`, the answer of `stopped_decision` (``literal``/``paired``) or `adaptive_stopped_decision`
    (``adaptive``) over every item added so far — the same None or the same `Decision` — without a
    pass over the split (see "the bounds, incrementally" above for the cost).

    ``incumbent``: the incumbent's answers (read by the paired bound); ``incumbent_judgements``: its
    first-pass judgements of every item (read by the adaptive bound). An item added again replaces
    its earlier result. Order-free, like the bounds.
    """

    def __init__(self, labels: Mapping[str, Label], incumbent: Mapping[str, Answer],
                 incumbent_judgements: Judgements, loop: LoopSection, *, alpha: float | None = None) -> None:
        self.labels = labels
        # A policy that decides on every judgement has the adaptive bound; the others, the first pass's.
        rejudges = policy_for(loop).rejudges
        self._adaptive = _AdaptiveBound(labels, incumbent_judgements, loop, alpha) if rejudges else None
        self._paired = _PairedBound(labels, incumbent, loop, alpha) if self._adaptive is None else None

    def add(self, trajectory_id: str, answer: Answer, judgements: Sequence[Answer]) -> Decision | None:
        """Record the candidate's result on one item (its answer and its first-pass judgements) and
        return the rollback `Decision` if a bound now fires, else None."""
        if trajectory_id not in self.labels:
            raise ValueError(f"partial results name 1 id(s) outside the labels, e.g. {trajectory_id!r}")
        if self._adaptive is not None:
            return self._adaptive.add(trajectory_id, judgements)
        assert self._paired is not None
        return self._paired.add(trajectory_id, answer)


# --- online false-discovery control ---------------------------------------------------------------


def lord_level(target_fdr: float, past_keeps: Sequence[bool]) -> float:
    """The test level for the next candidate under LORD++ (Ramdas, Yang, Wainwright & Jordan, "Online
    control of the false discovery rate with decaying memory", NeurIPS 2017), which controls the
    FDR at ``target_fdr`` over a run of independent tests.

    ``past_keeps``: the outcomes of this run's earlier tested candidates, in order (True = kept).
    Level of test t: γ_t·W0 + (α − W0)·γ_{t−τ1} + α·Σ_{j≥2} γ_{t−τj}, with W0 = α/2, τ_j the
    positions of the keeps, and γ_n = 1/(n(n+1)) — a non-increasing sequence summing to 1 that spends
    half of the wealth on the first two tests, suited to runs of tens of candidates.
    """
    if not 0 < target_fdr < 1:
        raise ValueError(f"target FDR must be in (0, 1), got {target_fdr}")

    def gamma(n: int) -> float:
        return 1.0 / (n * (n + 1))

    t = len(past_keeps) + 1
    w0 = target_fdr / 2
    keeps = [i + 1 for i, kept in enumerate(past_keeps) if kept]
    level = gamma(t) * w0
    if keeps:
        level += (target_fdr - w0) * gamma(t - keeps[0])
        level += target_fdr * sum(gamma(t - tau) for tau in keeps[1:])
    return level


# --- cheaper, not worse ---------------------------------------------------------------------------
#
# ``[loop] cheaper_margin_items = M`` (0: off). A candidate that is not kept as an improvement but
# costs at least ``cheaper_min_saving`` less per verdict is kept when it is shown *not worse* than the
# incumbent by more than M items: H0 "the candidate's gain Σ d_i is ≤ −M" against H1 "> −M", tested
# with the same exact one-sided sign-flip test on the per-item differences shifted by the margin,
# d_i + M/n over all n items (the items both prompts judged alike too: each carries its share of the
# margin). Statistic: the plain sum (the shift makes every item non-zero, so a d·|d| weighting would
# weigh the margin by itself). The FPR veto is unchanged: the candidate's FPR (majority over all
# judgements) may not exceed the incumbent's + fpr_tolerance. Such a keep is a test at the
# candidate's level like any other, so it counts in the run's expected false keeps.


# In a decision's reason when the non-inferiority test ran (the report counts such tests, `accounting`).
CHEAPER_TEST_MARK = "non-inferiority (margin"


class CheaperTest(BaseModel):
    """The outcome of the non-inferiority test of one cheaper candidate."""

    model_config = ConfigDict(frozen=True)

    keep: bool
    reason: str
    p_value: float
    gain: float  # Σ d_i, in items (negative: worse)
    margin_items: int
    saving: float  # 1 − candidate cost per verdict / incumbent's


def noninferiority_test(differences: Sequence[Fraction], n_items: int, margin_items: int, *,
                        seed: int = 0) -> SignFlipResult:
    """One-sided p-value for "the candidate is worse than the incumbent by less than ``margin_items``":
    the sign-flip test (`optimizer.stats.signflip`) on each of the ``n_items`` differences (``differences``
    lists the non-zero ones and may omit zeros) plus ``margin_items / n_items``."""
    if n_items < len(differences) or n_items < 1:
        raise ValueError(f"n_items ({n_items}) must cover the {len(differences)} differences given")
    shift = Fraction(margin_items, n_items)
    shifted = [Fraction(d) + shift for d in differences] + [shift] * (n_items - len(differences))
    return sign_flip_test(shifted, seed=seed)


def decide_cheaper(
    labels: Mapping[str, Label], incumbent: Judgements, candidate: Judgements, loop: LoopSection, *,
    saving: float, alpha: float | None = None, seed: int = 0,
) -> CheaperTest:
    """Keep ``candidate`` as cheaper-not-worse? ``saving``: its billed saving per verdict (1 − ratio),
    checked against ``cheaper_min_saving`` here too. ``incumbent``/``candidate``: every labelled id →
    its judgements (all of them: first pass and re-judging)."""
    level = loop.alpha if alpha is None else alpha
    margin = loop.cheaper_margin_items
    missing = [t for t in labels if not incumbent.get(t) or not candidate.get(t)]
    if missing:
        raise ValueError(f"decide_cheaper: {len(missing)} item(s) without judgements, e.g. {missing[0]!r}")
    all_i = {t: is_correct(labels[t], majority_answer(incumbent[t])) for t in labels}
    all_c = {t: is_correct(labels[t], majority_answer(candidate[t])) for t in labels}
    counts_i, counts_c = _counts_from_correct(labels, all_i), _counts_from_correct(labels, all_c)
    n_neg = counts_i.tn + counts_i.fp
    fpr_ok = fpr_within(counts_c.fp, counts_i.fp, n_neg, loop.fpr_tolerance)
    diffs = [d for t in sorted(labels)
             if (d := Fraction(sum(1 for a in candidate[t] if is_correct(labels[t], a)), len(candidate[t]))
                 - Fraction(sum(1 for a in incumbent[t] if is_correct(labels[t], a)), len(incumbent[t])))]
    gain = float(sum(diffs, Fraction(0)))
    enough = Fraction(repr(saving)) >= exact_fraction(loop.cheaper_min_saving)
    result = noninferiority_test(diffs, len(labels), margin, seed=seed) if margin > 0 else None
    p = 1.0 if result is None else result.p_value
    within = result is not None and result.below(exact_fraction(level))
    keep = margin > 0 and enough and fpr_ok and within
    why: list[str] = []
    if not enough:
        why.append(f"saves {saving:.0%} per verdict, under cheaper_min_saving {loop.cheaper_min_saving:.0%}")
    if not fpr_ok:
        why.append("FPR rose")
    if not within:
        why.append(f"not shown within {margin} item(s) of the incumbent")
    text = (f"cheaper: {saving:.0%} less per verdict, gain {gain:+.2f} items, {CHEAPER_TEST_MARK} {margin} "
            f"item(s)) p={_fmt_p(p)} {'<' if within else '≥'} {level:.3g}: "
            + ("kept as cheaper, not worse" if keep else "not kept (" + "; ".join(why) + ")"))
    return CheaperTest(keep=keep, reason=text, p_value=p, gain=gain, margin_items=margin, saving=saving)


class FprStopper:
    """The FPR early-stopping bound alone, one item at a time: a cheaper-not-worse candidate may be kept
    without a kappa gain, so only the bound that no keep of either kind survives may stop it."""

    def __init__(self, labels: Mapping[str, Label], incumbent: Mapping[str, Answer], loop: LoopSection,
                 alpha: float | None = None) -> None:
        self.labels, self.loop = labels, loop
        self.level = loop.alpha if alpha is None else alpha
        negatives = [t for t, lab in labels.items() if not lab.is_positive]
        self.n_neg = len(negatives)
        self.fp_inc = sum(1 for t in negatives if not is_correct(labels[t], incumbent.get(t)))
        self.wrong: dict[str, bool] = {}
        self.fp = 0

    def add(self, trajectory_id: str, answer: Answer) -> Decision | None:
        label = self.labels[trajectory_id]
        if label.is_positive or not self.n_neg:
            return None
        wrong = not is_correct(label, answer)
        self.fp += wrong - self.wrong.get(trajectory_id, False)
        self.wrong[trajectory_id] = wrong
        fp = self.fp
        if fpr_within(fp, self.fp_inc, self.n_neg, self.loop.fpr_tolerance):
            return None
        judged_neg = len(self.wrong)
        return _fpr_stop(fp, self.fp_inc, self.n_neg, self.n_neg - judged_neg, judged_neg, len(self.labels),
                         self.loop, self.level)

# -- waves: several candidates against one incumbent --------------------------------------------------


class WaveRank(NamedTuple):
    """Where Holm's step-down put one candidate of a wave."""

    rank: int  # 1 = the smallest p-value of the wave (ties: the earlier candidate first)
    level: Fraction  # alpha / (family − rank + 1): the level its rank is compared at
    rejected: bool  # Holm rejected its null (no gain): it may be kept


def holm(p_values: Sequence[float | None], alpha: float, family: int | None = None) -> list[WaveRank]:
    """Holm's step-down over a wave's p-values (None: not fully tested, read as 1), with ``family``
    tests in all (at least ``len(p_values)``; the missing ones count as p = 1, which only makes every
    level stricter). Rejects in rank order while p < level and stops at the first that is not, so
    the chance of any false rejection in the wave is at most ``alpha`` whatever the dependence."""
    m = max(family or 0, len(p_values))
    ps = [Fraction(1) if p is None else Fraction(p) for p in p_values]
    order = sorted(range(len(ps)), key=lambda i: (ps[i], i))
    out: list[WaveRank | None] = [None] * len(ps)
    going = True
    for rank, i in enumerate(order, start=1):
        level = exact_fraction(alpha) / (m - rank + 1)
        going = going and ps[i] < level
        out[i] = WaveRank(rank, level, going)
    return [r for r in out if r is not None]


def _wave_statistic(d: Decision) -> float:
    """The observed gain a wave ranks its Holm-rejected candidates by (the sign-flip statistic)."""
    return d.test.statistic if d.test is not None else float("-inf")


def decide_wave(decisions: Sequence[Decision | None], alpha: float, family: int,
                labels: Sequence[str]) -> list[Decision | None]:
    """The wave's decisions: each candidate's own decision at ``alpha`` (None: undecided), corrected by
    Holm over the wave's ``family`` tests; among the Holm-rejected whose decision keeps (kappa and
    the FPR veto as for one candidate), the one with the largest observed gain is kept, every other
    rolled back. ``labels`` names each candidate in the reasons ("experiment 7"). A decision without a
    full test (an early stop, or re-judging skipped by the bound: their p-value is a bound, not a
    p-value) counts as p = 1: it cannot be kept at alpha, so at no Holm level."""
    ps = [None if d is None or d.early_stopped or d.test is None else d.p_value for d in decisions]
    ranks = holm(ps, alpha, family)
    eligible = [i for i, (d, r) in enumerate(zip(decisions, ranks, strict=True))
                if d is not None and r.rejected and d.keep]
    best = max(eligible, key=lambda i: (_wave_statistic(decisions[i]), -i)) if eligible else None  # type: ignore[arg-type]
    out: list[Decision | None] = []
    for i, (d, r) in enumerate(zip(decisions, ranks, strict=True)):
        if d is None:
            out.append(None)
            continue
        level = float(r.level)
        shown = f"p={_fmt_p(d.p_value)}" if ps[i] is not None else "no full test (counted as p=1)"
        where = f"wave of {family} (Holm): rank {r.rank}, level {level:.3g}, {shown}"
        if i == best:
            others = len(eligible) - 1
            verdict = "kept" + (f" (the largest gain of {others + 1} candidates that cleared their level)"
                                if others else "")
        elif r.rejected and d.keep:
            verdict = (f"rolled back ({labels[best]} of the wave has the larger gain; at most one keep per wave)"
                       if best is not None else "rolled back")
        elif r.rejected:
            verdict = "rolled back (cleared its Holm level, but not the kappa/FPR rule)"
        elif ps[i] is not None and Fraction(ps[i] or 1) < r.level:
            verdict = "rolled back (a candidate with a smaller p did not clear its level, so Holm stops there)"
        else:
            verdict = "rolled back (not below its Holm level)"
        out.append(d.model_copy(update={
            "keep": i == best, "alpha": level,
            "reason": f"{where}: {verdict} — alone at {alpha:g}: {d.reason}",
        }))
    return out
