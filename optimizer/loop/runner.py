"""The auto-research loop: propose → guard → commit → evaluate (dev split only) → decide → keep or roll back.

Everything the loop does is recorded in the ledger as it happens (one transaction per state change),
so a crash or ``kill -9`` leaves a consistent ledger, and ``judgeloop run --resume`` restores the
tree to the incumbent (or to the interrupted candidate's commit) and continues; every judge call
already paid for comes back from the cache.

Commands here: ``judgeloop run``, ``judgeloop decide``, ``judgeloop confirm``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import functools
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer import gitops
from optimizer.config import JudgeSection, LoopSection
from optimizer.decision import Decision, decide, stopped_decision
from optimizer.devset.labels import load_labels
from optimizer.devset.split import Split, open_split
from optimizer.errors import UserError
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import (
    Budget,
    EvalRun,
    ItemResult,
    ProgressSnapshot,
    evaluate_items,
    judge_with_overrides,
)
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import make_provider
from optimizer.ledger import Experiment, ItemVerdict, Ledger, ReplicateVerdict, Run
from optimizer.loop.guards import check_candidate, instruction_ngrams, instruction_values
from optimizer.loop.strategies import (
    Disagreement,
    PastExperiment,
    Proposal,
    ProposalContext,
    ProposalError,
    Strategy,
    make_strategy,
)
from optimizer.loop.strategies.manual import ManualStrategy, capture_edits
from optimizer.metrics import Answer, Metrics, bootstrap_intervals, flip_table, score
from optimizer.models import Label
from optimizer.report import export_experiments_tsv, write_markdown_report
from optimizer.workspace import Workspace, command_lock


def say(message: str) -> None:
    """Progress for the person at the terminal (stdout, flushed so `tee` and the TUI see it live)."""
    print(message, flush=True)


@dataclass
class Limits:
    max_experiments: int | None = None  # candidates, not counting the baseline
    budget_usd: float | None = None
    hours: float | None = None
    patience: int = 5
    propose_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_experiments": self.max_experiments,
            "budget_usd": self.budget_usd,
            "hours": self.hours,
            "patience": self.patience,
            "propose_only": self.propose_only,
        }


def evaluation_order(labels: Mapping[str, Label], ids: list[str]) -> list[str]:
    """Negatives first (the FPR guard needs only them), then positives; manifest order within each."""
    return [t for t in ids if not labels[t].is_positive] + [t for t in ids if labels[t].is_positive]


def item_verdicts(run: EvalRun) -> list[ItemVerdict]:
    """Ledger rows for every evaluated item (majority answer and each replicate)."""
    rows = []
    for item in run.items:
        reps = [
            ReplicateVerdict(
                replicate=r.index,
                success=r.success,
                status="ok" if r.status == "ok" else ("infra_error" if r.status == "infra_error" else "invalid"),
                reasoning=r.verdict.reasoning if r.verdict else (r.parse_error or r.infra_error or ""),
                confidence=r.verdict.confidence if r.verdict else None,
                mistake_type=r.verdict.mistake_type if r.verdict else None,
                raw=r.reply_text if r.verdict is None else None,
                cached=r.cached,
                cost_usd=r.cost_usd,
                tools=list(r.trace),
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


def _trailers(exp_id: int, metrics: Metrics | None, decision: str) -> dict[str, object]:
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
    spent_usd: float = 0.0
    started: float = field(default_factory=time.monotonic)
    interrupted: bool = False
    budget_exhausted: str | None = None  # why the judge budget cannot pay for another call
    _budget: Budget | None = None
    _guard_inputs: dict[str, Any] | None = None

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.ws.root

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

    def _progress(self, experiment_id: int):
        last = [0.0]

        def report(snap: ProgressSnapshot) -> None:
            now = time.monotonic()
            if now - last[0] < 0.5 and snap.done < snap.total:
                return
            last[0] = now
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

    def stage(self, name: str, experiment_id: int | None = None, **extra: Any) -> None:
        self.ledger.add_event(self.run.id, "stage", {"stage": name, **extra}, experiment_id=experiment_id)

    def stop_reason(self, candidates_done: int, since_keep: int) -> str | None:
        """Why the loop must stop before the next candidate, or None to go on."""
        if self.interrupted:
            return "interrupted (Ctrl-C)"
        if self.ws.stop_path.exists():
            return f"stop file {self.ws.stop_path.relative_to(self.root)} present"
        if self.limits.max_experiments is not None and candidates_done >= self.limits.max_experiments:
            return f"reached --max-experiments {self.limits.max_experiments}"
        if self.limits.hours is not None and time.monotonic() - self.started >= self.limits.hours * 3600:
            return f"reached --hours {self.limits.hours:g}"
        if self.limits.budget_usd is not None and self.spent_usd >= self.limits.budget_usd:
            return f"spent ${self.spent_usd:.4f} of the ${self.limits.budget_usd:g} budget"
        if self.budget_exhausted is not None:
            return self.budget_exhausted
        if since_keep >= self.limits.patience:
            return f"{since_keep} candidates in a row without a keep (patience {self.limits.patience})"
        return None

    # -- evaluation ------------------------------------------------------------------------------

    async def evaluate(
        self, experiment_id: int, prompts: PromptSet, incumbent: Mapping[str, Answer] | None, provider, cache
    ) -> Evaluated:
        """Evaluate ``prompts`` on the whole split (negatives first) and decide against ``incumbent``.

        With an incumbent, stop as soon as an exact bound proves a rollback. Items that hit
        infrastructure errors are left out of the bounds (unjudged) and make the evaluation
        incomplete: such a candidate is never decided on partial data.
        """
        order = evaluation_order(self.labels, self.split.ids)
        so_far: dict[str, Answer] = {}
        early: list[Decision] = []

        def on_item(item: ItemResult) -> bool:
            # --propose-only evaluates in full: a human decides, and a candidate they keep becomes the
            # incumbent, whose answers every later candidate is compared with item by item.
            if item.infra_error or incumbent is None or self.limits.propose_only:
                return False
            so_far[item.trajectory_id] = item.answer
            decision = stopped_decision(self.labels, so_far, incumbent, self.loop_cfg)
            if decision is not None:
                early.append(decision)
                return True
            return False

        result = await evaluate_items(
            self.ws, self.split, prompts, self.judge,
            item_ids=order, replicates=self.replicates, on_item=on_item, budget=self.budget(),
            progress=self._progress(experiment_id), provider=provider, cache=cache,
            infra_retry_rounds=self.loop_cfg.infra_retry_rounds, infra_retry_pause_s=self.loop_cfg.infra_retry_pause_s,
        )
        self.spent_usd += result.cost_usd
        # The evaluator refused a call that would cross the budget: no later candidate can be paid for.
        if result.stop_reason and result.stop_reason.startswith("budget of"):
            self.budget_exhausted = result.stop_reason
        answers = result.answers()
        if early:
            judged = {t: self.labels[t] for t in so_far}
            flips = flip_table(judged, {t: incumbent[t] for t in judged}, so_far) if incumbent else None
            return Evaluated(result, early[0], None, None, flips)
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
        if incumbent is None:
            return Evaluated(result, None, metrics, intervals, None)
        flips = flip_table(self.labels, incumbent, answers)
        decision = decide(score(self.labels, incumbent), metrics, flips, self.loop_cfg)
        return Evaluated(result, decision, metrics, intervals, flips)

    def _record_eval(self, exp_id: int, ev: Evaluated, **fields: Any) -> Experiment:
        self.ledger.record_verdicts(exp_id, item_verdicts(ev.run))
        d = ev.decision
        return self.ledger.finish_experiment(
            exp_id,
            metrics=ev.metrics,
            intervals=ev.intervals,
            flips=ev.flips,
            p_value=d.p_value if d else None,
            literal_keep=d.literal_keep if d else None,
            paired_keep=d.paired_keep if d else None,
            early_stopped=bool(d and d.early_stopped),
            items_evaluated=len(ev.run.items),
            calls=ev.run.calls_made,
            cache_hits=ev.run.cache_hits,
            input_tokens=ev.run.input_tokens,
            output_tokens=ev.run.output_tokens,
            cost_usd=ev.run.cost_usd + fields.pop("extra_cost", 0.0),
            duration_s=ev.run.duration_s,
            **fields,
        )

    # -- the baseline ----------------------------------------------------------------------------

    async def baseline(self, provider, cache, existing: Experiment | None = None) -> Experiment:
        sha = gitops.rev_parse(self.root, "HEAD")
        prompts = PromptSet.from_rev(self.ws, sha)
        exp = existing or self.ledger.start_experiment(
            self.run.id, parent_id=None, strategy="baseline", seq=0, commit_sha=sha,
            prompt_hash=prompts.prompt_hash(), rationale="the prompts the run started from",
        )
        self.stage("baseline", exp.id, started_at=time.time())
        say(f"experiment {exp.id} (baseline): evaluating {len(self.split.ids)} items × {self.replicates} replicate(s)")
        ev = await self.evaluate(exp.id, prompts, None, provider, cache)
        # A resumed baseline's row holds what it paid before the crash (calls now served by the cache).
        paid_before = existing.cost_usd if existing else 0.0
        if ev.metrics is None:
            self._record_eval(exp.id, ev, status="error", reason=f"baseline incomplete: {ev.error}",
                              extra_cost=paid_before)
            raise UserError(f"the baseline evaluation is incomplete ({ev.error}); fix the judge setup and "
                            "run `judgeloop run --resume`")
        m = ev.metrics
        exp = self._record_eval(exp.id, ev, status="baseline", decision="baseline", extra_cost=paid_before,
                                reason=f"baseline: kappa {m.kappa:.3f}, FPR {m.fpr:.3f}" if m.kappa is not None
                                else "baseline")
        say(f"  baseline kappa={_f(m.kappa)} FPR={_f(m.fpr)} bal.acc={_f(m.balanced_accuracy)} "
            f"calls={ev.run.calls_made} cached={ev.run.cache_hits} cost=${ev.run.cost_usd:.4f}")
        return exp

    # -- one candidate ---------------------------------------------------------------------------

    def context(self, incumbent: Experiment, seq: int) -> ProposalContext:
        allowed = list(self.ws.config.optimizer.allowed_files)
        current = {p: (self.root / p).read_text(encoding="utf-8") for p in allowed if (self.root / p).is_file()}
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
        guidance = self.ws.guidance_path.read_text(encoding="utf-8") if self.ws.guidance_path.is_file() else ""
        reviews = self.ledger.reviews()
        if reviews:
            guidance += "\n\n## Human reviews of judge verdicts\n" + "\n".join(
                f"- {r.kind.replace('_', ' ')} on {r.trajectory_id}: {r.note}" for r in reviews
            )
        return ProposalContext(
            workspace_root=self.root, allowed_files=allowed, current_files=current,
            disagreements=disagreements, history=history, guidance=guidance.strip(), split=self.split,
            rng_seed=self.ws.config.optimizer.seed, experiment_seq=seq,
            judge_mode=PromptSet.from_dir(self.ws.prompts_dir).settings.mode,
        )

    def guard_inputs(self) -> dict[str, Any]:
        """What the overfit lint checks against, built once per run (the instructions' 8-grams and values)."""
        if self._guard_inputs is None:
            recordings = {lab.original_id for lab in self.labels.values()}
            recordings |= {lab.paired_id for lab in self.labels.values() if lab.paired_id}
            instructions = [self.split.trajectory(t).task.instruction for t in self.split.ids]
            self._guard_inputs = {
                "dev_ids": set(self.split.ids),
                "dev_recording_ids": recordings,
                "dev_instructions": instruction_ngrams(instructions),
                "dev_values": instruction_values(instructions),
            }
        return self._guard_inputs

    async def candidate(self, incumbent: Experiment, provider, cache) -> Experiment:
        seq = max(e.seq for e in self.ledger.experiments(self.run.id)) + 1
        self.stage("proposing", None, seq=seq, strategy=self.strategy.name)
        say(f"candidate {seq}: asking the {self.strategy.name} optimiser for an edit")
        try:
            proposal: Proposal = await self.strategy.propose(self.context(incumbent, seq))
        except ProposalError as exc:
            self.charge(exc.cost_usd)
            exp = self.ledger.start_experiment(
                self.run.id, parent_id=incumbent.id, strategy=self.strategy.name, seq=seq, rationale=None,
                optimizer_calls=exc.calls, optimizer_input_tokens=exc.input_tokens,
                optimizer_output_tokens=exc.output_tokens, optimizer_cost_usd=exc.cost_usd,
            )
            say(f"  optimiser failed: {exc.reason}")
            # No judge call was made: the row's total cost is the optimiser's.
            return self.ledger.finish_experiment(
                exp.id, status="error", decision="error", reason=f"optimiser failed: {exc.reason}",
                cost_usd=exc.cost_usd,
            )
        self.charge(proposal.cost_usd)

        allowed = set(self.ws.config.optimizer.allowed_files)
        changed: dict[str, tuple[str | None, str | None]] = {}
        for path, new in proposal.files.items():
            if path not in allowed:
                # Never read a file outside the allowed set: its text would reach the ledger's diff and,
                # through the history, the optimiser (think devset/*/labels.jsonl). The guard rejects it.
                changed[path] = ("<not read: outside the allowed files>", new)
                continue
            target = self.root / path
            old = target.read_text(encoding="utf-8") if target.is_file() else None
            if old != new:
                changed[path] = (old, new)
        diff_text, ins, dels = unified_diff({p: c for p, c in changed.items() if p in allowed})
        exp = self.ledger.start_experiment(
            self.run.id, parent_id=incumbent.id, strategy=self.strategy.name, seq=seq,
            files_changed=sorted(changed), insertions=ins, deletions=dels, diff_text=diff_text,
            rationale=proposal.rationale, proposal_meta=proposal.meta,
            optimizer_calls=proposal.calls, optimizer_input_tokens=proposal.input_tokens,
            optimizer_output_tokens=proposal.output_tokens, optimizer_cost_usd=proposal.cost_usd,
        )
        # The row's calls and tokens are the judge's (none yet); its cost is the experiment's total,
        # judge + optimiser, so budgets and spend sums count the optimiser too.
        usage = dict(cost_usd=proposal.cost_usd)
        self.stage("guards", exp.id)
        guard = (
            check_candidate(changed, self.ws.config.optimizer.allowed_files, self.ws.config.optimizer.max_diff_lines,
                            **self.guard_inputs())
            if changed else None
        )
        if guard is None or not guard.ok:
            reason = "the proposal changed nothing" if guard is None else guard.reason
            say(f"  experiment {exp.id}: rejected by the guards: {reason}")
            return self.ledger.finish_experiment(exp.id, status="guard_rejected", decision="guard_rejected",
                                                 reason=reason, **usage)

        # Only guarded, allowed files are written, and only they are committed.
        for path, (_, new) in changed.items():
            (self.root / path).write_text(new or "", encoding="utf-8")
        sha = gitops.commit_candidate(
            self.root, sorted(changed), f"judgeloop candidate {exp.id}: {_one_line(proposal.rationale)}\n\n"
            f"{proposal.rationale}", exp.id,
        )
        self.ledger.finish_experiment(exp.id, status="running", decision="pending", commit_sha=sha, finished=False,
                                      reason="evaluating", **usage)
        return await self.evaluate_candidate(exp.id, sha, incumbent, provider, cache, proposal.cost_usd)

    async def evaluate_candidate(
        self, exp_id: int, sha: str, incumbent: Experiment, provider, cache, optimiser_cost: float = 0.0
    ) -> Experiment:
        prompts = PromptSet.from_rev(self.ws, sha)
        self.stage("evaluating", exp_id, started_at=time.time())  # wall clock, as the cache's `created`
        say(f"  experiment {exp_id}: evaluating (negatives first, stopping as soon as the outcome is certain)")
        ev = await self.evaluate(exp_id, prompts, self.ledger.item_answers(incumbent.id), provider, cache)
        incumbent_sha = incumbent.commit_sha or gitops.rev_parse(self.root, "HEAD~1")
        usage_extra = {"extra_cost": optimiser_cost, "prompt_hash": prompts.prompt_hash()}
        if ev.decision is None:
            reason = f"not decided: {ev.error}; rolled back"
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha, _trailers(exp_id, None, "error"))
            exp = self._record_eval(exp_id, ev, status="error", decision="error", reason=reason,
                                    commit_sha=rejected, **usage_extra)
            say(f"  experiment {exp_id}: {reason}")
            return exp
        d = ev.decision
        if self.limits.propose_only:
            exp = self._record_eval(exp_id, ev, status="waiting", decision="waiting", finished=False,
                                    reason=f"waiting for a human decision; the {d.policy} policy says: {d.reason}",
                                    **usage_extra)
            say(f"  experiment {exp_id}: {d.reason}")
            say(f"  waiting: review it (`git show {sha[:12]}`, `judgeloop tui`), then "
                f"`judgeloop decide {exp_id} keep|discard`")
            return exp
        if d.keep:
            new_sha = gitops.finalize_kept(self.root, sha, _trailers(exp_id, ev.metrics, "kept"))
            exp = self._record_eval(exp_id, ev, status="kept", decision="kept", reason=d.reason,
                                    commit_sha=new_sha, **usage_extra)
        else:
            rejected = gitops.roll_back(self.root, sha, exp_id, incumbent_sha,
                                        _trailers(exp_id, ev.metrics, "rolled_back"))
            exp = self._record_eval(exp_id, ev, status="rolled_back", decision="rolled_back", reason=d.reason,
                                    commit_sha=rejected, **usage_extra)
        say(f"  experiment {exp_id}: {'KEPT' if d.keep else 'rolled back'} — {d.reason} "
            f"(calls={ev.run.calls_made}, cached={ev.run.cache_hits}, ${ev.run.cost_usd:.4f})")
        return exp

    # -- the loop --------------------------------------------------------------------------------

    async def resume_interrupted(self, provider, cache) -> None:
        """Bring the tree and the ledger back to a consistent state after a crash."""
        run = self.ledger.get_run(self.run.id)
        incumbent = self.ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
        for exp in self.ledger.experiments_with_status("running", self.run.id):
            tip = gitops.rev_parse(self.root, "HEAD")
            if exp.seq == 0:
                gitops.restore_tree(self.root, exp.commit_sha or tip)
                say(f"resuming: re-evaluating the interrupted baseline (experiment {exp.id}) from the cache")
                await self.baseline(provider, cache, existing=exp)
            elif exp.commit_sha and exp.commit_sha == tip and incumbent is not None:
                gitops.restore_tree(self.root, tip)
                say(f"resuming: re-evaluating interrupted candidate {exp.id} ({tip[:12]}) from the cache")
                # The running row holds the optimiser's spend on this candidate; keep it on the record.
                await self.evaluate_candidate(exp.id, tip, incumbent, provider, cache, exp.cost_usd)
            else:
                restore_to = incumbent.commit_sha if incumbent and incumbent.commit_sha else tip
                if exp.commit_sha:
                    gitops.store_rejected(self.root, exp.commit_sha, exp.id)
                gitops.restore_tree(self.root, restore_to)
                self.ledger.finish_experiment(exp.id, status="error", decision="error",
                                              reason="interrupted before it was evaluated; rolled back on resume")
        run = self.ledger.get_run(self.run.id)
        if run.incumbent_experiment is not None:
            inc = self.ledger.get_experiment(run.incumbent_experiment)
            if inc.commit_sha:
                gitops.restore_tree(self.root, inc.commit_sha)

    async def loop(self) -> str:
        provider = make_provider(self.judge)
        cache = JudgeCache(self.ws.cache_path)
        try:
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
            while True:
                reason = self.stop_reason(done, since_keep)
                if reason:
                    return reason
                run = self.ledger.get_run(self.run.id)
                incumbent = self.ledger.get_experiment(run.incumbent_experiment)
                exp = await self.candidate(incumbent, provider, cache)
                done += 1
                since_keep = 0 if exp.status == "kept" else since_keep + 1
                if self.limits.propose_only and exp.status == "waiting":
                    return "propose-only: candidate waiting for `judgeloop decide`"
                if self.limits.propose_only:
                    return f"propose-only: candidate ended as {exp.status}"
        finally:
            await provider.aclose()
            cache.close()


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _one_line(text: str, limit: int = 72) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _limits(args: argparse.Namespace, ws: Workspace, previous: Mapping[str, Any] | None = None) -> Limits:
    prev = dict(previous or {})
    return Limits(
        max_experiments=args.max_experiments if args.max_experiments is not None else prev.get("max_experiments"),
        budget_usd=args.budget_usd if args.budget_usd is not None else prev.get("budget_usd"),
        hours=args.hours if args.hours is not None else prev.get("hours"),
        patience=args.patience if args.patience is not None else prev.get("patience", ws.config.loop.patience),
        propose_only=bool(args.propose_only),
    )


