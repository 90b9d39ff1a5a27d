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
from dataclasses import dataclass, field, replace

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
        Answer(
            success=r.success,
            mistake_type=r.verdict.mistake_type if r.verdict else None,
            status="ok" if r.status == "ok" else ("infra_error" if r.status == "infra_error" else "invalid"),
        )
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


@dataclass(frozen=True)
class JudgingSetup:
    """Where and how a comparison judges: the workspace and dev ``split``, the ``judge`` and ``[loop]``
    settings, the provider and the judge-call cache; optionally the budget the calls are paid from, a
    progress callback, a stop request, and batch options (re-judging only: each prompt's pass one batch)."""

    ws: Workspace
    split: Split
    judge: JudgeSection
    loop_cfg: LoopSection
    provider: Provider
    cache: JudgeCache
    budget: Budget | None = None
    progress: ProgressFn | None = None
    stop: StopRequest | None = None
    batch: BatchOptions | None = None


async def rejudge(
    setup: JudgingSetup,
    *,
    items: Sequence[str],
    prompts: tuple[PromptSet, PromptSet],
    judgements: tuple[Judgements, Judgements],
    first_replicate: int,
) -> Rejudging:
    """Judge ``items`` ``setup.loop_cfg.rejudge`` more times under each of ``prompts`` (replicate indices
    ``first_replicate`` onwards, so a judgement asked for twice is paid once) and append them to
    ``judgements``; under ``setup.batch`` each prompt's pass is one batch. Stops at the first pass that is
    incomplete (infrastructure errors, budget)."""
    s = setup
    passes: list[EvalRun] = []
    budget_stop: str | None = None
    for side in prompts:
        extra = await evaluate_items(
            s.ws,
            s.split,
            side,
            s.judge,
            item_ids=items,
            replicates=s.loop_cfg.rejudge,
            first_replicate=first_replicate,
            options=PassOptions(
                budget=s.budget,
                progress=s.progress,
                provider=s.provider,
                cache=s.cache,
                infra_retry_rounds=s.loop_cfg.infra_retry_rounds,
                infra_retry_pause_s=s.loop_cfg.infra_retry_pause_s,
                batch=s.batch,
                stop=s.stop,
            ),
        )
        passes.append(extra)
        if extra.stop is not None and extra.stop.kind is StopKind.BUDGET:
            budget_stop = extra.stop.message
        failed = extra.infra_error_ids or extra.not_evaluated
        if failed or extra.stop is not None:
            why = extra.stop_reason or f"{len(failed)} item(s) hit infrastructure errors while re-judged"
            return Rejudging(
                passes,
                dict(judgements[0]),
                dict(judgements[1]),
                error=f"re-judging incomplete: {why}",
                budget_stop=budget_stop,
            )
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
        return (
            f"{len(result.infra_error_ids)} item(s) hit infrastructure errors after every retry "
            f"(e.g. {result.infra_error_ids[0]})"
        )
    if result.stop is not None or result.not_evaluated:
        return result.stop_reason or f"{len(result.not_evaluated)} item(s) not evaluated"
    return None


async def compare_prompts(
    setup: JudgingSetup,
    labels: Mapping[str, Label],
    base_prompts: PromptSet,
    other_prompts: PromptSet,
    *,
    replicates: int,
    seed: int = 0,
) -> Comparison:
    """Evaluate both prompt sets on every item of ``setup.split`` (``replicates`` judgements each), re-judge
    the items they disagree on, and test ``other`` against ``base`` with the adaptive policy's test at
    ``setup.loop_cfg.alpha`` (see `Comparison`). Nothing is decided on partial data: an evaluation cut by the
    budget or by infrastructure errors gives a `Comparison` with ``error`` set. ``setup.batch`` is not used
    (the first passes go call by call)."""
    s = setup
    split, loop_cfg = s.split, s.loop_cfg
    out = Comparison()
    results: list[EvalRun] = []
    for prompts in (base_prompts, other_prompts):
        result = await evaluate_items(
            s.ws,
            split,
            prompts,
            s.judge,
            item_ids=split.ids,
            replicates=replicates,
            options=PassOptions(
                budget=s.budget,
                progress=s.progress,
                provider=s.provider,
                cache=s.cache,
                infra_retry_rounds=loop_cfg.infra_retry_rounds,
                infra_retry_pause_s=loop_cfg.infra_retry_pause_s,
                stop=s.stop,
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
        # The first passes went call by call: so does their re-judging.
        rj = await rejudge(
            replace(setup, batch=None),
            items=out.rejudged,
            prompts=(base_prompts, other_prompts),
            judgements=(base_j, other_j),
            first_replicate=replicates,
        )
        out.runs.extend(rj.passes)
        if rj.error is not None:
            out.error, out.budget_stop = rj.error, rj.budget_stop
            return out
        base_j, other_j = rj.first, rj.second
    policy = loop_cfg.model_copy(update={"policy": "adaptive"})
    out.decision = decide_adaptive(
        labels, base_j, other_j, policy, first_pass=replicates, rejudged=out.rejudged, seed=seed
    )
    base_major = {t: majority_answer(js) for t, js in base_j.items() if t in labels}
    other_major = {t: majority_answer(js) for t, js in other_j.items() if t in labels}
    out.base_metrics, out.other_metrics = score(labels, base_major), score(labels, other_major)
    for tid in split.ids:
        right_before, right_after = (
            is_correct(labels[tid], base_major[tid]),
            is_correct(labels[tid], other_major[tid]),
        )
        if right_after and not right_before:
            out.fixed.append(tid)
        elif right_before and not right_after:
            out.broken.append(tid)
    return out
