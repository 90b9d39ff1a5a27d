"""The auto-research loop: propose → guard → commit → evaluate (dev split only) → decide → keep or roll back.

Everything the loop does is recorded in the ledger as it happens (one transaction per state change),
so a crash or ``kill -9`` leaves a consistent ledger, and ``judgeloop run --resume`` restores the
tree to the incumbent (or to the interrupted candidate's commit) and continues; every judge call
already paid for comes back from the cache.

A candidate goes through its rooms, each a module with a typed record in and out:
`optimizer.loop.propose` (→ `Rejected` | `Prepared`), `optimizer.loop.evaluate` (→ `Evaluated`),
`optimizer.loop.settle` (→ the decided `Experiment`); `optimizer.loop.waves` runs a wave of them and
`optimizer.loop.costs` holds the cost rules. `LoopRunner` only loops (stop reasons, patience, the budget,
waves or single candidates, a resume) and is the engine's public face for one run: `baseline`,
`candidate` (with per-call `Limits`), `evaluate_candidate`, `record_spend` — what `judgeloop run`
(`optimizer.loop.session`) and `judgeloop mcp` (`optimizer.mcp.session`) call. It tells the person
following it what happens through its context's ``events`` listener.
"""

from __future__ import annotations

import time

from optimizer.errors import UserError
from optimizer.evaluation.cache import JudgeCache
from optimizer.events import Message, StopKind, StopReason
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import Usage, make_provider
from optimizer.judge.types import Provider
from optimizer.ledger import Experiment, ProposedEdit
from optimizer.loop.context import RunContext
from optimizer.loop.costs import cheaper_eligible
from optimizer.loop.evaluate import EvalOptions, evaluate
from optimizer.loop.propose import committed_prompts, prepare
from optimizer.loop.records import EvaluationInterrupted, Prepared, Rejected, fmt3
from optimizer.loop.settle import record_evaluation, roll_back_unevaluable, settle
from optimizer.loop.stack import merged_candidate, pool_target
from optimizer.loop.strategies import Strategy
from optimizer.loop.waves import decide_wave_members, interrupted_wave, run_wave
from optimizer.runsettings import Limits
from optimizer.stats.policies import policy_for
from optimizer.vocab import StageKind
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace


