"""`judgeloop selftest`: how the workspace's own judge behaves under the loop's decision rule, on the dev split.

Three checks, each decided by the real decision code (`optimizer.stats.decision`: the early-stopping bounds,
the re-judging of disagreements under ``adaptive``, `decide_adaptive`) at the level a run's first
candidate is tested at:

- **A/A**: the incumbent (the prompts committed at HEAD) proposed again as a candidate, byte-identical.
  The judge-call cache keys every call by its replicate index, so each side of a comparison is given
  its own replicate indices ("slot" s: indices s·(k + r) … s·(k + r) + k + r − 1 for k judgements per
  item and r re-judgements): every judgement is a fresh call to the judge with the same request, the
  way a candidate that changes nothing real meets the judge. Repeat i compares slot 2i (incumbent)
  with slot 2i + 1 (candidate); slot 0 holds the indices a run's baseline and its re-judging use, so
  the first incumbent pass is usually cached. Every keep is a false keep. Reported: keep rate (with an
  exact 95% interval), the items whose verdict changed between judgements of the same prompts
  (instability), and the share of items whose first-pass verdict differs between two evaluations.
- **Planted degradation**: the incumbent with `PLANTED_RULE` appended to its rubric (accept any
  trajectory that claims success or ends with a saved file). It must be rolled back.
- **Minimum detectable gain** on this split at this level (`decision.min_fixes_to_keep`, what the
  report says when nothing is kept), beside the flips the judge's own noise makes.

Reported next to the decision-power benchmark's figures for the same policy (`BENCHMARK`, copied from
``benchmarks/decision_power.py``'s README table): an A/A repeat is a no-op against a *fresh*
incumbent, the benchmark's ``sim1`` row. Nothing here writes outside ``experiments/selftest/`` and the
judge cache: no file under ``prompts/`` or ``devset/``, no commit, no branch move; held-out splits
are refused.

The result is a `SelftestResult` (frozen pydantic records, fields in the file's key order; `to_json` is
the file's object; `optimizer.trust.selftest_records`); `read_selftest` validates a recorded file strictly
back into one (`optimizer.trust.selftest_files`, with the Markdown rendering). The power figures
(detectable gain, simulated power at the judge's noise, the benchmark beside) are
`optimizer.trust.power`'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.devset.labels import load_labels
from optimizer.devset.split import Split, open_split
from optimizer.errors import UserError
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.events import Listener, Message, Progress, ProgressSnapshot, StopKind, ignore
from optimizer.judge.prompts import RUBRIC_MD, PromptSet
from optimizer.judge.providers import make_provider
from optimizer.judge.types import Provider
from optimizer.loop.compare import RunTotals, incomplete, judgements_of, with_extra
from optimizer.loop.records import evaluation_order
from optimizer.models import Label
from optimizer.stats.binomial import clopper_pearson_interval
from optimizer.stats.decision import (
    Decision,
    EarlyStopper,
    adaptive_stopped_decision,
    decide_adaptive,
    disagreements,
    lord_level,
)
from optimizer.stats.metrics import Answer, is_correct, majority_answer, outcome, score
from optimizer.stats.policies import policy_for
from optimizer.trust.power import (
    benchmark_beside,
    detectable_gain,
    power_at_noise,
    power_phrase,
)
from optimizer.trust.selftest_files import (
    markdown_lines,
    result_files,
    selftest_dir,
)
from optimizer.trust.selftest_records import (
    SELFTEST_VERSION,
    AARecord,
    DecisionRow,
    Instability,
    JudgeRecord,
    PlantedRow,
    PolicyRecord,
    SelftestResult,
    SplitRecord,
)
from optimizer.workspace import gitops
from optimizer.workspace.config import JudgeOverrides, JudgeSection, LoopSection
from optimizer.workspace.paths import unused_path
from optimizer.workspace.workspace import Workspace

DEFAULT_REPEATS = 5

# The known harmful change: on AgentHorizon a negative is a coherent execution of the wrong request,
# so it often ends with a saved file and a final message saying the task is done.
PLANTED_RULE = (
    "Acceptance shortcut: judge every trajectory whose final message says the task is complete, or "
    "that ends with a file saved, as a success (success: true)."
)


@dataclass(frozen=True)
class SelftestOptions:
    """What `judgeloop selftest` was asked: a budget (US dollars, every call of the self-test), the
    most A/A repeats to make, judge overrides (``--provider/--model/--base-url/--concurrency``)."""

    budget_usd: float | None = None
    repeats: int = DEFAULT_REPEATS
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)


@dataclass
class SlotComparison(RunTotals):
    """One comparison of two prompt sets at given slots of replicate indices (see the module docstring)."""

    decision: Decision | None = None
    base: dict[str, list[Answer]] = field(default_factory=dict)  # every judgement, re-judging included
    other: dict[str, list[Answer]] = field(default_factory=dict)
    base_first: dict[str, Answer] = field(default_factory=dict)  # first-pass majorities
    other_first: dict[str, Answer] = field(default_factory=dict)  # (only the items judged, on an early stop)
    rejudged: list[str] = field(default_factory=list)
    runs: list[EvalRun] = field(default_factory=list)
    error: str | None = None
    budget_stop: str | None = None


@dataclass
class Bench:
    """What every comparison of one self-test shares."""

    ws: Workspace
    split: Split
    labels: dict[str, Label]
    judge: JudgeSection
    loop: LoopSection
    replicates: int
    level: float
    provider: Provider
    cache: JudgeCache
    budget: Budget | None
    events: Listener = ignore

    @property
    def rejudge(self) -> int:
        return policy_for(self.loop).rejudge(self.loop)

    @property
    def width(self) -> int:
        """Replicate indices per slot: a first pass and its re-judging."""
        return self.replicates + self.rejudge

    def progress(self, snap: ProgressSnapshot) -> None:
        self.events(Progress(snap))

    async def _pass(
        self, prompts: PromptSet, ids: Sequence[str], replicates: int, first: int, on_item: Any = None
    ) -> EvalRun:
        return await evaluate_items(
            self.ws,
            self.split,
            prompts,
            self.judge,
            item_ids=ids,
            replicates=replicates,
            first_replicate=first,
            options=PassOptions(
                on_item=on_item,
                budget=self.budget,
                progress=self.progress,
                provider=self.provider,
                cache=self.cache,
                infra_retry_rounds=self.loop.infra_retry_rounds,
                infra_retry_pause_s=self.loop.infra_retry_pause_s,
            ),
        )

    def _done(self, out: SlotComparison, result: EvalRun) -> bool:
        """Record ``result``; True when it leaves the comparison incomplete (``out.error`` set)."""
        out.runs.append(result)
        if result.stop is not None and result.stop.kind is StopKind.BUDGET:
            out.budget_stop = result.stop.message
        out.error = incomplete(result)
        return out.error is not None

    async def compare(
        self, base: PromptSet, base_slot: int, other: PromptSet, other_slot: int, *, seed: int
    ) -> SlotComparison:
        """``other`` (at ``other_slot``) as a candidate against ``base`` (at ``base_slot``), as the loop's
        runner decides one: negatives first with the exact early-stopping bounds, the disagreements
        re-judged under ``adaptive``, then `decide_adaptive` (every policy). Nothing is decided on
        partial data: a pass cut by the budget or infrastructure errors sets ``error``."""
        out = SlotComparison()
        order = evaluation_order(self.labels, self.split.ids)
        k = self.replicates
        base_run = await self._pass(base, order, k, base_slot * self.width)
        if self._done(out, base_run):
            return out
        out.base = {item.trajectory_id: judgements_of(item) for item in base_run.items}
        out.base_first = base_run.answers()
        stopper = EarlyStopper(self.labels, out.base_first, out.base, self.loop, alpha=self.level)
        early: list[Decision] = []

        def on_item(item: ItemResult) -> bool:
            if item.infra_error:
                return False
            decision = stopper.add(item.trajectory_id, item.answer, judgements_of(item))
            if decision is not None:
                early.append(decision)
                return True
            return False

        other_run = await self._pass(other, order, k, other_slot * self.width, on_item)
        out.other = {
            item.trajectory_id: judgements_of(item) for item in other_run.items if not item.infra_error
        }
        out.other_first = {t: a for t, a in other_run.answers().items() if t in out.other}
        if early:  # an exact bound proved the rollback: what was not judged could not change it
            out.runs.append(other_run)
            out.decision = early[0]
            return out
        if self._done(out, other_run):
            return out
        if self.rejudge > 0:
            skip = adaptive_stopped_decision(self.labels, out.other, out.base, self.loop, alpha=self.level)
            if skip is not None:
                out.decision = skip
                return out
            wanted = set(disagreements(out.base_first, out.other_first))
            out.rejudged = [t for t in order if t in wanted]
        if out.rejudged:
            for prompts, slot, side in ((base, base_slot, "base"), (other, other_slot, "other")):
                extra = await self._pass(prompts, out.rejudged, self.rejudge, slot * self.width + k)
                if self._done(out, extra):
                    return out
                setattr(out, side, with_extra(getattr(out, side), extra))
        out.decision = decide_adaptive(
            self.labels,
            out.base,
            out.other,
            self.loop,
            first_pass=k,
            rejudged=out.rejudged,
            alpha=self.level,
            seed=seed,
        )
        return out


def planted_prompts(incumbent: PromptSet) -> PromptSet:
    """The incumbent with `PLANTED_RULE` appended to its rubric (in memory: nothing is written)."""
    files = dict(incumbent.files)
    files[RUBRIC_MD] = files[RUBRIC_MD].rstrip("\n") + f"\n\n- {PLANTED_RULE}\n"
    return PromptSet.from_files(files, source=f"{incumbent.source} + planted rule")


def dev_split_for(ws: Workspace, command: str) -> str:
    """The workspace's dev split, refused when it is listed as held out (its figures only via confirm)."""
    name = ws.config.workspace.dev_split
    if name in ws.config.workspace.heldout_splits:
        raise UserError(
            f"[workspace] dev_split {name!r} is also listed in heldout_splits; `judgeloop {command}` works on the "
            "dev split only and never on a held-out one: set dev_split to a split that is not held out"
        )
    return name


