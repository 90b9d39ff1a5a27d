"""The auto-research loop: propose → guard → commit → evaluate (dev split only) → decide → keep or roll back.

Everything the loop does is recorded in the ledger as it happens (one transaction per state change),
so a crash or ``kill -9`` leaves a consistent ledger, and ``judgeloop run --resume`` restores the
tree to the incumbent (or to the interrupted candidate's commit) and continues; every judge call
already paid for comes back from the cache.

`LoopRunner` drives one run; `optimizer.loop.session` sets runs up, resumes them and decides waiting
candidates. The runner tells the person following it what happens through its ``events`` listener.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer import gitops
from optimizer.config import JudgeSection, LoopSection
from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.evaluation.batch import BatchOptions, WaveBatches
from optimizer.evaluation.batchstore import BatchRecord, BatchStatus, batch_status
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import evaluate_items
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.evaluation.stopping import StopRequest
from optimizer.events import Listener, Message, Progress, ProgressSnapshot, StopKind, StopReason, ignore
from optimizer.judge.criteria import verdict_calls
from optimizer.judge.endpoints import ENDPOINT_NOTE
from optimizer.judge.estimate import steady_cost_usd
from optimizer.judge.memory import CASES_JSONL, MEMORY_FILES, PRINCIPLES_MD, Case, parse_cases
from optimizer.judge.prompts import PromptSet
from optimizer.judge.provenance import ItemIndex
from optimizer.judge.providers import Usage, make_provider
from optimizer.judge.providers.pricing import Price, price_for, warm_cost_usd
from optimizer.judge.types import BatchState, Provider, batches, stable_json
from optimizer.ledger import (
    AnswerStatus,
    Experiment,
    ExperimentOutcome,
    ExperimentStatus,
    ItemVerdict,
    Ledger,
    MemberVerdict,
    ReplicateVerdict,
    Run,
    verdict_detail,
)
from optimizer.ledger.waves import next_wave_number
from optimizer.loop import trust
from optimizer.loop.compare import Judgements, Rejudging, judgements_of, rejudge
from optimizer.loop.guards import (
    check_candidate,
    check_rationale,
    clipped_rationale,
    instruction_ngrams,
    instruction_values,
    trajectory_values,
)
from optimizer.loop.strategies import (
    IN_WAVE,
    Disagreement,
    PastExperiment,
    Proposal,
    ProposalContext,
    ProposalError,
    ReviewNote,
    Strategy,
    proposes_waves,
)
from optimizer.loop.validate import candidate_files, validate_prompts
from optimizer.models import Label
from optimizer.paths import allowed_name, read_prompt_file, write_prompt_file
from optimizer.runsettings import Limits
from optimizer.stats.decision import (
    Decision,
    EarlyStopper,
    FprStopper,
    adaptive_stopped_decision,
    decide_adaptive,
    decide_cheaper,
    decide_wave,
    disagreements,
    lord_level,
)
from optimizer.stats.futility import Screen, make_looks, screen_decision
from optimizer.stats.metrics import Answer, Metrics, bootstrap_intervals, flip_table, score
from optimizer.stats.policies import policy_for
from optimizer.vocab import TESTED_STATUSES, StageKind
from optimizer.workspace import Workspace


def evaluation_order(labels: Mapping[str, Label], ids: list[str]) -> list[str]:
    """Negatives first (the FPR guard needs only them), then positives; manifest order within each."""
    return [t for t in ids if not labels[t].is_positive] + [t for t in ids if labels[t].is_positive]


def _answer_status(status: str) -> AnswerStatus:
    return "ok" if status == "ok" else ("infra_error" if status == "infra_error" else "invalid")


def item_verdicts(run: EvalRun) -> list[ItemVerdict]:
    """Ledger rows for every evaluated item (majority answer and each replicate)."""
    rows = []
    for item in run.items:
        reps = [
            ReplicateVerdict(
                replicate=r.index,
                success=r.success,
                status=_answer_status(r.status),
                reasoning=r.verdict.reasoning if r.verdict else (r.parse_error or r.infra_error or ""),
                confidence=r.verdict.confidence if r.verdict else None,
                mistake_type=r.verdict.mistake_type if r.verdict else None,
                raw=r.reply_text if r.verdict is None else None,
                cached=r.cached,
                cost_usd=r.cost_usd,
                tools=list(r.trace),
                members=[
                    MemberVerdict(
                        member=m.member or str(k), success=m.success, status=_answer_status(m.status),
                        reasoning=m.verdict.reasoning if m.verdict else (m.parse_error or m.infra_error or ""),
                        confidence=m.verdict.confidence if m.verdict else None,
                        mistake_type=m.verdict.mistake_type if m.verdict else None,
                        cached=m.cached, cost_usd=m.cost_usd,
                    )
                    for k, m in enumerate(r.members)
                ],
                **verdict_detail(r.verdict),
            )
            for r in item.replicates
        ]
        rows.append(
            ItemVerdict(
                trajectory_id=item.trajectory_id,
                success=item.answer.success,
                status=item.answer.status,
                mistake_type=item.answer.mistake_type,
                unstable=item.unstable,
                replicates=reps,
            )
        )
    return rows


def unified_diff(changed: Mapping[str, tuple[str | None, str | None]]) -> tuple[str, int, int]:
    """A git-style unified diff of the candidate's files, with insertion and deletion counts."""
    chunks: list[str] = []
    ins = dels = 0
    for path, (old, new) in sorted(changed.items()):
        lines = list(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"a/{path}",
                tofile=f"b/{path}",
            )
        )
        for line in lines:
            if line.startswith("+") and not line.startswith("+++"):
                ins += 1
            elif line.startswith("-") and not line.startswith("---"):
                dels += 1
        chunks.append("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return "".join(chunks), ins, dels


def decision_trailers(exp_id: int, metrics: Metrics | None, decision: str) -> dict[str, object]:
    return {
        "Judgeloop-Experiment": exp_id,
        "Judgeloop-Kappa": "n/a" if metrics is None or metrics.kappa is None else f"{metrics.kappa:.3f}",
        "Judgeloop-FPR": "n/a" if metrics is None or metrics.fpr is None else f"{metrics.fpr:.3f}",
        "Judgeloop-Decision": decision,
    }


@dataclass
class Evaluated:
    """A candidate's evaluation and the decision on it."""

    run: EvalRun
    decision: Decision | None  # None when the evaluation is incomplete (infra errors, budget)
    metrics: Metrics | None
    intervals: dict[str, tuple[float, float]] | None
    flips: Any
    error: str | None = None
    # The re-judging passes (incumbent's, then candidate's) under the adaptive policy.
    rejudge: list[EvalRun] = field(default_factory=list)
    # The first pass's cost per paid verdict (`LoopRunner.verdict_cost`); None when unknown.
    verdict_cost: float | None = None

    @property
    def rejudge_usage(self) -> Usage:
        return sum((p.usage for p in self.rejudge), Usage())

    @property
    def usage(self) -> Usage:
        """The judge's calls of every pass (first pass and re-judging)."""
        return self.run.usage + self.rejudge_usage

    @property
    def calls(self) -> int:
        return self.usage.calls

    def outcome(
        self, status: ExperimentStatus, reason: str, *, extra_cost_usd: float = 0.0, commit_sha: str | None = None,
        prompt_hash: str | None = None,
    ) -> ExperimentOutcome:
        """The ledger's record of this evaluation ending as ``status``; ``extra_cost_usd``: what else
        the row's total counts (the optimiser's proposal, or what was paid before a crash)."""
        d = self.decision
        return ExperimentOutcome(
            status=status, reason=reason, metrics=self.metrics, intervals=self.intervals, flips=self.flips,
            p_value=d.p_value if d else None,
            literal_keep=d.literal_keep if d else None,
            paired_keep=d.paired_keep if d else None,
            adaptive_keep=d.adaptive_keep if d else None,
            alpha=d.alpha if d else None,
            test=d.test.model_dump(mode="json") if d and d.test else None,
            early_stopped=bool(d and d.early_stopped),
            items_evaluated=len(self.run.items),
            usage=self.usage,
            cache_hits=self.run.cache_hits + sum(p.cache_hits for p in self.rejudge),
            rejudge=self.rejudge_usage,
            extra_cost_usd=extra_cost_usd,
            duration_s=self.run.duration_s + sum(p.duration_s for p in self.rejudge),
            commit_sha=commit_sha,
            prompt_hash=prompt_hash,
            keep_kind=(d.keep_kind or "improved") if d and status == "kept" else None,
            verdict_cost_usd=self.verdict_cost,
            policy_keep=d.keep if d else None,
            policy_reason=d.reason if d else None,
            # The policy decided when the status is its keep or roll back; a waiting one is a person's to decide.
            decided_by="policy" if d and status in ("kept", "rolled_back") else None,
        )


# Items rendered to estimate a prompt set's cost per verdict before it is evaluated.
ESTIMATE_ITEMS = 3


class LedgerBatches:
    """The run's `BatchStore`: batches recorded in the ledger under the run and the experiment being
    evaluated, so `judgeloop run --resume` collects a batch a killed run left pending."""

    def __init__(self, ledger: Ledger, run_id: str, experiment_id: int | None) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.experiment_id = experiment_id

    def record_batch(self, *, provider: str, endpoint: str, model: str, custom_ids: list[str],
                     estimate_usd: float) -> int:
        return self.ledger.record_batch(self.run_id, self.experiment_id, provider=provider, endpoint=endpoint,
                                        model=model, custom_ids=custom_ids, estimate_usd=estimate_usd)

    def update_batch(self, record_id: int, *, status: BatchStatus, batch_id: str | None = None) -> None:
        self.ledger.update_batch(record_id, status=status, batch_id=batch_id)

    def open_batches(self, *, provider: str, endpoint: str, model: str) -> list[BatchRecord]:
        return [
            BatchRecord(record_id=row.id, provider=row.provider, endpoint=row.endpoint, model=row.model,
                        batch_id=row.batch_id, status=batch_status(row.status), custom_ids=tuple(row.custom_ids),
                        estimate_usd=row.estimate_usd)
            for row in self.ledger.batches(self.run_id, open_only=True)
            if (row.provider, row.endpoint, row.model) == (provider, endpoint, model)
        ]


class EvaluationInterrupted(Exception):
    """The run's `StopRequest` stopped an evaluation before it could be decided; the experiment stays
    ``running`` (what was judged is cached), so `judgeloop run --resume` finishes it."""

    def __init__(self, experiment_id: int, judged: int, total: int, cost_usd: float) -> None:
        super().__init__(f"experiment {experiment_id} interrupted after {judged}/{total} items")
        self.experiment_id, self.judged, self.total, self.cost_usd = experiment_id, judged, total, cost_usd


@dataclass
class LoopRunner:
    ws: Workspace
    ledger: Ledger
    run: Run
    split: Split
    labels: dict[str, Label]
    judge: JudgeSection
    loop_cfg: LoopSection
    strategy: Strategy
    limits: Limits
    replicates: int
    seed: int  # [optimizer] seed as the run recorded it (`RunSettings.seed`)
    spent_usd: float = 0.0
    started: float = field(default_factory=time.monotonic)
    # Set by a Ctrl-C or SIGTERM (`optimizer.cli.signals`), or by any caller: no new judge call starts.
    stop: StopRequest = field(default_factory=StopRequest)
    budget_exhausted: str | None = None  # why the judge budget cannot pay for another call
    events: Listener = ignore
    batch: bool = False  # each pass is one batch through the provider's batch API (no early stopping)
    _budget: Budget | None = None
    _guard_inputs: dict[str, Any] | None = None
    _wave_line: WaveProgress | None = None  # while a wave is judged: its one progress line
    _reads_seen: bool = False  # some pass of this run was billed cache reads
    _silent_passes: int = 0  # passes below plan before any read was billed (`cache_telemetry`)

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.ws.root

    @property
    def interrupted(self) -> bool:
        return self.stop.is_set()

    def budget(self) -> Budget | None:
        if self.limits.budget_usd is None:
            return None
        if self._budget is None:
            self._budget = Budget(self.limits.budget_usd, spent_usd=self.spent_usd)
        return self._budget

    def charge(self, cost_usd: float) -> None:
        """Count optimiser spending (US dollars) against the run's spend and the judge budget."""
        self.spent_usd += cost_usd
        if self._budget is not None:
            self._budget.spent_usd += cost_usd

    def _progress(self, experiment_id: int, *, before: EvalRun | None = None, total: int | None = None,
                  rejudging: bool = False) -> Callable[[ProgressSnapshot], None]:
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
            wave = self._wave_line
            if wave is not None and not rejudging:
                wave.update(experiment_id, snap)
            now = time.monotonic()
            if now - last[0] < 0.5 and not ended:
                return
            last[0] = now
            if wave is None:
                self.events(Progress(snap))
            self.ledger.add_event(
                self.run.id,
                "progress",
                {
                    "done": snap.done,
                    "total": snap.total,
                    "errors": snap.infra_errors + snap.parse_errors,
                    "calls": snap.calls_made,
                    "cache_hits": snap.cache_hits,
                    "input_tokens": snap.input_tokens,
                    "output_tokens": snap.output_tokens,
                    "cost_usd": round(self.spent_usd + snap.cost_usd, 6),
                    "elapsed_s": round(time.monotonic() - self.started, 1),
                },
                experiment_id=experiment_id,
            )

        return report

    def cache_telemetry(self, experiment_id: int, run: EvalRun) -> None:
        """Record a pass's planned cache reads; its warning when the billed ones fell below plan (stderr)."""
        self.ledger.add_planned_cache_reads(experiment_id, run.cache_reads.planned)
        self.ledger.add_endpoint_pass(experiment_id, run.endpoints)  # [judge] base_urls: per endpoint
        warning = run.cache_reads.warning()
        self._reads_seen = self._reads_seen or run.cache_reads.billed > 0
        if warning is None:
            return
        if not self._reads_seen:
            # A server that never caches (or never reports it) would repeat the warning on every pass.
            self._silent_passes += 1
            if self._silent_passes > SILENT_PASSES_SAID:
                return
            if self._silent_passes == SILENT_PASSES_SAID:
                warning += ("; no pass of this run has read the cache: a server without prompt caching, or one "
                            "that does not report cached tokens, would repeat this on every pass, so this run says "
                            "it no more (planned and billed reads stay in the ledger and `judgeloop report`)")
        self.events(Message(f"  experiment {experiment_id}: {warning}", "note"))

    def say(self, message: str) -> None:
        """A line for the person following the run (the CLI prints it on stdout)."""
        self.events(Message(message))

    def stage(self, name: StageKind, experiment_id: int | None = None, **extra: Any) -> None:
        self.ledger.add_event(self.run.id, "stage", {"stage": name, **extra}, experiment_id=experiment_id)

    def stop_reason(self, candidates_done: int, since_keep: int) -> StopReason | None:
        """Why the loop must stop before the next candidate, or None to go on."""
        if self.interrupted:
            return StopReason(StopKind.INTERRUPTED, f"interrupted ({self.stop.reason})")
        if self.ws.stop_path.exists():
            return StopReason(StopKind.STOP_FILE, f"stop file {self.ws.stop_path.relative_to(self.root)} present")
        if self.limits.max_experiments is not None and candidates_done >= self.limits.max_experiments:
            return StopReason(StopKind.MAX_EXPERIMENTS, f"reached --max-experiments {self.limits.max_experiments}")
        if self.limits.hours is not None and time.monotonic() - self.started >= self.limits.hours * 3600:
            return StopReason(StopKind.HOURS, f"reached --hours {self.limits.hours:g}")
        if self.limits.budget_usd is not None and self.spent_usd >= self.limits.budget_usd:
            return StopReason(StopKind.SPENT, f"spent ${self.spent_usd:.4f} of the ${self.limits.budget_usd:g} budget")
        if self.budget_exhausted is not None:
            return StopReason(StopKind.SPENT, self.budget_exhausted)
        if since_keep >= self.limits.patience:
            return StopReason(StopKind.PATIENCE,
                              f"{since_keep} candidates in a row without a keep (patience {self.limits.patience})")
        return None

    # -- evaluation ------------------------------------------------------------------------------

    def test_level(self) -> float:
        """The level the next candidate is tested at: ``[loop] alpha``, or with ``[loop] fdr`` the
        LORD++ level given this run's earlier tested candidates (`optimizer.stats.decision.lord_level`)."""
        if self.loop_cfg.fdr is None:
            return self.loop_cfg.alpha
        past = [e.status == "kept" for e in self.ledger.experiments(self.run.id)
                if e.seq > 0 and e.alpha is not None and e.status in TESTED_STATUSES]
        return lord_level(self.loop_cfg.fdr, past)

    async def evaluate(
        self, experiment_id: int, prompts: PromptSet, incumbent: Experiment | None,
        provider: Provider, cache: JudgeCache, judge: JudgeSection | None = None, *, cheaper: bool = False,
        look_seed: int | None = None,
    ) -> Evaluated:
        """Evaluate ``prompts`` on the whole split (negatives first) and decide against ``incumbent``.

        With an incumbent, stop as soon as an exact bound proves a rollback; under the adaptive
        policy, then re-judge the items the two prompts disagree on (`rejudge`). Items that hit
        infrastructure errors are left out of the bounds (unjudged) and make the evaluation
        incomplete: such a candidate is never decided on partial data. ``cheaper``: the candidate is
        estimated cheaper by ``cheaper_min_saving`` (`cheaper_eligible`), so it may be kept without a
        kappa gain: only the FPR bound may stop it early, and it is re-judged in full. ``judge``: the
        run's judge with another ``max_concurrency`` (a wave shares the run's among its candidates).
        ``look_seed``: the seed of futility's looks (default the candidate's decision seed); a wave's
        candidates share one, so they judge their first passes in one order, item by item together.
        """
        judge = judge or self.judge
        order = evaluation_order(self.labels, self.split.ids)
        policy = policy_for(self.loop_cfg)
        level = self.test_level()
        inc_answers = self.ledger.item_answers(incumbent.id) if incumbent else None
        inc_judgements = self.ledger.item_judgements(incumbent.id) if incumbent else None
        so_far: dict[str, Answer] = {}
        early: list[Decision] = []
        stopper: EarlyStopper | FprStopper | None = None
        # Futility screening (adaptive, direct passes): the first pass goes look by look (`optimizer.stats.futility.
        # make_looks`); after each, the look's disagreements are re-judged — the calls the decision makes
        # anyway, paid once — and P(clear) checked on everything judged so far.
        looks: list[Screen] = []
        if (policy.screens_futility(self.loop_cfg) and inc_answers is not None and not self.batch
                and not self.limits.propose_only):
            looks = make_looks(self.labels, inc_answers,
                               self.decision_seed(experiment_id) if look_seed is None else look_seed)
            order = looks[-1].order(self.labels, self.split.ids)
        so_far_judgements: dict[str, list[Answer]] = {}

        def on_item(item: ItemResult) -> bool:
            nonlocal stopper
            # --propose-only evaluates in full: a human decides, and a candidate they keep becomes the
            # incumbent, whose answers every later candidate is compared with item by item.
            # (A batch pass never calls this: every call of a batch is paid for once it is sent.)
            if item.infra_error or inc_answers is None or inc_judgements is None or self.limits.propose_only:
                return False
            so_far[item.trajectory_id] = item.answer
            # Incremental (`stopped_decision` / `adaptive_stopped_decision` over everything judged so
            # far would make the checks quadratic in the split).
            if stopper is None:
                stopper = (FprStopper(self.labels, inc_answers, self.loop_cfg, alpha=level) if cheaper else
                           EarlyStopper(self.labels, inc_answers, inc_judgements, self.loop_cfg, alpha=level))
            judgements = judgements_of(item)
            decision = (stopper.add(item.trajectory_id, item.answer) if isinstance(stopper, FprStopper)
                        else stopper.add(item.trajectory_id, item.answer, judgements))
            so_far_judgements[item.trajectory_id] = judgements
            if decision is not None:
                early.append(decision)
                return True
            return False

        batch = self.batch_options(experiment_id)
        # The phases of the first pass: each look's new items, then the rest (one phase without futility).
        phases: list[list[str]] = []
        seen: set[str] = set()
        for look in looks:
            phases.append([t for t in order if t in look.ids and t not in seen])
            seen |= look.ids
        phases.append([t for t in order if t not in seen])
        result: EvalRun | None = None
        passes: list[EvalRun] = []
        rejudged: list[str] = []  # re-judged at a look (their judgements below include the re-judging)
        inc_now = dict(inc_judgements) if inc_judgements is not None else None
        cand_now: dict[str, list[Answer]] = {}
        for index, phase in enumerate(phases):
            if not phase and (result is not None or index < len(phases) - 1):
                continue  # a look that adds nothing (a tiny class), or nothing left after the last look
            part = await evaluate_items(
                self.ws, self.split, prompts, judge,
                item_ids=phase, replicates=self.replicates, on_item=on_item, budget=self.budget(),
                progress=self._progress(experiment_id, before=result, total=len(order)), provider=provider,
                cache=cache, infra_retry_rounds=self.loop_cfg.infra_retry_rounds,
                infra_retry_pause_s=self.loop_cfg.infra_retry_pause_s, batch=batch, stop=self.stop,
            )
            result = part if result is None else _joined(result, part)
            cand_now |= {item.trajectory_id: judgements_of(item) for item in part.items}
            if (index == len(phases) - 1 or early or part.stop is not None or part.infra_error_ids
                    or part.not_evaluated or inc_answers is None or inc_now is None or incumbent is None):
                break
            look = looks[index]
            fresh = [t for t in disagreements(inc_answers, part.answers()) if t not in set(rejudged)]
            if fresh and self.loop_cfg.rejudge > 0:
                # (Its own: in a wave, the run's last stage may be another candidate's.)
                evaluating = self.ledger.last_event(self.run.id, "stage", experiment_id=experiment_id)
                self.stage(StageKind.REJUDGING, experiment_id, items=len(fresh))
                self.say(f"  experiment {experiment_id}: re-judging the screen's {len(fresh)} disagreement(s), "
                         f"{self.loop_cfg.rejudge} more time(s) under each")
                rj = await self._rejudge(experiment_id, judge, incumbent, prompts, fresh, (inc_now, cand_now),
                                         provider, cache, batch, passes, result, len(order))
                if rj.error is not None:
                    self._account_first_pass(experiment_id, result)  # the looks judged so far were paid
                    return Evaluated(result, None, None, None, None, error=rj.error, rejudge=passes)
                inc_now, cand_now = rj.first, rj.second
                rejudged += fresh
                # Back to the first pass, from the same start (what a crash paid is counted from it).
                if (evaluating is not None and evaluating.experiment_id == experiment_id
                        and evaluating.payload.get("stage") == StageKind.EVALUATING):
                    self.stage(StageKind.EVALUATING, experiment_id, started_at=evaluating.payload.get("started_at"))
            if cheaper:
                continue  # a candidate estimated cheaper is judged in full: futility does not stop it
            futile = screen_decision(self.labels, look, inc_now, cand_now, self.loop_cfg, level=level,
                                     seed=self.decision_seed(experiment_id), rejudged=True)
            if futile is not None:
                early.append(futile)
                break
        assert result is not None
        self._account_first_pass(experiment_id, result)
        answers = result.answers()
        if early:
            judged = {t: self.labels[t] for t in so_far}
            flips = flip_table(judged, {t: inc_answers[t] for t in judged}, so_far) if inc_answers else None
            return Evaluated(result, early[0], None, None, flips, rejudge=passes)
        if result.stop is not None and result.stop.kind is StopKind.INTERRUPTED:
            raise EvaluationInterrupted(experiment_id, len(result.items), len(order), result.cost_usd)
        if result.infra_error_ids:
            n = len(result.infra_error_ids)
            return Evaluated(result, None, None, None, None,
                             error=f"{n} item(s) hit infrastructure errors after every retry "
                                   f"(e.g. {result.infra_error_ids[0]}); not decided on partial data")
        if result.stopped_early or result.not_evaluated:
            return Evaluated(result, None, None, None, None,
                             error=result.stop_reason or f"{len(result.not_evaluated)} item(s) not evaluated")
        metrics = score(self.labels, answers)
        intervals = bootstrap_intervals(self.labels, answers)
        verdict_cost = self.verdict_cost(result)
        if incumbent is None or inc_answers is None or inc_judgements is None:
            return Evaluated(result, None, metrics, intervals, None, verdict_cost=verdict_cost)
        flips = flip_table(self.labels, inc_answers, answers)
        cand_judgements = {item.trajectory_id: judgements_of(item) for item in result.items}
        to_rejudge: list[str] = []
        if policy.rejudge(self.loop_cfg) > 0:
            # Nothing re-judging could bring would make it a keep: the re-judging calls are not made.
            skip = (None if cheaper or rejudged else
                    adaptive_stopped_decision(self.labels, cand_judgements, inc_judgements, self.loop_cfg, alpha=level))
            if skip is not None:
                return Evaluated(result, skip, metrics, intervals, flips, verdict_cost=verdict_cost)
            to_rejudge = [t for t in order if t in set(disagreements(inc_answers, answers)) and t not in set(rejudged)]
        if rejudged and inc_now is not None:  # the looks' re-judging, paid already
            inc_judgements, cand_judgements = inc_now, cand_now
        if to_rejudge:
            self.stage(StageKind.REJUDGING, experiment_id, items=len(to_rejudge))
            self.say(f"  experiment {experiment_id}: re-judging the {len(to_rejudge)} item(s) the prompts disagree "
                     f"on, {self.loop_cfg.rejudge} more time(s) under each")
            rj = await self._rejudge(experiment_id, judge, incumbent, prompts, to_rejudge,
                                     (inc_judgements, cand_judgements), provider, cache,
                                     self.batch_options(experiment_id), passes, result, len(order))
            if rj.error is not None:
                return Evaluated(result, None, None, None, None, error=rj.error, rejudge=passes)
            inc_judgements, cand_judgements = rj.first, rj.second
        to_rejudge = rejudged + to_rejudge
        decision = decide_adaptive(
            self.labels, inc_judgements, cand_judgements, self.loop_cfg, first_pass=self.replicates,
            rejudged=to_rejudge, alpha=level, seed=self.decision_seed(experiment_id),
        )
        decision = self.cost_rules(decision, incumbent, verdict_cost, inc_judgements, cand_judgements, level,
                                   experiment_id, cheaper=cheaper)
        return Evaluated(result, decision, metrics, intervals, flips, rejudge=passes, verdict_cost=verdict_cost)

    def _account_first_pass(self, experiment_id: int, result: EvalRun) -> None:
        """Count a candidate's first pass (every look judged so far) once, however the evaluation ends:
        its notes, its cache telemetry, its spend (US dollars) in the run's, and a budget stop."""
        for note in result.notes if self.batch else [n for n in result.notes if n.startswith(ENDPOINT_NOTE)]:
            if note == result.cache_reads.warning():  # said on stderr by cache_telemetry
                continue
            self.say(f"  {note}")
            if note.startswith(ENDPOINT_NOTE) and " drained (" in note:  # kept in the ledger, not only said
                self.stage(StageKind.ENDPOINT_DRAINED, experiment_id, text=note)
        self.cache_telemetry(experiment_id, result)
        self.spent_usd += result.cost_usd
        # The evaluator refused a call that would cross the budget: no later candidate can be paid for.
        if result.stop is not None and result.stop.kind is StopKind.BUDGET:
            self.budget_exhausted = result.stop.message

    # -- cost per verdict ([loop] cheaper_*, [optimizer] max_cost_ratio) --------------------------

    def judge_price(self) -> Price | None:
        """The judge model's price; None when unknown or free (then no cost rule applies)."""
        price = price_for(self.judge.model, self.ws.config.prices)
        if price is None or (price.input == 0 and price.output == 0):
            return None
        return price

    def verdict_cost(self, run: EvalRun) -> float | None:
        """A pass's cost per paid verdict (US dollars): its billed tokens priced warm (`warm_cost_usd`:
        a cache write at the read price) over the judgements that were not served by judgeloop's cache."""
        price = self.judge_price()
        paid = sum(1 for item in run.items for r in item.replicates if not r.cached)
        if price is None or paid == 0 or run.usage.calls == 0:
            return None
        return warm_cost_usd(run.usage, price) / paid

    def estimated_verdict_cost(self, prompts: PromptSet, provider: Provider, output_tokens: int) -> float | None:
        """A prompt set's expected cost per verdict before any call (`steady_cost_usd` over the split's
        first `ESTIMATE_ITEMS` items, every call of the verdict: `verdict_calls` — a panel's members, the
        criteria derivation and check, a review on the split's positive share); None for an agentic
        judge or an unknown price."""
        price = self.judge_price()
        ids = self.split.ids[:ESTIMATE_ITEMS]
        if price is None or not ids or prompts.settings.mode != "direct":
            return None
        traits = provider.traits
        share = sum(1 for t in self.split.ids if self.labels[t].is_positive) / len(self.split.ids)
        total = 0.0
        for tid in ids:
            calls = verdict_calls(self.split.trajectory(tid), self.split, prompts, success_share=share,
                                  replicates=self.replicates, text_only=traits.text_only,
                                  image_cache_dir=self.ws.experiments_dir / IMAGE_CACHE_DIRNAME, layout=traits.layout)
            total += sum(weight * steady_cost_usd(request, output_tokens, price) for request, weight in calls)
        return total / len(ids)

    def estimated_ratio(self, incumbent: Experiment, prompts: PromptSet, provider: Provider) -> float | None:
        """Candidate / incumbent estimated cost per verdict (None when either cannot be estimated)."""
        if not incumbent.commit_sha:
            return None
        inc_prompts = PromptSet.from_rev(self.ws, incumbent.commit_sha)
        # Output: the incumbent's billed mean per call, else the cap (the same for both sides).
        out = (incumbent.output_tokens // incumbent.calls if incumbent.calls else inc_prompts.settings.max_tokens)
        try:
            inc = self.estimated_verdict_cost(inc_prompts, provider, out)
            cand = self.estimated_verdict_cost(prompts, provider, out)
        except UserError:
            return None
        return None if inc is None or cand is None or inc <= 0 else cand / inc

    async def _rejudge(
        self, experiment_id: int, judge: JudgeSection, incumbent: Experiment, prompts: PromptSet, items: list[str],
        judgements: tuple[Judgements, Judgements], provider: Provider, cache: JudgeCache, batch: BatchOptions | None,
        passes: list[EvalRun], result: EvalRun, n_order: int,
    ) -> Rejudging:
        """Re-judge ``items`` under the incumbent's prompts and ``prompts`` (`rejudge`), and account for it:
        the spend, the passes (appended to ``passes``) and their cache telemetry, a budget stop; a cut by the
        user raises `EvaluationInterrupted`. The caller handles ``error``."""
        rj = await rejudge(
            self.ws, self.split, judge, self.loop_cfg, items=items,
            prompts=(PromptSet.from_rev(self.ws, incumbent.commit_sha or "HEAD~1"), prompts),
            judgements=judgements, first_replicate=self.replicates, budget=self.budget(),
            progress=self._progress(experiment_id, rejudging=True), provider=provider, cache=cache, batch=batch,
            stop=self.stop,
        )
        self.spent_usd += rj.cost_usd
        passes += rj.passes
        if self._wave_line is not None:
            self._wave_line.rejudged(experiment_id, passes)
        for again in rj.passes:
            self.cache_telemetry(experiment_id, again)
        if rj.budget_stop is not None:
            self.budget_exhausted = rj.budget_stop
        if rj.error is not None and self.interrupted:
            raise EvaluationInterrupted(experiment_id, len(result.items), n_order, result.cost_usd + rj.cost_usd)
        return rj

    def case_copy(self, changed: Mapping[str, tuple[str | None, str | None]]) -> str | None:
        """Why the candidate is refused for copying a memory case into a file sent with every item (the
        rubric, judge.md, principles.md: a case states a dev item's verdict, and there it would reach the
        case's own fold), whoever made it; None when it copies none. The memory tools refuse the same."""
        from optimizer.loop.strategies.memoryedit import MemoryEditError, check_no_case_copy

        cases: list[Case] = []
        for text in (read_prompt_file(self.root, CASES_JSONL), changed.get(CASES_JSONL, (None, None))[1]):
            if text:
                try:
                    cases += parse_cases(text)
                except UserError:  # a malformed cases.jsonl is the validation's to refuse, in its own words
                    continue
        if not cases:
            return None
        for path, (old, new) in sorted(changed.items()):
            if (path in MEMORY_FILES and path != PRINCIPLES_MD) or new is None:
                continue
            try:
                check_no_case_copy(path, old, new, cases)
            except MemoryEditError as exc:
                return str(exc)
        return None

    def cheaper_eligible(self, incumbent: Experiment, prompts: PromptSet, provider: Provider) -> bool:
        """``[loop] cheaper_margin_items`` is on and the candidate is estimated cheaper by ``cheaper_min_saving``."""
        if self.loop_cfg.cheaper_margin_items <= 0 or self.limits.propose_only:
            return False
        ratio = self.estimated_ratio(incumbent, prompts, provider)
        return ratio is not None and 1 - ratio >= self.loop_cfg.cheaper_min_saving

    def cost_rules(
        self, decision: Decision, incumbent: Experiment, verdict_cost: float | None, inc_judgements: Any,
        cand_judgements: Any, level: float, experiment_id: int, *, cheaper: bool,
    ) -> Decision:
        """The decision after the cost rules: a candidate not kept may be kept as cheaper-not-worse
        (`decide_cheaper`, on the billed cost per verdict); a keep over ``max_cost_ratio`` (billed) is
        rolled back."""
        inc_cost = incumbent.verdict_cost_usd
        ratio = verdict_cost / inc_cost if verdict_cost is not None and inc_cost else None
        if cheaper and not decision.keep and not decision.early_stopped:
            if ratio is None:
                return decision.model_copy(update={"reason": decision.reason + "; cheaper: not tested (no billed "
                                                   "cost per verdict to compare: served from the cache or unpriced)"})
            test = decide_cheaper(self.labels, inc_judgements, cand_judgements, self.loop_cfg, saving=1 - ratio,
                                  alpha=level, seed=self.decision_seed(experiment_id))
            decision = decision.model_copy(update={"keep": test.keep, "keep_kind": "cheaper" if test.keep else None,
                                                   "reason": decision.reason + "; " + test.reason})
        cap = self.ws.config.optimizer.max_cost_ratio
        if decision.keep and cap is not None and ratio is not None and ratio > cap:
            decision = decision.model_copy(update={
                "keep": False, "keep_kind": None,
                "reason": decision.reason + f"; but it costs {ratio:.2f}x the incumbent per verdict (billed), over "
                          f"[optimizer] max_cost_ratio {cap:g}: rolled back"})
        return decision

    def batch_options(self, experiment_id: int) -> BatchOptions | None:
        """Under ``--batch``, each pass (first pass, each side's re-judging) is one batch."""
        if not self.batch:
            return None
        def on_state(state: BatchState) -> None:
            self.say(f"  {state.line()}")
            # A stage event: the TUI's live strip shows the batch's state ("batch msgbatch_…: in_progress").
            self.stage(StageKind.BATCH, experiment_id, text=state.line())

        return BatchOptions.from_judge(
            self.judge, store=LedgerBatches(self.ledger, self.run.id, experiment_id), on_state=on_state,
        )

    def decision_seed(self, experiment_id: int) -> int:
        """The seed of a candidate's Monte Carlo p-value (used only when the exact one is out of
        reach), stored with the decision so it replays."""
        return (self.seed * 1_000_003 + experiment_id) % 2**32

    def _record_eval(self, exp_id: int, ev: Evaluated, outcome: ExperimentOutcome) -> Experiment:
        self.ledger.record_verdicts(exp_id, item_verdicts(ev.run))
        return self.ledger.record_decision(exp_id, outcome)

    # -- the baseline ----------------------------------------------------------------------------

    async def baseline(self, provider: Provider, cache: JudgeCache, existing: Experiment | None = None) -> Experiment:
        sha = gitops.rev_parse(self.root, "HEAD")
        prompts = PromptSet.from_rev(self.ws, sha)
        exp = existing or self.ledger.start_experiment(
            self.run.id, parent_id=None, strategy="baseline", seq=0, commit_sha=sha,
            prompt_hash=prompts.prompt_hash(), rationale="the prompts the run started from",
        )
        self.stage(StageKind.BASELINE, exp.id, started_at=time.time())
        self.say(f"experiment {exp.id} (baseline): evaluating {len(self.split.ids)} items × {self.replicates} replicate(s)")
        ev = await self.evaluate(exp.id, prompts, None, provider, cache)
        # A resumed baseline's row holds what it paid before the crash (calls now served by the cache).
        paid_before = existing.cost_usd if existing else 0.0
        if ev.metrics is None:
            self._record_eval(exp.id, ev, ev.outcome("error", f"baseline incomplete: {ev.error}",
                                                     extra_cost_usd=paid_before))
            raise UserError(f"the baseline evaluation is incomplete ({ev.error}); fix the judge setup and "
                            "run `judgeloop run --resume`")
        m = ev.metrics
        reason = f"baseline: kappa {m.kappa:.3f}, FPR {m.fpr:.3f}" if m.kappa is not None else "baseline"
        exp = self._record_eval(exp.id, ev, ev.outcome("baseline", reason, extra_cost_usd=paid_before))
        self.say(f"  baseline kappa={fmt3(m.kappa)} FPR={fmt3(m.fpr)} bal.acc={fmt3(m.balanced_accuracy)} "
            f"calls={ev.run.calls_made} cached={ev.run.cache_hits} cost=${ev.run.cost_usd:.4f}")
        return exp

    # -- one candidate ---------------------------------------------------------------------------

    def context(self, incumbent: Experiment, seq: int) -> ProposalContext:
        allowed = list(self.ws.config.optimizer.allowed_files)
        # With structure moves on, strategies see judge.toml too (they change it through set_structure).
        current = {p: text for p in self.ws.config.optimizer.editable_files
                   if (text := read_prompt_file(self.root, p)) is not None}
        disagreements = []
        for row in self.ledger.item_verdicts(incumbent.id):
            label = self.labels.get(row.trajectory_id)
            if label is None or (row.status == "ok" and row.success == label.is_positive):
                continue
            first = next((r for r in row.replicates if r.success == row.success), None)
            disagreements.append(
                Disagreement(
                    trajectory_id=row.trajectory_id,
                    instruction=self.split.trajectory(row.trajectory_id).task.instruction,
                    label_positive=label.is_positive,
                    mistake_type=label.mistake_type,
                    judge_success=row.success,
                    reasoning=(first.reasoning if first else "") or "",
                    confidence=first.confidence if first else None,
                    unstable=row.unstable,
                    judge_tools=tuple(first.tools) if first else (),
                )
            )
        history = []
        # The whole history: `library` reads it to never repeat a tried set; the LLM strategies trim
        # what they show their model themselves.
        for exp in self.ledger.experiments(self.run.id):
            if exp.seq == 0:
                continue
            full = self.ledger.get_experiment(exp.id)
            history.append(
                PastExperiment(
                    id=exp.id, decision=exp.status, reason=exp.reason or "", rationale=exp.rationale or "",
                    kappa=exp.kappa, fpr=exp.fpr, diff=full.diff_text or "", meta=exp.proposal_meta,
                )
            )
        earlier = self._earlier_from_same_prompts(incumbent)
        guidance = self.ws.guidance_path.read_text(encoding="utf-8") if self.ws.guidance_path.is_file() else ""
        # Only the dev split's reviews reach a strategy, in the guidance as in the notes: the ledger holds
        # every review, a held-out item's too (the run's split shares no item with a held-out one: check_apart).
        dev_ids = set(self.split.ids)
        reviews = [r for r in self.ledger.reviews() if r.trajectory_id in dev_ids]
        if reviews:
            guidance += "\n\n## Human reviews of judge verdicts\n" + "\n".join(
                f"- {r.kind.replace('_', ' ')} on {r.trajectory_id}: {r.note}" for r in reviews
            )
        settings = PromptSet.from_dir(self.ws.prompts_dir).settings
        notes = [ReviewNote(r.trajectory_id, r.kind, r.note, self.split.trajectory(r.trajectory_id).task.instruction)
                 for r in reviews]
        return ProposalContext(
            workspace_root=self.root, allowed_files=allowed, current_files=current,
            disagreements=disagreements, history=history, guidance=guidance.strip(), split=self.split,
            rng_seed=self.seed, experiment_seq=seq,
            judge_mode=settings.mode, judge_memory=settings.memory, earlier=earlier, reviews=notes,
            structure_moves=list(self.ws.config.optimizer.structure_moves),
            max_members=self.ws.config.optimizer.max_members,
        )

    def _earlier_from_same_prompts(self, incumbent: Experiment) -> list[PastExperiment]:
        """Decided candidates of earlier runs on this split whose parent had the incumbent's prompts (the
        same git tree): a new run from the same prompts would only repeat them (their calls are cached)."""
        tree = gitops.prompts_tree(self.root, incumbent.commit_sha) if incumbent.commit_sha else None
        if tree is None:
            return []
        trees: dict[str, str | None] = {}
        out: list[PastExperiment] = []
        for run in self.ledger.runs():
            if run.id == self.run.id or run.split != self.split.name:
                continue
            by_id = {e.id: e for e in self.ledger.experiments(run.id)}
            for exp in by_id.values():
                parent = by_id.get(exp.parent_id) if exp.parent_id else None
                if exp.seq == 0 or parent is None or not parent.commit_sha:
                    continue
                if parent.commit_sha not in trees:
                    trees[parent.commit_sha] = gitops.prompts_tree(self.root, parent.commit_sha)
                if trees[parent.commit_sha] == tree:
                    out.append(PastExperiment(id=exp.id, decision=exp.status, reason=exp.reason or "",
                                              rationale=exp.rationale or "", kappa=exp.kappa, fpr=exp.fpr,
                                              diff="", meta=exp.proposal_meta))
        return out

    def guard_inputs(self) -> dict[str, Any]:
        """What the overfit lint checks against, built once per run (the instructions' 8-grams and values,
        the trajectories' typed texts and click targets, and per item for the memory's cases)."""
        if self._guard_inputs is None:
            recordings = {lab.original_id for lab in self.labels.values()}
            recordings |= {lab.paired_id for lab in self.labels.values() if lab.paired_id}
            trajectories = [self.split.trajectory(t) for t in self.split.ids]
            instructions = [t.task.instruction for t in trajectories]
            self._guard_inputs = {
                "dev_ids": set(self.split.ids),
                "dev_recording_ids": recordings,
                "dev_instructions": instruction_ngrams(instructions),
                "dev_values": instruction_values(instructions),
                "dev_trajectory_values": trajectory_values(trajectories),
                "dev_items": ItemIndex(zip(self.split.ids, trajectories, strict=True)),
            }
        return self._guard_inputs

    def validate(self, changed: Mapping[str, str | None], provider: Provider, base_rev: str = "HEAD") -> str | None:
        """Why the prompt set ``base_rev`` + ``changed`` cannot be judged with (`optimizer.loop.validate`), or None."""
        files = candidate_files(self.root, base_rev, changed)
        return validate_prompts(files, self.split, provider, batch=self.batch,
                                image_cache_dir=self.ws.experiments_dir / IMAGE_CACHE_DIRNAME)

    def cost_guard(self, incumbent: Experiment, changed: Mapping[str, str | None], provider: Provider) -> str | None:
        """Why the candidate is refused before any judge call under ``[optimizer] max_cost_ratio``
        (its estimated cost per verdict over that multiple of the incumbent's), or None."""
        cap = self.ws.config.optimizer.max_cost_ratio
        if cap is None:
            return None
        prompts = PromptSet.from_files(candidate_files(self.root, "HEAD", changed))
        ratio = self.estimated_ratio(incumbent, prompts, provider)
        if ratio is None or ratio <= cap:
            return None
        return (f"estimated at {ratio:.2f}x the incumbent's cost per verdict, over [optimizer] max_cost_ratio "
                f"{cap:g}")

    def check_tip(self, incumbent: Experiment) -> None:
        """Refuse (`UserError`, one line naming the unexpected commits) unless the run's branch is checked out
        at the incumbent's commit: the loop builds a candidate only on a commit it made (`optimizer.loop.trust`)."""
        expected = incumbent.commit_sha or self.run.start_rev
        problem = trust.tip_problem(self.root, self.run.branch, expected)
        if problem is not None:
            raise UserError(trust.refusal(problem, self.run.branch, expected))

    def whole_diff_guard(self, incumbent_sha: str, sha: str,
                         proposed: Mapping[str, tuple[str | None, str | None]]) -> str | None:
        """Why the committed candidate ``sha`` is refused on its whole diff from the incumbent (read from
        git, not from the proposal), or None: the guards again over every file it changes, and no commit
        the loop did not make between the two (one slipped in while the strategy proposed)."""
        full = trust.full_diff(self.root, incumbent_sha, sha)
        opt = self.ws.config.optimizer
        guard = check_candidate(full, opt.allowed_files, opt.max_diff_lines, **self.guard_inputs(),
                                structure_moves=opt.structure_moves, max_members=opt.max_members)
        if not guard.ok:
            return f"its whole diff from the incumbent {incumbent_sha[:12]}: {guard.reason or 'rejected'}"
        slipped = trust.slipped_commits(self.root, incumbent_sha, sha)
        if slipped or set(full) != set(proposed):
            named = trust.commits_line(slipped) if slipped else "changes beside the proposal"
            return f"commits the loop did not make lie under the candidate: {named}"
        return None

    async def candidate(self, incumbent: Experiment, provider: Provider, cache: JudgeCache) -> Experiment:
        prepared = await self.prepare(incumbent, provider)
        if isinstance(prepared, Experiment):
            return prepared
        exp_id, sha, cost = prepared
        return await self.evaluate_candidate(exp_id, sha, incumbent, provider, cache, cost)

    async def prepare(
        self, incumbent: Experiment, provider: Provider, *, siblings: list[PastExperiment] | None = None,
        wave_meta: dict[str, Any] | None = None, seen: dict[str, int] | None = None,
        given: Proposal | ProposalError | None = None,
    ) -> Experiment | tuple[int, str, float]:
        """Propose, guard and commit one candidate on the incumbent: the decided experiment when it ends
        before evaluation (optimiser failure, guards), else its (id, commit, optimiser cost). In a wave,
        ``siblings`` are the wave's earlier candidates (shown to the strategy), ``wave_meta`` goes into
        the row's proposal meta and ``seen`` maps an earlier candidate's files to its id (a duplicate is
        rejected; ``given``: the proposal a strategy made for the whole wave at once)."""
        self.check_tip(incumbent)
        seq = max(e.seq for e in self.ledger.experiments(self.run.id)) + 1
        if given is None:
            self.stage(StageKind.PROPOSING, None, seq=seq, strategy=self.strategy.name)
            self.say("next candidate: your edit" if self.strategy.name == "manual"
                     else f"next candidate: asking the {self.strategy.name} optimiser for an edit")
        try:
            if isinstance(given, ProposalError):
                raise given
            if given is not None:
                proposal: Proposal = given
            else:
                ctx = self.context(incumbent, seq)
                if siblings:
                    ctx.history = [*ctx.history, *siblings]
                proposal = await self.strategy.propose(ctx)
        except ProposalError as exc:
            self.charge(exc.cost_usd)
            exp = self.ledger.start_experiment(
                self.run.id, parent_id=incumbent.id, strategy=self.strategy.name, seq=seq, rationale=None,
                proposal_meta={"wave": wave_meta} if wave_meta else None,  # a wave's failure is its member
                optimizer_calls=exc.calls, optimizer_input_tokens=exc.input_tokens,
                optimizer_output_tokens=exc.output_tokens, optimizer_cost_usd=exc.cost_usd,
            )
            self.say(f"  optimiser failed: {exc.reason}")
            # No judge call was made: the row's total cost is the optimiser's.
            return self.ledger.record_error(exp.id, f"optimiser failed: {exc.reason}", cost_usd=exc.cost_usd)
        self.charge(proposal.cost_usd)

        allowed = set(self.ws.config.optimizer.editable_files)
        changed: dict[str, tuple[str | None, str | None]] = {}
        link_error: str | None = None
        for path, new in proposal.files.items():
            # One path rule: the guards judge, and the loop writes, the canonical name alone.
            name = allowed_name(path, allowed)
            if name is None or (name != path and name in proposal.files):
                # Never read a file outside the allowed set: its text would reach the ledger's diff and,
                # through the history, the optimiser (think devset/*/labels.jsonl). The guard rejects it.
                changed[path] = ("<not read: outside the allowed files>", new)
                continue
            try:
                old = read_prompt_file(self.root, name)
            except UserError as exc:  # a link in prompts/: never read or written through
                link_error = link_error or str(exc)
                continue
            if old != new:
                changed[name] = (old, new)
        diff_text, ins, dels = unified_diff({p: c for p, c in changed.items() if p in allowed})
        exp = self.ledger.start_experiment(
            self.run.id, parent_id=incumbent.id, strategy=self.strategy.name, seq=seq,
            files_changed=sorted(changed), insertions=ins, deletions=dels, diff_text=diff_text,
            rationale=clipped_rationale(proposal.rationale),
            proposal_meta=proposal.meta | ({"wave": wave_meta} if wave_meta else {}),
            optimizer_calls=proposal.calls, optimizer_input_tokens=proposal.input_tokens,
            optimizer_output_tokens=proposal.output_tokens, optimizer_cost_usd=proposal.cost_usd,
        )
        # The row's calls and tokens are the judge's (none yet); its cost is the experiment's total,
        # judge + optimiser, so budgets and spend sums count the optimiser too.
        self.stage(StageKind.GUARDS, exp.id)
        guard = (
            check_candidate(changed, self.ws.config.optimizer.allowed_files, self.ws.config.optimizer.max_diff_lines,
                            **self.guard_inputs(), structure_moves=self.ws.config.optimizer.structure_moves,
                            max_members=self.ws.config.optimizer.max_members)
            if changed else None
        )
        reason: str | None = None
        files_key = stable_json({p: n for p, (_, n) in sorted(changed.items())})
        if not (told := check_rationale(proposal.rationale)).ok:
            reason = told.reason
        elif link_error is not None:
            reason = link_error
        elif seen is not None and changed and files_key in seen:
            reason = f"the same edit as experiment {seen[files_key]} of this wave"
        elif guard is None or not guard.ok:
            reason = "the proposal changed nothing" if guard is None else (guard.reason or "rejected")
        elif (copied := self.case_copy(changed)) is not None:
            reason = copied
        else:
            # Complete before commit: a candidate the judge could not be run with is a rejection, not a crash.
            invalid = self.validate({p: n for p, (_, n) in changed.items()}, provider)
            if invalid is not None:
                reason = f"the candidate cannot be used: {invalid}"
            else:
                reason = self.cost_guard(incumbent, {p: n for p, (_, n) in changed.items()}, provider)
        if reason is not None:
            self.say(f"  experiment {exp.id}: rejected by the guards: {reason}")
            return self.ledger.reject(exp.id, reason, cost_usd=proposal.cost_usd)

        # Only guarded, allowed files are written (never through a link), and only they are committed.
        for path, (_, new_text) in changed.items():
            write_prompt_file(self.root, path, new_text or "")
        sha = gitops.commit_candidate(
            self.root, sorted(changed), f"judgeloop candidate {exp.id}: {_one_line(proposal.rationale)}\n\n"
            f"{proposal.rationale}", exp.id,
        )
        incumbent_sha = incumbent.commit_sha or self.run.start_rev
        slipped = self.whole_diff_guard(incumbent_sha, sha, changed)
        if slipped is not None:
            rejected = gitops.roll_back(self.root, sha, exp.id, incumbent_sha,
                                        decision_trailers(exp.id, None, "guard_rejected"))
            self.say(f"  experiment {exp.id}: rejected by the guards: {slipped}")
            return self.ledger.record_decision(exp.id, ExperimentOutcome(
                status="guard_rejected", reason=slipped, extra_cost_usd=proposal.cost_usd, commit_sha=rejected))
        self.ledger.mark_evaluating(exp.id, sha, cost_usd=proposal.cost_usd)
        if seen is not None:
            seen[files_key] = exp.id
        if siblings is not None:
            siblings.append(PastExperiment(
                id=exp.id, decision=IN_WAVE, reason="another candidate of this wave, judged together with yours "
                "against the same incumbent: propose a different edit", rationale=proposal.rationale,
                kappa=None, fpr=None, diff=diff_text, meta=proposal.meta,
            ))
        return exp.id, sha, proposal.cost_usd

    async def evaluate_candidate(
        self, exp_id: int, sha: str, incumbent: Experiment, provider: Provider, cache: JudgeCache,
        optimiser_cost: float = 0.0
    ) -> Experiment:
        incumbent_sha = incumbent.commit_sha or gitops.rev_parse(self.root, "HEAD~1")
        try:
            prompts = PromptSet.from_rev(self.ws, sha)
            invalid = self.validate({}, provider, base_rev=sha)
        except UserError as exc:
            invalid = str(exc)
        if invalid is not None:
            # A commit the judge cannot be run with (left by an older judgeloop, or a hand-made one on the
            # branch): rolled back with the reason, so a resume goes on instead of failing forever.
            reason = f"cannot be evaluated: {invalid}; rolled back"
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, None, "error"))
            self.say(f"  experiment {exp_id}: {reason}")
            return self.ledger.record_error(exp_id, reason, cost_usd=optimiser_cost, commit_sha=rejected)
        self.stage(StageKind.EVALUATING, exp_id, started_at=time.time())  # wall clock, as the cache's `created`
        if self.batch:
            self.say(f"  experiment {exp_id}: evaluating every item as one batch (batch mode: early stopping "
                     "does not apply)")
        elif policy_for(self.loop_cfg).rejudges:
            self.say(f"  experiment {exp_id}: evaluating (negatives first), then re-judging the items the prompts "
                     "disagree on; stopping as soon as the outcome is certain")
        else:
            self.say(f"  experiment {exp_id}: evaluating (negatives first, stopping as soon as the outcome is certain)")
        cheaper = self.cheaper_eligible(incumbent, prompts, provider)
        if cheaper:
            self.say(f"  experiment {exp_id}: estimated at least {self.loop_cfg.cheaper_min_saving:.0%} cheaper per "
                     "verdict: evaluated in full, and kept if it is not worse ([loop] cheaper_margin_items)")
        ev = await self.evaluate(exp_id, prompts, incumbent, provider, cache, cheaper=cheaper)
        prompt_hash = prompts.prompt_hash()

        def outcome(status: ExperimentStatus, reason: str, commit_sha: str | None = None) -> ExperimentOutcome:
            return ev.outcome(status, reason, extra_cost_usd=optimiser_cost, commit_sha=commit_sha,
                              prompt_hash=prompt_hash)

        if ev.decision is None:
            reason = f"not decided: {ev.error}; rolled back"
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, None, "error"))
            exp = self._record_eval(exp_id, ev, outcome("error", reason, rejected))
            self.say(f"  experiment {exp_id}: {reason}")
            return exp
        d = ev.decision
        if self.limits.propose_only:
            waiting = f"waiting for a human decision; the {d.policy} policy says: {d.reason}"
            gitops.park_waiting(self.root, sha, exp_id)  # decidable whatever later moves the branch
            exp = self._record_eval(exp_id, ev, outcome("waiting", waiting))
            # Advice, not an outcome: the run's summary says once that it waits for `judgeloop decide`.
            self.say(f"  experiment {exp_id}: evaluated; the {d.policy} policy {as_advice(d.reason)} "
                     f"(review it: `git show {sha[:12]}`, `judgeloop tui`)")
            return exp
        if d.keep:
            new_sha = gitops.finalize_kept(self.root, sha, decision_trailers(exp_id, ev.metrics, "kept"))
            exp = self._record_eval(exp_id, ev, outcome("kept", d.reason, new_sha))
        else:
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha,
                                        decision_trailers(exp_id, ev.metrics, "rolled_back"))
            exp = self._record_eval(exp_id, ev, outcome("rolled_back", d.reason, rejected))
        kept = "KEPT (cheaper, not worse)" if d.keep_kind == "cheaper" else "KEPT"
        self.say(f"  experiment {exp_id}: {kept if d.keep else 'rolled back'} — {d.reason} "
            f"(calls={ev.calls}, cached={ev.run.cache_hits}, ${ev.usage.cost_usd:.4f})")
        return exp

    # -- the loop --------------------------------------------------------------------------------

    async def resume_interrupted(self, provider: Provider, cache: JudgeCache) -> None:
        """Bring the tree and the ledger back to a consistent state after a crash."""
        run = self.ledger.get_run(self.run.id)
        incumbent = self.ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
        wave = self.interrupted_wave(incumbent)
        for exp in self.ledger.experiments_with_status("running", self.run.id):
            tip = gitops.rev_parse(self.root, "HEAD")
            if any(exp.id == member_id for member_id, _, _ in wave):
                continue
            if exp.seq == 0:
                gitops.restore_tree(self.root, exp.commit_sha or tip)
                self.say(f"resuming: re-evaluating the interrupted baseline (experiment {exp.id}) from the cache")
                await self.baseline(provider, cache, existing=exp)
            elif exp.commit_sha and exp.commit_sha == tip and incumbent is not None:
                gitops.restore_tree(self.root, tip)
                self.say(f"resuming: re-evaluating interrupted candidate {exp.id} ({tip[:12]}) from the cache")
                # The running row holds the optimiser's spend on this candidate; keep it on the record.
                await self.evaluate_candidate(exp.id, tip, incumbent, provider, cache, exp.cost_usd)
            else:
                restore_to = incumbent.commit_sha if incumbent and incumbent.commit_sha else tip
                if exp.commit_sha:
                    gitops.store_rejected(self.root, exp.commit_sha, exp.id)
                gitops.restore_tree(self.root, restore_to)
                self.ledger.record_error(exp.id, "interrupted before it was evaluated; rolled back on resume")
        if wave and incumbent is not None:
            size = max(int(e.proposal_meta.get("wave", {}).get("size", 1)) for e in self.ledger.experiments(self.run.id)
                       if any(e.id == member_id for member_id, _, _ in wave))
            self.say(f"resuming: re-evaluating the interrupted wave (experiments {', '.join(str(m[0]) for m in wave)}) "
                     "from the cache")
            await self.decide_wave(wave, incumbent, provider, cache, family=size)
        run = self.ledger.get_run(self.run.id)
        if run.incumbent_experiment is not None:
            inc = self.ledger.get_experiment(run.incumbent_experiment)
            if inc.commit_sha:
                gitops.restore_tree(self.root, inc.commit_sha)

    def interrupted_wave(self, incumbent: Experiment | None) -> list[tuple[int, str, float]]:
        """The candidates of a wave a crash or a stop cut short: running rows of a wave on the incumbent
        with a commit, each parked (one left at the tip, committed but not parked yet, is parked now).
        A parked candidate of another incumbent cannot be decided any more: rolled back."""
        parked = gitops.parked_candidates(self.root)
        members: list[tuple[int, str, float]] = []
        tip = gitops.rev_parse(self.root, "HEAD")
        for exp in self.ledger.experiments_with_status("running", self.run.id):
            if exp.seq == 0 or not exp.commit_sha or "wave" not in exp.proposal_meta:
                continue
            if incumbent is None or exp.parent_id != incumbent.id or not incumbent.commit_sha:
                gitops.store_rejected(self.root, exp.commit_sha, exp.id)
                if exp.id in parked:
                    gitops.unpark(self.root, exp.id)
                self.ledger.record_error(exp.id, "a wave candidate of an earlier incumbent; rolled back on resume")
                continue
            if exp.id not in parked:
                if exp.commit_sha != tip:
                    continue  # never parked nor at the tip: the one-candidate path rolls it back
                gitops.park_candidate(self.root, exp.commit_sha, exp.id, incumbent.commit_sha)
                tip = incumbent.commit_sha
            members.append((exp.id, exp.commit_sha, exp.cost_usd))
        return members

    # -- a wave ----------------------------------------------------------------------------------

    async def wave(self, incumbent: Experiment, provider: Provider, cache: JudgeCache,
                   room: int | None) -> list[Experiment]:
        """One round of ``[loop] wave`` candidates against ``incumbent`` (fewer when ``room``, the
        candidates ``--max-experiments`` leaves, is smaller, or the strategy runs out): each proposed
        on the incumbent with the wave's earlier ones in its history, guarded and committed on the
        incumbent (parked under ``refs/judgeloop/wave/``), then judged together and decided together
        (`decide_wave`). Holm's family is the wave's size, whatever number got to be tested; the
        meta's ``number`` counts the run's waves (`optimizer.ledger.waves`, so a resume goes on)."""
        k = self.loop_cfg.wave
        incumbent_sha = incumbent.commit_sha or gitops.rev_parse(self.root, "HEAD")
        meta: dict[str, Any] = {"size": k, "alpha": self.test_level(), "incumbent": incumbent.id,
                                "number": next_wave_number(self.ledger.experiments(self.run.id))}
        siblings: list[PastExperiment] = []
        seen: dict[str, int] = {}
        ended: list[Experiment] = []
        parked: list[tuple[int, str, float]] = []
        n = k if room is None else max(1, min(k, room))
        self.say(f"wave of {k}: proposing {n} candidate(s) against experiment {incumbent.id}")
        given: list[Proposal | ProposalError] | None = None
        if proposes_waves(self.strategy):  # the whole wave in one conversation
            seq = max(e.seq for e in self.ledger.experiments(self.run.id)) + 1
            self.stage(StageKind.PROPOSING, None, seq=seq, strategy=self.strategy.name)
            self.say(f"  asking the {self.strategy.name} optimiser for {n} edits in one conversation")
            given = await self.strategy.propose_wave(self.context(incumbent, seq), n)
            given = (given + [ProposalError("the optimiser proposed fewer candidates than the wave holds")] * n)[:n]
        for i in range(n):
            # (Proposals already made and paid for are committed; the stop comes before their judging.)
            if given is None and (self.interrupted or self.budget_exhausted is not None):
                break
            prepared = await self.prepare(incumbent, provider, siblings=siblings, wave_meta=meta, seen=seen,
                                          given=None if given is None else given[i])
            if isinstance(prepared, Experiment):
                ended.append(prepared)
                continue
            gitops.park_candidate(self.root, prepared[1], prepared[0], incumbent_sha)
            parked.append(prepared)
        return ended + await self.decide_wave(parked, incumbent, provider, cache, family=k)

    async def decide_wave(self, members: list[tuple[int, str, float]], incumbent: Experiment, provider: Provider,
                          cache: JudgeCache, *, family: int) -> list[Experiment]:
        """Judge a wave's parked candidates (id, commit, optimiser cost) item by item together — each
        candidate's evaluation runs at once, in the same order, on a share of the run's concurrency,
        so an item's calls for every candidate go out together and one cached prefix serves them —
        then decide them with `optimizer.stats.decision.decide_wave` and settle git: every candidate not
        kept is rolled back (``refs/judgeloop/rejected/<id>``), the kept one (at most one) finalised
        as the branch's tip."""
        incumbent_sha = incumbent.commit_sha or gitops.rev_parse(self.root, "HEAD")
        out: list[Experiment] = []
        ready: list[tuple[int, str, float, PromptSet]] = []
        for exp_id, sha, cost in members:
            try:
                prompts = PromptSet.from_rev(self.ws, sha)
                invalid = self.validate({}, provider, base_rev=sha)
            except UserError as exc:
                invalid = str(exc)
            if invalid is not None:
                reason = f"cannot be evaluated: {invalid}; rolled back"
                gitops.store_rejected(self.root, sha, exp_id)
                gitops.unpark(self.root, exp_id)
                self.say(f"  experiment {exp_id}: {reason}")
                out.append(self.ledger.record_error(exp_id, reason, cost_usd=cost, commit_sha=sha))
                continue
            ready.append((exp_id, sha, cost, prompts))
        if not ready:
            return out
        for exp_id, *_ in ready:
            self.stage(StageKind.EVALUATING, exp_id, started_at=time.time())
        ids = ", ".join(str(r[0]) for r in ready)
        self.say(f"  wave: evaluating experiments {ids} item by item together (negatives first), "
                 + ("one batch per wave pass (batch mode: early stopping does not apply)" if self.batch
                    else "each stopping as soon as its outcome at the wave's level is certain"))
        judge = self.judge.model_copy(update={"max_concurrency": max(1, self.judge.max_concurrency // len(ready))})
        # Futility's looks in one order for every member (the same incumbent, one seed: the wave's first
        # id, the same on resume), so an item's calls still go out together and share its cached prefix.
        look_seed = self.decision_seed(min(exp_id for exp_id, _, _ in members))
        # --batch: the candidates' passes go out as one batch per wave pass (`WaveBatches`).
        shared = WaveBatches(provider, len(ready)) if self.batch and batches(provider) else None

        async def member(exp_id: int, prompts: PromptSet) -> Evaluated:
            try:
                return await self.evaluate(exp_id, prompts, incumbent, shared or provider, cache, judge=judge,
                                           look_seed=look_seed)
            finally:
                if shared is not None:
                    shared.leave()

        self._wave_line = WaveProgress([r[0] for r in ready], len(self.split.ids), self.events)
        try:
            results = await asyncio.gather(*(member(exp_id, prompts) for exp_id, _, _, prompts in ready),
                                           return_exceptions=True)
        finally:
            self._wave_line = None
        if shared is not None:
            self.say(f"  wave: {shared.submitted} batch(es) for its {len(ready)} candidates")
        failed = [r for r in results if isinstance(r, BaseException) and not isinstance(r, EvaluationInterrupted)]
        if failed:
            raise failed[0]
        if any(isinstance(r, EvaluationInterrupted) for r in results):
            # Each member's calls so far go on its row now, counted once (`resuming`), as for one
            # candidate; the wave stays running and parked, and `--resume` decides it from the cache.
            first: EvaluationInterrupted | None = None
            for (exp_id, *_), r in zip(ready, results, strict=True):
                paid = r.cost_usd if isinstance(r, EvaluationInterrupted) else (
                    r.usage.cost_usd if isinstance(r, Evaluated) else 0.0)
                if first is None and isinstance(r, EvaluationInterrupted):
                    first = r
                    continue
                if paid > 0:
                    self.ledger.add_cost(exp_id, Usage(cost_usd=paid))
                self.stage(StageKind.RESUMING, exp_id, paid_before_crash_usd=round(paid, 6))
            assert first is not None
            raise first
        evaluated = [r for r in results if isinstance(r, Evaluated)]
        decisions = decide_wave([ev.decision for ev in evaluated], self.test_level(), family,
                                [f"experiment {r[0]}" for r in ready])
        # Roll back first, keep last: the branch ends at the kept candidate, or at the incumbent.
        order = sorted(range(len(ready)), key=lambda i: bool(decisions[i] and decisions[i].keep))  # type: ignore[union-attr]
        for i in order:
            exp_id, sha, cost, prompts = ready[i]
            ev = dataclasses.replace(evaluated[i], decision=decisions[i])
            out.append(self._settle(exp_id, sha, cost, prompts, ev, incumbent_sha))
            gitops.unpark(self.root, exp_id)
        return out

    def _settle(self, exp_id: int, sha: str, cost: float, prompts: PromptSet, ev: Evaluated,
                incumbent_sha: str) -> Experiment:
        """Record one wave candidate's decision and finalise or roll back its parked commit."""
        def outcome(status: ExperimentStatus, reason: str, commit_sha: str | None = None) -> ExperimentOutcome:
            return ev.outcome(status, reason, extra_cost_usd=cost, commit_sha=commit_sha,
                              prompt_hash=prompts.prompt_hash())

        gitops.check_out_parked(self.root, sha)
        d = ev.decision
        if d is None:
            reason = f"not decided: {ev.error}; rolled back"
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, None, "error"))
            self.say(f"  experiment {exp_id}: {reason}")
            return self._record_eval(exp_id, ev, outcome("error", reason, rejected))
        if d.keep:
            new_sha = gitops.finalize_kept(self.root, sha, decision_trailers(exp_id, ev.metrics, "kept"))
            exp = self._record_eval(exp_id, ev, outcome("kept", d.reason, new_sha))
        else:
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha,
                                        decision_trailers(exp_id, ev.metrics, "rolled_back"))
            exp = self._record_eval(exp_id, ev, outcome("rolled_back", d.reason, rejected))
        self.say(f"  experiment {exp_id}: {'KEPT' if d.keep else 'rolled back'} — {d.reason} "
                 f"(calls={ev.calls}, cached={ev.run.cache_hits}, ${ev.usage.cost_usd:.4f})")
        return exp

    async def loop(self) -> StopReason:
        provider = make_provider(self.judge)
        cache = JudgeCache(self.ws.cache_path)
        try:
            return await self._loop(provider, cache)
        except EvaluationInterrupted as exc:
            # What the cut evaluation paid goes on the experiment's row now, marked as counted (the
            # `resuming` stage) so that `--resume`, which re-evaluates it from the cache, counts it once.
            if exc.cost_usd > 0:
                self.ledger.add_cost(exc.experiment_id, Usage(cost_usd=exc.cost_usd))
            self.stage(StageKind.RESUMING, exc.experiment_id, paid_before_crash_usd=round(exc.cost_usd, 6))
            return StopReason(
                StopKind.INTERRUPTED,
                f"interrupted ({self.stop.reason}) while evaluating experiment {exc.experiment_id}, after "
                f"{exc.judged}/{exc.total} items; `judgeloop run --resume` finishes it (what was judged is "
                "cached, not paid again)",
            )
        finally:
            await provider.aclose()
            cache.close()

    async def _loop(self, provider: Provider, cache: JudgeCache) -> StopReason:
        await self.resume_interrupted(provider, cache)
        run = self.ledger.get_run(self.run.id)
        if run.incumbent_experiment is None:
            await self.baseline(provider, cache)
        experiments = self.ledger.experiments(self.run.id)
        done = sum(1 for e in experiments if e.seq > 0)
        since_keep = 0
        for e in reversed(experiments):
            if e.seq == 0 or e.status == "kept":
                break
            since_keep += 1
        k, patience = self.loop_cfg.wave, self.limits.patience
        if k > patience:  # patience counts candidates: one wave without a keep already exceeds it
            self.events(Message(f"note: patience {patience} is fewer candidates than a wave of {k}: the run stops "
                                f"after the first wave without a keep (--patience {2 * k} allows two)", "note"))
        while True:
            reason = self.stop_reason(done, since_keep)
            if reason:
                return reason
            run = self.ledger.get_run(self.run.id)
            assert run.incumbent_experiment is not None  # the baseline ran above
            incumbent = self.ledger.get_experiment(run.incumbent_experiment)
            if self.loop_cfg.wave > 1:
                room = None if self.limits.max_experiments is None else self.limits.max_experiments - done
                wave = await self.wave(incumbent, provider, cache, room)
                done += len(wave)
                since_keep = 0 if any(e.status == "kept" for e in wave) else since_keep + len(wave)
                continue
            exp = await self.candidate(incumbent, provider, cache)
            done += 1
            since_keep = 0 if exp.status == "kept" else since_keep + 1
            if self.limits.propose_only and exp.status == "waiting":
                return StopReason(StopKind.WAITING, "propose-only: candidate waiting for `judgeloop decide`")
            if self.limits.propose_only:
                return StopReason(StopKind.PROPOSED, f"propose-only: candidate ended as {exp.status}")


