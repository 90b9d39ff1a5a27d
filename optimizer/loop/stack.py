"""Stacking sub-threshold candidates (`[loop] stack = K`; 0 = off).

A candidate the policy rolls back may still point the right way (`optimizer.stats.pooling.points_right_way`:
fully decided, kappa estimate up, FPR estimate not up, a positive gain in items). With stacking on, `settle`
records such a candidate as pooled on its incumbent (the ledger's ``experiments.pooled_on``, written with its
decision, so ``--resume`` sees the pool); its commit stays under ``refs/judgeloop/rejected/<id>``. When the
incumbent's pool holds K candidates, the next candidate is not asked of the strategy: the K rejected commits
are merged onto the incumbent with git's three-way merge (`optimizer.workspace.merging`; an edit that
conflicts with the ones merged before it is left out and named), and the merged files go through the normal
propose path as one candidate of the ``stack`` strategy: the same guards, commit, evaluation and policy, one
test in the run's accounting (patience, ``--max-experiments``, online FDR). Its row's ``proposal_meta["stack"]``
records the pooled ids, the ones it carries and the ones left out; its commit carries a
``Judgeloop-Carries: <ids>`` trailer. A merged candidate is never pooled itself; its test uses the pool up
(kept or not), and a new incumbent starts an empty pool. Stacking applies to single candidates (``wave = 1``).

The null distribution is unchanged by this: the merged candidate is judged afresh against the same incumbent
and tested at the same level as any candidate, so a merge of edits that change nothing is kept at most
alpha's share of the time (`benchmarks/night.py` counts it over 200+ simulated nights).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from optimizer.ledger import Experiment
from optimizer.loop.context import RunContext
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.workspace.merging import merge_pooled

# The strategy name of a merged candidate's row (`Experiment.carries` reads only such rows).
STACK = "stack"
CARRIES_TRAILER = "Judgeloop-Carries"


@dataclass
class Stacked:
    """The merged candidate as a strategy that proposes it (its row's strategy is ``stack``)."""

    proposal: Proposal
    name: str = STACK

    async def propose(self, ctx: ProposalContext) -> Proposal:  # noqa: ARG002 - the merge is made already
        return self.proposal


def pool(ctx: RunContext, incumbent: Experiment) -> list[int]:
    """The ids pooled on ``incumbent`` that no merged candidate on it has used yet, oldest first."""
    rows = ctx.ledger.experiments(ctx.run.id)
    used: set[int] = set()
    for row in rows:
        if row.parent_id == incumbent.id and row.strategy == STACK:
            used |= set(row.stack_pooled)
    return [
        r.id for r in rows if r.pooled_on == incumbent.id and r.status == "rolled_back" and r.id not in used
    ]


def pool_target(ctx: RunContext, experiment_id: int, incumbent: Experiment) -> int | None:
    """The incumbent whose pool ``experiment_id`` joins if it is rolled back pointing the right way, or
    None: stacking off, a wave, or a merged candidate (never pooled again)."""
    loop = ctx.settings.loop
    if loop.stack == 0 or loop.wave > 1:
        return None
    return None if ctx.ledger.get_experiment(experiment_id).strategy == STACK else incumbent.id


def merged_candidate(ctx: RunContext, incumbent: Experiment) -> Stacked | None:
    """The incumbent's full pool merged as the next candidate, or None while it holds fewer than
    ``[loop] stack`` (or stacking is off)."""
    k = ctx.settings.loop.stack
    members = pool(ctx, incumbent)[:k] if k and ctx.settings.loop.wave == 1 else []
    if not k or len(members) < k or incumbent.commit_sha is None:
        return None
    merged = merge_pooled(ctx.root, incumbent.commit_sha, members)
    ids = ", ".join(str(i) for i in merged.carried) or "none"
    left = "; ".join(f"experiment {i} left out: {why}" for i, why in merged.left_out.items())
    rationale = (
        f"Stacking: experiments {', '.join(str(i) for i in members)} were each rolled back but pointed the right "
        f"way (kappa up, FPR not up); their edits merged onto the incumbent (carries {ids}) and tested as one "
        "candidate." + (f" {left}." if left else "")
    )
    meta = {
        "stack": {
            "pooled": members,
            "carries": merged.carried,
            "left_out": {str(i): why for i, why in merged.left_out.items()},
        }
    }
    files = {path: text for path, text in merged.files.items() if text is not None}
    return Stacked(Proposal(files=files, rationale=rationale, meta=meta))


def carries_trailers(strategy: str, meta: Mapping[str, object]) -> dict[str, object]:
    """The ``Judgeloop-Carries`` trailer of a merged candidate's commit (none for any other strategy, or for a
    record that is not a list of experiment ids)."""
    stack = meta.get("stack") if strategy == STACK else None
    carried = stack.get("carries") if isinstance(stack, dict) else None
    if not isinstance(carried, list) or not carried:
        return {}
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in carried):
        return {}
    return {CARRIES_TRAILER: ", ".join(str(i) for i in carried)}
