"""What a budget buys before a run (`judgeloop plan`): candidates, judge calls, cost per candidate.

Two sources, the first that applies:
- ``ledger``: the candidates (seq ≥ 1) of past runs of this workspace with the same judge (provider
  and model) that made paid judge calls — their mean judge cost, calls and wall time per candidate,
  their re-judging share (re-judging calls over first-pass calls).
- ``estimate``: every item of the split rendered with the current prompts (the estimator of
  `optimizer.judge.estimate`, the price table of `optimizer.judge.providers.pricing`): a call's
  cacheable prefix at the cache-write price when cold (the baseline: its replicates go out together
  and each writes the prefix), at the cache-read price when warm (a candidate after the baseline),
  the rest at the input price, and ``max_tokens`` of output — an upper bound, as the budget reserves.
  Under adaptive, re-judging adds `ADAPTIVE_REJUDGE_SHARE` of a pass (the share measured on the
  bundled benchmark: a candidate costs about 1.48 passes); paired and literal add none.

The baseline is priced as a cold first pass (the judge cache may make it free; not counted).

The ``local`` CPU judge costs nothing but time: before any run its seconds per call, pass and candidate
are estimated from the rendered requests' tokens at the throughput measured on a 2-core machine
(`optimizer.judge.providers.pricing.CpuSpeed`: the shared instructions read once, each item's text and a
typical verdict per call; both cores idle, and with one busy); after a run the ledger's seconds replace it.

With ``wave`` K > 1 (`run --wave K`) the run proposes and decides K candidates a round, so a budget
buys whole waves: the candidates are rounded down to a multiple of K. A candidate's cost is the same
figure (each is judged on the whole split); the time figure is for candidates one after another.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.evaluation.cascade import first_prompts, second_prompts
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.judge.cascade import CascadeSettings, EscalationRule
from optimizer.judge.criteria import verdict_calls
from optimizer.judge.estimate import chars_tokens, request_input_tokens, request_token_split
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers.pricing import CPU_IDLE, CPU_ONE_BUSY, CpuSpeed, Price, price_for
from optimizer.judge.render import RenderOptions
from optimizer.judge.types import JudgeRequest
from optimizer.ledger import Experiment, Ledger
from optimizer.stats.policies import policy_for
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace

# Adaptive re-judging, in passes of the split per candidate, when the ledger has no figure.
ADAPTIVE_REJUDGE_SHARE = 0.48


@dataclass(frozen=True)
class Plan:
    """What ``budget_usd`` buys; US dollars, seconds. ``candidates`` excludes the baseline."""

    budget_usd: float
    source: str  # "ledger" or "estimate"
    judge: str
    policy: str
    layout: str
    replicates: int
    items: int
    baseline_usd: float
    first_pass_cold_usd: float
    first_pass_warm_usd: float
    rejudge_share: float
    cost_per_candidate_usd: float
    calls_per_candidate: float
    candidates: int | None  # None: the judge costs nothing, the budget does not bound the run
    calls: int | None
    hours: float | None = None
    seconds_per_candidate: float | None = None
    candidates_in_hours: int | None = None
    measured_candidates: int = 0
    wave: int = 1
    waves: int | None = None  # whole waves of ``wave`` candidates the budget buys (None: no limit)
    seconds_source: str = "measured"  # or "estimated" (the CPU judge's token throughput, before any run)
    notes: list[str] = field(default_factory=list)
    # A cascade judge (judge.toml structure = "cascade"): `cascade_stages`'s record, else None.
    cascade: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The plan as a few lines of text."""
        out = [
            f"judge {self.judge}, policy {self.policy}, layout {self.layout}, {self.replicates} replicate(s), "
            f"{self.items} items; figures from the {'ledger (' + str(self.measured_candidates) + ' past candidates)' if self.source == 'ledger' else 'estimator (upper bounds)'}",
            f"first pass: ${self.first_pass_cold_usd:.4f} cold, ${self.first_pass_warm_usd:.4f} warm from the cache; "
            f"re-judging adds {self.rejudge_share:.0%} of a pass",
            f"cost per candidate: ${self.cost_per_candidate_usd:.4f} ({self.calls_per_candidate:.0f} calls); "
            f"baseline ${self.baseline_usd:.4f}",
        ]
        if self.candidates is None:
            out.append(f"${self.budget_usd:.2f} buys: no limit (this judge costs nothing)")
        else:
            out.append(
                f"${self.budget_usd:.2f} buys: {self.candidates} candidate(s), {self.calls} judge calls"
                + (f", in {self.waves} wave(s) of {self.wave}" if self.wave > 1 else "")
            )
        if self.hours is not None:
            if self.candidates_in_hours is None:
                out.append(f"{self.hours:g} h: no measured call latency yet (run once to measure it)")
            else:
                out.append(
                    f"{self.hours:g} h buys: {self.candidates_in_hours} candidate(s) "
                    f"at {self.seconds_per_candidate:.0f} s each ({self.seconds_source})"
                )
        return out + [f"note: {n}" for n in self.notes]


