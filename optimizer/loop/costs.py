"""What a candidate costs per verdict, and the cost rules (``[loop] cheaper_*``, ``[optimizer]
max_cost_ratio``): the judge's price, a pass's billed cost per paid verdict, a prompt set's estimated
cost per verdict before any call, the candidate / incumbent ratio, whether a candidate may be kept as
cheaper-not-worse, the decision after the cost rules, and the cost guard before any judge call.
Every figure is in US dollars (per verdict) or a ratio of two such figures."""

from __future__ import annotations

from collections.abc import Mapping

from optimizer.errors import UserError
from optimizer.evaluation.cascade import first_prompts, second_prompts
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.evaluation.results import EvalRun
from optimizer.judge.cascade import CascadeSettings
from optimizer.judge.criteria import verdict_calls
from optimizer.judge.estimate import steady_cost_usd
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers.pricing import Price, price_for, warm_cost_usd
from optimizer.judge.render import RenderOptions
from optimizer.judge.types import Provider
from optimizer.ledger import Experiment
from optimizer.loop.compare import Judgements
from optimizer.loop.context import RunContext
from optimizer.loop.validate import candidate_files
from optimizer.stats.decision import Decision, Reason, decide_cheaper

# Items rendered to estimate a prompt set's cost per verdict before it is evaluated.
ESTIMATE_ITEMS = 3


def judge_price(ctx: RunContext) -> Price | None:
    """The judge model's price; None when unknown or free (then no cost rule applies)."""
    price = price_for(ctx.settings.judge.model, ctx.ws.config.prices)
    if price is None or (price.input == 0 and price.output == 0):
        return None
    return price


def second_price(ctx: RunContext, cascade: CascadeSettings) -> Price | None:
    """A cascade's second judge's price (its own [cascade.second] prices over the workspace's); None when
    unknown or free."""
    price = price_for(cascade.second.model, {**ctx.ws.config.prices, **cascade.second.prices})
    return None if price is None or (price.input == 0 and price.output == 0) else price


def verdict_cost(ctx: RunContext, run: EvalRun) -> float | None:
    """A pass's cost per paid verdict (US dollars): its billed tokens priced warm (`warm_cost_usd`:
    a cache write at the read price) over the judgements that were not served by judgeloop's cache.
    A cascade: what its verdicts cost as made, each stage at its own judge's price, over all of them (a
    rule change reuses both judges' cached calls, yet each verdict still costs its stages' calls)."""
    if run.meta.cascade is not None:
        reps = [r for item in run.items for r in item.replicates]
        spent = sum(r.usage.cost_usd for r in reps)
        return spent / len(reps) if reps and spent > 0 else None
    price = judge_price(ctx)
    paid = sum(1 for item in run.items for r in item.replicates if not r.cached)
    if price is None or paid == 0 or run.usage.calls == 0:
        return None
    return warm_cost_usd(run.usage, price) / paid


def estimated_verdict_cost(
    ctx: RunContext, prompts: PromptSet, provider: Provider, output_tokens: int
) -> float | None:
    """A prompt set's expected cost per verdict before any call (`steady_cost_usd` over the split's
    first `ESTIMATE_ITEMS` items, every call of the verdict: `verdict_calls` — a panel's members, the
    criteria derivation and check, a review on the split's positive share; a cascade's first judge on
    every verdict and its second at its own price on the rule's `EscalationRule.estimated_share`); None
    for an agentic judge or an unknown price."""
    traits = provider.traits
    render = RenderOptions(
        text_only=traits.text_only,
        layout=traits.layout,
        image_cache_dir=ctx.ws.experiments_dir / IMAGE_CACHE_DIRNAME,
    )
    cascade = prompts.settings.cascade
    if prompts.settings.structure != "cascade" or cascade is None:
        return _estimate(ctx, prompts, render, judge_price(ctx), output_tokens)
    first = _estimate(ctx, first_prompts(prompts), render, judge_price(ctx), output_tokens)
    second_render = RenderOptions(image_cache_dir=render.image_cache_dir)
    second = _estimate(ctx, second_prompts(prompts), second_render, second_price(ctx, cascade), output_tokens)
    if first is None or second is None:
        return None
    return first + cascade.rule().estimated_share(_positive_share(ctx)) * second


def _positive_share(ctx: RunContext) -> float:
    split = ctx.split
    return sum(1 for t in split.ids if ctx.labels[t].is_positive) / len(split.ids)


def _estimate(
    ctx: RunContext, prompts: PromptSet, render: RenderOptions, price: Price | None, output_tokens: int
) -> float | None:
    split = ctx.split
    ids = split.ids[:ESTIMATE_ITEMS]
    if price is None or not ids or prompts.settings.mode != "direct":
        return None
    share = _positive_share(ctx)
    total = 0.0
    for tid in ids:
        calls = verdict_calls(
            split.trajectory(tid),
            split,
            prompts,
            success_share=share,
            replicates=ctx.settings.replicates,
            render=render,
        )
        total += sum(weight * steady_cost_usd(request, output_tokens, price) for request, weight in calls)
    return total / len(ids)