def _install_interrupt(runner: LoopRunner) -> None:
    """First Ctrl-C: finish the current step, then stop cleanly. Second: abort (resume later)."""
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()

    def on_sigint() -> None:
        if runner.interrupted:
            say("second Ctrl-C: aborting now; `judgeloop run --resume` continues from the ledger")
            if main_task is not None:
                main_task.cancel()
            return
        runner.interrupted = True
        say("Ctrl-C: finishing the current step, then stopping (press again to abort)")

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        loop.add_signal_handler(signal.SIGTERM, on_sigint)
    except (NotImplementedError, RuntimeError):  # not the main thread (e.g. tests)
        pass


Command = Callable[[argparse.Namespace], int]


def _holding_loop_lock(what: str) -> Callable[[Command], Command]:
    """Run the decorated `judgeloop WHAT` command while holding the workspace's loop lock
    (`workspace.command_lock`): run, decide and confirm move the branch and write the ledger."""

    def wrap(command: Command) -> Command:
        @functools.wraps(command)
        def locked(args: argparse.Namespace) -> int:
            with command_lock(Workspace.open(args.workspace), what):
                return command(args)

        return locked

    return wrap


async def _drive(runner: LoopRunner) -> str:
    _install_interrupt(runner)
    return await runner.loop()


@_holding_loop_lock("run")
def cmd_run(args: argparse.Namespace) -> int:
    ws = Workspace.open(args.workspace)
    cfg = ws.config
    judge = judge_with_overrides(cfg.judge, args)
    loop_cfg = cfg.loop.model_copy(update={"policy": args.policy} if args.policy else {})
    if gitops.clear_stale_index_lock(ws.root):
        say("removed a stale .git/index.lock (left by a process killed in the middle of a git command)")
    ledger = Ledger(ws.ledger_path)
    try:
        if args.resume:
            run = _resumable_run(ledger)
            if run.split in cfg.workspace.heldout_splits:
                raise UserError(f"run {run.id} names held-out split {run.split!r}; the loop never sees it")
            split = open_split(ws, run.split)
            if split.fingerprint != run.split_fingerprint:
                raise UserError(f"split {run.split!r} changed since run {run.id} started (fingerprint differs); "
                                "start a new run")
            judge = _resumed_judge(run, judge, args)
            dirty = [p for p in gitops.dirty_paths(ws.root) if p not in cfg.optimizer.allowed_files]
            if dirty:
                raise UserError(f"the working tree has changes outside the loop's files ({', '.join(dirty[:5])}); "
                                "commit or discard them before `judgeloop run --resume` (it resets the tree)")
            if not ledger.experiments(run.id) and not gitops.branch_exists(ws.root, run.branch):
                # Killed between recording the run and creating its branch: nothing happened yet.
                gitops.ensure_clean(ws.root, "judgeloop run --resume")
                gitops.create_run_branch(ws.root, run.id, run.start_rev)
                say(f"run {run.id} was interrupted before its branch existed; created {run.branch} at its start")
            if not ledger.labels(run.id):
                ledger.set_labels(run.id, load_labels(split))  # for the TUI and the report, never for a judge
            gitops.checkout_branch(ws.root, run.branch)
            strategy_name = run.strategy
            loop_cfg = loop_cfg.model_copy(update={"policy": run.policy})
            limits = _limits(args, ws, run.budgets)
            replicates = int(run.budgets.get("replicates") or 1)
            # Calls paid before a crash come back from the cache on resume and are not re-counted by
            # the resumed evaluation: put them on the interrupted experiment's row first. The last
            # progress event's running total is a floor (it is throttled, so it may lag the cache).
            _record_spend_before_crash(ledger, ws, run.id)
            spent = max(sum(e.cost_usd for e in ledger.experiments(run.id)), _last_reported_spend(ledger, run.id))
            ledger.set_run_status(run.id, "running", pid=_pid())
            say(f"resuming run {run.id} on {run.branch} (spent so far ${spent:.4f})")
        else:
            strategy_name = args.strategy or cfg.optimizer.strategy
            if strategy_name != "manual":
                gitops.ensure_clean(ws.root, "judgeloop run")
            waiting = ledger.experiments_with_status("waiting")
            if waiting:
                raise UserError(f"experiment {waiting[0].id} is waiting for a decision; run "
                                f"`judgeloop decide {waiting[0].id} keep|discard` first")
            split_name = args.split or cfg.workspace.dev_split
            if split_name in cfg.workspace.heldout_splits:
                raise UserError(f"split {split_name!r} is held out ([workspace] heldout_splits); the loop may only "
                                "use the dev split — evaluate held-out splits with `judgeloop confirm`")
            split = open_split(ws, split_name)
            limits = _limits(args, ws)
            manual_dir: Path | None = None
            if strategy_name == "manual":
                # Save the edit, reset the files: the run starts clean and proposes the saved copy once.
                manual_dir = capture_edits(ws.root, ws.experiments_dir, list(cfg.optimizer.allowed_files),
                                           getattr(args, "message", None))
                gitops.ensure_clean(ws.root, "judgeloop run")
                limits = dataclasses.replace(limits, max_experiments=1)
                say(f"your edit is saved in {manual_dir.relative_to(ws.root)} and judged as one candidate")
            start_rev = gitops.rev_parse(ws.root, "HEAD")
            start_settings = PromptSet.from_rev(ws, start_rev).settings
            if start_settings.mode == "agentic" and judge.provider == "local":
                raise UserError('prompts/judge.toml sets mode = "agentic", which needs a provider that can use '
                                'tools (anthropic or openai); the local judge supports mode = "direct" only')
            replicates = args.replicates or start_settings.replicates
            run = ledger.create_run(
                strategy=strategy_name, policy=loop_cfg.policy, split=split.name,
                split_fingerprint=split.fingerprint, start_rev=start_rev,
                budgets=limits.as_dict() | {"replicates": replicates}
                | ({"manual_edit": str(manual_dir.relative_to(ws.root))} if manual_dir else {}),
                config=cfg.model_dump(mode="json") | {"judge": judge.model_dump(mode="json")},
            )
            gitops.create_run_branch(ws.root, run.id, start_rev)
            ledger.set_labels(run.id, load_labels(split))  # for the TUI and the report, never for a judge
            spent = 0.0
            say(f"run {run.id}: branch {run.branch}, split {split.name} ({len(split.ids)} items), "
                f"strategy {strategy_name}, policy {loop_cfg.policy}, judge {judge.provider}:{judge.model}")
            if judge.provider == "local":
                say("  note: the local SmolLM2-135M judge is a demonstration-quality judge (text only, 8k context); "
                    "its verdicts show the mechanics, not a useful judge")
        if strategy_name == "manual":
            strategy: Any = ManualStrategy(ws.root / str(run.budgets.get("manual_edit", "")))
        else:
            strategy = make_strategy(strategy_name, cfg.optimizer, cfg.prices)
        labels = load_labels(split)
        runner = LoopRunner(ws=ws, ledger=ledger, run=run, split=split, labels=labels, judge=judge,
                            loop_cfg=loop_cfg, strategy=strategy, limits=limits, replicates=replicates,
                            spent_usd=spent)
        try:
            reason = asyncio.run(_drive(runner))
        except (KeyboardInterrupt, asyncio.CancelledError):
            ledger.set_run_status(run.id, "stopped", stop_reason="aborted by a second Ctrl-C")
            say(f"run {run.id} aborted; `judgeloop run --resume` continues it")
            return 130
        except UserError as exc:
            ledger.set_run_status(run.id, "crashed", stop_reason=str(exc))
            raise
        except BaseException as exc:
            ledger.set_run_status(run.id, "crashed", stop_reason=f"{type(exc).__name__}: {exc}")
            raise
        status = "waiting" if reason.startswith("propose-only: candidate waiting") else (
            "stopped" if reason.startswith(("interrupted", "stop file")) else "finished")
        ledger.set_run_status(run.id, status, stop_reason=reason)
        if ws.stop_path.exists() and reason.startswith("stop file"):
            ws.stop_path.unlink()
        _summary(ledger, run.id, reason)
        if strategy_name == "manual":
            _manual_outcome(ledger, run.id, str(run.budgets.get("manual_edit", "")))
        out = ws.experiments_dir / "runs" / run.id
        write_markdown_report(ledger, run.id, out / "report.md", ws)
        export_experiments_tsv(ledger, run.id, out / "experiments.tsv")
        say(f"  wrote {(out / 'report.md').relative_to(ws.root)} and experiments.tsv")
        return 0
    finally:
        ledger.close()


