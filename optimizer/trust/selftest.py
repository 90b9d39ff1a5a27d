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
the file's object); `read_selftest` validates a recorded file strictly back into one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

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
    Counts,
    Decision,
    EarlyStopper,
    adaptive_stopped_decision,
    adaptive_test,
    decide_adaptive,
    decide_counts,
    disagreements,
    lord_level,
    min_fixes_to_keep,
)
from optimizer.stats.metrics import Answer, is_correct, majority_answer, outcome, score
from optimizer.stats.policies import policy_for
from optimizer.workspace import gitops
from optimizer.workspace.config import JudgeOverrides, JudgeSection, LoopSection
from optimizer.workspace.paths import unused_path
from optimizer.workspace.workspace import Workspace

SELFTEST_VERSION = 1
SELFTEST_DIR = "selftest"
DEFAULT_REPEATS = 5

# The known harmful change: on AgentHorizon a negative is a coherent execution of the wrong request,
# so it often ends with a saved file and a final message saying the task is done.
PLANTED_RULE = (
    "Acceptance shortcut: judge every trajectory whose final message says the task is complete, or "
    "that ends with a file saved, as a success (success: true)."
)

# benchmarks/decision_power.py, README "How the loop decides": its judge has AH-D's composition (162 items,
# 62 positives / 100 negatives, 70% of items stable, 30% answered right with probability 0.3-0.7, every
# call a fresh draw), one judgement per item, alpha 0.1, adaptive re-judging 2x. ``noop_fresh``: no-op
# kept against a fresh incumbent (``sim1``, n = 3,000: the A/A setting); ``noop_in_run``: inside a run
# (``sim``, n = 9,000), lower because a run's incumbent is the lucky draw that won its comparison;
# ``fixD``: a D-item fix kept against a fresh incumbent.
BENCHMARK: dict[str, Any] = {
    "source": "benchmarks/decision_power.py (README table, rows sim1 and sim)",
    "judge": "162 items (62 positive / 100 negative), 30% unstable (right with p 0.3-0.7), 1 judgement "
             "per item, adaptive re-judges 2x, alpha 0.1",
    "items": 162,
    "alpha": 0.1,
    "policies": {
        "literal": {"noop_fresh": 0.388, "noop_fresh_n": 3000, "noop_in_run": 0.249,
                    "fix4": 0.606, "fix8": 0.803, "fix12": 0.919},
        "paired": {"noop_fresh": 0.077, "noop_fresh_n": 3000, "noop_in_run": 0.026,
                   "fix4": 0.179, "fix8": 0.372, "fix12": 0.614},
        "adaptive": {"noop_fresh": 0.083, "noop_fresh_n": 3000, "noop_in_run": 0.057,
                     "fix4": 0.391, "fix8": 0.782, "fix12": 0.946},
        "adaptive+fdr0.1": {"noop_fresh": 0.019, "noop_fresh_n": 3000, "noop_in_run": 0.007,
                            "fix4": 0.145, "fix8": 0.510, "fix12": 0.831},
    },
}


@dataclass(frozen=True)
class SelftestOptions:
    """What `judgeloop selftest` was asked: a budget (US dollars, every call of the self-test), the
    most A/A repeats to make, judge overrides (``--provider/--model/--base-url/--concurrency``)."""

    budget_usd: float | None = None
    repeats: int = DEFAULT_REPEATS
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)


# --- the result: typed records, their fields in the order the result file writes them ---------------


class Record(BaseModel):
    """A frozen record of a result file (the self-test's, the certificate's). `to_json` is the JSON
    object the file holds: the fields in declaration order, the keys in `OMITTED_WHEN_NONE` left out
    while None (the files never wrote them as null)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)
    OMITTED_WHEN_NONE: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _serialise(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        for key in self.OMITTED_WHEN_NONE:
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def to_json(self) -> dict[str, object]:
        """The record as its file's JSON object (same keys, same order, same values)."""
        return self.model_dump(by_alias=True)


class ResultFiles(Record):
    """Where a result was written, relative to the workspace."""

    json_path: str = Field(alias="json")  # (``json`` would shadow a BaseModel method)
    markdown: str


class JudgeRecord(Record):
    provider: str
    model: str
    base_url: str | None