def estimated_ratio(
    ctx: RunContext, incumbent: Experiment, prompts: PromptSet, provider: Provider
) -> float | None:
    """Candidate / incumbent estimated cost per verdict (None when either cannot be estimated)."""
    if not incumbent.commit_sha:
        return None
    inc_prompts = PromptSet.from_rev(ctx.ws, incumbent.commit_sha)
    # Output: the incumbent's billed mean per call, else the cap (the same for both sides).
    out = incumbent.output_tokens // incumbent.calls if incumbent.calls else inc_prompts.settings.max_tokens
    try:
        inc = estimated_verdict_cost(ctx, inc_prompts, provider, out)
        cand = estimated_verdict_cost(ctx, prompts, provider, out)
    except UserError:
        return None
    return None if inc is None or cand is None or inc <= 0 else cand / inc


def estimated_evaluation_usd(ctx: RunContext, incumbent: Experiment, provider: Provider) -> float | None:
    """What a candidate like ``incumbent`` is estimated to cost if judged on every item of the split (US
    dollars), before any call: `estimated_verdict_cost` of its prompts times the split's items; when that
    cannot be estimated (an agentic judge, an unknown price), what the incumbent's own evaluation cost
    (None when that is nothing). Every item judged once: re-judging the disagreements costs more, cached
    calls and an early stop less."""
    if incumbent.commit_sha:
        prompts = PromptSet.from_rev(ctx.ws, incumbent.commit_sha)
        out = incumbent.output_tokens // incumbent.calls if incumbent.calls else prompts.settings.max_tokens
        try:
            per = estimated_verdict_cost(ctx, prompts, provider, out)
        except UserError:
            per = None
        if per is not None:
            return per * len(ctx.split.ids)
    return incumbent.cost_usd or None


def cheaper_eligible(
    ctx: RunContext, incumbent: Experiment, prompts: PromptSet, provider: Provider, *, propose_only: bool
) -> bool:
    """``[loop] cheaper_margin_items`` is on and the candidate is estimated cheaper by ``cheaper_min_saving``
    (never under ``propose_only``: a person decides, on the whole evaluation)."""
    loop = ctx.settings.loop
    if loop.cheaper_margin_items <= 0 or propose_only:
        return False
    ratio = estimated_ratio(ctx, incumbent, prompts, provider)
    return ratio is not None and 1 - ratio >= loop.cheaper_min_saving


def cost_rules(
    ctx: RunContext,
    decision: Decision,
    incumbent: Experiment,
    cost: float | None,
    judgements: tuple[Judgements, Judgements],
    *,
    level: float,
    experiment_id: int,
    cheaper: bool,
) -> Decision:
    """The decision after the cost rules: a candidate not kept may be kept as cheaper-not-worse
    (`decide_cheaper`, on the billed cost per verdict ``cost``); a keep over ``max_cost_ratio`` (billed)
    is rolled back. ``judgements``: the incumbent's and the candidate's, per item."""
    inc_cost = incumbent.verdict_cost_usd
    ratio = cost / inc_cost if cost is not None and inc_cost else None
    if cheaper and not decision.keep and not decision.early_stopped:
        if ratio is None:
            untested = "; cheaper: not tested (no billed cost per verdict to compare: served from the cache or unpriced)"
            why = decision.why
            return decision.model_copy(
                update={
                    "reason": decision.reason + untested,
                    "why": None if why is None else why.model_copy(update={"after": why.after + untested}),
                }
            )
        inc_judgements, cand_judgements = judgements
        test = decide_cheaper(
            ctx.labels,
            inc_judgements,
            cand_judgements,
            ctx.settings.loop,
            saving=1 - ratio,
            alpha=level,
            seed=ctx.decision_seed(experiment_id),
        )
        decision = decision.model_copy(
            update={
                "keep": test.keep,
                "keep_kind": "cheaper" if test.keep else None,
                "reason": decision.reason + "; " + test.reason,
                "why": test.why.model_copy(
                    update={"evidence": decision.reason + "; " + test.why.evidence, "earlier": decision.why}
                ),
            }
        )
    cap = ctx.ws.config.optimizer.max_cost_ratio
    if decision.keep and cap is not None and ratio is not None and ratio > cap:
        why = Reason(
            rule="cost_cap",
            kept=False,
            evidence=decision.reason
            + f"; but it costs {ratio:.2f}x the incumbent per verdict (billed), over "
            f"[optimizer] max_cost_ratio {cap:g}",
            earlier=decision.why,
        )
        decision = decision.model_copy(
            update={"keep": False, "keep_kind": None, "reason": why.text(), "why": why}
        )
    return decision


def cost_guard(
    ctx: RunContext, incumbent: Experiment, changed: Mapping[str, str | None], provider: Provider
) -> str | None:
    """Why the candidate is refused before any judge call under ``[optimizer] max_cost_ratio``
    (its estimated cost per verdict over that multiple of the incumbent's), or None."""
    cap = ctx.ws.config.optimizer.max_cost_ratio
    if cap is None:
        return None
    prompts = PromptSet.from_files(candidate_files(ctx.root, "HEAD", changed))
    ratio = estimated_ratio(ctx, incumbent, prompts, provider)
    if ratio is None or ratio <= cap:
        return None
    return (
        f"estimated at {ratio:.2f}x the incumbent's cost per verdict, over [optimizer] max_cost_ratio {cap:g}"
    )
