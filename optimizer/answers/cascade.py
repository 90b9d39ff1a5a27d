"""`judgeloop cascade calibrate`: choosing a cascade's escalation rule honestly. Label side.

Both judges of judge.toml's ``[cascade]`` judge every item of the dev split (each stage as the cascade runs
it, so the calls are the cascade's own cache entries: a later `eval` or `run` of the chosen rule pays
nothing for them). The split is dealt into pair-aware folds (the memory's, `optimizer.judge.memory`); every
candidate rule is scored on the tuning fold, one rule is chosen there (the highest kappa, then the lowest
cost per verdict), and every rule is reported on the held-out fold, which the choice never saw: the
figures a user should believe. Cost per verdict is the first judge's cost per item plus the second's on the
escalated items, US dollars as the calls were made (cached ones included).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optimizer.devset.heldout import refuse_heldout
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split
from optimizer.errors import UserError
from optimizer.evaluation.cascade import first_prompts, second_prompts
from optimizer.evaluation.evaluator import PassOptions, evaluate_single
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.events import Listener, Message, ignore
from optimizer.judge.cascade import EscalationRule
from optimizer.judge.memory import split_folds
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import make_provider
from optimizer.models import Label
from optimizer.stats.binomial import clopper_pearson_interval
from optimizer.stats.metrics import Answer, bootstrap_intervals, score
from optimizer.structure import ESCALATE_ON
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace

# Rows that are no cascade, for comparison: the first judge alone and the second judge on every item.
FIRST_ALONE = EscalationRule(frozenset())
SECOND_ALONE = EscalationRule(frozenset({"success", "failure", "invalid"}))


@dataclass(frozen=True)
class CalibrateOptions:
    """``split`` (default: the dev split), ``rev`` (default: the working tree's prompts), ``folds`` (pair-aware
    folds the split is dealt into), ``tune_fold`` (the one the rule is chosen on; the next one is reported),
    ``judge`` (the first judge's overrides)."""

    split: str | None = None
    rev: str | None = None
    folds: int = 2
    tune_fold: int = 0
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)


@dataclass(frozen=True)
class FoldFigures:
    """One rule on one fold: items, escalated, escalation share, kappa, FPR and cost per verdict (US dollars),
    each rate with its 95% interval (share: Clopper-Pearson; kappa, FPR: the stratified bootstrap; cost:
    the share's interval carried through the mean costs)."""

    n: int
    escalated: int
    share: float
    share_ci: tuple[float, float]
    kappa: float | None
    kappa_ci: tuple[float, float] | None
    fpr: float | None
    fpr_ci: tuple[float, float] | None
    cost: float
    cost_ci: tuple[float, float]

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class RuleRow:
    rule: str
    tuning: FoldFigures
    heldout: FoldFigures
    chosen: bool = False


@dataclass(frozen=True)
class Calibration:
    """Every rule's figures on both folds; ``chosen`` the rule picked on the tuning fold."""

    split: str
    tune_fold: int
    heldout_fold: int
    folds_digest: str
    rows: list[RuleRow]
    chosen: str

    def as_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "tune_fold": self.tune_fold,
            "heldout_fold": self.heldout_fold,
            "folds_digest": self.folds_digest,
            "chosen": self.chosen,
            "rules": [
                {
                    "rule": r.rule,
                    "chosen": r.chosen,
                    "tuning": r.tuning.as_json(),
                    "heldout": r.heldout.as_json(),
                }
                for r in self.rows
            ],
        }


def candidate_rules() -> list[EscalationRule]:
    """Every rule worth a row: each non-empty set of escalation reasons (``low_confidence`` below medium and
    below high), plus the two ends, the first judge alone and the second judge on every item."""
    rules = [FIRST_ALONE]
    for size in range(1, len(ESCALATE_ON) + 1):
        for combo in itertools.combinations(ESCALATE_ON, size):
            below = ("medium", "high") if "low_confidence" in combo else ("medium",)
            rules += [EscalationRule(frozenset(combo), b) for b in below]
    return [r for r in rules if r != SECOND_ALONE] + [SECOND_ALONE]


