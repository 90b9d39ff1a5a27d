"""A wave of candidates (``[loop] wave`` > 1): proposed on one incumbent, judged together item by item,
decided together (`optimizer.stats.decision.decide_wave`, Holm over the wave's size) and settled one by one
(`optimizer.loop.settle.settle`, rolled back first, kept last). `check_wave` refuses, in one line, what a
wave cannot be run with; `interrupted_wave` finds the members a crash or a stop cut short."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from optimizer.errors import UserError
from optimizer.evaluation.batch import WaveBatches
from optimizer.evaluation.cache import JudgeCache
from optimizer.events import CandidateDecided
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import Usage
from optimizer.judge.types import Provider, batches
from optimizer.ledger import Experiment
from optimizer.ledger.waves import next_wave_number
from optimizer.loop.context import RunContext
from optimizer.loop.evaluate import EvalOptions, evaluate
from optimizer.loop.progress import WaveProgress
from optimizer.loop.propose import WaveSlot, committed_prompts, prepare, proposal_context
from optimizer.loop.records import Evaluated, EvaluationInterrupted, Prepared, Rejected
from optimizer.loop.settle import settle
from optimizer.loop.strategies import Proposal, ProposalError, Strategy, proposes_waves
from optimizer.stats.decision import decide_wave
from optimizer.stats.policies import policy_for
from optimizer.vocab import StageKind
from optimizer.workspace import gitops
from optimizer.workspace.config import LoopSection


def check_wave(loop: LoopSection, *, strategy: str, propose_only: bool) -> None:
    """Refuse, in one line, what a wave of several candidates (``[loop] wave`` > 1) cannot be run with."""
    if loop.wave == 1:
        return
    what = f"a wave of {loop.wave} candidates ([loop] wave / --wave)"
    if strategy == "manual":
        raise UserError(
            f"{what} needs a strategy that proposes; --strategy manual judges one hand edit: drop --wave"
        )
    if strategy == "mcp":
        raise UserError(
            f"{what}: an MCP client submits one candidate at a time; set [loop] wave = 1 in judgeloop.toml"
        )
    if propose_only:
        raise UserError(
            f"{what} is decided by Holm over its candidates, not by a person: drop --propose-only or "
            "use --wave 1"
        )
    if not policy_for(loop).tests_at_alpha:
        raise UserError(
            f"{what} is decided by Holm over the candidates' p-values; the {loop.policy} policy runs no "
            "test: use --policy adaptive or paired, or --wave 1"
        )
    if loop.fdr is not None:
        raise UserError(
            f"{what} keeps its false-keep bound with Holm at [loop] alpha; [loop] fdr (LORD++) levels "
            "are per candidate: remove fdr from judgeloop.toml or use --wave 1"
        )
    if loop.cheaper_margin_items > 0:
        raise UserError(
            f"{what} decides improvements only; cheaper-not-worse keeps ([loop] cheaper_margin_items) "
            "are decided one candidate at a time: set cheaper_margin_items = 0 or use --wave 1"
        )


async def run_wave(
    ctx: RunContext,
    strategy: Strategy,
    incumbent: Experiment,
    provider: Provider,
    cache: JudgeCache,
    room: int | None,
) -> list[Experiment]:
    """One round of ``[loop] wave`` candidates against ``incumbent`` (fewer when ``room``, the
    candidates ``--max-experiments`` leaves, is smaller, or the strategy runs out): each proposed
    on the incumbent with the wave's earlier ones in its history, guarded and committed on the
    incumbent (parked under ``refs/judgeloop/wave/``), then judged together and decided together
    (`decide_wave`). Holm's family is the wave's size, whatever number got to be tested; the
    meta's ``number`` counts the run's waves (`optimizer.ledger.waves`, so a resume goes on)."""
    k = ctx.settings.loop.wave
    incumbent_sha = incumbent.commit_sha or gitops.rev_parse(ctx.root, "HEAD")
    meta: dict[str, Any] = {
        "size": k,
        "alpha": ctx.test_level(),
        "incumbent": incumbent.id,
        "number": next_wave_number(ctx.ledger.experiments(ctx.run.id)),
    }
    slot = WaveSlot(meta)
    ended: list[Experiment] = []
    parked: list[Prepared] = []
    n = k if room is None else max(1, min(k, room))
    ctx.say(f"wave of {k}: proposing {n} candidate(s) against experiment {incumbent.id}")
    given: list[Proposal | ProposalError] | None = None
    if proposes_waves(strategy):  # the whole wave in one conversation
        seq = max(e.seq for e in ctx.ledger.experiments(ctx.run.id)) + 1
        ctx.stage(StageKind.PROPOSING, None, seq=seq, strategy=strategy.name)
        ctx.say(f"  asking the {strategy.name} optimiser for {n} edits in one conversation")
        given = await strategy.propose_wave(proposal_context(ctx, incumbent, seq), n)
        given = (given + [ProposalError("the optimiser proposed fewer candidates than the wave holds")] * n)[
            :n
        ]
    for i in range(n):
        # (Proposals already made and paid for are committed; the stop comes before their judging.)
        if given is None and (ctx.interrupted or ctx.budget_exhausted is not None):
            break
        prepared = await prepare(
            ctx, strategy, incumbent, provider, wave=slot, given=None if given is None else given[i]
        )
        if isinstance(prepared, Rejected):
            ended.append(prepared.experiment)
            continue
        gitops.park_candidate(ctx.root, prepared.commit_sha, prepared.experiment_id, incumbent_sha)
        parked.append(prepared)
    return ended + await decide_wave_members(ctx, parked, incumbent, provider, cache, family=k)


async def decide_wave_members(
    ctx: RunContext,
    members: list[Prepared],
    incumbent: Experiment,
    provider: Provider,
    cache: JudgeCache,
    *,
    family: int,
) -> list[Experiment]:
    """Judge a wave's parked candidates item by item together — each candidate's evaluation runs at
    once, in the same order, on a share of the run's concurrency, so an item's calls for every
    candidate go out together and one cached prefix serves them — then decide them with
    `optimizer.stats.decision.decide_wave` and settle git: every candidate not kept is rolled back
    (``refs/judgeloop/rejected/<id>``), the kept one (at most one) finalised as the branch's tip."""
    incumbent_sha = incumbent.commit_sha or gitops.rev_parse(ctx.root, "HEAD")
    out: list[Experiment] = []
    ready: list[tuple[Prepared, PromptSet]] = []
    for member in members:
        exp_id, sha = member.experiment_id, member.commit_sha
        prompts, invalid = committed_prompts(ctx, sha, provider)
        if invalid is not None or prompts is None:
            reason = f"cannot be evaluated: {invalid}; rolled back"
            gitops.store_rejected(ctx.root, sha, exp_id)
            gitops.unpark(ctx.root, exp_id)
            ctx.events(CandidateDecided(exp_id, "error", reason))
            out.append(
                ctx.ledger.record_error(exp_id, reason, cost_usd=member.optimiser_cost_usd, commit_sha=sha)
            )
            continue
        ready.append((member, prompts))
    if not ready:
        return out
    for member, _ in ready:
        ctx.stage(StageKind.EVALUATING, member.experiment_id, started_at=time.time())
    ids = ", ".join(str(m.experiment_id) for m, _ in ready)
    ctx.say(
        f"  wave: evaluating experiments {ids} item by item together (negatives first), "
        + (
            "one batch per wave pass (batch mode: early stopping does not apply)"
            if ctx.settings.batch
            else "each stopping as soon as its outcome at the wave's level is certain"
        )
    )
    results = await _judge_together(
        ctx,
        ready,
        incumbent,
        provider,
        cache,
        look_seed=ctx.decision_seed(min(m.experiment_id for m in members)),
    )
    evaluated = [r for r in results if isinstance(r, Evaluated)]
    decisions = decide_wave(
        [ev.decision for ev in evaluated],
        ctx.test_level(),
        family,
        [f"experiment {m.experiment_id}" for m, _ in ready],
    )
    # Roll back first, keep last: the branch ends at the kept candidate, or at the incumbent.
    order = sorted(range(len(ready)), key=lambda i: bool(decisions[i] and decisions[i].keep))  # type: ignore[union-attr]
    for i in order:
        member, prompts = ready[i]
        ev = dataclasses.replace(evaluated[i], decision=decisions[i])
        gitops.check_out_parked(ctx.root, member.commit_sha)
        out.append(settle(ctx, member, prompts, ev, incumbent_sha))
        gitops.unpark(ctx.root, member.experiment_id)
    return out