# Passes below plan said on stderr before any pass of the run was billed a cache read (then silent).
SILENT_PASSES_SAID = 2


def check_wave(loop: LoopSection, *, strategy: str, propose_only: bool) -> None:
    """Refuse, in one line, what a wave of several candidates (``[loop] wave`` > 1) cannot be run with."""
    if loop.wave == 1:
        return
    what = f"a wave of {loop.wave} candidates ([loop] wave / --wave)"
    if strategy == "manual":
        raise UserError(f"{what} needs a strategy that proposes; --strategy manual judges one hand edit: drop --wave")
    if strategy == "mcp":
        raise UserError(f"{what}: an MCP client submits one candidate at a time; set [loop] wave = 1 in judgeloop.toml")
    if propose_only:
        raise UserError(f"{what} is decided by Holm over its candidates, not by a person: drop --propose-only or "
                        "use --wave 1")
    if not policy_for(loop).tests_at_alpha:
        raise UserError(f"{what} is decided by Holm over the candidates' p-values; the {loop.policy} policy runs no "
                        "test: use --policy adaptive or paired, or --wave 1")
    if loop.fdr is not None:
        raise UserError(f"{what} keeps its false-keep bound with Holm at [loop] alpha; [loop] fdr (LORD++) levels "
                        "are per candidate: remove fdr from judgeloop.toml or use --wave 1")
    if loop.cheaper_margin_items > 0:
        raise UserError(f"{what} decides improvements only; cheaper-not-worse keeps ([loop] cheaper_margin_items) "
                        "are decided one candidate at a time: set cheaper_margin_items = 0 or use --wave 1")


