"""Running a cascade judge (judge.toml ``structure = "cascade"``, `optimizer.judge.cascade`): the first judge
judges every item, the escalation rule picks the items that go on, the second judge judges those alone.

Each stage is an ordinary pass of `optimizer.evaluation.evaluator` (its provider, the engine's cache,
budget, endpoints, stop request and batch machinery), so a stage's calls are cached and paid exactly as a
single judge's: re-evaluating a candidate that changed only the second judge's files re-pays only the second
stage. The final `ItemResult` of an escalated item is the second judge's, each replicate's usage holding
both stages' calls and its verdict the cascade's record (`CASCADE_KEY`: the rule, the first verdict);
an item that stays is the first judge's with the same record. Judge-input side: never reads labels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from optimizer.errors import UserError
from optimizer.evaluation.files import redacted_url, settings_record
from optimizer.evaluation.results import EvalRun, ItemResult, ReplicateResult
from optimizer.events import StopKind, StopReason
from optimizer.judge.cascade import CASCADE_KEY, EscalationRule, cascade_record
from optimizer.judge.memory import EMPTY_MEMORY
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers.pricing import Price
from optimizer.judge.types import Provider
from optimizer.models import Verdict
from optimizer.workspace.config import JudgeSection

# One stage's pass (`optimizer.evaluation.evaluator.evaluate_single` with the caller's options): the stage's
# prompts, judge section, items, provider (None: the caller's) and prices over the workspace's.
StageRun = Callable[
    [PromptSet, JudgeSection, Sequence[str], Provider | None, Mapping[str, Price] | None], Awaitable[EvalRun]
]


def first_prompts(prompts: PromptSet) -> PromptSet:
    """The prompt set the first judge judges with: the workspace's, as a single judge."""
    settings = prompts.settings.model_copy(update={"structure": "single", "cascade": None})
    return dataclasses.replace(prompts, settings=settings)


def second_prompts(prompts: PromptSet) -> PromptSet:
    """The prompt set the second judge judges with: its own judge.md and rubric.md, judge.toml's
    rendering settings, its own mode; no panel, review or memory (those are the first judge's)."""
    cascade = prompts.settings.cascade
    if cascade is None:
        raise ValueError("second_prompts: this prompt set has no [cascade]")
    judge_md, rubric_md = (prompts.files[p] for p in cascade.files())
    settings = prompts.settings.model_copy(
        update={
            "structure": "single",
            "cascade": None,
            "mode": cascade.second.mode,
            "panel": None,
            "review": "off",
            "memory": "off",
        }
    )
    return dataclasses.replace(
        prompts, judge_md=judge_md, rubric_md=rubric_md, settings=settings, memory=EMPTY_MEMORY
    )


def escalated_items(run: EvalRun, rule: EscalationRule) -> list[str]:
    """The items of a first-stage pass the rule sends on, in the pass's order (an infrastructure error
    never goes on: it is judged again next time)."""
    out = []
    for item in run.items:
        if item.infra_error:
            continue
        confidence = item.verdict.confidence if item.verdict is not None else None
        if rule.escalates(item.answer.success, confidence, split=panel_split(item)):
            out.append(item.trajectory_id)
    return out


def panel_split(item: ItemResult) -> bool:
    """Whether the first judge is a panel (judge.toml [panel]) whose members did not all give the same
    answer on the item, in any replicate (a member whose reply did not parse counts as a different answer)."""
    for rep in item.replicates:
        answers = {None if m.verdict is None else m.verdict.success for m in rep.members}
        if len(answers) > 1:
            return True
    return False


def _with_record(verdict: Verdict | None, record: dict[str, Any]) -> Verdict | None:
    if verdict is None:
        return None
    return Verdict.model_validate({**verdict.model_dump(), CASCADE_KEY: record})


def _stay(item: ItemResult, rule: EscalationRule) -> ItemResult:
    """A first-stage item that is final: its verdicts carry the record (not escalated)."""
    first = None if item.verdict is None else item.verdict.model_dump()
    record = cascade_record(rule, first, escalated=False, first_status=item.answer.status)
    reps = [
        dataclasses.replace(
            r, verdict=_with_record(r.verdict, {**record, "first_cost_usd": r.usage.cost_usd})
        )
        for r in item.replicates
    ]
    return dataclasses.replace(item, replicates=reps, verdict=_with_record(item.verdict, record))


def _merge(first: ItemResult, second: ItemResult, rule: EscalationRule) -> ItemResult:
    """An escalated item: the second judge's answer, every replicate's usage both stages' calls, and
    the first verdict in the record."""
    record = cascade_record(
        rule,
        None if first.verdict is None else first.verdict.model_dump(),
        escalated=True,
        first_status=first.answer.status,
    )
    reps: list[ReplicateResult] = []
    for k, rep in enumerate(second.replicates):
        mine = first.replicates[k] if k < len(first.replicates) else None
        costs = {
            "first_cost_usd": 0.0 if mine is None else mine.usage.cost_usd,
            "second_cost_usd": rep.usage.cost_usd,
        }
        reps.append(
            dataclasses.replace(
                rep,
                verdict=_with_record(rep.verdict, {**record, **costs}),
                usage=rep.usage if mine is None else rep.usage + mine.usage,
                cached=rep.cached and (mine is None or mine.cached),
                duration_s=rep.duration_s + (0.0 if mine is None else mine.duration_s),
            )
        )
    return dataclasses.replace(
        second,
        replicates=reps,
        verdict=_with_record(second.verdict, record),
        notes=(*first.notes, *second.notes),
        duration_s=first.duration_s + second.duration_s,
    )


