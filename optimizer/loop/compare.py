"""Compare two prompt sets on the dev split as the adaptive policy does: a first pass under each, then
the items whose verdicts differ re-judged ``[loop] rejudge`` more times under both, then the sign-flip
test on the per-item shares of correct judgements (`optimizer.stats.decision.decide_adaptive`).

`rejudge` is the re-judging step the loop's runner shares (its incumbent's first pass comes from the
ledger); `compare_prompts` is the whole comparison for two prompt sets that are both evaluated through
the evaluator (attribution: the final prompts against the final prompts without one edit). Every call
goes through `evaluate_items`, so the judge-call cache, replicates and the budget behave as in a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from optimizer.devset.split import Split
from optimizer.evaluation.batch import BatchOptions
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.evaluation.stopping import StopRequest
from optimizer.events import ProgressSnapshot, StopKind
from optimizer.judge.prompts import PromptSet
from optimizer.judge.types import Provider
from optimizer.models import Label
from optimizer.stats.decision import Decision, decide_adaptive, disagreements
from optimizer.stats.metrics import Answer, Metrics, is_correct, majority_answer, score
from optimizer.workspace.config import JudgeSection, LoopSection
from optimizer.workspace.workspace import Workspace

Judgements = dict[str, list[Answer]]
ProgressFn = Callable[[ProgressSnapshot], None]


def judgements_of(item: ItemResult) -> list[Answer]:
    """An item's judgements (one `Answer` per replicate call, in replicate order)."""
    return [
        Answer(success=r.success, mistake_type=r.verdict.mistake_type if r.verdict else None,
               status="ok" if r.status == "ok" else ("infra_error" if r.status == "infra_error" else "invalid"))
        for r in item.replicates
    ]


def with_extra(judgements: Mapping[str, list[Answer]], extra: EvalRun) -> dict[str, list[Answer]]:
    """``judgements`` with a re-judging pass's judgements appended to the items it judged."""
    out = {tid: list(answers) for tid, answers in judgements.items()}
    for item in extra.items:
        out[item.trajectory_id] = out.get(item.trajectory_id, []) + judgements_of(item)
    return out


@dataclass
class Rejudging:
    """The re-judging passes (the first prompt set's, then the second's) and every judgement after them.

    ``error`` says why re-judging is incomplete (then the judgements are the ones before it);
    ``budget_stop`` is the evaluator's message when the budget refused a call.
    """

    passes: list[EvalRun]
    first: Judgements
    second: Judgements
    error: str | None = None
    budget_stop: str | None = None

    @property
    def cost_usd(self) -> float:
        return sum(p.cost_usd for p in self.passes)


async def rejudge(
    ws: Workspace, split: Split, judge: JudgeSection, loop_cfg: LoopSection, *,
    items: Sequence[str], prompts: tuple[PromptSet, PromptSet], judgements: tuple[Judgements, Judgements],
    first_replicate: int, provider: Provider, cache: JudgeCache, budget: Budget | None = None,
    progress: ProgressFn | None = None, batch: BatchOptions | None = None, stop: StopRequest | None = None,
) -> Rejudging:
    """Judge ``items`` ``loop_cfg.rejudge`` more times under each of ``prompts`` (replicate indices
    ``first_replicate`` onwards, so a judgement asked for twice is paid once) and append them to
    ``judgements``; under ``batch`` each prompt's pass is one batch. Stops at the first pass that is incomplete (infrastructure errors, budget)."""
    passes: list[EvalRun] = []
    budget_stop: str | None = None
    for side in prompts:
        extra = await evaluate_items(
            ws,
            split,
            side,
            judge,
            item_ids=items,
            replicates=loop_cfg.rejudge,
            first_replicate=first_replicate,
            options=PassOptions(
                budget=budget, progress=progress, provider=provider, cache=cache,
                infra_retry_rounds=loop_cfg.infra_retry_rounds,
                infra_retry_pause_s=loop_cfg.infra_retry_pause_s, batch=batch, stop=stop,
            ),
        )
        passes.append(extra)
        if extra.stop is not None and extra.stop.kind is StopKind.BUDGET:
            budget_stop = extra.stop.message
        failed = extra.infra_error_ids or extra.not_evaluated
        if failed or extra.stop is not None:
            why = extra.stop_reason or f"{len(failed)} item(s) hit infrastructure errors while re-judged"
            return Rejudging(passes, dict(judgements[0]), dict(judgements[1]),
                             error=f"re-judging incomplete: {why}", budget_stop=budget_stop)
    return Rejudging(passes, with_extra(judgements[0], passes[0]), with_extra(judgements[1], passes[1]))


class RunTotals:
    """Cost, paid calls and cache hits summed over a comparison's evaluations (``runs``)."""

    runs: list[EvalRun]

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_usd for r in self.runs)

    @property
    def calls(self) -> int:
        return sum(r.calls_made for r in self.runs)

    @property
    def cache_hits(self) -> int:
        return sum(r.cache_hits for r in self.runs)