def _manual_outcome(ledger: Ledger, run_id: str, saved: str) -> None:
    """Tell the person where their hand edit went."""
    cand = next((e for e in ledger.experiments(run_id) if e.seq == 1), None)
    if cand is None:
        return
    if cand.status == "kept":
        say(f"  your edit was kept: it is the tip of the run branch (experiment {cand.id})")
    elif cand.status == "waiting":
        say(f"  your edit waits for you: `judgeloop decide {cand.id} keep|discard`")
    else:
        back = (f"`git checkout refs/judgeloop/rejected/{cand.id} -- prompts/` or copy it from {saved}"
                if cand.status == "rolled_back" else f"copy it from {saved}")
        say(f"  your edit was not kept ({cand.status.replace('_', ' ')}); to work on it again: {back}")


def _pid() -> int:
    import os

    return os.getpid()


def _resumed_judge(run: Run, judge: JudgeSection, args: argparse.Namespace) -> JudgeSection:
    """The judge the run started with: a resumed run must not silently switch judges mid-comparison."""
    stored = run.config.get("judge")
    if not stored:
        return judge
    original = JudgeSection.model_validate(stored)
    for flag, field_name in (("provider", "provider"), ("model", "model"), ("base_url", "base_url")):
        asked = getattr(args, flag, None)
        if asked is not None and asked != getattr(original, field_name):
            raise UserError(f"run {run.id} judges with {field_name} {getattr(original, field_name)!r}; "
                            f"--{flag.replace('_', '-')} {asked!r} would compare different judges — start a new run")
    if getattr(args, "concurrency", None):
        original = original.model_copy(update={"max_concurrency": args.concurrency})
    return original


