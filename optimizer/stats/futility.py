"""Futility screening under the adaptive policy: roll a candidate back after part of the split when its
chance of clearing the full test is small. Pure (numpy for the draws).

The looks (what the loop does, `make_looks` and `p_clear_rejudged`). The candidate's first pass goes
in nested *looks*: every item the incumbent gets wrong (its first-pass majority disagrees with the
label — the only items a candidate can fix) and the first ``ceil(share · n)`` of each class's
incumbent-right items in one shuffle by `random.Random(seed)` (the candidate's decision seed, so the
looks replay), for each share in `LOOKS`. After each look, the items it added whose verdicts differ
are re-judged (the re-judging the adaptive decision makes anyway, made earlier and paid once), then
`p_clear_rejudged` estimates P(clear): the chance that the adaptive decision on the full split
(`decide_adaptive`) keeps the candidate. Below ``[loop] futility_threshold`` the candidate is rolled
back there, with the reason "futile: P(clear) = x < threshold after n of N items"; otherwise the
next look (in the end the rest of the split and its re-judging) goes on exactly as without
screening. The model: judged items keep all their judgements (re-judgings included); each unjudged
item (incumbent-right, as every sampled item) takes the whole judgements under both prompts of one
sampled item of its class, drawn by the Bayesian bootstrap — Dirichlet(1, …, 1) weights over the
sampled items per draw — so the break rate carries its uncertainty and no model of re-judging is
needed. Re-judging first matters: at the first pass, a no-op's noise "fixes" on the incumbent's
wrong items look like a real fix's; their re-judging tells them apart.

The first-pass screen (`make_screen`, `p_clear`; the benchmark's comparison row): one look at
``SCREEN_SHARE``, no re-judging, P(clear) computed from first-pass judgements with a model of the
re-judging to come:

- the items judged so far keep their judgements;
- an unjudged item is incumbent-right (every incumbent-wrong item is in the screen). The candidate's
  first pass on it is drawn from the sampled items of its class (the random part of the screen:
  incumbent-right items of the same label, exchangeable with the unjudged ones) by the Bayesian
  bootstrap, so the break rate carries its uncertainty, not only its point estimate;
- an item whose verdicts differ (judged or drawn) is re-judged ``rejudge`` more times under each
  prompt, each side right with its own probability drawn from Beta(½ + right, ½ + wrong) of that
  side's first-pass judgements of the item (Jeffreys' prior; an unusable judgement counts as wrong,
  and a majority over all judgements is "right" when more than half are right, a tie being right
  on a negative — `metrics.majority_answer`'s tie rule).

Each draw is decided by the adaptive rule itself (kappa and FPR by `decision`'s exact comparisons, the
exact sign-flip p-value; where the exact test is out of reach the draw counts as a clear, which can
only raise P(clear)). P(clear) is the share of draws that clear.

Why false keeps cannot rise: the screen only ever returns a rollback (`Decision.keep` is False);
a candidate it does not stop is evaluated and decided exactly as without it, on the full split
(the same judgements: a look only moves re-judging earlier).
For a fixed candidate and fixed judge answers, "kept with futility" implies "kept without"; the
false-keep bound of the adaptive test (alpha per candidate) holds unchanged. What screening can
cost is power: a real fix stopped because the screen looked worse than it was
(benchmarks/decision_power.py measures how often).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from optimizer.models import Label
from optimizer.stats.decision import (
    Counts,
    Decision,
    Judgements,
    Reason,
    evidence,
    exact_fraction,
    fpr_within,
    kappa_clears,
)
from optimizer.stats.metrics import Answer, is_correct, majority_answer, outcome
from optimizer.stats.signflip import (
    MAX_EXACT_BITS,
    exact_bits_grouped,
    sign_flip_test_grouped,
    sign_flip_upper_bound,
)
from optimizer.workspace.config import LoopSection

# The share of each class's incumbent-right items judged in the screen (chosen on the benchmark).
SCREEN_SHARE = 0.3
# The looks of the re-judged screen (`make_looks`, `p_clear_rejudged`): cumulative shares of each
# class's incumbent-right items, one futility check after each (chosen on the benchmark).
LOOKS = (0.1, 0.2, 0.3, 0.5, 0.7)
DRAWS = 200
JEFFREYS = 0.5
# The adaptive rule's conditions in the order `_clears` checks them, worded as `decide_adaptive` words them.
KAPPA_FAIL, FPR_FAIL, TEST_FAIL = "kappa did not rise", "FPR rose", "the gain is not significant"
FAILS = (KAPPA_FAIL, FPR_FAIL, TEST_FAIL)


@dataclass(frozen=True)
class Screen:
    """The items judged before the futility check: ``wrong`` (the incumbent's disagreements with
    the labels) and ``sampled`` (the stratified random part), and the seed that drew them."""

    wrong: tuple[str, ...]
    sampled: tuple[str, ...]
    seed: int
    share: float

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.wrong) | frozenset(self.sampled)

    def order(self, labels: Mapping[str, Label], ids: Sequence[str]) -> list[str]:
        """``ids`` with the screen first; negatives first within the screen and within the rest,
        manifest order within each (the FPR bound sees negatives early either way)."""
        screen = self.ids
        first = [t for t in ids if t in screen]
        rest = [t for t in ids if t not in screen]
        return (
            [t for t in first if not labels[t].is_positive]
            + [t for t in first if labels[t].is_positive]
            + [t for t in rest if not labels[t].is_positive]
            + [t for t in rest if labels[t].is_positive]
        )


def make_screen(
    labels: Mapping[str, Label], incumbent: Mapping[str, Answer], seed: int, share: float = SCREEN_SHARE
) -> Screen:
    """The screen for a candidate against ``incumbent`` (its answer per item; see the module docstring)."""
    if not 0 < share <= 1:
        raise ValueError(f"screen share must be in (0, 1], got {share}")
    wrong = tuple(t for t in labels if not is_correct(labels[t], incumbent.get(t)))
    rng = random.Random(seed)
    sampled: list[str] = []
    for positive in (False, True):
        right = sorted(t for t, lab in labels.items() if lab.is_positive is positive and t not in set(wrong))
        sampled += sorted(rng.sample(right, math.ceil(share * len(right))))
    return Screen(wrong=wrong, sampled=tuple(sampled), seed=seed, share=share)


def make_looks(
    labels: Mapping[str, Label], incumbent: Mapping[str, Answer], seed: int, shares: Sequence[float] = LOOKS
) -> list[Screen]:
    """Nested screens, one per cumulative share in ``shares`` (increasing, in (0, 1)): each holds every
    incumbent-wrong item and the first ``ceil(share · n)`` of each class's incumbent-right items in one
    seeded shuffle, so a later look adds items to an earlier one."""
    if not shares or any(not a < b for a, b in zip((0.0, *shares), (*shares, 1.0), strict=True)):
        raise ValueError(f"looks must be increasing shares in (0, 1), got {list(shares)}")
    wrong = tuple(t for t in labels if not is_correct(labels[t], incumbent.get(t)))
    rng = random.Random(seed)
    shuffled: dict[bool, list[str]] = {}
    for positive in (False, True):
        shuffled[positive] = sorted(
            t for t, lab in labels.items() if lab.is_positive is positive and t not in set(wrong)
        )
        rng.shuffle(shuffled[positive])
    return [
        Screen(
            wrong=wrong,
            seed=seed,
            share=share,
            sampled=tuple(
                sorted(
                    t for pos in (False, True) for t in shuffled[pos][: math.ceil(share * len(shuffled[pos]))]
                )
            ),
        )
        for share in shares
    ]


@dataclass(frozen=True)
class FutilityEstimate:
    """P(clear) and what it was computed from."""

    p_clear: float
    judged: int
    total: int
    draws: int
    # Why the draws that do not clear fail: the adaptive rule's first unmet condition (`FAILS`) -> draws.
    fails: tuple[tuple[str, int], ...] = ()

    def why(self) -> str:
        """The draws that fail, by reason, most first: ``FPR rose in 180 of 200 draws, …``."""
        ranked = sorted(self.fails, key=lambda kv: (-kv[1], FAILS.index(kv[0])))
        return ", ".join(f"{what} in {k} of {self.draws} draws" for what, k in ranked if k)


def _right(correct: np.ndarray, total: np.ndarray, negative: np.ndarray) -> np.ndarray:
    return (correct * 2 > total) | ((correct * 2 == total) & negative)


def _counts(right: np.ndarray, positive: np.ndarray) -> Counts:
    tp, tn = int((right & positive).sum()), int((right & ~positive).sum())
    n_pos = int(positive.sum())
    return Counts(tp, n_pos - tp, tn, len(positive) - n_pos - tn)


class Tally(NamedTuple):
    """One draw's judgements per item (arrays over the split, in items): right judgements out of
    totals under the candidate (``cc``/``cn``) and the incumbent (``ic``/``in_``), and whether each
    prompt's majority is right (``cr``/``ir``)."""

    cc: np.ndarray
    cn: np.ndarray
    ic: np.ndarray
    in_: np.ndarray
    cr: np.ndarray
    ir: np.ndarray