@dataclass
class Comparison(RunTotals):
    """``other`` against ``base`` on every item of the split (``decision`` None when incomplete).

    ``base_metrics``/``other_metrics`` score each item's majority over all its judgements (re-judged
    items included); ``fixed``/``broken``: items right under ``other`` and wrong under ``base`` / the
    reverse, on the same majorities. ``decision.test.statistic`` is Σ over items of (share of
    ``other``'s judgements that are correct − ``base``'s), in items.
    """

    runs: list[EvalRun] = field(default_factory=list)  # every evaluation made, re-judging included
    decision: Decision | None = None
    base_metrics: Metrics | None = None
    other_metrics: Metrics | None = None
    fixed: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    rejudged: list[str] = field(default_factory=list)
    error: str | None = None
    budget_stop: str | None = None

    @property
    def items(self) -> float | None:
        """The contribution in items (Σ of per-item share differences), None when incomplete."""
        return None if self.decision is None or self.decision.test is None else self.decision.test.statistic


def incomplete(result: EvalRun) -> str | None:
    """Why an evaluation cannot be decided on (infrastructure errors, a stop, items left), or None."""
    if result.infra_error_ids:
        return (f"{len(result.infra_error_ids)} item(s) hit infrastructure errors after every retry "
                f"(e.g. {result.infra_error_ids[0]})")
    if result.stop is not None or result.not_evaluated:
        return result.stop_reason or f"{len(result.not_evaluated)} item(s) not evaluated"
    return None


async def compare_prompts(
    ws: Workspace, split: Split, labels: Mapping[str, Label], base_prompts: PromptSet, other_prompts: PromptSet,
    judge: JudgeSection, loop_cfg: LoopSection, *, replicates: int, provider: Provider, cache: JudgeCache,
    budget: Budget | None = None, progress: ProgressFn | None = None, seed: int = 0,
    stop: StopRequest | None = None,
) -> Comparison:
    """Evaluate both prompt sets on every item of ``split`` (``replicates`` judgements each), re-judge
    the items they disagree on, and test ``other`` against ``base`` with the adaptive policy's test at
    ``loop_cfg.alpha`` (see `Comparison`). Nothing is decided on partial data: an evaluation cut by the
    budget or by infrastructure errors gives a `Comparison` with ``error`` set."""
    out = Comparison()
    results: list[EvalRun] = []
    for prompts in (base_prompts, other_prompts):
        result = await evaluate_items(
            ws,
            split,
            prompts,
            judge,
            item_ids=split.ids,
            replicates=replicates,
            options=PassOptions(
                budget=budget, progress=progress, provider=provider, cache=cache,
                infra_retry_rounds=loop_cfg.infra_retry_rounds,
                infra_retry_pause_s=loop_cfg.infra_retry_pause_s, stop=stop,
            ),
        )
        out.runs.append(result)
        results.append(result)
        if result.stop is not None and result.stop.kind is StopKind.BUDGET:
            out.budget_stop = result.stop.message
        problem = incomplete(result)
        if problem is not None:
            out.error = problem
            return out
    base_run, other_run = results
    base_j = {item.trajectory_id: judgements_of(item) for item in base_run.items}
    other_j = {item.trajectory_id: judgements_of(item) for item in other_run.items}
    if loop_cfg.rejudge > 0:
        out.rejudged = disagreements(base_run.answers(), other_run.answers())
    if out.rejudged:
        rj = await rejudge(ws, split, judge, loop_cfg, items=out.rejudged, prompts=(base_prompts, other_prompts),
                           judgements=(base_j, other_j), first_replicate=replicates, provider=provider, cache=cache,
                           budget=budget, progress=progress, stop=stop)
        out.runs.extend(rj.passes)
        if rj.error is not None:
            out.error, out.budget_stop = rj.error, rj.budget_stop
            return out
        base_j, other_j = rj.first, rj.second
    policy = loop_cfg.model_copy(update={"policy": "adaptive"})
    out.decision = decide_adaptive(labels, base_j, other_j, policy, first_pass=replicates, rejudged=out.rejudged,
                                   seed=seed)
    base_major = {t: majority_answer(js) for t, js in base_j.items() if t in labels}
    other_major = {t: majority_answer(js) for t, js in other_j.items() if t in labels}
    out.base_metrics, out.other_metrics = score(labels, base_major), score(labels, other_major)
    for tid in split.ids:
        right_before, right_after = is_correct(labels[tid], base_major[tid]), is_correct(labels[tid], other_major[tid])
        if right_after and not right_before:
            out.fixed.append(tid)
        elif right_before and not right_after:
            out.broken.append(tid)
    return out