async def _judge_together(
    ctx: RunContext,
    ready: list[tuple[Prepared, PromptSet]],
    incumbent: Experiment,
    provider: Provider,
    cache: JudgeCache,
    *,
    look_seed: int,
) -> list[Evaluated]:
    """Every ready member's evaluation at once on a share of the run's concurrency; a member cut by the
    stop request has its calls so far put on its row and `EvaluationInterrupted` is raised for the wave.
    ``look_seed``: futility's looks in one order for every member (the same incumbent, one seed: the wave's
    first id, the same on resume), so an item's calls still go out together and share its cached prefix."""
    settings = ctx.settings
    judge = settings.judge.model_copy(
        update={"max_concurrency": max(1, settings.judge.max_concurrency // len(ready))}
    )
    # --batch: the candidates' passes go out as one batch per wave pass (`WaveBatches`).
    shared = WaveBatches(provider, len(ready)) if settings.batch and batches(provider) else None
    options = EvalOptions(judge=judge, look_seed=look_seed, propose_only=settings.limits.propose_only)

    async def member(exp_id: int, prompts: PromptSet) -> Evaluated:
        try:
            return await evaluate(ctx, exp_id, prompts, incumbent, shared or provider, cache, options)
        finally:
            if shared is not None:
                shared.leave()

    ctx.wave_line = WaveProgress([m.experiment_id for m, _ in ready], len(ctx.split.ids), ctx.events)
    try:
        results = await asyncio.gather(
            *(member(m.experiment_id, prompts) for m, prompts in ready), return_exceptions=True
        )
    finally:
        ctx.wave_line = None
    if shared is not None:
        ctx.say(f"  wave: {shared.submitted} batch(es) for its {len(ready)} candidates")
    failed = [r for r in results if isinstance(r, BaseException) and not isinstance(r, EvaluationInterrupted)]
    if failed:
        raise failed[0]
    if any(isinstance(r, EvaluationInterrupted) for r in results):
        # Each member's calls so far go on its row now, counted once (`resuming`), as for one
        # candidate; the wave stays running and parked, and `--resume` decides it from the cache.
        first: EvaluationInterrupted | None = None
        for (m, _), r in zip(ready, results, strict=True):
            paid = (
                r.cost_usd
                if isinstance(r, EvaluationInterrupted)
                else (r.usage.cost_usd if isinstance(r, Evaluated) else 0.0)
            )
            if first is None and isinstance(r, EvaluationInterrupted):
                first = r
                continue
            if paid > 0:
                ctx.ledger.add_cost(m.experiment_id, Usage(cost_usd=paid))
            ctx.stage(StageKind.RESUMING, m.experiment_id, paid_before_crash_usd=round(paid, 6))
        assert first is not None
        raise first
    return [r for r in results if isinstance(r, Evaluated)]


def interrupted_wave(ctx: RunContext, incumbent: Experiment | None) -> list[Prepared]:
    """The candidates of a wave a crash or a stop cut short: running rows of a wave on the incumbent
    with a commit, each parked (one left at the tip, committed but not parked yet, is parked now).
    A parked candidate of another incumbent cannot be decided any more: rolled back."""
    parked = gitops.parked_candidates(ctx.root)
    members: list[Prepared] = []
    tip = gitops.rev_parse(ctx.root, "HEAD")
    for exp in ctx.ledger.experiments_with_status("running", ctx.run.id):
        if exp.seq == 0 or not exp.commit_sha or "wave" not in exp.proposal_meta:
            continue
        if incumbent is None or exp.parent_id != incumbent.id or not incumbent.commit_sha:
            gitops.store_rejected(ctx.root, exp.commit_sha, exp.id)
            if exp.id in parked:
                gitops.unpark(ctx.root, exp.id)
            ctx.ledger.record_error(exp.id, "a wave candidate of an earlier incumbent; rolled back on resume")
            continue
        if exp.id not in parked:
            if exp.commit_sha != tip:
                continue  # never parked nor at the tip: the one-candidate path rolls it back
            gitops.park_candidate(ctx.root, exp.commit_sha, exp.id, incumbent.commit_sha)
            tip = incumbent.commit_sha
        members.append(Prepared(exp.id, exp.commit_sha, exp.cost_usd))
    return members
