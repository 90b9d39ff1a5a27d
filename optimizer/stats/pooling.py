"""Which rolled-back candidate points the right way (`[loop] stack`): the rule a candidate must meet to
join the pool of sub-threshold candidates that are merged and tested together. Pure.

A candidate points the right way when it was rolled back after a full decision (not stopped early by a
bound, not screened out by futility, not an error), and its estimates say "better, not worse" without the
test clearing: kappa up and FPR not up on the judgements it has (the literal rule: on per-item majorities
over every judgement under ``adaptive``, on the first pass under ``paired`` and ``literal``) and, when the
adaptive test was computed, a positive gain in items (Σ d > 0). Nothing here is a keep: a pooled
candidate is only ever kept as part of a merged candidate that clears the same policy on fresh judgements.
"""

from __future__ import annotations

from optimizer.stats.rules import Decision


def points_right_way(decision: Decision) -> bool:
    """True when a rolled-back, fully decided candidate's kappa estimate rose, its FPR estimate did not,
    and its adaptive gain (if computed) is positive (module docstring)."""
    if decision.keep or decision.early_stopped or decision.keep_kind is not None:
        return False
    estimates_up = (
        decision.majority_literal_keep
        if decision.majority_literal_keep is not None
        else decision.literal_keep
    )
    gain_up = decision.test is None or decision.test.statistic > 0
    return estimates_up and gain_up