def make_plan(
    ws: Workspace,
    split: Split,
    judge: JudgeSection,
    *,
    policy: str,
    replicates: int,
    budget_usd: float,
    hours: float | None = None,
    wave: int = 1,
) -> Plan:
    """The plan for a run of ``split`` judged by ``judge`` (``wave``: candidates per round, `run --wave`);
    raises `UserError` for an unknown price."""
    cfg = ws.config
    prompts = PromptSet.from_dir(ws.prompts_dir)
    price = price_for(judge.model, cfg.prices)
    if price is None:
        raise UserError(
            f'no price is known for model {judge.model!r}; add [prices."{judge.model}"] '
            "to judgeloop.toml (US dollars per million tokens)"
        )
    sampling = prompts.settings.sampling()
    settings = prompts.settings
    share, share_note = _success_share(ws, judge, split) if settings.review == "success" else (0.0, None)
    images = ws.experiments_dir / IMAGE_CACHE_DIRNAME
    # The CPU judge reads text only, instructions first (its traits); other providers follow judge.toml.
    on_cpu = judge.provider == "local"
    render = (
        RenderOptions(image_cache_dir=images, text_only=True, layout="rubric-first")
        if on_cpu
        else RenderOptions(image_cache_dir=images)
    )
    stage = _PassCost(split, share, replicates, sampling.max_tokens)
    cascade_plan: dict[str, Any] | None = None
    if settings.structure == "cascade" and settings.cascade is not None:
        first_stage = stage.price(first_prompts(prompts), price, render)
        second_stage = stage.price(
            second_prompts(prompts),
            _second_price(cfg.prices, settings.cascade),
            RenderOptions(image_cache_dir=images),
        )
        cascade_plan = cascade_stages(
            settings.cascade.rule(), first_stage, second_stage, _positive_share(split)
        )
        escalated = cascade_plan["escalation_share"]
        cold, warm = (
            first_stage.cold + escalated * second_stage.cold,
            first_stage.warm + escalated * second_stage.warm,
        )
        per_item = first_stage.calls + escalated * second_stage.calls
        cpu_tokens = first_stage.cpu
    else:
        only = stage.price(prompts, price, render)
        cold, warm, per_item, cpu_tokens = only.cold, only.warm, only.calls, only.cpu
    n = len(split.ids)
    notes: list[str] = []
    if cascade_plan is not None:
        notes.append(cascade_note(cascade_plan))
    if settings.panel is not None:
        notes.append(f"[panel]: {settings.panel.size} member calls per replicate")
    if settings.structure == "criteria":
        notes.append(
            'structure = "criteria": 1 derivation per item (from the instruction alone) + 1 check per '
            "replicate; the check is priced with a typical 5-criterion list"
        )
    if share_note is not None:
        notes.append(share_note)
    rule = policy_for(policy)
    rejudge = ADAPTIVE_REJUDGE_SHARE if rule.rejudges else 0.0
    per_candidate, calls = warm * (1 + rejudge), n * per_item * (1 + rejudge)
    source, seconds, measured = "estimate", None, 0
    past = _past_candidates(ws, judge)
    if past:
        measured, source = len(past), "ledger"
        per_candidate = sum(e["cost"] for e in past) / measured
        calls = sum(e["calls"] for e in past) / measured
        first = [e["calls"] - e["rejudge"] for e in past]
        rejudge = sum(e["rejudge"] for e in past) / max(1, sum(first))
        durations = [e["duration"] for e in past if e["duration"]]
        seconds = sum(durations) / len(durations) if durations else None
    if source == "estimate" and rule.screens_futility(cfg.loop):
        notes.append(
            "futility screening is on ([loop] futility): a candidate it stops early costs less (a no-op "
            "about 0.84 of a pass in benchmarks/decision_power.py); the figures above are for a candidate "
            "judged in full"
        )
    waves: int | None = None
    if per_candidate <= 0:
        candidates = total_calls = None
        notes.append(f"model {judge.model!r} costs nothing at the price table's figures")
    else:
        candidates = max(0, math.floor((budget_usd - cold) / per_candidate))
        waves = candidates // wave
        if wave > 1:
            if candidates % wave:
                notes.append(
                    f"a wave is {wave} candidates: the {candidates % wave} candidate(s) the budget "
                    "buys beyond whole waves are not counted"
                )
            candidates = waves * wave
            notes.append(
                "waves judge their candidates together; through --batch (one batch per wave pass) an "
                f"hour decides about {wave}x the candidates of --wave 1 (benchmarks/throughput.py), and "
                "the time figure above is for candidates one after another"
            )
        total_calls = math.floor(candidates * calls + (n * per_item if budget_usd >= cold else 0))
        if budget_usd < cold:
            notes.append(f"the budget does not cover the baseline's cold first pass (${cold:.4f})")
    seconds_source = "measured"
    if on_cpu:
        idle, busy = (cpu_tokens.candidate_seconds(speed, 1 + rejudge) for speed in (CPU_IDLE, CPU_ONE_BUSY))
        notes.append(
            f"CPU judge: about {cpu_tokens.pass_seconds(CPU_IDLE) / 60:.1f} min a pass of the {n} items "
            f"({cpu_tokens.call_seconds(CPU_IDLE):.0f} s a call), {idle / 60:.1f} min a candidate judged "
            f"in full with both cores idle, {busy / 60:.1f} min with one busy (estimated from the tokens at "
            "the throughput measured on 2 cores; an early stop costs less; loading the model adds ~2 s once)"
        )
        if seconds is None:
            seconds, seconds_source = idle, "estimated, both cores idle"
    in_hours = None if hours is None or seconds is None else math.floor(hours * 3600 / seconds)
    return Plan(
        budget_usd=budget_usd,
        source=source,
        judge=f"{judge.provider}:{judge.model}",
        policy=policy,
        layout=prompts.settings.layout,
        replicates=replicates,
        items=n,
        baseline_usd=cold,
        first_pass_cold_usd=cold,
        first_pass_warm_usd=warm,
        rejudge_share=rejudge,
        cost_per_candidate_usd=per_candidate,
        calls_per_candidate=calls,
        candidates=candidates,
        calls=total_calls,
        hours=hours,
        seconds_per_candidate=seconds,
        candidates_in_hours=in_hours,
        measured_candidates=measured,
        wave=wave,
        waves=waves,
        seconds_source=seconds_source,
        notes=notes,
        cascade=cascade_plan,
    )


