"""The second room of a candidate's life: its evaluation on the dev split, and the decision on it.

`evaluate` judges the candidate's first pass (negatives first) by phases — futility's looks, each
followed by re-judging its disagreements and a futility check (`optimizer.stats.futility`) — stopping as soon
as an exact bound proves a rollback (`optimizer.stats.decision.EarlyStopper`); then, under a policy that
re-judges, it re-judges the items the two prompts disagree on (`optimizer.loop.compare.rejudge`) and
asks the policy, then the cost rules (`optimizer.loop.costs.cost_rules`). It hands on an `Evaluated`
record; an evaluation the run's stop request cut raises `EvaluationInterrupted`. Every pass is counted
in the run's spend, its cache telemetry recorded, a budget stop noted on the `RunContext`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from optimizer.evaluation.batch import BatchOptions
from optimizer.evaluation.batchstore import BatchRecord, BatchStatus, batch_status
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.inspect_log import write_inspect_log
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.events import Message, PassProgress, Progress, ProgressSnapshot, StageChanged, StopKind
from optimizer.judge.endpoints import ENDPOINT_NOTE
from optimizer.judge.prompts import PromptSet
from optimizer.judge.types import BatchState, Provider
from optimizer.ledger import Experiment, Ledger
from optimizer.loop.compare import Judgements, JudgingSetup, Rejudging, judgements_of, rejudge
from optimizer.loop.context import RunContext
from optimizer.loop.costs import cost_rules, verdict_cost
from optimizer.loop.progress import pass_figures
from optimizer.loop.records import Evaluated, EvaluationInterrupted, evaluation_order
from optimizer.stats.decision import (
    Decision,
    EarlyStopper,
    FprStopper,
    adaptive_stopped_decision,
    decide_adaptive,
    disagreements,
)
from optimizer.stats.futility import Screen, make_looks, screen_decision_rejudged
from optimizer.stats.metrics import Answer, bootstrap_intervals, flip_table, score
from optimizer.stats.policies import policy_for
from optimizer.vocab import StageKind
from optimizer.workspace.config import JudgeSection

# Passes below plan said on stderr before any pass of the run was billed a cache read (then silent).
SILENT_PASSES_SAID = 2


@dataclass(frozen=True)
class EvalOptions:
    """How one candidate is evaluated. ``judge``: the run's judge with another ``max_concurrency`` (a wave
    shares the run's among its candidates), None for the run's own; ``cheaper``: the candidate is estimated
    cheaper by ``cheaper_min_saving`` (`optimizer.loop.costs.cheaper_eligible`), so it may be kept without a
    kappa gain: only the FPR bound may stop it early, and it is re-judged in full; ``look_seed``: the seed
    of futility's looks (default the candidate's decision seed; a wave's candidates share one, so they
    judge their first passes in one order); ``propose_only``: a person decides, so nothing stops early."""

    judge: JudgeSection | None = None
    cheaper: bool = False
    look_seed: int | None = None
    propose_only: bool = False


class LedgerBatches:
    """The run's `BatchStore`: batches recorded in the ledger under the run and the experiment being
    evaluated, so `judgeloop run --resume` collects a batch a killed run left pending."""

    def __init__(self, ledger: Ledger, run_id: str, experiment_id: int | None) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.experiment_id = experiment_id

    def record_batch(
        self, *, provider: str, endpoint: str, model: str, custom_ids: list[str], estimate_usd: float
    ) -> int:
        return self.ledger.record_batch(
            self.run_id,
            self.experiment_id,
            provider=provider,
            endpoint=endpoint,
            model=model,
            custom_ids=custom_ids,
            estimate_usd=estimate_usd,
        )

    def update_batch(self, record_id: int, *, status: BatchStatus, batch_id: str | None = None) -> None:
        self.ledger.update_batch(record_id, status=status, batch_id=batch_id)

    def open_batches(self, *, provider: str, endpoint: str, model: str) -> list[BatchRecord]:
        return [
            BatchRecord(
                record_id=row.id,
                provider=row.provider,
                endpoint=row.endpoint,
                model=row.model,
                batch_id=row.batch_id,
                status=batch_status(row.status),
                custom_ids=tuple(row.custom_ids),
                estimate_usd=row.estimate_usd,
            )
            for row in self.ledger.batches(self.run_id, open_only=True)
            if (row.provider, row.endpoint, row.model) == (provider, endpoint, model)
        ]


def batch_options(ctx: RunContext, experiment_id: int) -> BatchOptions | None:
    """Under ``--batch``, each pass (first pass, each side's re-judging) is one batch."""
    if not ctx.settings.batch:
        return None

    def on_state(state: BatchState) -> None:
        ctx.say(f"  {state.line()}")
        # A stage event: the TUI's live strip shows the batch's state ("batch msgbatch_…: in_progress").
        ctx.stage(StageKind.BATCH, experiment_id, text=state.line())

    return BatchOptions.from_judge(
        ctx.settings.judge,
        store=LedgerBatches(ctx.ledger, ctx.run.id, experiment_id),
        on_state=on_state,
    )


def pass_reporter(
    ctx: RunContext,
    experiment_id: int,
    *,
    before: EvalRun | None = None,
    total: int | None = None,
    rejudging: bool = False,
) -> Callable[[ProgressSnapshot], None]:
    """The progress reporter of one pass of ``experiment_id``: the terminal line (a wave's own while a
    wave is judged) and the ledger's progress events. ``before``: the first pass's earlier phases
    (futility's looks), counted in, and ``total`` its items, so the first pass reads as one."""
    last = [0.0]
    base = None if before is None else pass_figures(before)

    def report(snap: ProgressSnapshot) -> None:
        ended = snap.done >= snap.total  # this pass (or look) is judged: always reported
        if base is not None:
            snap = base.plus(snap)
        if total is not None:
            snap = dataclasses.replace(snap, total=total)
        wave = ctx.wave_line
        if wave is not None and not rejudging:
            wave.update(experiment_id, snap)
        now = time.monotonic()
        if now - last[0] < 0.5 and not ended:
            return
        last[0] = now
        if wave is None:
            ctx.events(Progress(snap))
        ctx.ledger.add_event(
            ctx.run.id,
            PassProgress(
                done=snap.done,
                total=snap.total,
                errors=snap.infra_errors + snap.parse_errors,
                calls=snap.calls_made,
                cache_hits=snap.cache_hits,
                input_tokens=snap.input_tokens,
                output_tokens=snap.output_tokens,
                cost_usd=round(ctx.spent_usd + snap.cost_usd, 6),
                elapsed_s=round(time.monotonic() - ctx.started, 1),
            ),
            experiment_id=experiment_id,
        )

    return report


def cache_telemetry(ctx: RunContext, experiment_id: int, run: EvalRun) -> None:
    """Record a pass's planned cache reads; its warning when the billed ones fell below plan (stderr)."""
    ctx.ledger.add_planned_cache_reads(experiment_id, run.cache_reads.planned)
    ctx.ledger.add_endpoint_pass(experiment_id, run.endpoints)  # [judge] base_urls: per endpoint
    warning = run.cache_reads.warning()
    ctx.reads_seen = ctx.reads_seen or run.cache_reads.billed > 0
    if warning is None:
        return
    if not ctx.reads_seen:
        # A server that never caches (or never reports it) would repeat the warning on every pass.
        ctx.silent_passes += 1
        if ctx.silent_passes > SILENT_PASSES_SAID:
            return
        if ctx.silent_passes == SILENT_PASSES_SAID:
            warning += (
                "; no pass of this run has read the cache: a server without prompt caching, or one "
                "that does not report cached tokens, would repeat this on every pass, so this run says "
                "it no more (planned and billed reads stay in the ledger and `judgeloop report`)"
            )
    ctx.events(Message(f"  experiment {experiment_id}: {warning}", "note"))


def joined(first: EvalRun, then: EvalRun) -> EvalRun:
    """One first pass out of two consecutive parts (futility's looks): items, usage and figures summed."""
    endpoints = {name: dict(figures) for name, figures in first.endpoints.items()}
    for name, figures in then.endpoints.items():
        mine = endpoints.setdefault(name, {})
        for key, value in figures.items():
            mine[key] = mine.get(key, 0) + value
    return EvalRun(
        items=first.items + then.items,
        usage=first.usage + then.usage,
        cache_hits=first.cache_hits + then.cache_hits,
        duration_s=first.duration_s + then.duration_s,
        stop=then.stop,
        notes=first.notes + then.notes,
        not_evaluated=first.not_evaluated + then.not_evaluated,
        item_ids=first.item_ids + then.item_ids,
        cache_reads=dataclasses.replace(
            first.cache_reads,
            planned=first.cache_reads.planned + then.cache_reads.planned,
            billed=first.cache_reads.billed + then.cache_reads.billed,
        ),
        # Both parts are one evaluation's (same judge, prompts and split): the later part's says it.
        meta=then.meta,
        endpoints=endpoints,
    )


async def evaluate(
    ctx: RunContext,
    experiment_id: int,
    prompts: PromptSet,
    incumbent: Experiment | None,
    provider: Provider,
    cache: JudgeCache,
    options: EvalOptions | None = None,
) -> Evaluated:
    """Evaluate ``prompts`` on the whole split (negatives first) and decide against ``incumbent``.

    With an incumbent, stop as soon as an exact bound proves a rollback; under the adaptive
    policy, then re-judge the items the two prompts disagree on (`rejudge`). Items that hit
    infrastructure errors are left out of the bounds (unjudged) and make the evaluation
    incomplete: such a candidate is never decided on partial data. ``options``: `EvalOptions`.
    """
    return await _Evaluation(
        ctx, experiment_id, prompts, incumbent, provider, cache, options or EvalOptions()
    ).run()


@dataclass
class _Evaluation:
    """One candidate's evaluation in progress (the state `evaluate`'s steps share)."""

    ctx: RunContext
    experiment_id: int
    prompts: PromptSet
    incumbent: Experiment | None
    provider: Provider
    cache: JudgeCache
    options: EvalOptions
    passes: list[EvalRun] = field(default_factory=list)  # the re-judging passes, in order
    rejudged: list[str] = field(default_factory=list)  # re-judged at a look (judgements include it)
    early: list[Decision] = field(default_factory=list)
    so_far: dict[str, Answer] = field(default_factory=dict)
    stopper: EarlyStopper | FprStopper | None = None

    def __post_init__(self) -> None:
        ctx = self.ctx
        self.judge = self.options.judge or ctx.settings.judge
        self.loop = ctx.settings.loop
        self.order = evaluation_order(ctx.labels, ctx.split.ids)
        self.policy = policy_for(self.loop)
        self.level = ctx.test_level()
        self.inc_answers = ctx.ledger.item_answers(self.incumbent.id) if self.incumbent else None
        self.inc_judgements = ctx.ledger.item_judgements(self.incumbent.id) if self.incumbent else None

    async def run(self) -> Evaluated:
        ctx, loop, exp_id = self.ctx, self.loop, self.experiment_id
        # Futility screening (adaptive, direct passes): the first pass goes look by look (`optimizer.stats.futility.
        # make_looks`); after each, the look's disagreements are re-judged — the calls the decision makes
        # anyway, paid once — and P(clear) checked on everything judged so far.
        looks: list[Screen] = []
        if (
            self.policy.screens_futility(loop)
            and self.inc_answers is not None
            and not ctx.settings.batch
            and not self.options.propose_only
        ):
            looks = make_looks(
                ctx.labels,
                self.inc_answers,
                ctx.decision_seed(exp_id) if self.options.look_seed is None else self.options.look_seed,
            )
            self.order = looks[-1].order(ctx.labels, ctx.split.ids)
        first = await self._first_pass(looks)
        if isinstance(first, Evaluated):
            return first
        result, inc_now, cand_now = first
        _account_first_pass(ctx, exp_id, result)
        write_pass_log(ctx, exp_id, result)
        return await self._decide(result, inc_now, cand_now)

    def _on_item(self, item: ItemResult) -> bool:
        """Whether the first pass may stop after ``item`` (an exact bound proves the rollback)."""
        inc_answers, inc_judgements = self.inc_answers, self.inc_judgements
        # --propose-only evaluates in full: a human decides, and a candidate they keep becomes the
        # incumbent, whose answers every later candidate is compared with item by item.
        # (A batch pass never calls this: every call of a batch is paid for once it is sent.)
        if item.infra_error or inc_answers is None or inc_judgements is None or self.options.propose_only:
            return False
        self.so_far[item.trajectory_id] = item.answer
        # Incremental (`stopped_decision` / `adaptive_stopped_decision` over everything judged so
        # far would make the checks quadratic in the split).
        if self.stopper is None:
            ctx = self.ctx
            self.stopper = (
                FprStopper(ctx.labels, inc_answers, self.loop, alpha=self.level)
                if self.options.cheaper
                else EarlyStopper(ctx.labels, inc_answers, inc_judgements, self.loop, alpha=self.level)
            )
        stopper = self.stopper
        decision = (
            stopper.add(item.trajectory_id, item.answer)
            if isinstance(stopper, FprStopper)
            else stopper.add(item.trajectory_id, item.answer, judgements_of(item))
        )
        if decision is not None:
            self.early.append(decision)
            return True
        return False

    async def _first_pass(
        self,
        looks: list[Screen],
    ) -> Evaluated | tuple[EvalRun, Judgements | None, Judgements]:
        """The first pass, phase by phase: each look's new items, then the rest (one phase without
        futility); after each look, its disagreements re-judged and futility checked. An `Evaluated`
        when the looks' re-judging failed, else (the pass, the incumbent's and the candidate's judgements)."""
        ctx, exp_id, loop = self.ctx, self.experiment_id, self.loop
        batch = batch_options(ctx, exp_id)
        phases: list[list[str]] = []
        seen: set[str] = set()
        for look in looks:
            phases.append([t for t in self.order if t in look.ids and t not in seen])
            seen |= look.ids
        phases.append([t for t in self.order if t not in seen])
        result: EvalRun | None = None
        inc_now = dict(self.inc_judgements) if self.inc_judgements is not None else None
        cand_now: Judgements = {}
        for index, phase in enumerate(phases):
            if not phase and (result is not None or index < len(phases) - 1):
                continue  # a look that adds nothing (a tiny class), or nothing left after the last look
            part = await evaluate_items(
                ctx.ws,
                ctx.split,
                self.prompts,
                self.judge,
                item_ids=phase,
                replicates=ctx.settings.replicates,
                options=PassOptions(
                    on_item=self._on_item,
                    budget=ctx.budget(),
                    progress=pass_reporter(ctx, exp_id, before=result, total=len(self.order)),
                    provider=self.provider,
                    cache=self.cache,
                    infra_retry_rounds=loop.infra_retry_rounds,
                    infra_retry_pause_s=loop.infra_retry_pause_s,
                    batch=batch,
                    stop=ctx.stop,
                ),
            )
            result = part if result is None else joined(result, part)
            cand_now |= {item.trajectory_id: judgements_of(item) for item in part.items}
            if (
                index == len(phases) - 1
                or self.early
                or part.stop is not None
                or part.infra_error_ids
                or part.not_evaluated
                or self.inc_answers is None
                or inc_now is None
                or self.incumbent is None
            ):
                break
            look = looks[index]
            fresh = [
                t for t in disagreements(self.inc_answers, part.answers()) if t not in set(self.rejudged)
            ]
            if fresh and loop.rejudge > 0:
                # (Its own: in a wave, the run's last stage may be another candidate's.)
                last = ctx.ledger.last_event(ctx.run.id, "stage", experiment_id=exp_id)
                evaluating = last.typed() if last is not None else None
                ctx.stage(StageKind.REJUDGING, exp_id, items=len(fresh))
                ctx.say(
                    f"  experiment {exp_id}: re-judging the screen's {len(fresh)} disagreement(s), "
                    f"{loop.rejudge} more time(s) under each"
                )
                rj = await self._rejudge(fresh, (inc_now, cand_now), batch, result)
                if rj.error is not None:
                    _account_first_pass(ctx, exp_id, result)  # the looks judged so far were paid
                    return Evaluated(result, None, None, None, None, error=rj.error, rejudge=self.passes)
                inc_now, cand_now = rj.first, rj.second
                self.rejudged += fresh
                # Back to the first pass, from the same start (what a crash paid is counted from it).
                if isinstance(evaluating, StageChanged) and evaluating.stage == StageKind.EVALUATING:
                    ctx.stage(StageKind.EVALUATING, exp_id, started_at=evaluating.started_at)
            if self.options.cheaper:
                continue  # a candidate estimated cheaper is judged in full: futility does not stop it
            futile = screen_decision_rejudged(
                ctx.labels,
                look,
                inc_now,
                cand_now,
                loop,
                level=self.level,
                seed=ctx.decision_seed(exp_id),
            )
            if futile is not None:
                self.early.append(futile)
                break
        assert result is not None
        return result, inc_now, cand_now

    async def _decide(self, result: EvalRun, inc_now: Judgements | None, cand_now: Judgements) -> Evaluated:
        """The decision on a whole first pass (or its early stop): the re-judging, the policy, the cost rules."""
        ctx, exp_id, loop, cheaper = self.ctx, self.experiment_id, self.loop, self.options.cheaper
        inc_answers, inc_judgements, incumbent = self.inc_answers, self.inc_judgements, self.incumbent
        answers = result.answers()
        if self.early:
            judged = {t: ctx.labels[t] for t in self.so_far}
            flips = (
                flip_table(judged, {t: inc_answers[t] for t in judged}, self.so_far) if inc_answers else None
            )
            return Evaluated(result, self.early[0], None, None, flips, rejudge=self.passes)
        if result.stop is not None and result.stop.kind is StopKind.INTERRUPTED:
            raise EvaluationInterrupted(exp_id, len(result.items), len(self.order), result.cost_usd)
        if result.infra_error_ids:
            n = len(result.infra_error_ids)
            return Evaluated(
                result,
                None,
                None,
                None,
                None,
                error=f"{n} item(s) hit infrastructure errors after every retry "
                f"(e.g. {result.infra_error_ids[0]}); not decided on partial data",
            )
        if result.stopped_early or result.not_evaluated:
            return Evaluated(
                result,
                None,
                None,
                None,
                None,
                error=result.stop_reason or f"{len(result.not_evaluated)} item(s) not evaluated",
            )
        metrics = score(ctx.labels, answers)
        intervals = bootstrap_intervals(ctx.labels, answers)
        cost = verdict_cost(ctx, result)
        if incumbent is None or inc_answers is None or inc_judgements is None:
            return Evaluated(result, None, metrics, intervals, None, verdict_cost=cost)
        flips = flip_table(ctx.labels, inc_answers, answers)
        cand_judgements = {item.trajectory_id: judgements_of(item) for item in result.items}
        to_rejudge: list[str] = []
        if self.policy.rejudge(loop) > 0:
            # Nothing re-judging could bring would make it a keep: the re-judging calls are not made.
            skip = (
                None
                if cheaper or self.rejudged
                else adaptive_stopped_decision(
                    ctx.labels, cand_judgements, inc_judgements, loop, alpha=self.level
                )
            )
            if skip is not None:
                return Evaluated(result, skip, metrics, intervals, flips, verdict_cost=cost)
            to_rejudge = [
                t
                for t in self.order
                if t in set(disagreements(inc_answers, answers)) and t not in set(self.rejudged)
            ]
        if self.rejudged and inc_now is not None:  # the looks' re-judging, paid already
            inc_judgements, cand_judgements = inc_now, cand_now
        if to_rejudge:
            ctx.stage(StageKind.REJUDGING, exp_id, items=len(to_rejudge))
            ctx.say(
                f"  experiment {exp_id}: re-judging the {len(to_rejudge)} item(s) the prompts disagree "
                f"on, {loop.rejudge} more time(s) under each"
            )
            rj = await self._rejudge(
                to_rejudge, (inc_judgements, cand_judgements), batch_options(ctx, exp_id), result
            )
            if rj.error is not None:
                return Evaluated(result, None, None, None, None, error=rj.error, rejudge=self.passes)
            inc_judgements, cand_judgements = rj.first, rj.second
        to_rejudge = self.rejudged + to_rejudge
        decision = decide_adaptive(
            ctx.labels,
            inc_judgements,
            cand_judgements,
            loop,
            first_pass=ctx.settings.replicates,
            rejudged=to_rejudge,
            alpha=self.level,
            seed=ctx.decision_seed(exp_id),
        )
        decision = cost_rules(
            ctx,
            decision,
            incumbent,
            cost,
            (inc_judgements, cand_judgements),
            level=self.level,
            experiment_id=exp_id,
            cheaper=cheaper,
        )
        return Evaluated(result, decision, metrics, intervals, flips, rejudge=self.passes, verdict_cost=cost)

    async def _rejudge(
        self,
        items: list[str],
        judgements: tuple[Judgements, Judgements],
        batch: BatchOptions | None,
        result: EvalRun,
    ) -> Rejudging:
        """Re-judge ``items`` under the incumbent's prompts and the candidate's (`rejudge`), and account for
        it: the spend, the passes (appended to ``passes``) and their cache telemetry, a budget stop; a cut by
        the user raises `EvaluationInterrupted`. The caller handles ``error``."""
        ctx, exp_id = self.ctx, self.experiment_id
        assert self.incumbent is not None
        setup = JudgingSetup(
            ctx.ws,
            ctx.split,
            self.judge,
            self.loop,
            provider=self.provider,
            cache=self.cache,
            budget=ctx.budget(),
            progress=pass_reporter(ctx, exp_id, rejudging=True),
            stop=ctx.stop,
            batch=batch,
        )
        rj = await rejudge(
            setup,
            items=items,
            prompts=(PromptSet.from_rev(ctx.ws, self.incumbent.commit_sha or "HEAD~1"), self.prompts),
            judgements=judgements,
            first_replicate=ctx.settings.replicates,
        )
        ctx.count_judged(rj.cost_usd)
        self.passes += rj.passes
        if ctx.wave_line is not None:
            ctx.wave_line.rejudged(exp_id, self.passes)
        for again in rj.passes:
            cache_telemetry(ctx, exp_id, again)
        if rj.budget_stop is not None:
            ctx.budget_exhausted = rj.budget_stop
        if rj.error is not None and ctx.interrupted:
            raise EvaluationInterrupted(
                exp_id, len(result.items), len(self.order), result.cost_usd + rj.cost_usd
            )
        return rj


def _account_first_pass(ctx: RunContext, experiment_id: int, result: EvalRun) -> None:
    """Count a candidate's first pass (every look judged so far) once, however the evaluation ends:
    its notes, its cache telemetry, its spend (US dollars) in the run's, and a budget stop."""
    for note in (
        result.notes if ctx.settings.batch else [n for n in result.notes if n.startswith(ENDPOINT_NOTE)]
    ):
        if note == result.cache_reads.warning():  # said on stderr by cache_telemetry
            continue
        ctx.say(f"  {note}")
        if note.startswith(ENDPOINT_NOTE) and " drained (" in note:  # kept in the ledger, not only said
            ctx.stage(StageKind.ENDPOINT_DRAINED, experiment_id, text=note)
    cache_telemetry(ctx, experiment_id, result)
    ctx.count_judged(result.cost_usd)
    # The evaluator refused a call that would cross the budget: no later candidate can be paid for.
    if result.stop is not None and result.stop.kind is StopKind.BUDGET:
        ctx.budget_exhausted = result.stop.message


def pass_log_path(ctx: RunContext, experiment_id: int) -> Path:
    """Where ``[loop] inspect_logs`` writes a candidate's first pass: under the run's folder."""
    return ctx.ws.experiments_dir / "runs" / ctx.run.id / "inspect" / f"experiment-{experiment_id}.eval"


def write_pass_log(ctx: RunContext, experiment_id: int, result: EvalRun) -> None:
    """With ``[loop] inspect_logs``: the candidate's first pass (every look) as an Inspect AI log at
    `pass_log_path`; its kappa and FPR only when the pass was judged whole (an early stop is a part)."""
    if not ctx.settings.loop.inspect_logs:
        return
    whole = not (result.stopped_early or result.not_evaluated or result.infra_error_ids)
    metrics = score(ctx.labels, result.answers()) if whole else None
    write_inspect_log(pass_log_path(ctx, experiment_id), result, ctx.split, ctx.labels, metrics)
