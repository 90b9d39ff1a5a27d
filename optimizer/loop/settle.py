"""The last room of a candidate's life: a policy's decision recorded in git and the ledger.

`settle` is the one path for a single candidate and a wave's member: not decided (an incomplete
evaluation) → rolled back as an error; under ``propose_only`` → parked, waiting for a person; kept →
its commit finalised as the branch's tip; else rolled back (kept under ``refs/judgeloop/rejected/<id>``).
Every outcome's row holds the item verdicts and the decision (`record_evaluation`).
"""

from __future__ import annotations

from optimizer.events import CandidateDecided, Judged
from optimizer.judge.prompts import PromptSet
from optimizer.ledger import Experiment, ExperimentOutcome, ExperimentStatus
from optimizer.loop.context import RunContext
from optimizer.loop.records import Evaluated, Prepared, as_advice, decision_trailers, item_verdicts
from optimizer.stats.pooling import points_right_way
from optimizer.workspace import gitops


def record_evaluation(ctx: RunContext, exp_id: int, ev: Evaluated, outcome: ExperimentOutcome) -> Experiment:
    """The evaluation's item verdicts and its outcome in the ledger; the experiment's row as it ends."""
    ctx.ledger.record_verdicts(exp_id, item_verdicts(ev.run))
    return ctx.ledger.record_decision(exp_id, outcome)


def roll_back_unevaluable(
    ctx: RunContext, candidate: Prepared, incumbent_sha: str, invalid: str
) -> Experiment:
    """Roll back a committed candidate the judge cannot be run with (left by an older judgeloop, or a
    hand-made one on the branch), with the reason, so a resume goes on instead of failing forever."""
    exp_id, sha = candidate.experiment_id, candidate.commit_sha
    reason = f"cannot be evaluated: {invalid}; rolled back"
    rejected = gitops.roll_back(
        ctx.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, None, "error")
    )
    ctx.events(CandidateDecided(exp_id, "error", reason))
    return ctx.ledger.record_error(exp_id, reason, cost_usd=candidate.optimiser_cost_usd, commit_sha=rejected)


def settle(
    ctx: RunContext,
    candidate: Prepared,
    prompts: PromptSet,
    ev: Evaluated,
    incumbent_sha: str,
    *,
    propose_only: bool = False,
    pool_on: int | None = None,
) -> Experiment:
    """Record ``candidate``'s evaluation and decision, and keep, park or roll back its commit (checked
    out at the branch's tip); ``propose_only``: a decided candidate waits for a person instead; ``pool_on``:
    the incumbent whose pool a rolled-back candidate that points the right way joins (`optimizer.loop.stack`;
    None: no pooling), recorded with its decision in one transaction."""
    exp_id, sha = candidate.experiment_id, candidate.commit_sha
    prompt_hash = prompts.prompt_hash()

    def outcome(status: ExperimentStatus, reason: str, commit_sha: str | None = None) -> ExperimentOutcome:
        return ev.outcome(
            status,
            reason,
            extra_cost_usd=candidate.optimiser_cost_usd,
            commit_sha=commit_sha,
            prompt_hash=prompt_hash,
        )

    d = ev.decision
    if d is None:
        reason = f"not decided: {ev.error}; rolled back"
        rejected = gitops.roll_back(
            ctx.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, None, "error")
        )
        exp = record_evaluation(ctx, exp_id, ev, outcome("error", reason, rejected))
        ctx.events(CandidateDecided(exp_id, "error", reason))
        return exp
    if propose_only:
        waiting = f"waiting for a human decision; the {d.policy} policy says: {d.reason}"
        gitops.park_waiting(ctx.root, sha, exp_id)  # decidable whatever later moves the branch
        exp = record_evaluation(ctx, exp_id, ev, outcome("waiting", waiting))
        # Advice, not an outcome: the run's summary says once that it waits for `judgeloop decide`.
        ctx.events(
            CandidateDecided(exp_id, "waiting", as_advice(d.why, d.reason), policy=d.policy, commit_sha=sha)
        )
        return exp
    if d.keep:
        new_sha = gitops.finalize_kept(ctx.root, sha, decision_trailers(exp_id, ev.metrics, "kept"))
        exp = record_evaluation(ctx, exp_id, ev, outcome("kept", d.reason, new_sha))
    else:
        rejected = gitops.roll_back(
            ctx.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, ev.metrics, "rolled_back")
        )
        pooled = pool_on if pool_on is not None and points_right_way(d) else None
        reason = d.reason + ("; it points the right way: pooled for stacking" if pooled is not None else "")
        rolled_back = ev.outcome(
            "rolled_back",
            reason,
            extra_cost_usd=candidate.optimiser_cost_usd,
            commit_sha=rejected,
            prompt_hash=prompt_hash,
            pooled_on=pooled,
        )
        exp = record_evaluation(ctx, exp_id, ev, rolled_back)
    ctx.events(
        CandidateDecided(
            exp_id,
            "kept" if d.keep else "rolled_back",
            d.reason,
            judged=Judged(ev.calls, ev.run.cache_hits, ev.usage.cost_usd),
            cheaper=d.keep_kind == "cheaper",
        )
    )
    return exp