def rule_label(rule: EscalationRule) -> str:
    if rule == FIRST_ALONE:
        return "first alone"
    return "second alone" if rule == SECOND_ALONE else rule.describe()


@dataclass(frozen=True)
class StageResults:
    """Both judges' results on every item, each item's cost as made (US dollars)."""

    first: Mapping[str, ItemResult]
    second: Mapping[str, ItemResult]

    def escalates(self, rule: EscalationRule, tid: str) -> bool:
        item = self.first[tid]
        if item.infra_error:
            return False
        return rule.escalates(
            item.answer.success, item.verdict.confidence if item.verdict is not None else None
        )

    def answer(self, rule: EscalationRule, tid: str) -> Answer:
        return (self.second if self.escalates(rule, tid) else self.first)[tid].answer


def fold_figures(
    results: StageResults, rule: EscalationRule, labels: Mapping[str, Label], ids: Sequence[str]
) -> FoldFigures:
    """``rule``'s figures on the items ``ids`` (see `FoldFigures`)."""
    if not ids:
        raise UserError("a calibration fold holds no items; use a larger split or fewer --folds")
    answers = {tid: results.answer(rule, tid) for tid in ids}
    fold_labels = {tid: labels[tid] for tid in ids}
    metrics = score(fold_labels, answers)
    intervals = bootstrap_intervals(fold_labels, answers)
    up = [tid for tid in ids if results.escalates(rule, tid)]
    n = len(ids)
    first_cost = sum(results.first[t].usage.cost_usd for t in ids) / n
    second_cost = sum(results.second[t].usage.cost_usd for t in ids) / n  # per item, if every one went on
    share_ci = clopper_pearson_interval(len(up), n)
    return FoldFigures(
        n=n,
        escalated=len(up),
        share=len(up) / n,
        share_ci=share_ci,
        kappa=metrics.kappa,
        kappa_ci=intervals.get("kappa"),
        fpr=metrics.fpr,
        fpr_ci=intervals.get("fpr"),
        cost=first_cost + sum(results.second[t].usage.cost_usd for t in up) / n,
        cost_ci=(first_cost + share_ci[0] * second_cost, first_cost + share_ci[1] * second_cost),
    )


def choose(rows: Sequence[tuple[EscalationRule, FoldFigures]]) -> EscalationRule:
    """The tuning fold's pick among the cascades (not the two ends): the highest kappa, then the lowest cost."""
    cascades = [(r, f) for r, f in rows if r not in (FIRST_ALONE, SECOND_ALONE)]
    return min(cascades, key=lambda rf: (-(rf[1].kappa if rf[1].kappa is not None else -2.0), rf[1].cost))[0]


def calibrate_results(
    results: StageResults, labels: Mapping[str, Label], folds: Mapping[int, Sequence[str]], tune_fold: int
) -> tuple[list[RuleRow], str]:
    """Every candidate rule on the tuning and held-out folds, and the rule chosen on the tuning fold (pure)."""
    heldout_fold = (tune_fold + 1) % len(folds)
    rules = candidate_rules()
    tuning = [(r, fold_figures(results, r, labels, folds[tune_fold])) for r in rules]
    chosen = choose(tuning)
    rows = [
        RuleRow(rule_label(r), t, fold_figures(results, r, labels, folds[heldout_fold]), chosen=r == chosen)
        for r, t in tuning
    ]
    return rows, rule_label(chosen)