def _record_spend_before_crash(ledger: Ledger, ws: Workspace, run_id: str) -> None:
    """Add to the interrupted experiment's row what its judge calls cost before a crash.

    The experiment is the one the run's last stage event started evaluating; every call stored in
    the cache since that moment is its (a call made meanwhile by another process sharing the cache
    is counted too: the budget errs on the safe side).
    """
    stage = ledger.last_event(run_id, "stage")
    if stage is None or stage.payload.get("stage") not in ("baseline", "evaluating"):
        return
    started_at = stage.payload.get("started_at")
    exp = next((e for e in ledger.experiments_with_status("running", run_id) if e.id == stage.experiment_id), None)
    if exp is None or started_at is None or not ws.cache_path.exists():
        return
    with JudgeCache(ws.cache_path) as cache:
        paid = cache.cost_since(float(started_at))
    if paid > 0:
        ledger.finish_experiment(
            exp.id, status="running", decision=exp.decision, reason=exp.reason, finished=False,
            calls=exp.calls, input_tokens=exp.input_tokens, output_tokens=exp.output_tokens,
            cost_usd=exp.cost_usd + paid,
        )
    # Counted once: a crash before the resumed evaluation starts must not count this window again.
    ledger.add_event(run_id, "stage", {"stage": "resuming", "paid_before_crash_usd": round(paid, 6)},
                     experiment_id=exp.id)