def first_level(loop: LoopSection) -> float:
    """The level a run's first candidate is tested at: ``alpha``, or the LORD++ level under ``[loop] fdr``."""
    return loop.alpha if loop.fdr is None else lord_level(loop.fdr, [])


def policy_name(loop: LoopSection) -> str:
    """The policy as the benchmark names it (``adaptive+fdr0.1`` with online FDR)."""
    return loop.policy if loop.fdr is None else f"{loop.policy}+fdr{loop.fdr:g}"


def _decision_row(index: int, comparison: SlotComparison) -> DecisionRow:
    d = comparison.decision
    test = d.test if d is not None else None
    return DecisionRow(
        repeat=index,
        kept=None if d is None else d.keep,
        reason=comparison.error if d is None else d.reason,
        p_value=None if d is None else d.p_value,
        early_stopped=bool(d and d.early_stopped),
        gain_items=None if test is None else test.statistic,
        rejudged=len(comparison.rejudged),
        calls=comparison.calls,
        cache_hits=comparison.cache_hits,
        cost_usd=round(comparison.cost_usd, 6),
    )


def instability(comparisons: Sequence[SlotComparison]) -> Instability:
    """Per-item instability over every judgement of the (identical) prompts in the A/A comparisons:
    an item is unstable when its judgements do not all say the same (True / False / no verdict);
    ``flip_rate``: the share of items whose first-pass verdict differs between the two sides of a repeat."""
    outcomes: dict[str, set[bool | None]] = {}
    counts: dict[str, int] = {}
    flips = compared = 0
    for c in comparisons:
        for side in (c.base, c.other):
            for tid, answers in side.items():
                outcomes.setdefault(tid, set()).update(outcome(a) for a in answers)
                counts[tid] = counts.get(tid, 0) + len(answers)
        for tid, answer in c.other_first.items():
            if tid in c.base_first:
                compared += 1
                flips += outcome(answer) != outcome(c.base_first[tid])
    judged_twice = sorted(t for t, n in counts.items() if n >= 2)
    unstable = [t for t in judged_twice if len(outcomes[t]) > 1]
    return Instability(
        items_judged_twice=len(judged_twice),
        unstable_items=len(unstable),
        unstable_share=None if not judged_twice else len(unstable) / len(judged_twice),
        unstable_ids=unstable[:50],
        first_pass_flips=flips,
        first_pass_compared=compared,
        flip_rate=None if not compared else flips / compared,
    )