def calibrate(ws: Workspace, options: CalibrateOptions, events: Listener = ignore) -> Calibration:
    """Judge the split with both of the cascade's judges, then score every candidate rule (module docstring)."""
    split_name = options.split or ws.config.workspace.dev_split
    refuse_heldout(ws, split_name, "cascade calibrate")
    if not 0 <= options.tune_fold < options.folds:
        raise UserError(f"--tune-fold must be between 0 and {options.folds - 1} (got {options.tune_fold})")
    split = open_split(ws, split_name)
    prompts = PromptSet.from_rev(ws, options.rev) if options.rev else PromptSet.from_dir(ws.prompts_dir)
    cascade = prompts.settings.cascade
    if cascade is None:
        raise UserError(
            "prompts/judge.toml has no [cascade] table; add [cascade] and [cascade.second] (see the cascade guide) "
            "before calibrating its rule"
        )
    judge = options.judge.apply(ws.config.judge)
    second = cascade.second.section()
    replicates = prompts.settings.replicates
    events(
        Message(
            f"calibrating on {split.name!r} ({len(split.ids)} items): both judges judge every item", "note"
        )
    )

    async def both() -> tuple[EvalRun, EvalRun]:
        first_run = await evaluate_single(
            ws, split, first_prompts(prompts), judge,
            item_ids=split.ids, replicates=replicates, first_replicate=0, options=PassOptions(),
        )  # fmt: skip
        provider = make_provider(second)
        try:
            second_run = await evaluate_single(
                ws, split, second_prompts(prompts), second,
                item_ids=split.ids, replicates=replicates, first_replicate=0,
                options=PassOptions(provider=provider, prices={**ws.config.prices, **cascade.second.prices}),
            )  # fmt: skip
        finally:
            await provider.aclose()
        return first_run, second_run

    first_run, second_run = asyncio.run(both())
    for name, run in (("first", first_run), ("second", second_run)):
        if run.not_evaluated:
            raise UserError(
                f"the {name} judge left {len(run.not_evaluated)} items unjudged ({run.stop_reason}); retry"
            )
        events(
            Message(f"{name} judge: {run.usage.calls} calls made, {run.cache_hits} from the cache", "note")
        )
    results = StageResults(
        {i.trajectory_id: i for i in first_run.items}, {i.trajectory_id: i for i in second_run.items}
    )
    folds = split_folds(split, options.folds)
    members = {k: folds.members(k) for k in range(options.folds)}
    rows, chosen = calibrate_results(results, load_labels(split), members, options.tune_fold)
    return Calibration(
        split=split.name,
        tune_fold=options.tune_fold,
        heldout_fold=(options.tune_fold + 1) % options.folds,
        folds_digest=folds.digest,
        rows=rows,
        chosen=chosen,
    )


def _ci(value: float | None, ci: tuple[float, float] | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return (
        f"{value:.{digits}f}"
        if ci is None
        else f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    )


def calibration_lines(cal: Calibration) -> list[str]:
    """The calibration as a table: each rule on the tuning fold and, with intervals, on the held-out fold."""
    lines = [
        f"split {cal.split}: rule chosen on fold {cal.tune_fold}, reported on fold {cal.heldout_fold} "
        f"(pair-aware folds {cal.folds_digest[:8]})",
        f"{'rule':<34} {'tune kappa':>10} {'tune FPR':>8}  held-out: escalated | kappa | FPR | $/verdict",
    ]
    for row in cal.rows:
        t, h = row.tuning, row.heldout
        mark = "*" if row.chosen else " "
        lines.append(
            f"{mark}{row.rule:<33} {_ci(t.kappa, None):>10} {_ci(t.fpr, None):>8}  "
            f"{_ci(h.share, h.share_ci)} | {_ci(h.kappa, h.kappa_ci)} | {_ci(h.fpr, h.fpr_ci)} | "
            f"{_ci(h.cost, h.cost_ci, 4)}"
        )
    lines.append(
        f"* chosen on the tuning fold: {cal.chosen}; set [cascade] escalate in prompts/judge.toml to use it "
        "(its held-out row is the estimate to believe)"
    )
    return lines
