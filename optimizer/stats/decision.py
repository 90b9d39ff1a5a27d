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

The rules live in sibling modules, one per section, and are importable from here as before:
`optimizer.stats.rules` (the literal and paired rules, `Decision`), `optimizer.stats.bounds` (their
early-stopping bounds), `optimizer.stats.evidence` (the adaptive test and its record),
`optimizer.stats.adaptive` (the adaptive policy and its bound), `optimizer.stats.incremental` (the
bounds one item at a time), `optimizer.stats.cheaper` (cheaper, not worse) and
`optimizer.stats.multiplicity` (online FDR, waves).
"""

from __future__ import annotations

from optimizer.stats.adaptive import (
    Judgements,
    adaptive_stopped_decision,
    decide_adaptive,
    disagreements,
)
from optimizer.stats.bounds import (
    Observed,
    best_completion,
    fpr_provably_rose,
    kappa_provably_cannot_beat,
    stopped_decision,
)
from optimizer.stats.cheaper import (
    CHEAPER_TEST_MARK,
    CheaperTest,
    FprStopper,
    decide_cheaper,
    noninferiority_test,
)
from optimizer.stats.evidence import (
    AdaptiveTest,
    ItemShares,
    adaptive_test,
    evidence,
)
from optimizer.stats.incremental import (
    EarlyStopper,
)
from optimizer.stats.multiplicity import (
    WaveRank,
    decide_wave,
    holm,
    lord_level,
)
from optimizer.stats.rules import (
    Counts,
    Decision,
    Policy,
    Reason,
    ReasonRule,
    decide,
    decide_counts,
    detectable_gain_line,
    exact_fraction,
    fpr_within,
    kappa_clears,
    min_fixes_to_keep,
)

__all__ = [
    "CHEAPER_TEST_MARK",
    "AdaptiveTest",
    "CheaperTest",
    "Counts",
    "Decision",
    "EarlyStopper",
    "FprStopper",
    "ItemShares",
    "Judgements",
    "Observed",
    "Policy",
    "Reason",
    "ReasonRule",
    "WaveRank",
    "adaptive_stopped_decision",
    "adaptive_test",
    "best_completion",
    "decide",
    "decide_adaptive",
    "decide_cheaper",
    "decide_counts",
    "decide_wave",
    "detectable_gain_line",
    "disagreements",
    "evidence",
    "exact_fraction",
    "fpr_provably_rose",
    "fpr_within",
    "holm",
    "kappa_clears",
    "kappa_provably_cannot_beat",
    "lord_level",
    "min_fixes_to_keep",
    "noninferiority_test",
    "stopped_decision",
]