def _last_reported_spend(ledger: Ledger, run_id: str) -> float:
    """The running total of the run's last progress event (0 when there is none)."""
    event = ledger.last_event(run_id, "progress")
    return float(event.payload.get("cost_usd", 0.0)) if event else 0.0


def _resumable_run(ledger: Ledger) -> Run:
    for run in ledger.runs():
        if run.status == "finished":
            continue
        if run.status == "waiting":
            waiting = ledger.experiments_with_status("waiting", run.id)
            if waiting:
                raise UserError(f"run {run.id} has experiment {waiting[0].id} waiting; "
                                f"`judgeloop decide {waiting[0].id} keep|discard` first")
        return run
    raise UserError("no unfinished run to resume; start one with `judgeloop run`")


def _summary(ledger: Ledger, run_id: str, reason: str) -> None:
    run = ledger.get_run(run_id)
    exps = ledger.experiments(run_id)
    kept = [e for e in exps if e.status == "kept"]
    base = next((e for e in exps if e.seq == 0), None)
    inc = ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
    cost = sum(e.cost_usd for e in exps)
    say(f"run {run_id} {run.status}: {reason}")
    say(f"  {len(exps) - 1} candidate(s): {len(kept)} kept, "
        f"{sum(e.status == 'rolled_back' for e in exps)} rolled back, "
        f"{sum(e.status == 'guard_rejected' for e in exps)} guard-rejected, "
        f"{sum(e.status == 'error' for e in exps)} error(s); spent ${cost:.4f}")
    if base and inc:
        say(f"  kappa {_f(base.kappa)} → {_f(inc.kappa)}, FPR {_f(base.fpr)} → {_f(inc.fpr)} "
            f"(incumbent: experiment {inc.id}, {(inc.commit_sha or '')[:12]})")
    say(f"  audit: `judgeloop report --run {run_id}`, `git log {run.branch}`, `judgeloop tui`")


