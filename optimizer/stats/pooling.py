"""Which rolled-back candidate points the right way (`[loop] stack`): the rule a candidate must meet to
join the pool of sub-threshold candidates that are merged and tested together. Pure.

A candidate points the right way when it was rolled back and its estimates say "better, not worse"
without the test clearing, either

- after a full decision: kappa up and FPR not up on the judgements it has (the literal rule: on per-item
  majorities over every judgement under ``adaptive``, on the first pass under ``paired`` and ``literal``)
  and, when the adaptive test was computed, a positive gain in items (Σ d > 0); or
- stopped early by the adaptive bound *only* because its gain could not become significant at alpha (even
  the best completion keeps kappa up and FPR not up) with more items fixed than broken so far: the exact
  bound stops every small real fix this way, so without this case nothing small would ever be pooled.

A candidate stopped by any other bound (FPR provably rose, kappa provably cannot rise) or screened out by
futility, an error, or a keep never points the right way. Nothing here is a keep: a pooled
candidate is only ever kept as part of a merged candidate that clears the same policy on fresh judgements.
"""

from __future__ import annotations

from optimizer.stats.rules import Decision


def points_right_way(decision: Decision) -> bool:
    """True when a rolled-back candidate's estimates point the right way (module docstring): decided in
    full with kappa up, FPR not up and a positive gain, or stopped by the adaptive bound only because its
    gain could not become significant, with more items fixed than broken."""
    if decision.keep or decision.keep_kind is not None:
        return False
    if decision.short_of_significance is not None:  # the adaptive bound stopped it
        return decision.short_of_significance
    if decision.early_stopped:  # another bound (FPR rose, kappa cannot rise) or futility's screen
        return False
    estimates_up = (
        decision.majority_literal_keep
        if decision.majority_literal_keep is not None
        else decision.literal_keep
    )
    gain_up = decision.test is None or decision.test.statistic > 0
    return estimates_up and gain_up
