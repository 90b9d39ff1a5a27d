"""What the self-test says about power: the smallest gain the rule can tell from noise on the split
(`detectable_gain`), the keep rate of a D-item fix simulated at the judge's measured noise
(`power_at_noise`), and the decision-power benchmark's figures for the same policy beside the A/A rate
(`BENCHMARK`, `benchmark_beside`). Pure."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from optimizer.stats.binomial import clopper_pearson_interval
from optimizer.stats.decision import (
    Counts,
    adaptive_test,
    decide_counts,
    min_fixes_to_keep,
)
from optimizer.stats.policies import policy_for
from optimizer.trust.selftest_records import (
    BenchmarkBeside,
    BenchmarkReference,
    DetectableGain,
    PowerAtNoise,
)
from optimizer.workspace.config import LoopSection

# benchmarks/decision_power.py, README "How the loop decides": its judge has AH-D's composition (162 items,
# 62 positives / 100 negatives, 70% of items stable, 30% answered right with probability 0.3-0.7, every
# call a fresh draw), one judgement per item, alpha 0.1, adaptive re-judging 2x. ``noop_fresh``: no-op
# kept against a fresh incumbent (``sim1``, n = 3,000: the A/A setting); ``noop_in_run``: inside a run
# (``sim``, n = 9,000), lower because a run's incumbent is the lucky draw that won its comparison;
# ``fixD``: a D-item fix kept against a fresh incumbent.
BENCHMARK: dict[str, Any] = {
    "source": "benchmarks/decision_power.py (README table, rows sim1 and sim)",
    "judge": "162 items (62 positive / 100 negative), 30% unstable (right with p 0.3-0.7), 1 judgement "
    "per item, adaptive re-judges 2x, alpha 0.1",
    "items": 162,
    "alpha": 0.1,
    "policies": {
        "literal": {
            "noop_fresh": 0.388,
            "noop_fresh_n": 3000,
            "noop_in_run": 0.249,
            "fix4": 0.606,
            "fix8": 0.803,
            "fix12": 0.919,
        },
        "paired": {
            "noop_fresh": 0.077,
            "noop_fresh_n": 3000,
            "noop_in_run": 0.026,
            "fix4": 0.179,
            "fix8": 0.372,
            "fix12": 0.614,
        },
        "adaptive": {
            "noop_fresh": 0.083,
            "noop_fresh_n": 3000,
            "noop_in_run": 0.057,
            "fix4": 0.391,
            "fix8": 0.782,
            "fix12": 0.946,
        },
        "adaptive+fdr0.1": {
            "noop_fresh": 0.019,
            "noop_fresh_n": 3000,
            "noop_in_run": 0.007,
            "fix4": 0.145,
            "fix8": 0.510,
            "fix12": 0.831,
        },
    },
}


def detectable_gain(n_items: int, level: float, policy: str, flip_rate: float | None) -> DetectableGain:
    """What gain the policy can tell from noise on ``n_items`` (`decision.min_fixes_to_keep`: the
    fewest items newly right, all judgements agreeing, breaking none / one / two), beside the items the
    judge's own noise flips between two evaluations of identical prompts."""
    noise_items = None if flip_rate is None else flip_rate * n_items
    rule = policy_for(policy.partition("+")[0])  # `policy_name`: "adaptive+fdr0.1" is the adaptive policy
    if not rule.tests_at_alpha:
        return DetectableGain(
            min_clean_fixes=1,
            with_one_broken=2,
            with_two_broken=3,
            share_of_split=1 / n_items,
            noise_items_per_evaluation=noise_items,
            line=(
                f"the literal policy has no significance test: any rise in kappa is kept, so on {n_items} items "
                "its A/A keep rate is its false-keep rate"
                + (
                    ""
                    if noise_items is None
                    else f"; the judge's noise flips ~{noise_items:.1f} items between two evaluations"
                )
            ),
        )
    clean, one, two = (min_fixes_to_keep(w, level) for w in (0, 1, 2))
    items = rule.items_right
    line = (
        f"on {n_items} items the {policy} policy (level {level:g}) keeps a candidate only if it newly gets at "
        f"least {clean} {items} while breaking none ({one} if it breaks one, {two} if two): "
        f"{clean / n_items:.0%} of the split at the least"
    )
    if noise_items is not None:
        line += f"; the judge's own noise flips ~{noise_items:.1f} items between two evaluations of identical prompts"
    return DetectableGain(
        min_clean_fixes=clean,
        with_one_broken=one,
        with_two_broken=two,
        share_of_split=clean / n_items,
        noise_items_per_evaluation=noise_items,
        line=line,
    )


POWER_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
POWER_TARGET = 0.8
POWER_TRIALS = 200


def _counts(right: np.ndarray, positive: np.ndarray) -> Counts:
    tp = int((right & positive).sum())
    tn = int((right & ~positive).sum())
    n_pos = int(positive.sum())
    return Counts(tp, n_pos - tp, tn, len(positive) - n_pos - tn)