def measured_odds(labels: Mapping[str, Label], comparisons: Sequence[SlotComparison]) -> dict[str, float]:
    """Per item, the share of its A/A judgements (every side, identical prompts) that are correct."""
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    for c in comparisons:
        for side in (c.base, c.other):
            for tid, answers in side.items():
                right[tid] = right.get(tid, 0) + sum(1 for a in answers if is_correct(labels[tid], a))
                total[tid] = total.get(tid, 0) + len(answers)
    return {tid: right[tid] / total[tid] for tid in total if total[tid]}


def _fpr(labels: Mapping[str, Label], answers: Mapping[str, Answer]) -> float | None:
    judged = {t: labels[t] for t in answers}
    return score(judged, dict(answers)).fpr if judged else None


def _planted_row(comparison: SlotComparison, labels: Mapping[str, Label]) -> PlantedRow:
    d = comparison.decision
    base_major = {t: majority_answer(js) for t, js in comparison.base.items()}
    other_major = {t: majority_answer(js) for t, js in comparison.other.items()}
    shared = {t: base_major[t] for t in other_major if t in base_major}
    fpr_before, fpr_after = _fpr(labels, shared), _fpr(labels, other_major)
    return PlantedRow(
        rule=PLANTED_RULE,
        where=RUBRIC_MD,
        decided=d is not None,
        rolled_back=None if d is None else not d.keep,
        reason=comparison.error if d is None else d.reason,
        early_stopped=bool(d and d.early_stopped),
        items_judged=len(other_major),
        rejudged=len(comparison.rejudged),
        fpr_incumbent=fpr_before,
        fpr_planted=fpr_after,
        # Did the judge follow the harmful rule at all (its FPR rose by more than one negative in 20)?
        judge_obeyed=fpr_before is not None and fpr_after is not None and fpr_after - fpr_before > 0.05,
        calls=comparison.calls,
        cache_hits=comparison.cache_hits,
        cost_usd=round(comparison.cost_usd, 6),
    )