@dataclass
class CpuTokens:
    """The prompt tokens a pass makes the CPU judge read: its single request slot keeps the longest prefix
    it has seen, so the text every request shares (the instructions: the local provider puts them first
    whatever judge.toml's layout says) is read once a pass and each call reads only the rest."""

    requests: list[tuple[str, int, float]] = field(default_factory=list)  # (text, input tokens, calls)

    def add(self, request: JudgeRequest, calls: float) -> None:
        """Count ``calls`` calls of ``request``."""
        text = request.system + "".join(getattr(part, "text", "") for part in request.parts)
        self.requests.append((text, request_input_tokens(request), calls))

    @property
    def shared(self) -> int:
        """Estimated tokens of the longest prefix every request shares (0 with fewer than two)."""
        texts = [text for text, _, _ in self.requests]
        # Character by character on purpose: the model reuses the prompt text it has already read.
        return chars_tokens(len(os.path.commonprefix(texts))) if len(texts) > 1 else 0  # noqa: RUF071

    def call_seconds(self, speed: CpuSpeed) -> float:
        """A typical call's seconds: its tokens beyond the shared prefix and a typical verdict."""
        calls = sum(c for _, _, c in self.requests)
        own = sum(c * max(0, t - self.shared) for _, t, c in self.requests)
        return speed.call_seconds(own / max(1.0, calls))

    def pass_seconds(self, speed: CpuSpeed) -> float:
        """Seconds for every call of one pass of the split."""
        calls = sum(c for _, _, c in self.requests)
        return self.shared / speed.prompt_tokens_per_s + calls * self.call_seconds(speed)

    def candidate_seconds(self, speed: CpuSpeed, passes: float) -> float:
        """Seconds for a candidate judged in full: ``passes`` passes (re-judging included)."""
        return passes * self.pass_seconds(speed)