def _majority_right(correct: np.ndarray, judgements: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Whether each item's majority is right (`metrics.majority_answer`: a tie is "failure", right on a negative)."""
    return (correct * 2 > judgements) | ((correct * 2 == judgements) & ~positive)


def simulated_keep_rate(
    positive: np.ndarray,
    q: np.ndarray,
    fix: int,
    loop: LoopSection,
    level: float,
    *,
    replicates: int = 1,
    trials: int = POWER_TRIALS,
    seed: int = 0,
) -> float:
    """The share of ``trials`` simulated candidates that fix ``fix`` items (made right on every judgement,
    chosen among the items the judge gets right less than half the time) and are kept, against a fresh
    incumbent, with item i judged right with probability ``q[i]`` on every call: the decision-power
    benchmark's ``sim1`` model on this judge's odds. Decided by `optimizer.stats.decision` (first pass of
    ``replicates`` judgements; under ``adaptive`` the disagreements re-judged ``loop.rejudge`` times)."""
    rng = np.random.default_rng(seed)
    n, k = len(q), replicates
    pool = np.flatnonzero(q < 0.5)
    if fix > len(pool):
        raise ValueError(f"only {len(pool)} items can be fixed, not {fix}")
    cfg = loop.model_copy(update={"alpha": level})
    literal_cfg = cfg.model_copy(update={"policy": "literal"})
    policy = policy_for(loop)
    r = policy.rejudge(loop)
    kept = 0
    for _ in range(trials):
        fixed = np.zeros(n, bool)
        fixed[rng.choice(pool, fix, replace=False)] = True
        q_c = np.where(fixed, 1.0, q)
        inc, cand = rng.binomial(k, q), rng.binomial(k, q_c)
        first = np.full(n, k)
        inc_right, cand_right = _majority_right(inc, first, positive), _majority_right(cand, first, positive)
        if not policy.rejudges:
            decision = decide_counts(
                _counts(inc_right, positive),
                _counts(cand_right, positive),
                int((~inc_right & cand_right).sum()),
                int((inc_right & ~cand_right).sum()),
                cfg,
            )
            kept += policy.keeps(decision)
            continue
        total = first.copy()
        if r:
            # Same label: the two majorities say different things exactly when one is right and the other not.
            disagree = inc_right != cand_right
            inc = inc + np.where(disagree, rng.binomial(r, q), 0)
            cand = cand + np.where(disagree, rng.binomial(r, q_c), 0)
            total = np.where(disagree, k + r, k)
        inc_all, cand_all = _majority_right(inc, total, positive), _majority_right(cand, total, positive)
        literal = decide_counts(
            _counts(inc_all, positive),
            _counts(cand_all, positive),
            int((~inc_all & cand_all).sum()),
            int((inc_all & ~cand_all).sum()),
            literal_cfg,
        )
        if not literal.literal_keep:
            continue
        diffs = [
            Fraction(int(c) - int(i), int(m)) for c, i, m in zip(cand, inc, total, strict=True) if c != i
        ]
        kept += adaptive_test(diffs).below(Fraction(repr(float(level))))
    return kept / trials


def power_at_noise(
    positive: np.ndarray,
    q: np.ndarray,
    loop: LoopSection,
    level: float,
    *,
    replicates: int = 1,
    trials: int = POWER_TRIALS,
    seed: int = 0,
) -> PowerAtNoise:
    """Simulated keep rates of D-item fixes at the judge's measured per-item odds ``q`` (`simulated_keep_rate`),
    for growing D until one is kept at least `POWER_TARGET` of the time: that D is the smallest gain this
    judge, split and policy detect reliably."""
    rates: dict[str, float] = {}
    smallest: int | None = None
    for d in POWER_SIZES:
        if d > int((q < 0.5).sum()):
            break
        rate = simulated_keep_rate(
            positive, q, d, loop, level, replicates=replicates, trials=trials, seed=seed + d
        )
        rates[str(d)] = rate
        if rate >= POWER_TARGET:
            smallest = d
            break
    return PowerAtNoise(
        keep_rate_by_fix=rates,
        target=POWER_TARGET,
        smallest_fix=smallest,
        trials=trials,
        fixable_items=int((q < 0.5).sum()),
        method="decision-power sim1 model on the per-item shares of correct A/A judgements",
    )


def benchmark_beside(policy: str, kept: int, repeats: int) -> BenchmarkBeside:
    """The benchmark's figures for ``policy`` and whether the observed A/A keep rate agrees with its
    fresh-incumbent no-op keep rate (the benchmark's figure inside the exact 95% interval of ours)."""
    row = BENCHMARK["policies"].get(policy)
    ref = None if row is None else BenchmarkReference.model_validate(row)
    if ref is None or repeats == 0:
        return BenchmarkBeside(
            policy=policy, reference=ref, agrees=None, source=BENCHMARK["source"], judge=BENCHMARK["judge"]
        )
    lo, hi = clopper_pearson_interval(kept, repeats)
    return BenchmarkBeside(
        policy=policy,
        reference=ref,
        source=BENCHMARK["source"],
        judge=BENCHMARK["judge"],
        interval=(lo, hi),
        agrees=lo <= ref.noop_fresh <= hi,
    )


def power_phrase(power: PowerAtNoise) -> str:
    rates = ", ".join(f"{d}: {rate:.0%}" for d, rate in power.keep_rate_by_fix.items())
    found = power.smallest_fix
    head = (
        f"at this noise the smallest fix kept {power.target:.0%} of the time is {found} items"
        if found
        else f"at this noise no fix of up to {max(map(int, power.keep_rate_by_fix), default=0)} items is kept "
        f"{power.target:.0%} of the time"
    )
    return f"{head} (simulated keep rate by items fixed — {rates}; {power.trials} trials each)"