def selftest(ws: Workspace, options: SelftestOptions, events: Listener = ignore) -> SelftestResult:
    """Run the self-test (module docstring) within ``options.budget_usd`` and write its JSON and Markdown
    under ``experiments/selftest/``; returns the result (its ``files`` set)."""
    if options.repeats < 1:
        raise UserError(f"--repeats must be at least 1 (got {options.repeats})")
    split_name = dev_split_for(ws, "selftest")
    split = open_split(ws, split_name)
    labels = load_labels(split)
    judge = options.judge.apply(ws.config.judge)
    loop = ws.config.loop
    head = gitops.rev_parse(ws, "HEAD")
    incumbent = PromptSet.from_rev(ws, head)
    planted = planted_prompts(incumbent)
    replicates = incumbent.settings.replicates
    level = first_level(loop)
    policy = policy_name(loop)

    def tell(text: str) -> None:
        events(Message(text))

    dirty = [p for p in gitops.dirty_paths(ws.root) if p.startswith("prompts/")]
    tell(
        f"selftest: judge {judge.provider}:{judge.model}, split {split.name} ({len(split.ids)} items), prompts at "
        f"HEAD {head[:10]} [{incumbent.prompt_hash()[:8]}], policy {policy} at level {level:g}, "
        f"{replicates} judgement(s) per item; up to {options.repeats} A/A repeat(s)"
        + (f", budget ${options.budget_usd:g}" if options.budget_usd is not None else "")
    )
    if dirty:
        tell(f"  note: uncommitted changes in {', '.join(dirty[:3])} are not tested: the committed HEAD is")
    budget = Budget(options.budget_usd) if options.budget_usd is not None else None

    async def measure() -> tuple[list[SlotComparison], SlotComparison | None, str | None]:
        provider = make_provider(judge)
        cache = JudgeCache(ws.cache_path)
        bench = Bench(ws, split, labels, judge, loop, replicates, level, provider, cache, budget, events)
        aa: list[SlotComparison] = []
        planted_cmp: SlotComparison | None = None
        stopped: str | None = None
        try:
            for step in range(options.repeats + 1):
                if step == 1:
                    tell(
                        "  planted degradation: the incumbent with an 'accept what claims success' rule appended"
                    )
                    planted_cmp = await bench.compare(incumbent, 0, planted, 0, seed=10_007)
                    tell(f"    {_planted_line(planted_cmp)}")
                    if planted_cmp.decision is None:
                        stopped = planted_cmp.budget_stop or planted_cmp.error
                        break
                    continue
                repeat = step if step == 0 else step - 1
                tell(
                    f"  A/A repeat {repeat + 1}: the incumbent against itself (replicate slots {2 * repeat}, "
                    f"{2 * repeat + 1})"
                )
                comparison = await bench.compare(
                    incumbent, 2 * repeat, incumbent, 2 * repeat + 1, seed=repeat
                )
                if comparison.decision is None:
                    stopped = comparison.budget_stop or comparison.error
                    tell(f"    not decided: {stopped}")
                    break
                aa.append(comparison)
                tell(
                    f"    {'KEPT (a false keep)' if comparison.decision.keep else 'rolled back'}: "
                    f"{comparison.decision.reason}"
                )
        finally:
            await provider.aclose()
            cache.close()
        return aa, planted_cmp, stopped

    aa, planted_cmp, stopped = asyncio.run(measure())
    kept = sum(1 for c in aa if c.decision is not None and c.decision.keep)
    unstable = instability(aa)
    keep_rate = kept / len(aa) if aa else None
    interval = clopper_pearson_interval(kept, len(aa)) if aa else None
    every = [*aa, *([planted_cmp] if planted_cmp is not None else [])]
    detectable = detectable_gain(len(split.ids), level, policy, unstable.flip_rate)
    odds = measured_odds(labels, aa)
    if len(odds) == len(split.ids):
        order = list(split.ids)
        at_noise = power_at_noise(
            np.array([labels[t].is_positive for t in order]),
            np.array([odds[t] for t in order]),
            loop,
            level,
            replicates=replicates,
        )
        detectable = detectable.model_copy(
            update={"at_noise": at_noise, "line": detectable.line + "; " + power_phrase(at_noise)}
        )
    result = SelftestResult(
        selftest_version=SELFTEST_VERSION,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        judge=JudgeRecord(provider=judge.provider, model=judge.model, base_url=judge.base_url),
        split=SplitRecord(
            name=split.name,
            fingerprint=split.fingerprint,
            items=len(split.ids),
            positives=sum(1 for t in split.ids if labels[t].is_positive),
            negatives=sum(1 for t in split.ids if not labels[t].is_positive),
        ),
        revision=head,
        prompt_hash=incumbent.prompt_hash(),
        policy=PolicyRecord(
            name=policy,
            policy=loop.policy,
            level=level,
            alpha=loop.alpha,
            fdr=loop.fdr,
            rejudge=loop.rejudge,
            replicates=replicates,
            min_kappa_delta=loop.min_kappa_delta,
            fpr_tolerance=loop.fpr_tolerance,
        ),
        aa=AARecord(
            asked=options.repeats,
            repeats=len(aa),
            kept=kept,
            keep_rate=keep_rate,
            keep_rate_interval=interval,
            interval_method="Clopper-Pearson exact, two-sided 95%",
            decisions=[_decision_row(i, c) for i, c in enumerate(aa)],
            instability=unstable,
        ),
        planted=None if planted_cmp is None else _planted_row(planted_cmp, labels),
        detectable=detectable,
        benchmark=benchmark_beside(policy, kept, len(aa)),
        complete=stopped is None and len(aa) == options.repeats and planted_cmp is not None,
        stopped=stopped,
        calls=sum(c.calls for c in every),
        cache_hits=sum(c.cache_hits for c in every),
        cost_usd=round(sum(c.cost_usd for c in every), 6),
    )
    files = result_files(ws, write_selftest(ws, result))
    result = result.model_copy(update={"files": files})
    for line in markdown_lines(result)[2:]:
        if line.startswith("- "):
            tell("  " + line[2:])
    tell(f"  wrote {files.json_path} and {files.markdown}")
    return result


def _planted_line(comparison: SlotComparison) -> str:
    d = comparison.decision
    if d is None:
        return f"not decided: {comparison.budget_stop or comparison.error}"
    return f"{'KEPT' if d.keep else 'rolled back'}: {d.reason}"


def write_selftest(ws: Workspace, result: SelftestResult) -> Path:
    """Write ``result`` as ``experiments/selftest/<stamp>-<prompt hash>.json`` and ``.md``; returns the JSON's path."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = unused_path(selftest_dir(ws), f"{stamp}-{result.prompt_hash[:8]}")
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text("\n".join(markdown_lines(result)) + "\n", encoding="utf-8")
    return path
