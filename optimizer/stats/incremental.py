"""The early-stopping bounds kept up to date one judged item at a time (`EarlyStopper`), for the loop. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

from optimizer.models import Label
from optimizer.stats.adaptive import (
    Judgements,
    adaptive_stop,
)
from optimizer.stats.bounds import (
    Observed,
    best_case_stop,
    fpr_stop,
)
from optimizer.stats.evidence import evidence
from optimizer.stats.metrics import (
    Answer,
    is_correct,
    majority_answer,
    outcome,
)
from optimizer.stats.policies import policy_for
from optimizer.stats.rules import (
    Counts,
    Decision,
    decide_counts,
    exact_fraction,
    fpr_within,
    kappa_clears,
)
from optimizer.stats.signflip import (
    MAX_EXACT_BITS,
    exact_bits_grouped,
    sign_flip_test_grouped,
    sign_flip_upper_bound,
)
from optimizer.workspace.config import LoopSection

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

    def __init__(
        self,
        labels: Mapping[str, Label],
        incumbent: Mapping[str, Answer],
        loop: LoopSection,
        alpha: float | None,
    ) -> None:
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
        self.inc_error = (
            f"score() has answers for {len(extra)} id(s) outside the labels, e.g. {extra[0]!r}"
            if extra
            else None
        )
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
            return fpr_stop(
                self.wrong_neg,
                fp_inc,
                n_neg,
                n_neg - self.judged_neg,
                len(self.judged),
                len(self.labels),
                loop,
                self.level,
            )
        if self.n_pos in (0, len(self.labels)):
            return None
        if self.inc_error is not None:
            raise ValueError(self.inc_error)
        wrong_pos, wrong_neg = self.wrong_pos, self.wrong_neg
        best_counts = Counts(self.n_pos - wrong_pos, wrong_pos, n_neg - wrong_neg, wrong_neg)
        best = decide_counts(
            self.inc_counts, best_counts, self.improved, self.worsened, loop, alpha=self.alpha
        )
        if policy_for(loop).bound_keeps(best):
            return None
        observed = Observed(
            judged=len(self.judged), total=len(self.labels), fixed=self.fixed, broken=self.worsened
        )
        return best_case_stop(
            best, self.inc_counts, best_counts, self.improved, self.worsened, observed, loop, self.level
        )


class _ItemBound(NamedTuple):
    """One item's share in the adaptive bound: its largest difference, and whether the candidate /
    the incumbent is right in the completion the bound decides."""

    difference: Fraction
    candidate_right: bool
    incumbent_right: bool
    disagrees: bool


class _AdaptiveBound:
    """`adaptive_stopped_decision`, kept up to date one item at a time."""

    def __init__(
        self, labels: Mapping[str, Label], incumbent: Judgements, loop: LoopSection, alpha: float | None
    ) -> None:
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
        observed = Observed(
            judged=len(self.judged), total=len(self.labels), fixed=self.fixed, broken=self.broken
        )
        return adaptive_stop(kappa_ok, fpr_ok, best.p_value, observed, self.disagreeing, loop, self.level)


class EarlyStopper:
    """The loop's early-stopping bound for one candidate, fed one judged item at a time: after each
    `add`, the answer of `stopped_decision` (``literal``/``paired``) or `adaptive_stopped_decision`
    (``adaptive``) over every item added so far — the same None or the same `Decision` — without a
    pass over the split (see "the bounds, incrementally" above for the cost).

    ``incumbent``: the incumbent's answers (read by the paired bound); ``incumbent_judgements``: its
    first-pass judgements of every item (read by the adaptive bound). An item added again replaces
    its earlier result. Order-free, like the bounds.
    """

    def __init__(
        self,
        labels: Mapping[str, Label],
        incumbent: Mapping[str, Answer],
        incumbent_judgements: Judgements,
        loop: LoopSection,
        *,
        alpha: float | None = None,
    ) -> None:
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