@_holding_loop_lock("decide")
def cmd_decide(args: argparse.Namespace) -> int:
    ws = Workspace.open(args.workspace)
    ledger = Ledger(ws.ledger_path)
    try:
        try:
            exp = ledger.get_experiment(int(args.experiment))
        except ValueError:
            raise UserError(f"experiment ids are numbers (got {args.experiment!r}); see `judgeloop history`") from None
        if exp.status != "waiting":
            raise UserError(f"experiment {exp.id} is {exp.status}, not waiting for a decision")
        run = ledger.get_run(exp.run_id)
        gitops.checkout_branch(ws.root, run.branch)
        tip = gitops.rev_parse(ws.root, "HEAD")
        if exp.commit_sha != tip:
            raise UserError(f"the tip of {run.branch} is not experiment {exp.id}'s commit; "
                            "the branch was changed by hand — reset it and retry")
        metrics = exp.metrics_model()
        policy_said = exp.reason or ""
        if args.decision == "keep":
            parent = ledger.get_experiment(exp.parent_id) if exp.parent_id else None
            if parent and exp.fpr is not None and parent.fpr is not None and exp.fpr > parent.fpr:
                say(f"warning: keeping a candidate that raised FPR {parent.fpr:.3f} → {exp.fpr:.3f} (a human override)")
            sha = gitops.finalize_kept(ws.root, tip, _trailers(exp.id, metrics, "kept"))
            ledger.set_experiment_decision(exp.id, status="kept", commit_sha=sha,
                                           reason=f"kept by a human ({policy_said})")
            say(f"experiment {exp.id} kept as {sha[:12]} on {run.branch}")
        else:
            parent = ledger.get_experiment(exp.parent_id) if exp.parent_id else None
            incumbent_sha = parent.commit_sha if parent and parent.commit_sha else gitops.rev_parse(ws.root, "HEAD~1")
            rejected = gitops.roll_back(ws.root, tip, exp.id, incumbent_sha, _trailers(exp.id, metrics, "rolled_back"))
            ledger.set_experiment_decision(exp.id, status="rolled_back", commit_sha=rejected,
                                           reason=f"discarded by a human ({policy_said})")
            say(f"experiment {exp.id} discarded; kept under refs/judgeloop/rejected/{exp.id}")
        ledger.set_run_status(run.id, "stopped", stop_reason="propose-only candidate decided by a human")
        say("next candidate: `judgeloop run --resume --propose-only`")
        return 0
    finally:
        ledger.close()


