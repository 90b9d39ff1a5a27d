"""The agentic judge's conversation with one item: turns replayed from the judge-call cache while
they can be, then paid turns, each checked against the budget first and cached as soon as it is
answered. On a cold cached opening (trajectory-first layouts) one conversation goes first and the
others wait without holding a call slot (`optimizer.evaluation.warmup`).

`Conversations` works for an `optimizer.evaluation.judging.ItemJudge` (the `CallHost` below): its
provider, cache, call slots, budget and stop switch. Judge-input side: never reads labels.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any, Protocol

from optimizer.devset.split import Split
from optimizer.evaluation.budget import Budget, estimate_turn_cost_usd
from optimizer.evaluation.cache import JudgeCache, cache_key, cached_usage
from optimizer.evaluation.results import ReplicateResult, parsed_result
from optimizer.evaluation.stopping import Stopped
from optimizer.evaluation.warmup import PrefixWarmth
from optimizer.judge.agentic import AGENTIC_VERSION, AgenticTask, ConversationState
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import (
    AssistantTurn,
    InfrastructureError,
    Provider,
    ProviderReply,
    Sampling,
    TextPart,
    converses,
    stable_json,
)


class CallHost(Protocol):
    """What a conversation uses of the judge it works for (`ItemJudge`): the provider and its
    endpoint key, the cache, the call slots, the budget (US dollars) and the stop switch."""

    split: Split
    prompts: PromptSet
    provider: Provider
    cache: JudgeCache
    endpoint: str | None
    sampling: Sampling
    prices: dict[str, Any]
    budget: Budget | None
    image_cache_dir: Path | None
    semaphore: asyncio.Semaphore
    warmth: PrefixWarmth
    stop_reason: str | None

    def reserve(self, estimate: float, basis: str = "") -> float: ...

    def account(
        self,
        reply: ProviderReply,
        text: str,
        estimate: float,
        key: str,
        index: int,
        fingerprint: str,
        duration: float,
        *,
        batch: bool = False,
    ) -> Usage: ...


def cached_turn(text: str) -> AssistantTurn | None:
    """A cached agentic turn, or None when the stored text is not one (then it is asked again)."""
    try:
        return AssistantTurn.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None


class Conversations:
    """The agentic verdicts of the items ``judge`` judges (one conversation per replicate)."""

    def __init__(self, judge: CallHost) -> None:
        self.judge = judge

    def task(self, tid: str) -> AgenticTask:
        """Item ``tid``'s conversation task (loaded; rendered as the agentic judge reads it)."""
        judge = self.judge
        return AgenticTask(
            judge.split.trajectory(tid), judge.split, judge.prompts, image_cache_dir=judge.image_cache_dir
        )

    async def converse(self, task: AgenticTask, index: int) -> ReplicateResult:
        """One agentic verdict (replicate ``index``): turns replayed from the cache while they can be,
        then paid turns, each checked against the budget first. The caller holds a semaphore slot
        for the whole conversation; it is released here, whatever happens."""
        judge = self.judge
        state = ConversationState(task)
        started = time.monotonic()
        usage = Usage()
        all_cached = True
        key = ""
        model = judge.provider.model
        final: str | None = None
        holding = True
        try:
            while final is None and state.turns < task.max_turns:
                key = cache_key(
                    provider=judge.provider.name,
                    model=judge.provider.model,
                    sampling=judge.sampling,
                    schema={"agentic": AGENTIC_VERSION},
                    request=state.key_material(),
                    replicate=index,
                    endpoint=judge.endpoint,
                )
                hit = judge.cache.get(key)
                turn = cached_turn(hit.reply_text) if hit is not None else None
                if hit is not None and turn is not None:
                    turn_usage, model = cached_usage(hit), hit.reply_model
                else:
                    all_cached = False
                    # The opening turn writes the item's cached prefix: on a cold one, one
                    # conversation goes first and the others wait without holding a slot.
                    prefix = self.opening_prefix_key(task) if state.turns == 0 else None
                    lead = prefix is not None and judge.warmth.try_lead(prefix)
                    if prefix is not None and not lead and not judge.warmth.is_warm(prefix):
                        judge.semaphore.release()
                        holding = False
                        lead = await judge.warmth.wait_turn(prefix)
                        await judge.semaphore.acquire()
                        holding = True
                    answered = False
                    try:
                        outcome = await self._paid_turn(task, state, key, index)
                        answered = not isinstance(outcome, str)
                    finally:
                        if lead and prefix is not None:
                            judge.warmth.done(prefix, answered=answered, ttl=task.cache_ttl)
                    if isinstance(outcome, str):  # an infrastructure error after every retry
                        return ReplicateResult(
                            index=index,
                            cache_key=key,
                            cached=False,
                            reply_text=None,
                            verdict=None,
                            parse_error=None,
                            model=model,
                            usage=usage,
                            duration_s=time.monotonic() - started,
                            infra_error=outcome,
                            trace=tuple(state.trace),
                            turns=state.turns,
                        )
                    turn, turn_usage, model = outcome
                usage += turn_usage
                final = await asyncio.to_thread(state.step, turn)
        finally:
            if holding:
                judge.semaphore.release()
        duration = time.monotonic() - started
        if final is None:
            last = next((m for m in reversed(state.messages) if isinstance(m, AssistantTurn)), None)
            return ReplicateResult(
                index=index,
                cache_key=key,
                cached=all_cached,
                reply_text=last.text if last else "",
                verdict=None,
                parse_error=f"no verdict after {task.max_turns} model calls (agent_max_turns)",
                model=model,
                usage=usage,
                duration_s=duration,
                trace=tuple(state.trace),
                turns=state.turns,
            )
        result = parsed_result(index, key, all_cached, final, model, usage, duration)
        return dataclasses.replace(result, trace=tuple(state.trace), turns=state.turns)

    def opening_prefix_key(self, task: AgenticTask) -> str | None:
        """The key of a trajectory-first conversation's cached opening (tools, system, the
        trajectory index), or None when the provider caches no prefix or the layout has none."""
        judge = self.judge
        if not judge.provider.traits.prompt_cache or not task.trajectory_first:
            return None
        opening = task.opening_message.parts[0]
        material = stable_json(
            [
                judge.provider.name,
                judge.endpoint,
                judge.provider.model,
                task.system,
                [[t.name, t.description, t.parameters] for t in task.tools],
                opening.text if isinstance(opening, TextPart) else "",
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()

    async def _paid_turn(
        self, task: AgenticTask, state: ConversationState, key: str, index: int
    ) -> tuple[AssistantTurn, Usage, str] | str:
        """One paid model turn of a conversation, cached as soon as it is answered; an
        infrastructure error's message instead when the transport failed after every retry."""
        judge = self.judge
        if judge.stop_reason is not None:
            raise Stopped
        estimate = 0.0
        reserved = False
        if judge.budget is not None:
            ttl = task.cache_ttl if task.trajectory_first else None
            estimate = judge.reserve(
                estimate_turn_cost_usd(
                    task.estimate_input_tokens(state), judge.sampling, judge.provider.model, judge.prices, ttl
                )
            )
            reserved = True
        t0 = time.monotonic()
        try:
            messages = await asyncio.to_thread(state.wire_messages)
            provider = judge.provider
            assert converses(provider)  # evaluate_items refuses the agentic mode without tool use
            turn, reply = await provider.converse(task.system, messages, state.offered, judge.sampling)
        except BaseException as exc:
            if reserved and judge.budget is not None:
                judge.budget.release(estimate)
            if not isinstance(exc, InfrastructureError):
                raise
            return str(exc) or type(exc).__name__
        usage = judge.account(
            reply, turn.to_json(), estimate, key, index, task.fingerprint, time.monotonic() - t0
        )
        return turn, usage, reply.model