class SplitRecord(Record):
    """The dev split tested: its name, fingerprint and size (items)."""

    name: str
    fingerprint: str
    items: int
    positives: int
    negatives: int


class PolicyRecord(Record):
    """The decision rule tested: ``name`` as the benchmark names it, ``level`` the one a first candidate meets."""

    name: str
    policy: str
    level: float
    alpha: float
    fdr: float | None
    rejudge: int
    replicates: int
    min_kappa_delta: float
    fpr_tolerance: float


class DecisionRow(Record):
    """One A/A repeat's decision (``kept`` None: not decided, ``reason`` then says why); cost in US dollars."""

    repeat: int
    kept: bool | None
    reason: str | None
    p_value: float | None
    early_stopped: bool
    gain_items: float | None
    rejudged: int
    calls: int
    cache_hits: int
    cost_usd: float


class Instability(Record):
    """`instability`'s figures: shares in [0, 1], None when nothing was compared."""

    items_judged_twice: int
    unstable_items: int
    unstable_share: float | None
    unstable_ids: list[str]
    first_pass_flips: int
    first_pass_compared: int
    flip_rate: float | None


class AARecord(Record):
    """The A/A repeats: how many were asked, decided and kept, the keep rate with its exact 95% interval."""

    asked: int
    repeats: int
    kept: int
    keep_rate: float | None
    keep_rate_interval: tuple[float, float] | None
    interval_method: str
    decisions: list[DecisionRow]
    instability: Instability


class PlantedRow(Record):
    """The planted degradation's decision (``rolled_back`` None: not decided) and the FPRs before and after."""

    rule: str
    where: str
    decided: bool
    rolled_back: bool | None
    reason: str | None
    early_stopped: bool
    items_judged: int
    rejudged: int
    fpr_incumbent: float | None
    fpr_planted: float | None
    judge_obeyed: bool
    calls: int
    cache_hits: int
    cost_usd: float


class PowerAtNoise(Record):
    """`power_at_noise`: simulated keep rates by items fixed (keys: the D as text, values in [0, 1])."""

    keep_rate_by_fix: dict[str, float]
    target: float
    smallest_fix: int | None
    trials: int
    fixable_items: int
    method: str


class DetectableGain(Record):
    """`detectable_gain`: the fewest items a kept candidate must fix, and the line that says it."""

    OMITTED_WHEN_NONE = ("at_noise",)

    min_clean_fixes: int
    with_one_broken: int
    with_two_broken: int
    share_of_split: float
    noise_items_per_evaluation: float | None
    line: str
    at_noise: PowerAtNoise | None = None


class BenchmarkReference(Record):
    """One policy's row of `BENCHMARK` (keep rates in [0, 1])."""

    noop_fresh: float
    noop_fresh_n: int
    noop_in_run: float
    fix4: float
    fix8: float
    fix12: float