def _success_share(ws: Workspace, judge: JudgeSection, split: Split) -> tuple[float, str]:
    """The share of first judgements that are successes (what ``review = "success"`` re-examines), and
    where it comes from: the ledger's verdicts of past runs with this judge (a reviewed verdict counts
    as a first success), else the split's positive share."""
    ok = successes = 0
    if ws.ledger_path.exists():
        with Ledger.open_readonly(ws.ledger_path) as ledger:
            for e in _experiments_judged_by(ledger, judge):
                for item in ledger.item_verdicts(e.id):
                    for rep in item.replicates:
                        if rep.status == "ok" and rep.success is not None:
                            ok += 1
                            successes += bool(rep.success or rep.review is not None)
    if ok:
        share = successes / ok
        return share, (
            f'review = "success": a review call on {share:.0%} of verdicts (the share of first '
            f"judgements that were successes in the ledger, {ok} verdicts)"
        )
    from optimizer.devset.labels import load_labels

    labels = load_labels(split)
    share = sum(1 for t in split.ids if labels[t].is_positive) / max(1, len(split.ids))
    return share, (
        f'review = "success": a review call on {share:.0%} of verdicts (assumed: the split\'s positive '
        "share; no verdicts of this judge in the ledger yet)"
    )


def _past_candidates(ws: Workspace, judge: JudgeSection) -> list[dict[str, float]]:
    """Judge cost, calls, re-judging calls and seconds of every past candidate with paid judge calls
    in runs of this workspace judged by the same provider and model."""
    if not ws.ledger_path.exists():
        return []
    with Ledger.open_readonly(ws.ledger_path) as ledger:
        return [
            {
                "cost": e.judge_cost_usd,
                "calls": e.calls,
                "rejudge": e.rejudge_calls,
                "duration": e.duration_s or 0.0,
            }
            for e in _experiments_judged_by(ledger, judge)
            if e.seq >= 1 and e.calls > 0 and e.decision is not None
        ]


def _experiments_judged_by(ledger: Ledger, judge: JudgeSection) -> Iterator[Experiment]:
    """Every experiment of the ledger's runs judged by the same provider and model as ``judge``."""
    for run in ledger.runs():
        used = run.config.get("judge") or {}
        if used.get("provider") == judge.provider and used.get("model") == judge.model:
            yield from ledger.experiments(run.id)


def budget_warning(
    ws: Workspace,
    judge: JudgeSection,
    split_name: str | None,
    policy: str | None,
    replicates: int | None,
    budget_usd: float,
) -> str | None:
    """One line when ``budget_usd`` cannot cover the baseline and one candidate of a run with these
    settings (``None``: the configured ones); None when it can, or when no plan can be made (the run's
    own checks then say what is wrong)."""
    from optimizer.devset.split import open_split

    try:
        split = open_split(ws, split_name or ws.config.workspace.dev_split)
        plan = make_plan(
            ws,
            split,
            judge,
            policy=policy or ws.config.loop.policy,
            replicates=replicates or PromptSet.from_dir(ws.prompts_dir).settings.replicates,
            budget_usd=budget_usd,
        )
    except UserError:
        return None
    if plan.candidates is None or plan.candidates >= 1:
        return None
    return (
        f"the budget of ${budget_usd:.2f} cannot cover one candidate (baseline ${plan.baseline_usd:.4f} "
        f"+ ${plan.cost_per_candidate_usd:.4f} per candidate, from the {plan.source}); see `judgeloop plan`"
    )