def _clears(tally: Tally, positive: np.ndarray, loop: LoopSection, alpha: Fraction) -> str | None:
    """The adaptive rule on one draw's `Tally`: None when the draw clears, else the first condition it
    fails (one of `FAILS`)."""
    cc, cn, ic, in_, cr, ir = tally
    counts_c, counts_i = _counts(cr, positive), _counts(ir, positive)
    if not kappa_clears(counts_c, counts_i, loop.min_kappa_delta):
        return KAPPA_FAIL
    if not fpr_within(counts_c.fp, counts_i.fp, counts_i.tn + counts_i.fp, loop.fpr_tolerance):
        return FPR_FAIL
    shares = Counter(zip(cc.tolist(), cn.tolist(), ic.tolist(), in_.tolist(), strict=True))
    ev: Counter[Fraction] = Counter()
    for (a, b, c, d), k in shares.items():
        diff = Fraction(a, b) - Fraction(c, d)
        if diff:
            ev[evidence(diff)] += k
    if Fraction(sign_flip_upper_bound(ev)) < alpha:
        return None
    # Out of exact reach: counted as a clear, which only raises P(clear).
    if exact_bits_grouped(ev) > MAX_EXACT_BITS or sign_flip_test_grouped(ev).below(alpha):
        return None
    return TEST_FAIL