class BenchmarkBeside(Record):
    """`benchmark_beside`: the benchmark's row for the policy and whether our A/A rate agrees with it
    (``agrees`` and ``interval`` None when there is no row or no repeat)."""

    policy: str
    reference: BenchmarkReference | None
    agrees: bool | None
    source: str
    judge: str
    interval: tuple[float, float] | None = None

    @model_serializer(mode="wrap")
    def _serialise(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if self.interval is None:  # no comparison made: the file has no interval, ``agrees`` after the reference
            del data["interval"]
            return data
        order = ("policy", "reference", "source", "judge", "interval", "agrees")
        return {key: data[key] for key in order}


class SelftestResult(Record):
    """What `selftest` returns and writes (``selftest_version`` `SELFTEST_VERSION`); ``files`` is set
    on the result returned and read back, never in the file itself. Costs in US dollars."""

    OMITTED_WHEN_NONE = ("files",)

    selftest_version: int = SELFTEST_VERSION
    created: str
    judge: JudgeRecord
    split: SplitRecord
    revision: str
    prompt_hash: str
    policy: PolicyRecord
    aa: AARecord
    planted: PlantedRow | None
    detectable: DetectableGain
    benchmark: BenchmarkBeside
    complete: bool
    stopped: str | None
    calls: int
    cache_hits: int
    cost_usd: int | float
    files: ResultFiles | None = None


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

    async def _pass(self, prompts: PromptSet, ids: Sequence[str], replicates: int, first: int,
                    on_item: Any = None) -> EvalRun:
        return await evaluate_items(
            self.ws,
            self.split,
            prompts,
            self.judge,
            item_ids=ids,
            replicates=replicates,
            first_replicate=first,
            options=PassOptions(
                on_item=on_item, budget=self.budget, progress=self.progress, provider=self.provider,
                cache=self.cache, infra_retry_rounds=self.loop.infra_retry_rounds,
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

    async def compare(self, base: PromptSet, base_slot: int, other: PromptSet, other_slot: int,
                      *, seed: int) -> SlotComparison:
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
        out.other = {item.trajectory_id: judgements_of(item) for item in other_run.items if not item.infra_error}
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
        out.decision = decide_adaptive(self.labels, out.base, out.other, self.loop, first_pass=k,
                                       rejudged=out.rejudged, alpha=self.level, seed=seed)
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


def detectable_gain(n_items: int, level: float, policy: str, flip_rate: float | None) -> DetectableGain:
    """What gain the policy can tell from noise on ``n_items`` (`decision.min_fixes_to_keep`: the
    fewest items newly right, all judgements agreeing, breaking none / one / two), beside the items the
    judge's own noise flips between two evaluations of identical prompts."""
    noise_items = None if flip_rate is None else flip_rate * n_items
    rule = policy_for(policy.partition("+")[0])  # `policy_name`: "adaptive+fdr0.1" is the adaptive policy
    if not rule.tests_at_alpha:
        return DetectableGain(
            min_clean_fixes=1, with_one_broken=2, with_two_broken=3, share_of_split=1 / n_items,
            noise_items_per_evaluation=noise_items,
            line=(f"the literal policy has no significance test: any rise in kappa is kept, so on {n_items} items "
                  "its A/A keep rate is its false-keep rate"
                  + ("" if noise_items is None else f"; the judge's noise flips ~{noise_items:.1f} items "
                     "between two evaluations")),
        )
    clean, one, two = (min_fixes_to_keep(w, level) for w in (0, 1, 2))
    items = rule.items_right
    line = (f"on {n_items} items the {policy} policy (level {level:g}) keeps a candidate only if it newly gets at "
            f"least {clean} {items} while breaking none ({one} if it breaks one, {two} if two): "
            f"{clean / n_items:.0%} of the split at the least")
    if noise_items is not None:
        line += f"; the judge's own noise flips ~{noise_items:.1f} items between two evaluations of identical prompts"
    return DetectableGain(min_clean_fixes=clean, with_one_broken=one, with_two_broken=two,
                          share_of_split=clean / n_items, noise_items_per_evaluation=noise_items, line=line)


POWER_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
POWER_TARGET = 0.8
POWER_TRIALS = 200


def _counts(right: np.ndarray, positive: np.ndarray) -> Counts:
    tp = int((right & positive).sum())
    tn = int((right & ~positive).sum())
    n_pos = int(positive.sum())
    return Counts(tp, n_pos - tp, tn, len(positive) - n_pos - tn)


def _majority_right(correct: np.ndarray, judgements: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Whether each item's majority is right (`metrics.majority_answer`: a tie is "failure", right on a negative)."""
    return (correct * 2 > judgements) | ((correct * 2 == judgements) & ~positive)


def simulated_keep_rate(positive: np.ndarray, q: np.ndarray, fix: int, loop: LoopSection, level: float, *,
                        replicates: int = 1, trials: int = POWER_TRIALS, seed: int = 0) -> float:
    """The share of ``trials`` simulated candidates that fix ``fix`` items (made right on every judgement,
    chosen among the items the judge gets right less than half the time) and are kept, against a fresh
    incumbent, with item i judged right with probability ``q[i]`` on every call: the decision-power
    benchmark's ``sim1`` model on this judge's odds. Decided by `optimizer.stats.decision` (first pass of
    ``replicates`` judgements; under ``adaptive`` the disagreements re-judged ``loop.rejudge`` times)."""
    rng = np.random.default_rng(seed)
    n, k = len(q), replicates
    pool = np.flatnonzero(q < 0.5)
    if fix > len(pool):
        raise ValueError(f"only {len(pool)} items can be fixed, not {fix}")
    cfg = loop.model_copy(update={"alpha": level})
    literal_cfg = cfg.model_copy(update={"policy": "literal"})
    policy = policy_for(loop)
    r = policy.rejudge(loop)
    kept = 0
    for _ in range(trials):
        fixed = np.zeros(n, bool)
        fixed[rng.choice(pool, fix, replace=False)] = True
        q_c = np.where(fixed, 1.0, q)
        inc, cand = rng.binomial(k, q), rng.binomial(k, q_c)
        first = np.full(n, k)
        inc_right, cand_right = _majority_right(inc, first, positive), _majority_right(cand, first, positive)
        if not policy.rejudges:
            decision = decide_counts(_counts(inc_right, positive), _counts(cand_right, positive),
                                     int((~inc_right & cand_right).sum()), int((inc_right & ~cand_right).sum()), cfg)
            kept += policy.keeps(decision)
            continue
        total = first.copy()
        if r:
            # Same label: the two majorities say different things exactly when one is right and the other not.
            disagree = inc_right != cand_right
            inc = inc + np.where(disagree, rng.binomial(r, q), 0)
            cand = cand + np.where(disagree, rng.binomial(r, q_c), 0)
            total = np.where(disagree, k + r, k)
        inc_all, cand_all = _majority_right(inc, total, positive), _majority_right(cand, total, positive)
        literal = decide_counts(_counts(inc_all, positive), _counts(cand_all, positive),
                                int((~inc_all & cand_all).sum()), int((inc_all & ~cand_all).sum()), literal_cfg)
        if not literal.literal_keep:
            continue
        diffs = [Fraction(int(c) - int(i), int(m)) for c, i, m in zip(cand, inc, total, strict=True) if c != i]
        kept += adaptive_test(diffs).below(Fraction(repr(float(level))))
    return kept / trials


def power_at_noise(positive: np.ndarray, q: np.ndarray, loop: LoopSection, level: float, *, replicates: int = 1,
                   trials: int = POWER_TRIALS, seed: int = 0) -> PowerAtNoise:
    """Simulated keep rates of D-item fixes at the judge's measured per-item odds ``q`` (`simulated_keep_rate`),
    for growing D until one is kept at least `POWER_TARGET` of the time: that D is the smallest gain this
    judge, split and policy detect reliably."""
    rates: dict[str, float] = {}
    smallest: int | None = None
    for d in POWER_SIZES:
        if d > int((q < 0.5).sum()):
            break
        rate = simulated_keep_rate(positive, q, d, loop, level, replicates=replicates, trials=trials, seed=seed + d)
        rates[str(d)] = rate
        if rate >= POWER_TARGET:
            smallest = d
            break
    return PowerAtNoise(keep_rate_by_fix=rates, target=POWER_TARGET, smallest_fix=smallest, trials=trials,
                        fixable_items=int((q < 0.5).sum()),
                        method="decision-power sim1 model on the per-item shares of correct A/A judgements")


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


def benchmark_beside(policy: str, kept: int, repeats: int) -> BenchmarkBeside:
    """The benchmark's figures for ``policy`` and whether the observed A/A keep rate agrees with its
    fresh-incumbent no-op keep rate (the benchmark's figure inside the exact 95% interval of ours)."""
    row = BENCHMARK["policies"].get(policy)
    ref = None if row is None else BenchmarkReference.model_validate(row)
    if ref is None or repeats == 0:
        return BenchmarkBeside(policy=policy, reference=ref, agrees=None, source=BENCHMARK["source"],
                               judge=BENCHMARK["judge"])
    lo, hi = clopper_pearson_interval(kept, repeats)
    return BenchmarkBeside(policy=policy, reference=ref, source=BENCHMARK["source"], judge=BENCHMARK["judge"],
                           interval=(lo, hi), agrees=lo <= ref.noop_fresh <= hi)


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
    tell(f"selftest: judge {judge.provider}:{judge.model}, split {split.name} ({len(split.ids)} items), prompts at "
         f"HEAD {head[:10]} [{incumbent.prompt_hash()[:8]}], policy {policy} at level {level:g}, "
         f"{replicates} judgement(s) per item; up to {options.repeats} A/A repeat(s)"
         + (f", budget ${options.budget_usd:g}" if options.budget_usd is not None else ""))
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
                    tell("  planted degradation: the incumbent with an 'accept what claims success' rule appended")
                    planted_cmp = await bench.compare(incumbent, 0, planted, 0, seed=10_007)
                    tell(f"    {_planted_line(planted_cmp)}")
                    if planted_cmp.decision is None:
                        stopped = planted_cmp.budget_stop or planted_cmp.error
                        break
                    continue
                repeat = step if step == 0 else step - 1
                tell(f"  A/A repeat {repeat + 1}: the incumbent against itself (replicate slots {2 * repeat}, "
                     f"{2 * repeat + 1})")
                comparison = await bench.compare(incumbent, 2 * repeat, incumbent, 2 * repeat + 1, seed=repeat)
                if comparison.decision is None:
                    stopped = comparison.budget_stop or comparison.error
                    tell(f"    not decided: {stopped}")
                    break
                aa.append(comparison)
                tell(f"    {'KEPT (a false keep)' if comparison.decision.keep else 'rolled back'}: "
                     f"{comparison.decision.reason}")
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
            np.array([labels[t].is_positive for t in order]), np.array([odds[t] for t in order]), loop, level,
            replicates=replicates)
        detectable = detectable.model_copy(
            update={"at_noise": at_noise, "line": detectable.line + "; " + _power_phrase(at_noise)})
    result = SelftestResult(
        selftest_version=SELFTEST_VERSION,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        judge=JudgeRecord(provider=judge.provider, model=judge.model, base_url=judge.base_url),
        split=SplitRecord(name=split.name, fingerprint=split.fingerprint, items=len(split.ids),
                          positives=sum(1 for t in split.ids if labels[t].is_positive),
                          negatives=sum(1 for t in split.ids if not labels[t].is_positive)),
        revision=head,
        prompt_hash=incumbent.prompt_hash(),
        policy=PolicyRecord(name=policy, policy=loop.policy, level=level, alpha=loop.alpha, fdr=loop.fdr,
                            rejudge=loop.rejudge, replicates=replicates, min_kappa_delta=loop.min_kappa_delta,
                            fpr_tolerance=loop.fpr_tolerance),
        aa=AARecord(asked=options.repeats, repeats=len(aa), kept=kept, keep_rate=keep_rate,
                    keep_rate_interval=interval, interval_method="Clopper-Pearson exact, two-sided 95%",
                    decisions=[_decision_row(i, c) for i, c in enumerate(aa)], instability=unstable),
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


def result_files(ws: Workspace, path: Path) -> ResultFiles:
    """A result's JSON file at ``path`` and its Markdown beside it, relative to the workspace."""
    return ResultFiles(json=str(path.relative_to(ws.root)), markdown=str(path.with_suffix(".md").relative_to(ws.root)))


def _power_phrase(power: PowerAtNoise) -> str:
    rates = ", ".join(f"{d}: {rate:.0%}" for d, rate in power.keep_rate_by_fix.items())
    found = power.smallest_fix
    head = (f"at this noise the smallest fix kept {power.target:.0%} of the time is {found} items" if found
            else f"at this noise no fix of up to {max(map(int, power.keep_rate_by_fix), default=0)} items is kept "
                 f"{power.target:.0%} of the time")
    return f"{head} (simulated keep rate by items fixed — {rates}; {power.trials} trials each)"


def _planted_line(comparison: SlotComparison) -> str:
    d = comparison.decision
    if d is None:
        return f"not decided: {comparison.budget_stop or comparison.error}"
    return f"{'KEPT' if d.keep else 'rolled back'}: {d.reason}"


def selftest_dir(ws: Workspace) -> Path:
    return ws.experiments_dir / SELFTEST_DIR


def write_selftest(ws: Workspace, result: SelftestResult) -> Path:
    """Write ``result`` as ``experiments/selftest/<stamp>-<prompt hash>.json`` and ``.md``; returns the JSON's path."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = unused_path(selftest_dir(ws), f"{stamp}-{result.prompt_hash[:8]}")
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text("\n".join(markdown_lines(result)) + "\n", encoding="utf-8")
    return path


def read_selftest(text: str) -> SelftestResult | None:
    """A recorded self-test from its file's text, or None when it is not one a certificate can cite: not
    this `SELFTEST_VERSION`, a value of the wrong type (strict: no coercion), or findings that do not
    render (a file edited by hand, or cut short by a full disk, is skipped rather than cited)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("selftest_version") != SELFTEST_VERSION:
            return None
        result = SelftestResult.model_validate_json(text, strict=True)
        summary_lines(result)
    except (json.JSONDecodeError, ValidationError, TypeError, ValueError, IndexError):
        return None
    return result


def latest_selftest(ws: Workspace) -> SelftestResult | None:
    """The newest self-test recorded under ``experiments/selftest/`` (by its ``created`` time), or None.
    Files that do not read as a self-test (`read_selftest`) are skipped."""
    best: SelftestResult | None = None
    folder = selftest_dir(ws)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.json")):
        try:
            found = read_selftest(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if found is None:
            continue
        found = found.model_copy(update={"files": result_files(ws, path)})
        if best is None or found.created >= best.created:
            best = found
    return best


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def summary_lines(result: SelftestResult) -> list[str]:
    """The self-test's findings as Markdown bullets (also what a certificate quotes)."""
    aa, bench = result.aa, result.benchmark
    pol = result.policy
    lines: list[str] = []
    if aa.repeats:
        if aa.keep_rate_interval is None:
            raise ValueError("a decided A/A repeat without a keep-rate interval")
        lo, hi = aa.keep_rate_interval
        lines.append(f"- A/A: {aa.kept} of {aa.repeats} byte-identical candidates kept "
                     f"({_pct(aa.keep_rate)}, exact 95% interval {lo:.1%}–{hi:.1%}) under {pol.name} at level "
                     f"{pol.level:g}")
    else:
        lines.append("- A/A: no repeat decided")
    ref = bench.reference
    if ref is not None and bench.agrees is not None:
        lines.append(f"- decision-power benchmark, same policy: a no-op kept {_pct(ref.noop_fresh)} of the time "
                     f"against a fresh incumbent (n = {ref.noop_fresh_n}; {_pct(ref.noop_in_run)} inside a run); "
                     + ("consistent with this judge's A/A rate" if bench.agrees
                        else "OUTSIDE this judge's A/A interval: its noise differs from the benchmark's judge"))
    inst = aa.instability
    if inst.items_judged_twice:
        lines.append(f"- instability: {inst.unstable_items} of {inst.items_judged_twice} items "
                     f"({_pct(inst.unstable_share)}) got different verdicts from identical prompts; "
                     f"{inst.first_pass_flips} of {inst.first_pass_compared} first-pass verdicts "
                     f"({_pct(inst.flip_rate)}) differ between two evaluations")
    planted = result.planted
    if planted is None:
        lines.append("- planted degradation: not run")
    elif not planted.decided:
        lines.append(f"- planted degradation: not decided ({planted.reason})")
    else:
        lines.append(f"- planted degradation ({planted.where} + 'accept what claims success'): "
                     + ("rolled back" if planted.rolled_back else "KEPT")
                     + f"; FPR {_pct(planted.fpr_incumbent)} → {_pct(planted.fpr_planted)} on the "
                     f"{planted.items_judged} items judged"
                     + ("" if planted.judge_obeyed else
                        " — the judge barely reacted to the rule, so for it this was close to a no-op"))
    lines.append(f"- minimum detectable gain: {result.detectable.line}")
    return lines


def markdown_lines(result: SelftestResult) -> list[str]:
    """The self-test as a Markdown document."""
    judge, split = result.judge, result.split
    head = [
        f"# judgeloop selftest, {result.created}",
        "",
        f"Judge `{judge.provider}:{judge.model}`, dev split `{split.name}` ({split.items} items, "
        f"fingerprint `{split.fingerprint[:12]}`), prompts at `{result.revision[:10]}` "
        f"(hash `{result.prompt_hash[:12]}`); {result.calls} judge calls made, {result.cache_hits} "
        f"cached, ${result.cost_usd:.4f}."
        + ("" if result.complete else f" Incomplete: {result.stopped or 'fewer repeats than asked'}."),
        "",
    ]
    return head + summary_lines(result)