class LoopRunner:
    """One run's loop over its `RunContext` with ``strategy`` proposing (see the module docstring)."""

    def __init__(self, ctx: RunContext, strategy: Strategy) -> None:
        self.ctx = ctx
        self.strategy = strategy

    @property
    def ws(self) -> Workspace:
        return self.ctx.ws

    # -- the engine's public face ----------------------------------------------------------------

    def record_spend(self, cost_usd: float) -> None:
        """Count judge spending made outside the loop's evaluations (US dollars; `judgeloop mcp`'s
        ``attribute``, paid from the run's budget, which reserved it already) in the run's spend."""
        self.ctx.count_judged(cost_usd)

    async def baseline(
        self, provider: Provider, cache: JudgeCache, existing: Experiment | None = None
    ) -> Experiment:
        """Evaluate the prompts the run started from (``existing``: a resumed baseline's row) as experiment 0."""
        ctx = self.ctx
        sha = gitops.rev_parse(ctx.root, "HEAD")
        prompts = PromptSet.from_rev(ctx.ws, sha)
        exp = existing or ctx.ledger.start_experiment(
            ctx.run.id,
            parent_id=None,
            strategy="baseline",
            seq=0,
            commit_sha=sha,
            edit=ProposedEdit(
                rationale="the prompts the run started from", prompt_hash=prompts.prompt_hash()
            ),
        )
        ctx.stage(StageKind.BASELINE, exp.id, started_at=time.time())
        ctx.say(
            f"experiment {exp.id} (baseline): evaluating {len(ctx.split.ids)} items × "
            f"{ctx.settings.replicates} replicate(s)"
        )
        ev = await evaluate(
            ctx, exp.id, prompts, None, provider, cache, EvalOptions(propose_only=ctx.limits.propose_only)
        )
        # A resumed baseline's row holds what it paid before the crash (calls now served by the cache).
        paid_before = existing.cost_usd if existing else 0.0
        if ev.metrics is None:
            record_evaluation(
                ctx,
                exp.id,
                ev,
                ev.outcome("error", f"baseline incomplete: {ev.error}", extra_cost_usd=paid_before),
            )
            raise UserError(
                f"the baseline evaluation is incomplete ({ev.error}); fix the judge setup and "
                "run `judgeloop run --resume`"
            )
        m = ev.metrics
        reason = f"baseline: kappa {m.kappa:.3f}, FPR {m.fpr:.3f}" if m.kappa is not None else "baseline"
        exp = record_evaluation(ctx, exp.id, ev, ev.outcome("baseline", reason, extra_cost_usd=paid_before))
        ctx.say(
            f"  baseline kappa={fmt3(m.kappa)} FPR={fmt3(m.fpr)} bal.acc={fmt3(m.balanced_accuracy)} "
            f"calls={ev.run.calls_made} cached={ev.run.cache_hits} cost=${ev.run.cost_usd:.4f}"
        )
        return exp

    async def candidate(
        self, incumbent: Experiment, provider: Provider, cache: JudgeCache, *, limits: Limits | None = None
    ) -> Experiment:
        """One candidate on ``incumbent``, proposed, evaluated and settled: its decided row. ``limits``:
        this call's (``propose_only``), else the run's own. With ``[loop] stack`` and a full pool on
        ``incumbent``, the candidate is the pool's merge (`optimizer.loop.stack`), not the strategy's."""
        stacked = merged_candidate(self.ctx, incumbent)
        if stacked is None:
            prepared = await prepare(self.ctx, self.strategy, incumbent, provider)
        else:
            self.ctx.say(
                f"next candidate: the {len(stacked.proposal.meta['stack']['pooled'])} pooled candidates that "
                "pointed the right way, merged onto the incumbent ([loop] stack)"
            )
            prepared = await prepare(self.ctx, stacked, incumbent, provider, given=stacked.proposal)
        if isinstance(prepared, Rejected):
            return prepared.experiment
        return await self.evaluate_candidate(prepared, incumbent, provider, cache, limits=limits)

    async def evaluate_candidate(
        self,
        candidate: Prepared,
        incumbent: Experiment,
        provider: Provider,
        cache: JudgeCache,
        *,
        limits: Limits | None = None,
    ) -> Experiment:
        """Evaluate a committed candidate against ``incumbent`` and settle it (`optimizer.loop.settle`)."""
        ctx = self.ctx
        propose_only = (limits or ctx.limits).propose_only
        exp_id, sha = candidate.experiment_id, candidate.commit_sha
        incumbent_sha = incumbent.commit_sha or gitops.rev_parse(ctx.root, "HEAD~1")
        prompts, invalid = committed_prompts(ctx, sha, provider)
        if invalid is not None or prompts is None:
            return roll_back_unevaluable(ctx, candidate, incumbent_sha, str(invalid))
        ctx.stage(
            StageKind.EVALUATING, exp_id, started_at=time.time()
        )  # wall clock, as the cache's `created`
        if ctx.settings.batch:
            ctx.say(
                f"  experiment {exp_id}: evaluating every item as one batch (batch mode: early stopping "
                "does not apply)"
            )
        elif policy_for(ctx.settings.loop).rejudges:
            ctx.say(
                f"  experiment {exp_id}: evaluating (negatives first), then re-judging the items the prompts "
                "disagree on; stopping as soon as the outcome is certain"
            )
        else:
            ctx.say(
                f"  experiment {exp_id}: evaluating (negatives first, stopping as soon as the outcome is certain)"
            )
        cheaper = cheaper_eligible(ctx, incumbent, prompts, provider, propose_only=propose_only)
        if cheaper:
            ctx.say(
                f"  experiment {exp_id}: estimated at least {ctx.settings.loop.cheaper_min_saving:.0%} cheaper "
                "per verdict: evaluated in full, and kept if it is not worse ([loop] cheaper_margin_items)"
            )
        ev = await evaluate(
            ctx,
            exp_id,
            prompts,
            incumbent,
            provider,
            cache,
            EvalOptions(cheaper=cheaper, propose_only=propose_only),
        )
        pool_on = None if propose_only else pool_target(ctx, exp_id, incumbent)
        return settle(ctx, candidate, prompts, ev, incumbent_sha, propose_only=propose_only, pool_on=pool_on)

    # -- the loop --------------------------------------------------------------------------------

    def stop_reason(self, candidates_done: int, since_keep: int) -> StopReason | None:
        """Why the loop must stop before the next candidate, or None to go on."""
        ctx, limits = self.ctx, self.ctx.limits
        if ctx.interrupted:
            return StopReason(StopKind.INTERRUPTED, f"interrupted ({ctx.stop.reason})")
        if ctx.ws.stop_path.exists():
            return StopReason(
                StopKind.STOP_FILE, f"stop file {ctx.ws.stop_path.relative_to(ctx.root)} present"
            )
        if limits.max_experiments is not None and candidates_done >= limits.max_experiments:
            return StopReason(StopKind.MAX_EXPERIMENTS, f"reached --max-experiments {limits.max_experiments}")
        if limits.hours is not None and time.monotonic() - ctx.started >= limits.hours * 3600:
            return StopReason(StopKind.HOURS, f"reached --hours {limits.hours:g}")
        if limits.budget_usd is not None and ctx.spent_usd >= limits.budget_usd:
            return StopReason(
                StopKind.SPENT, f"spent ${ctx.spent_usd:.4f} of the ${limits.budget_usd:g} budget"
            )
        if ctx.budget_exhausted is not None:
            return StopReason(StopKind.SPENT, ctx.budget_exhausted)
        if since_keep >= limits.patience:
            return StopReason(
                StopKind.PATIENCE,
                f"{since_keep} candidates in a row without a keep (patience {limits.patience})",
            )
        return None

    async def resume_interrupted(self, provider: Provider, cache: JudgeCache) -> None:
        """Bring the tree and the ledger back to a consistent state after a crash."""
        ctx = self.ctx
        run = ctx.ledger.get_run(ctx.run.id)
        incumbent = ctx.ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
        wave = interrupted_wave(ctx, incumbent)
        in_wave = {m.experiment_id for m in wave}
        for exp in ctx.ledger.experiments_with_status("running", ctx.run.id):
            tip = gitops.rev_parse(ctx.root, "HEAD")
            if exp.id in in_wave:
                continue
            if exp.seq == 0:
                gitops.restore_tree(ctx.root, exp.commit_sha or tip)
                ctx.say(
                    f"resuming: re-evaluating the interrupted baseline (experiment {exp.id}) from the cache"
                )
                await self.baseline(provider, cache, existing=exp)
            elif exp.commit_sha and exp.commit_sha == tip and incumbent is not None:
                gitops.restore_tree(ctx.root, tip)
                ctx.say(f"resuming: re-evaluating interrupted candidate {exp.id} ({tip[:12]}) from the cache")
                # The running row holds the optimiser's spend on this candidate; keep it on the record.
                await self.evaluate_candidate(Prepared(exp.id, tip, exp.cost_usd), incumbent, provider, cache)
            else:
                restore_to = incumbent.commit_sha if incumbent and incumbent.commit_sha else tip
                if exp.commit_sha:
                    gitops.store_rejected(ctx.root, exp.commit_sha, exp.id)
                gitops.restore_tree(ctx.root, restore_to)
                ctx.ledger.record_error(exp.id, "interrupted before it was evaluated; rolled back on resume")
        if wave and incumbent is not None:
            size = max(
                int(e.proposal_meta.get("wave", {}).get("size", 1))
                for e in ctx.ledger.experiments(ctx.run.id)
                if e.id in in_wave
            )
            ctx.say(
                f"resuming: re-evaluating the interrupted wave (experiments "
                f"{', '.join(str(m.experiment_id) for m in wave)}) from the cache"
            )
            await decide_wave_members(ctx, wave, incumbent, provider, cache, family=size)
        run = ctx.ledger.get_run(ctx.run.id)
        if run.incumbent_experiment is not None:
            inc = ctx.ledger.get_experiment(run.incumbent_experiment)
            if inc.commit_sha:
                gitops.restore_tree(ctx.root, inc.commit_sha)

    async def loop(self) -> StopReason:
        """Drive the run until a limit, a stop or patience ends it; why it ended."""
        ctx = self.ctx
        provider = make_provider(ctx.settings.judge, root=ctx.root)
        cache = JudgeCache(ctx.ws.cache_path)
        try:
            return await self._loop(provider, cache)
        except EvaluationInterrupted as exc:
            # What the cut evaluation paid goes on the experiment's row now, marked as counted (the
            # `resuming` stage) so that `--resume`, which re-evaluates it from the cache, counts it once.
            if exc.cost_usd > 0:
                ctx.ledger.add_cost(exc.experiment_id, Usage(cost_usd=exc.cost_usd))
            ctx.stage(StageKind.RESUMING, exc.experiment_id, paid_before_crash_usd=round(exc.cost_usd, 6))
            return StopReason(
                StopKind.INTERRUPTED,
                f"interrupted ({ctx.stop.reason}) while evaluating experiment {exc.experiment_id}, after "
                f"{exc.judged}/{exc.total} items; `judgeloop run --resume` finishes it (what was judged is "
                "cached, not paid again)",
            )
        finally:
            await provider.aclose()
            cache.close()

    async def _loop(self, provider: Provider, cache: JudgeCache) -> StopReason:
        ctx = self.ctx
        await self.resume_interrupted(provider, cache)
        run = ctx.ledger.get_run(ctx.run.id)
        if run.incumbent_experiment is None:
            await self.baseline(provider, cache)
        experiments = ctx.ledger.experiments(ctx.run.id)
        done = sum(1 for e in experiments if e.seq > 0)
        since_keep = 0
        for e in reversed(experiments):
            if e.seq == 0 or e.status == "kept":
                break
            since_keep += 1
        k, patience = ctx.settings.loop.wave, ctx.limits.patience
        if k > patience:  # patience counts candidates: one wave without a keep already exceeds it
            ctx.events(
                Message(
                    f"note: patience {patience} is fewer candidates than a wave of {k}: the run stops "
                    f"after the first wave without a keep (--patience {2 * k} allows two)",
                    "note",
                )
            )
        while True:
            reason = self.stop_reason(done, since_keep)
            if reason:
                return reason
            run = ctx.ledger.get_run(ctx.run.id)
            assert run.incumbent_experiment is not None  # the baseline ran above
            incumbent = ctx.ledger.get_experiment(run.incumbent_experiment)
            if k > 1:
                max_experiments = ctx.limits.max_experiments
                room = None if max_experiments is None else max_experiments - done
                wave = await run_wave(ctx, self.strategy, incumbent, provider, cache, room)
                done += len(wave)
                since_keep = 0 if any(e.status == "kept" for e in wave) else since_keep + len(wave)
                continue
            exp = await self.candidate(incumbent, provider, cache)
            done += 1
            since_keep = 0 if exp.status == "kept" else since_keep + 1
            if ctx.limits.propose_only and exp.status == "waiting":
                return StopReason(StopKind.WAITING, "propose-only: candidate waiting for `judgeloop decide`")
            if ctx.limits.propose_only:
                return StopReason(StopKind.PROPOSED, f"propose-only: candidate ended as {exp.status}")