@dataclass
class StageCost:
    """One judge's pass of the split as the estimator prices it: US dollars cold and warm from the cache,
    calls per item, and the tokens a CPU judge would read."""

    cold: float = 0.0
    warm: float = 0.0
    calls: float = 0.0
    cpu: CpuTokens = field(default_factory=CpuTokens)


@dataclass(frozen=True)
class _PassCost:
    split: Split
    review_share: float
    replicates: int
    max_tokens: int

    def price(self, prompts: PromptSet, price: Price, render: RenderOptions) -> StageCost:
        """Every call of one verdict (`verdict_calls`: a panel's members, the criteria derivation (once per
        item) and check, a review on the success share), each weighted per verdict, over every item; the
        evaluation's on-disk JPEG cache: a run's plan encodes what its baseline would anyway."""
        out = StageCost()
        n = self.replicates
        for tid in self.split.ids:
            verdict = verdict_calls(
                self.split.trajectory(tid),
                self.split,
                prompts,
                success_share=self.review_share,
                replicates=n,
                render=render,
            )
            for request, weight in verdict:
                prefix, rest = request_token_split(request)
                tail = rest * price.input + self.max_tokens * price.output
                write = price.cache_write_1h_price if request.cache_ttl == "1h" else price.cache_write_price
                out.cold += weight * n * (prefix * write + tail) / 1e6
                out.warm += weight * n * (prefix * price.cache_read_price + tail) / 1e6
                out.calls += weight * n
                out.cpu.add(request, weight * n)
        out.calls /= max(1, len(self.split.ids))
        return out


def cascade_stages(
    rule: EscalationRule, first: StageCost, second: StageCost, positive_share: float
) -> dict[str, Any]:
    """A cascade's plan record: the escalation share the loop estimates before any call
    (`EscalationRule.estimated_share` on the split's positive share, as `optimizer.loop.costs` does), and each
    stage's calls per item and warm cost per pass (the second's on the escalated share only)."""
    share = rule.estimated_share(positive_share)
    return {
        "rule": rule.describe(),
        "escalation_share": share,
        "escalation_source": "estimate (the split's positive share; `judgeloop cascade calibrate` measures it)",
        "stages": {
            "first": {"calls_per_item": first.calls, "pass_usd": first.warm},
            "second": {"calls_per_item": share * second.calls, "pass_usd": share * second.warm},
        },
    }


def cascade_note(record: dict[str, Any]) -> str:
    """The plan's line for a cascade judge."""
    first, second = record["stages"]["first"], record["stages"]["second"]
    return (
        f"cascade (rule {record['rule']}): about {record['escalation_share']:.0%} of items escalated (estimated "
        f"from the split's positive share; `judgeloop cascade calibrate` measures it); first judge "
        f"{first['calls_per_item']:.2f} calls/item ${first['pass_usd']:.4f} a pass, second judge "
        f"{second['calls_per_item']:.2f} calls/item ${second['pass_usd']:.4f} a pass (warm)"
    )


def _second_price(prices: dict[str, Price], cascade: CascadeSettings) -> Price:
    model = cascade.second.model
    price = price_for(model, {**prices, **cascade.second.prices})
    if price is None:
        raise UserError(
            f'no price is known for the cascade\'s second judge model {model!r}; add [prices."{model}"] to '
            "judgeloop.toml or [cascade.second.prices] to prompts/judge.toml (US dollars per million tokens)"
        )
    return price


def _positive_share(split: Split) -> float:
    from optimizer.devset.labels import load_labels

    labels = load_labels(split)
    return sum(1 for t in split.ids if labels[t].is_positive) / max(1, len(split.ids))