@_holding_loop_lock("confirm")
def cmd_confirm(args: argparse.Namespace) -> int:
    """Evaluate a run's final prompts once on a held-out split; each use is recorded and capped."""
    ws = Workspace.open(args.workspace)
    cfg = ws.config
    judge = judge_with_overrides(cfg.judge, args)
    ledger = Ledger(ws.ledger_path)
    try:
        run = ledger.resolve_run(args.run)
        if args.split == run.split or args.split == cfg.workspace.dev_split:
            raise UserError(f"{args.split!r} is the dev split; confirm evaluates a held-out split "
                            "(list it under [workspace] heldout_splits)")
        if args.split not in cfg.workspace.heldout_splits:
            raise UserError(f"split {args.split!r} is not listed in [workspace] heldout_splits; add it there "
                            "so the loop can never use it, then retry")
        used = ledger.count_confirmations(args.split)
        if used >= cfg.confirm.max_uses:
            raise UserError(f"split {args.split!r} was already used {used} time(s) ([confirm] max_uses = "
                            f"{cfg.confirm.max_uses}); every look at a held-out split spends its honesty")
        if run.incumbent_experiment is None:
            raise UserError(f"run {run.id} has no incumbent yet; let it finish its baseline first")
        inc = ledger.get_experiment(run.incumbent_experiment)
        split = open_split(ws, args.split)
        prompts = PromptSet.from_rev(ws, inc.commit_sha or run.start_rev)
        labels = load_labels(split)
        say(f"confirming run {run.id}'s final prompts (experiment {inc.id}, {(inc.commit_sha or '')[:12]}) "
            f"on held-out split {split.name} ({len(split.ids)} items); use {used + 1} of {cfg.confirm.max_uses}")
        result = asyncio.run(evaluate_items(ws, split, prompts, judge, item_ids=split.ids,
                                            replicates=prompts.settings.replicates))
        if result.infra_error_ids:
            raise UserError(f"{len(result.infra_error_ids)} item(s) hit infrastructure errors; nothing recorded, "
                            "the use is not counted — retry when the provider is healthy")
        metrics = score(labels, result.answers())
        ledger.add_confirmation(split.name, inc.commit_sha or run.start_rev, metrics, run_id=run.id)
        from optimizer.evaluation.evaluator import format_metrics

        print(format_metrics(metrics))
        return 0
    finally:
        ledger.close()