def stage_figures(run: EvalRun) -> dict[str, Any]:
    """One stage's figures for the results and the report: calls made now, what they cost now (US
    dollars), cache hits, and what its verdicts cost as made (cached ones included)."""
    return {
        "items": len(run.items),
        "calls": run.usage.calls,
        "cost_usd": round(run.usage.cost_usd, 6),
        "cache_hits": run.cache_hits,
        "cost_usd_as_made": round(sum(item.usage.cost_usd for item in run.items), 6),
    }


async def evaluate_cascade(
    prompts: PromptSet,
    judge: JudgeSection,
    item_ids: Sequence[str],
    run_stage: StageRun,
    *,
    on_item: Callable[[ItemResult], bool] | None,
    batch: bool,
) -> EvalRun:
    """Judge ``item_ids`` with the cascade ``prompts`` sets (see the module docstring); `evaluate_items`'s
    contract, each stage a ``run_stage`` pass. ``on_item`` is asked about each final item in order once both
    stages are done (the rest are left out once it returns True); ``judge`` is the first judge's section; the
    second judge's provider is made here from ``[cascade.second]`` and closed at the end. ``batch``: the
    passes go through the providers' batch APIs (refused before any call when the second judge has none)."""
    from optimizer.judge.providers import make_provider

    cascade = prompts.settings.cascade
    if cascade is None:
        raise ValueError("evaluate_cascade: the prompt set has no [cascade]")
    rule = cascade.rule()
    second_section = cascade.second.section()
    second_provider = make_provider(second_section)
    try:
        if batch and (second_provider.traits.batch is None or cascade.second.mode != "direct"):
            raise UserError(
                f"--batch: the cascade's second judge ([cascade.second] provider = {second_section.provider}, mode = "
                f"{cascade.second.mode}) cannot judge through a batch API; drop --batch or make it a direct "
                "anthropic or openai judge"
            )
        first = await run_stage(first_prompts(prompts), judge, item_ids, None, None)
        escalated = escalated_items(first, rule) if first.stop is None else []
        second = await run_stage(
            second_prompts(prompts), second_section, escalated, second_provider, cascade.second.prices
        )
    finally:
        await second_provider.aclose()
    return _combine(first, second, prompts, item_ids, on_item)


def _combine(
    first: EvalRun,
    second: EvalRun,
    prompts: PromptSet,
    item_ids: Sequence[str],
    on_item: Callable[[ItemResult], bool] | None,
) -> EvalRun:
    assert prompts.settings.cascade is not None
    rule = prompts.settings.cascade.rule()
    by_first = {item.trajectory_id: item for item in first.items}
    by_second = {item.trajectory_id: item for item in second.items}
    escalated = set(escalated_items(first, rule)) if first.stop is None else set()
    items: list[ItemResult] = []
    stop = first.stop or second.stop
    for tid in item_ids:
        if tid not in by_first or (tid in escalated and tid not in by_second):
            continue
        item = _merge(by_first[tid], by_second[tid], rule) if tid in escalated else _stay(by_first[tid], rule)
        items.append(item)
        if on_item is not None and on_item(item) and stop is None:
            stop = StopReason(StopKind.EARLY_STOP, "stopped early: the caller's stopping rule was met")
            break
    done = {item.trajectory_id for item in items}
    judged = len([t for t in by_first if not by_first[t].infra_error])
    share = len(escalated) / judged if judged else 0.0
    meta = second.meta
    record = {
        "rule": rule.describe(),
        "escalated": len(escalated),
        "judged": judged,
        "escalation_share": round(share, 4),
        "second": {
            "provider": meta.provider,
            "model": meta.model,
            "base_url": redacted_url(meta.base_url),
            "prompt_hash": meta.prompt_hash,
        },
        "stages": {"first": stage_figures(first), "second": stage_figures(second)},
    }
    notes = [
        *first.notes,
        f"cascade: {len(escalated)} of {judged} items escalated ({share:.0%}, rule {rule.describe()}) to "
        f"{meta.provider} {meta.model}",
        *(f"second judge: {note}" for note in second.notes),
    ]
    return EvalRun(
        items=items,
        usage=first.usage + second.usage,
        cache_hits=first.cache_hits + second.cache_hits,
        duration_s=first.duration_s + second.duration_s,
        stop=stop,
        notes=notes,
        not_evaluated=[tid for tid in item_ids if tid not in done],
        item_ids=list(item_ids),
        cache_reads=first.cache_reads,
        meta=dataclasses.replace(first.meta, cascade=record, settings=settings_record(prompts)),
        endpoints=first.endpoints,
    )