def _estimate(fails: Counter[str], judged: int, total: int, draws: int) -> FutilityEstimate:
    """The estimate from the draws' outcomes (``""``: a draw that clears)."""
    return FutilityEstimate(
        p_clear=fails[""] / draws,
        judged=judged,
        total=total,
        draws=draws,
        fails=tuple((what, fails[what]) for what in FAILS if fails[what]),
    )


def _pools_and_holes(
    ids: Sequence[str], positive: np.ndarray, judged: np.ndarray, screen: Screen
) -> tuple[dict[bool, np.ndarray], dict[bool, np.ndarray]] | None:
    """Per class (positive or not): the indices of the screen's random sample (what an unjudged item is
    drawn from) and of the unjudged items; None when a class has unjudged items but no sample."""
    sampled = set(screen.sampled)
    pools = {
        pos: np.array([i for i, t in enumerate(ids) if t in sampled and positive[i] == pos])
        for pos in (False, True)
    }
    holes = {pos: np.flatnonzero(~judged & (positive == pos)) for pos in (False, True)}
    if any(len(holes[pos]) and not len(pools[pos]) for pos in (False, True)):
        return None
    return pools, holes


def _bootstrap(
    rng: np.random.Generator, pools: dict[bool, np.ndarray], holes: dict[bool, np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One draw's filling, per class with unjudged items: (those items, the sampled item each takes),
    drawn with Dirichlet(1, …, 1) weights over the class's sample (the Bayesian bootstrap)."""
    out = []
    for pos in (False, True):
        hole, pool = holes[pos], pools[pos]
        if len(hole):
            out.append(
                (hole, pool[rng.choice(len(pool), size=len(hole), p=rng.dirichlet(np.ones(len(pool))))])
            )
    return out


def p_clear(
    labels: Mapping[str, Label],
    screen: Screen,
    incumbent: Judgements,
    candidate_so_far: Judgements,
    loop: LoopSection,
    *,
    level: float,
    seed: int,
    draws: int = DRAWS,
) -> FutilityEstimate | None:
    """The chance the full adaptive decision keeps the candidate (module docstring), or None when it
    cannot be estimated: a one-class split, a screen item not judged yet, or a class with unjudged
    items and no sampled item to draw from.

    ``incumbent``: the incumbent's first-pass judgements of every item; ``candidate_so_far``: the
    candidate's first-pass judgements of the items judged so far (screen items and any others)."""
    ids = sorted(labels)
    positive = np.array([labels[t].is_positive for t in ids])
    if positive.all() or not positive.any() or not screen.ids <= set(candidate_so_far):
        return None
    r = loop.rejudge
    n = len(ids)
    inc_c = np.array([sum(is_correct(labels[t], a) for a in incumbent[t]) for t in ids])
    inc_n = np.array([len(incumbent[t]) for t in ids])
    inc_right = np.array([is_correct(labels[t], majority_answer(incumbent[t])) for t in ids])
    inc_out = [outcome(majority_answer(incumbent[t])) for t in ids]
    judged = np.array([t in candidate_so_far for t in ids])
    cand_c = np.zeros(n, int)
    cand_n = np.ones(n, int)
    cand_right = np.zeros(n, bool)
    differ = np.zeros(n, bool)
    for i, t in enumerate(ids):
        if t in candidate_so_far:
            js = candidate_so_far[t]
            cand_c[i], cand_n[i] = sum(is_correct(labels[t], a) for a in js), len(js)
            major = majority_answer(js)
            cand_right[i], differ[i] = is_correct(labels[t], major), outcome(major) != inc_out[i]
    filling = _pools_and_holes(ids, positive, judged, screen)
    if filling is None:
        return None
    pools, holes = filling
    rng = np.random.default_rng(seed)
    alpha = exact_fraction(level)
    negative = ~positive
    fails: Counter[str] = Counter()
    for _ in range(draws):
        cc, cn, cr, dd = cand_c.copy(), cand_n.copy(), cand_right.copy(), differ.copy()
        for hole, pick in _bootstrap(rng, pools, holes):
            # Every unjudged item is incumbent-right, as every sampled one: "differs" transplants as is.
            cc[hole], cn[hole], cr[hole], dd[hole] = (
                cand_c[pick],
                cand_n[pick],
                cand_right[pick],
                differ[pick],
            )
        ic, in_, ir = inc_c.copy(), inc_n.copy(), inc_right.copy()
        if r > 0 and dd.any():
            idx = np.flatnonzero(dd)
            # Apparent fixes beyond the apparent breaks are taken as real (and the reverse); the rest
            # as noise, both prompts then sharing one chance of a right judgement.
            fix, brk = cr[idx] & ~ir[idx], ir[idx] & ~cr[idx]
            n_fix, n_brk = int(fix.sum()), int(brk.sum())
            share_real = np.where(
                fix,
                max(0.0, 1 - n_brk / n_fix) if n_fix else 0.0,
                np.where(brk, max(0.0, 1 - n_fix / n_brk) if n_brk else 0.0, 0.0),
            )
            real = rng.random(len(idx)) < share_real
            pooled = rng.beta(JEFFREYS + cc[idx] + ic[idx], JEFFREYS + cn[idx] - cc[idx] + in_[idx] - ic[idx])
            pc = np.where(real, rng.beta(JEFFREYS + cc[idx], JEFFREYS + cn[idx] - cc[idx]), pooled)
            pi = np.where(real, rng.beta(JEFFREYS + ic[idx], JEFFREYS + in_[idx] - ic[idx]), pooled)
            cc[idx] += rng.binomial(r, pc)
            ic[idx] += rng.binomial(r, pi)
            cn[idx] += r
            in_[idx] += r
            cr[idx] = _right(cc[idx], cn[idx], negative[idx])
            ir[idx] = _right(ic[idx], in_[idx], negative[idx])
        fails[_clears(Tally(cc, cn, ic, in_, cr, ir), positive, loop, alpha) or ""] += 1
    return _estimate(fails, int(judged.sum()), n, draws)


def p_clear_rejudged(
    labels: Mapping[str, Label],
    screen: Screen,
    incumbent: Judgements,
    candidate_so_far: Judgements,
    loop: LoopSection,
    *,
    level: float,
    seed: int,
    draws: int = DRAWS,
) -> FutilityEstimate | None:
    """P(clear) once the screen's disagreements are re-judged (``incumbent``/``candidate_so_far``: every
    judgement so far, re-judgings included): the screen's items count as judged, and each unjudged
    item takes the whole judgements of both prompts (first pass and re-judging) of one sampled item
    of its class, drawn by the Bayesian bootstrap as in `p_clear` — no model of re-judging is needed.
    None when it cannot be estimated (as `p_clear`)."""
    ids = sorted(labels)
    positive = np.array([labels[t].is_positive for t in ids])
    if positive.all() or not positive.any() or not screen.ids <= set(candidate_so_far):
        return None
    judged = np.array([t in candidate_so_far for t in ids])
    cc0 = np.array([sum(is_correct(labels[t], a) for a in candidate_so_far.get(t, ())) for t in ids])
    cn0 = np.array([max(1, len(candidate_so_far.get(t, ()))) for t in ids])
    ic0 = np.array([sum(is_correct(labels[t], a) for a in incumbent[t]) for t in ids])
    in0 = np.array([len(incumbent[t]) for t in ids])
    filling = _pools_and_holes(ids, positive, judged, screen)
    if filling is None:
        return None
    pools, holes = filling
    rng = np.random.default_rng(seed)
    alpha = exact_fraction(level)
    negative = ~positive
    fails: Counter[str] = Counter()
    for _ in range(draws):
        cc, cn, ic, in_ = cc0.copy(), cn0.copy(), ic0.copy(), in0.copy()
        for hole, pick in _bootstrap(rng, pools, holes):
            cc[hole], cn[hole], ic[hole], in_[hole] = cc0[pick], cn0[pick], ic0[pick], in0[pick]
        tally = Tally(cc, cn, ic, in_, _right(cc, cn, negative), _right(ic, in_, negative))
        fails[_clears(tally, positive, loop, alpha) or ""] += 1
    return _estimate(fails, int(judged.sum()), len(ids), draws)


def screen_decision(
    labels: Mapping[str, Label],
    screen: Screen,
    incumbent: Judgements,
    candidate_so_far: Judgements,
    loop: LoopSection,
    *,
    level: float,
    seed: int,
    draws: int = DRAWS,
) -> Decision | None:
    """The futility rollback when P(clear) (`p_clear`: the screen's first pass only) < ``loop.futility_threshold``,
    else None (also when P(clear) cannot be estimated). Never a keep. ``p_value`` is 1.0: no test was run
    on the candidate."""
    est = p_clear(labels, screen, incumbent, candidate_so_far, loop, level=level, seed=seed, draws=draws)
    return _futile(est, screen, loop, level)


def screen_decision_rejudged(
    labels: Mapping[str, Label],
    screen: Screen,
    incumbent: Judgements,
    candidate_so_far: Judgements,
    loop: LoopSection,
    *,
    level: float,
    seed: int,
    draws: int = DRAWS,
) -> Decision | None:
    """`screen_decision` once the screen's disagreements are re-judged (`p_clear_rejudged`): what the
    loop asks at each look."""
    est = p_clear_rejudged(
        labels, screen, incumbent, candidate_so_far, loop, level=level, seed=seed, draws=draws
    )
    return _futile(est, screen, loop, level)


def _futile(est: FutilityEstimate | None, screen: Screen, loop: LoopSection, level: float) -> Decision | None:
    """The rollback when the estimate ``est`` is below ``loop.futility_threshold``, else None."""
    if est is None or est.p_clear >= loop.futility_threshold:
        return None
    why = Reason(
        rule="futility",
        kept=False,
        evidence=(
            f"futile: P(clear) = {est.p_clear:.3f} < {loop.futility_threshold:g} after {est.judged} of "
            f"{est.total} items — {est.why()} (screen: the incumbent's {len(screen.wrong)} wrong item(s) and "
            f"{len(screen.sampled)} drawn by label, seed {screen.seed})"
        ),
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
        adaptive_keep=False,
        alpha=level,
    )