def as_advice(reason: str) -> str:
    """A policy's reason worded as advice to the person who decides (--propose-only): its outcome
    ("…: rolled back (why)", "…: kept") becomes "would roll it back (why)" / "would keep it", first."""
    for done, would in ((": rolled back", "would roll it back"), (": kept", "would keep it")):
        evidence, found, rest = reason.rpartition(done)
        if found and (not rest or rest[0] in " ;"):
            return f"{would}{rest}: {evidence}"
    return f"says: {reason}"


def fmt3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _one_line(text: str, limit: int = 72) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def pass_figures(run: EvalRun, *, items: bool = True) -> ProgressSnapshot:
    """A finished pass's figures as a progress snapshot (``items`` False: its calls only, no items)."""
    judged = run.items if items else []
    return ProgressSnapshot(
        done=len(judged), total=len(judged), infra_errors=sum(1 for i in judged if i.infra_error),
        parse_errors=sum(1 for i in judged if i.answer.status == "invalid"), calls_made=run.usage.calls,
        cache_hits=run.cache_hits, input_tokens=run.usage.input_tokens, output_tokens=run.usage.output_tokens,
        cost_usd=run.cost_usd, elapsed_s=run.duration_s if items else 0.0,
    )


class WaveProgress:
    """One progress line for a wave's candidates judged together: every member's latest first-pass
    snapshot summed (a member that stopped early keeps its figures: its items were judged), plus the
    calls of its re-judging passes once each ends; the wave's elapsed time. ``items``: a first pass's."""

    MIN_INTERVAL_S = 0.25

    def __init__(self, ids: list[int], items: int, events: Listener) -> None:
        contiguous = ids == list(range(ids[0], ids[0] + len(ids)))
        which = (f"experiment {ids[0]}" if len(ids) == 1 else
                 f"experiments {ids[0]}–{ids[-1]}" if contiguous else f"experiments {', '.join(map(str, ids))}")
        self.label = f"wave of {len(ids)} ({which})"
        zero = ProgressSnapshot.summed([])
        self.first = {i: dataclasses.replace(zero, total=items) for i in ids}
        self.extra = {i: zero for i in ids}
        self.events = events
        self.started = time.monotonic()
        self._shown = 0.0

    def snapshot(self) -> ProgressSnapshot:
        snap = ProgressSnapshot.summed([*self.first.values(), *self.extra.values()])
        return dataclasses.replace(snap, elapsed_s=time.monotonic() - self.started, label=self.label)

    def update(self, experiment_id: int, snap: ProgressSnapshot) -> None:
        """Member ``experiment_id``'s first pass so far (its phases counted in)."""
        self.first[experiment_id] = snap
        self._show()

    def rejudged(self, experiment_id: int, passes: list[EvalRun]) -> None:
        """Member ``experiment_id``'s re-judging passes so far (every one that ended)."""
        self.extra[experiment_id] = ProgressSnapshot.summed(pass_figures(p, items=False) for p in passes)
        self._show(force=True)

    def _show(self, *, force: bool = False) -> None:
        snap = self.snapshot()
        now = time.monotonic()
        if force or snap.done >= snap.total or now - self._shown >= self.MIN_INTERVAL_S:
            self._shown = now
            self.events(Progress(snap))


def _joined(first: EvalRun, then: EvalRun) -> EvalRun:
    """One first pass out of two consecutive parts (futility's looks): items, usage and figures summed."""
    endpoints = {name: dict(figures) for name, figures in first.endpoints.items()}
    for name, figures in then.endpoints.items():
        mine = endpoints.setdefault(name, {})
        for key, value in figures.items():
            mine[key] = mine.get(key, 0) + value
    return EvalRun(
        items=first.items + then.items, usage=first.usage + then.usage, cache_hits=first.cache_hits + then.cache_hits,
        duration_s=first.duration_s + then.duration_s, stop=then.stop, notes=first.notes + then.notes,
        not_evaluated=first.not_evaluated + then.not_evaluated, item_ids=first.item_ids + then.item_ids,
        cache_reads=dataclasses.replace(first.cache_reads, planned=first.cache_reads.planned + then.cache_reads.planned,
                                        billed=first.cache_reads.billed + then.cache_reads.billed),
        meta=first.meta | then.meta, endpoints=endpoints,
    )
