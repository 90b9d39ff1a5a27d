"""Several tests in one run: the online false-discovery level of the next candidate (`lord_level`, LORD++)
and a wave's candidates against one incumbent (`holm`, `decide_wave`). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

from optimizer.stats.rules import (
    Decision,
    Reason,
    exact_fraction,
    p_text,
)

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


def decide_wave(
    decisions: Sequence[Decision | None], alpha: float, family: int, labels: Sequence[str]
) -> list[Decision | None]:
    """The wave's decisions: each candidate's own decision at ``alpha`` (None: undecided), corrected by
    Holm over the wave's ``family`` tests; among the Holm-rejected whose decision keeps (kappa and
    the FPR veto as for one candidate), the one with the largest observed gain is kept, every other
    rolled back. ``labels`` names each candidate in the reasons ("experiment 7"). A decision without a
    full test (an early stop, or re-judging skipped by the bound: their p-value is a bound, not a
    p-value) counts as p = 1: it cannot be kept at alpha, so at no Holm level."""
    ps = [None if d is None or d.early_stopped or d.test is None else d.p_value for d in decisions]
    ranks = holm(ps, alpha, family)
    eligible = [
        i
        for i, (d, r) in enumerate(zip(decisions, ranks, strict=True))
        if d is not None and r.rejected and d.keep
    ]
    best = max(eligible, key=lambda i: (_wave_statistic(decisions[i]), -i)) if eligible else None  # type: ignore[arg-type]
    out: list[Decision | None] = []
    for i, (d, r) in enumerate(zip(decisions, ranks, strict=True)):
        if d is None:
            out.append(None)
            continue
        level = float(r.level)
        shown = f"p={p_text(d.p_value)}" if ps[i] is not None else "no full test (counted as p=1)"
        where = f"wave of {family} (Holm): rank {r.rank}, level {level:.3g}, {shown}"
        alone = f" — alone at {alpha:g}: {d.reason}"
        unmet: tuple[str, ...] = ()
        note = ""
        if i == best:
            others = len(eligible) - 1
            note = (
                f" (the largest gain of {others + 1} candidates that cleared their level)" if others else ""
            )
        elif r.rejected and d.keep:
            if best is not None:
                unmet = (f"{labels[best]} of the wave has the larger gain", "at most one keep per wave")
        elif r.rejected:
            unmet = ("cleared its Holm level, but not the kappa/FPR rule",)
        elif ps[i] is not None and Fraction(ps[i] or 1) < r.level:
            unmet = ("a candidate with a smaller p did not clear its level, so Holm stops there",)
        else:
            unmet = ("not below its Holm level",)
        why = Reason(
            rule="wave", kept=i == best, evidence=where, unmet=unmet, after=note + alone, earlier=d.why
        )
        out.append(d.model_copy(update={"keep": i == best, "alpha": level, "reason": why.text(), "why": why}))
    return out
