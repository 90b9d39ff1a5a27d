"""Evaluate a prompt revision on a split: concurrency, the judge-call cache, cost, budgets, result files.

`evaluate_items` is the engine the CLI (`judgeloop eval`) and the loop share. It renders each
trajectory into a request, makes ``replicates`` judge calls per item (each its own cache key), takes
the majority verdict and reports per-item instability. Calls run under an asyncio semaphore of
``judge.max_concurrency``; items start in the order given. A transport failure that survives the
provider's retries marks the item ``infra_error``: reported apart, never cached, re-run next time.
A `Budget` is checked with an estimated cost before every paid call; a call that would cross it is
not made. Cached calls cost nothing and need no budget.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import hashlib
import inspect
import io
import json
import math
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO
from urllib.parse import urlsplit, urlunsplit

from PIL import Image

from optimizer.config import JudgeSection
from optimizer.errors import UserError
from optimizer.evaluation.cache import JudgeCache, cache_key
from optimizer.judge.types import (
    VERDICT_SCHEMA,
    AssistantTurn,
    ImagePart,
    InfrastructureError,
    JudgeRequest,
    JudgeToolCall,
    Provider,
    ProviderReply,
    Sampling,
    TextPart,
    stable_json,
)
from optimizer.metrics import Answer
from optimizer.models import Trajectory, Verdict

# The estimate the budget uses: text tokens ≈ characters / 4; an image ≈ width·height / 750 tokens
# (the Anthropic vision rule, within a few percent of OpenAI's tile rule at 512×332).
CHARS_PER_TOKEN = 4
IMAGE_PIXELS_PER_TOKEN = 750
MIN_IMAGE_TOKENS = 85

# Encoded screenshots shared across processes (see render.build_request's image_cache_dir).
IMAGE_CACHE_DIRNAME = "images"

ParseStatus = Literal["ok", "parse_error", "infra_error"]


# ---------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ReplicateResult:
    """One judge call for one item (replicate ``index``), fresh or from the cache.

    ``cost_usd`` is what the call cost when it was made; a cached replicate cost nothing now.
    """

    index: int
    cache_key: str
    cached: bool
    reply_text: str | None
    verdict: Verdict | None
    parse_error: str | None
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    infra_error: str | None = None
    # Agentic judge: the tool calls of the conversation in order (str() gives "read_steps(0-24)"),
    # and the number of model calls it took (1 for a direct judge).
    trace: tuple[JudgeToolCall, ...] = ()
    turns: int = 1

    @property
    def status(self) -> ParseStatus:
        if self.infra_error is not None:
            return "infra_error"
        return "ok" if self.verdict is not None else "parse_error"

    @property
    def success(self) -> bool | None:
        return None if self.verdict is None else self.verdict.success


@dataclass(frozen=True)
class ItemResult:
    """One evaluated item: its replicates, the majority `Answer` that is scored, and instability.

    ``verdict`` is the replicate verdict that represents the majority (its reasoning is exported);
    None when the majority is a parse failure or the item is an infrastructure error.
    """

    trajectory_id: str
    replicates: list[ReplicateResult]
    answer: Answer
    unstable: bool
    infra_error: bool
    verdict: Verdict | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def cost_usd(self) -> float:
        """What this item's calls cost when they were made (cached or not)."""
        return sum(r.cost_usd for r in self.replicates)

    @property
    def new_cost_usd(self) -> float:
        """What this item's calls cost in this evaluation (cached calls are free)."""
        return sum(r.cost_usd for r in self.replicates if not r.cached and r.infra_error is None)


@dataclass
class EvalRun:
    """Everything one evaluation produced. Tokens and ``cost_usd`` count only calls made now."""

    items: list[ItemResult]
    calls_made: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    stopped_early: bool = False
    stop_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def infra_error_ids(self) -> list[str]:
        return [item.trajectory_id for item in self.items if item.infra_error]

    @property
    def cached_cost_usd(self) -> float:
        """What the cached calls reused here originally cost (money this evaluation did not spend)."""
        return sum(r.cost_usd for item in self.items for r in item.replicates if r.cached)

    def answers(self) -> dict[str, Answer]:
        """The scored answer of every evaluated item (infrastructure errors included, as such)."""
        return {item.trajectory_id: item.answer for item in self.items}


class Budget:
    """A spending cap in US dollars, checked before each paid call with an estimated cost.

    `reserve` holds the estimate while the call is in flight; `settle` replaces it with the actual
    cost; `release` drops it when the call failed. One Budget may span several evaluations.
    """

    def __init__(self, max_usd: float, spent_usd: float = 0.0) -> None:
        self.max_usd = max_usd
        self.spent_usd = spent_usd
        self.reserved_usd = 0.0

    @property
    def remaining_usd(self) -> float:
        return self.max_usd - self.spent_usd - self.reserved_usd

    def reserve(self, estimated_usd: float) -> bool:
        """Hold ``estimated_usd`` if it fits under the cap; False means "do not make this call"."""
        if self.spent_usd + self.reserved_usd + estimated_usd > self.max_usd + 1e-12:
            return False
        self.reserved_usd += estimated_usd
        return True

    def settle(self, estimated_usd: float, actual_usd: float) -> None:
        self.reserved_usd = max(0.0, self.reserved_usd - estimated_usd)
        self.spent_usd += actual_usd

    def release(self, estimated_usd: float) -> None:
        self.reserved_usd = max(0.0, self.reserved_usd - estimated_usd)


# ---------------------------------------------------------------------------------------------------
# Progress


@dataclass(frozen=True)
class ProgressSnapshot:
    done: int
    total: int
    infra_errors: int
    parse_errors: int
    calls_made: int
    cache_hits: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    elapsed_s: float

    def line(self) -> str:
        tokens = self.input_tokens + self.output_tokens
        return (
            f"judge {self.done}/{self.total} items · {self.infra_errors} infra errors · "
            f"{self.parse_errors} parse failures · {self.calls_made} calls + {self.cache_hits} cached · "
            f"{tokens:,} tokens · ${self.cost_usd:.4f} · {self.elapsed_s:.0f}s"
        )


class StderrProgress:
    """A single updating progress line on a terminal; plain lines (about every 10%) otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_plain = -1
        self._open = False

    def __call__(self, snap: ProgressSnapshot) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + snap.line())
            self.stream.flush()
            self._open = True
            return
        step = max(1, snap.total // 10)
        if snap.done == snap.total or snap.done // step != self._last_plain // step or self._last_plain < 0:
            self._last_plain = snap.done
            print(snap.line(), file=self.stream, flush=True)

    def close(self) -> None:
        """End the updating line so later output starts on a fresh line."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


# ---------------------------------------------------------------------------------------------------
# Cost


def call_cost_usd(reply: ProviderReply, prices: dict[str, Any]) -> float:
    """Dollar cost of one reply from its usage fields and the price table (`[prices]` overrides)."""
    from optimizer.judge.providers.pricing import cost_usd

    return cost_usd(reply.model, reply, prices)


def estimate_input_tokens(request: JudgeRequest) -> int:
    """Input tokens of ``request`` as the budget estimates them (text chars/4 + per-image pixels/750)."""
    chars = len(request.system)
    tokens = 0
    for part in request.parts:
        if isinstance(part, TextPart):
            chars += len(part.text)
        else:
            tokens += _image_tokens(part)
    return tokens + math.ceil(chars / CHARS_PER_TOKEN)


def _image_tokens(part: ImagePart) -> int:
    try:
        with Image.open(io.BytesIO(part.data)) as img:  # reads the header only
            width, height = img.size
    except (OSError, ValueError):
        width, height = 512, 332
    return max(MIN_IMAGE_TOKENS, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN))


def estimate_cost_usd(request: JudgeRequest, sampling: Sampling, model: str, prices: dict[str, Any]) -> float:
    """Upper-bound-ish estimate of one call: estimated input tokens + ``sampling.max_tokens`` output."""
    reply = ProviderReply(text="", model=model, input_tokens=estimate_input_tokens(request), output_tokens=sampling.max_tokens)
    return call_cost_usd(reply, prices)


# ---------------------------------------------------------------------------------------------------
# The evaluator


class _BudgetStop(Exception):
    """A paid call would cross the budget; the item is not evaluated and evaluation stops."""


class _Stopped(Exception):
    """Evaluation is stopping; this item makes no new paid call."""


def _majority(replicates: Sequence[ReplicateResult]) -> tuple[Answer, Verdict | None, bool]:
    """The scored answer, its representative verdict, and whether the replicates disagree."""
    from optimizer.judge.verdicts import majority

    chosen, unstable = majority([r.verdict for r in replicates])
    if chosen is None:
        return Answer(success=None, status="invalid"), None, unstable
    return Answer(success=chosen.success, mistake_type=chosen.mistake_type), chosen, unstable


def _parsed_result(
    index: int, key: str, cached: bool, text: str, model: str,
    tokens: tuple[int, int, int, int], cost_usd: float, duration_s: float,
) -> ReplicateResult:
    """A replicate's result from a reply text (fresh or cached): the verdict parsed strictly.

    ``tokens``: input, output, cache-read and cache-write token counts.
    """
    from optimizer.judge.verdicts import parse_verdict

    parsed = parse_verdict(text)
    input_tokens, output_tokens, cache_read, cache_write = tokens
    return ReplicateResult(
        index=index, cache_key=key, cached=cached, reply_text=text, verdict=parsed.verdict,
        parse_error=parsed.error, model=model, input_tokens=input_tokens, output_tokens=output_tokens,
        cache_read_tokens=cache_read, cache_write_tokens=cache_write, cost_usd=cost_usd, duration_s=duration_s,
    )


def _cached_turn(text: str) -> AssistantTurn | None:
    """A cached agentic turn, or None when the stored text is not one (then it is asked again)."""
    try:
        return AssistantTurn.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None


class _Evaluator:
    def __init__(
        self,
        split: Any,
        prompts: Any,
        provider: Provider,
        cache: JudgeCache,
        *,
        sampling: Sampling,
        replicates: int,
        concurrency: int,
        prices: dict[str, Any],
        on_item: Callable[[ItemResult], bool] | None,
        budget: Budget | None,
        progress: Callable[[ProgressSnapshot], None] | None,
        total: int,
        image_cache_dir: Path | None,
    ) -> None:
        self.split = split
        self.prompts = prompts
        self.provider = provider
        self.cache = cache
        self.sampling = sampling
        self.replicates = replicates
        self.concurrency = concurrency
        self.prices = prices
        self.on_item = on_item
        self.budget = budget
        self.progress = progress
        self.total = total
        self.text_only = bool(getattr(provider, "text_only", False))
        self.agentic = prompts.settings.mode == "agentic"
        self.token_budget = getattr(prompts.settings, "token_budget", None)
        self.image_cache_dir = image_cache_dir
        self.semaphore = asyncio.Semaphore(concurrency)
        # Items loaded and rendered at once: about one per core. With one per worker, every worker's
        # load job queued ahead of the first item's render and delayed the first calls (~0.15 s at
        # concurrency 16 on 2 cores); rendering is mostly GIL-bound, so more threads buy nothing.
        self._prep_slots = asyncio.Semaphore(max(2, os.cpu_count() or 2))
        self.results: dict[str, ItemResult] = {}
        self.stop_reason: str | None = None
        self.stopped_early = False
        self.calls_made = 0
        self.cache_hits = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0
        self.parse_errors = 0
        self.started = time.monotonic()
        self._workers: list[asyncio.Task[None]] = []
        # Items take their turn to claim call slots in the order given (see `_item`).
        self._turn = 0
        self._turns_done: set[int] = set()
        self._turn_cond = asyncio.Condition()

    # -- one call --------------------------------------------------------------------------------
    def _lookup(self, fingerprint: str, index: int) -> tuple[str, ReplicateResult | None]:
        """The cache key of replicate ``index`` and its cached result, if any (cached calls are free)."""

        key = cache_key(
            provider=self.provider.name,
            model=self.provider.model,
            sampling=self.sampling,
            schema=VERDICT_SCHEMA,
            request=fingerprint,
            replicate=index,
        )
        hit = self.cache.get(key)
        if hit is None:
            return key, None
        return key, _parsed_result(
            index, key, True, hit.reply_text, hit.reply_model,
            (hit.input_tokens, hit.output_tokens, hit.cache_read_tokens, hit.cache_write_tokens),
            hit.cost_usd, hit.duration_s,
        )

    def _reserve(self, estimate: float) -> float:
        """Reserve ``estimate`` dollars of the budget for the next call, or stop: it would cross it."""
        assert self.budget is not None
        if not self.budget.reserve(estimate):
            raise _BudgetStop(
                f"budget of ${self.budget.max_usd:.2f} reached: the next call (estimated "
                f"${estimate:.4f}) would cross it (${self.budget.spent_usd:.4f} spent)"
            )
        return estimate

    async def _call(self, request: JudgeRequest, fingerprint: str, key: str, index: int) -> ReplicateResult:
        """One paid call. The caller holds a semaphore slot; it is released here, whatever happens."""

        estimate = 0.0
        reserved = False
        try:
            if self.stop_reason is not None:
                raise _Stopped
            if self.budget is not None:
                estimate = self._reserve(estimate_cost_usd(request, self.sampling, self.provider.model, self.prices))
                reserved = True
            started = time.monotonic()
            try:
                reply = await self.provider.complete(request, self.sampling, VERDICT_SCHEMA)
            except BaseException as exc:
                if reserved and self.budget is not None:
                    self.budget.release(estimate)
                if not isinstance(exc, InfrastructureError):
                    raise
                return ReplicateResult(
                    index=index,
                    cache_key=key,
                    cached=False,
                    reply_text=None,
                    verdict=None,
                    parse_error=None,
                    model=self.provider.model,
                    duration_s=time.monotonic() - started,
                    infra_error=str(exc) or type(exc).__name__,
                )
            duration = time.monotonic() - started
        finally:
            self.semaphore.release()
        cost = self._account(reply, reply.text, estimate, key, index, fingerprint, duration)
        return _parsed_result(
            index, key, False, reply.text, reply.model,
            (reply.input_tokens, reply.output_tokens, reply.cache_read_tokens, reply.cache_write_tokens),
            cost, duration,
        )

    def _account(
        self, reply: ProviderReply, text: str, estimate: float, key: str, index: int, fingerprint: str,
        duration: float,
    ) -> float:
        """Settle the budget, count one paid call and store it in the cache; return its cost."""
        cost = call_cost_usd(reply, self.prices)
        if self.budget is not None:
            self.budget.settle(estimate, cost)
        self.calls_made += 1
        self.input_tokens += reply.input_tokens
        self.output_tokens += reply.output_tokens
        self.cost_usd += cost
        self.cache.put(
            key, provider=self.provider.name, model=self.provider.model, replicate=index,
            request_fingerprint=fingerprint, reply_text=text, reply_model=reply.model,
            input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
            cache_read_tokens=reply.cache_read_tokens, cache_write_tokens=reply.cache_write_tokens,
            cost_usd=cost, duration_s=duration,
        )
        return cost

    # -- one item --------------------------------------------------------------------------------
    def _prepare(self, tid: str) -> tuple[Trajectory, str | None]:
        """Load the trajectory and compute its render-memo key (None when the split cannot say)."""
        traj = self.split.trajectory(tid)
        json_path = getattr(self.split, "json_path", None)
        if json_path is None:
            return traj, None
        screens: list[Any] = []
        for step in traj.steps:
            path = self.split.screenshot_file(step)
            try:
                st = path.stat() if path is not None else None
            except OSError:
                st = None
            screens.append(None if st is None else [str(path), st.st_mtime_ns, st.st_size])
        payload = {
            "code": _render_code_version(),
            "prompts": self.prompts.prompt_hash(),
            "text_only": self.text_only,
            "token_budget": self.token_budget,
            "trajectory": hashlib.sha256(Path(json_path(tid)).read_bytes()).hexdigest(),
            "screens": screens,
        }
        return traj, hashlib.sha256(stable_json(payload).encode()).hexdigest()

    def _render(self, traj: Trajectory) -> JudgeRequest:
        from optimizer.judge.render import build_request

        return build_request(
            traj,
            self.split,
            self.prompts,
            text_only=self.text_only,
            token_budget=self.token_budget,
            image_cache_dir=self.image_cache_dir,
        )

    async def _direct_lookups(
        self, tid: str
    ) -> tuple[Any, str, tuple[str, ...], list[tuple[str, ReplicateResult | None]]]:
        """Render ``tid`` (or recall its rendering) and look its replicates up in the cache:
        (request — None when every replicate is cached and the memo was enough —, fingerprint,
        notes, [(cache key, cached result or None)] per replicate)."""
        traj, memo_key = await asyncio.to_thread(self._prepare, tid)
        # A fully cached item whose rendering inputs are unchanged needs no rendering at all.
        memo = self.cache.get_request(memo_key) if memo_key is not None else None
        request: JudgeRequest | None = None
        if memo is None:
            request = await asyncio.to_thread(self._render, traj)
            fingerprint, notes = request.fingerprint(), request.notes
            if memo_key is not None:
                self.cache.put_request(memo_key, fingerprint, notes)
        else:
            fingerprint, notes = memo
        looked_up = [self._lookup(fingerprint, i) for i in range(self.replicates)]
        if request is None and any(hit is None for _, hit in looked_up):
            request = await asyncio.to_thread(self._render, traj)
            if request.fingerprint() != fingerprint:  # a stale memo: trust the rendering
                fingerprint, notes = request.fingerprint(), request.notes
                if memo_key is not None:
                    self.cache.put_request(memo_key, fingerprint, notes)
                looked_up = [self._lookup(fingerprint, i) for i in range(self.replicates)]
        return request, fingerprint, notes, looked_up

    def _agentic_task(self, tid: str) -> Any:
        from optimizer.judge.agentic import AgenticTask

        return AgenticTask(self.split.trajectory(tid), self.split, self.prompts, image_cache_dir=self.image_cache_dir)

    async def _converse(self, task: Any, index: int) -> ReplicateResult:
        """One agentic verdict (replicate ``index``): turns replayed from the cache while they can be,
        then paid turns, each checked against the budget first. The caller holds a semaphore slot
        for the whole conversation; it is released here, whatever happens."""
        from optimizer.judge.agentic import AGENTIC_VERSION, ConversationState

        state = ConversationState(task)
        started = time.monotonic()
        tokens = [0, 0, 0, 0]
        cost = 0.0
        all_cached = True
        key = ""
        model = self.provider.model
        final: str | None = None
        try:
            while final is None and state.turns < task.max_turns:
                key = cache_key(
                    provider=self.provider.name,
                    model=self.provider.model,
                    sampling=self.sampling,
                    schema={"agentic": AGENTIC_VERSION},
                    request=state.key_material(),
                    replicate=index,
                )
                hit = self.cache.get(key)
                turn = _cached_turn(hit.reply_text) if hit is not None else None
                if hit is not None and turn is not None:
                    usage = (hit.input_tokens, hit.output_tokens, hit.cache_read_tokens, hit.cache_write_tokens)
                    turn_cost, model = hit.cost_usd, hit.reply_model
                else:
                    all_cached = False
                    outcome = await self._paid_turn(task, state, key, index)
                    if isinstance(outcome, str):  # an infrastructure error after every retry
                        return ReplicateResult(
                            index=index, cache_key=key, cached=False, reply_text=None, verdict=None,
                            parse_error=None, model=model, input_tokens=tokens[0], output_tokens=tokens[1],
                            cache_read_tokens=tokens[2], cache_write_tokens=tokens[3], cost_usd=cost,
                            duration_s=time.monotonic() - started, infra_error=outcome,
                            trace=tuple(state.trace), turns=state.turns,
                        )
                    turn, usage, turn_cost, model = outcome
                tokens = [a + b for a, b in zip(tokens, usage, strict=True)]
                cost += turn_cost
                final = await asyncio.to_thread(state.step, turn)
        finally:
            self.semaphore.release()
        duration = time.monotonic() - started
        if final is None:
            last = next((m for m in reversed(state.messages) if isinstance(m, AssistantTurn)), None)
            return ReplicateResult(
                index=index, cache_key=key, cached=all_cached, reply_text=last.text if last else "",
                verdict=None, parse_error=f"no verdict after {task.max_turns} model calls (agent_max_turns)",
                model=model, input_tokens=tokens[0], output_tokens=tokens[1], cache_read_tokens=tokens[2],
                cache_write_tokens=tokens[3], cost_usd=cost, duration_s=duration,
                trace=tuple(state.trace), turns=state.turns,
            )
        result = _parsed_result(index, key, all_cached, final, model, (tokens[0], tokens[1], tokens[2], tokens[3]),
                                cost, duration)
        return dataclasses.replace(result, trace=tuple(state.trace), turns=state.turns)

    async def _paid_turn(
        self, task: Any, state: Any, key: str, index: int
    ) -> tuple[AssistantTurn, tuple[int, int, int, int], float, str] | str:
        """One paid model turn of a conversation, cached as soon as it is answered; an
        infrastructure error's message instead when the transport failed after every retry."""
        if self.stop_reason is not None:
            raise _Stopped
        estimate = 0.0
        reserved = False
        if self.budget is not None:
            guess = ProviderReply(text="", model=self.provider.model,
                                  input_tokens=task.estimate_input_tokens(state), output_tokens=self.sampling.max_tokens)
            estimate = self._reserve(call_cost_usd(guess, self.prices))
            reserved = True
        t0 = time.monotonic()
        try:
            messages = await asyncio.to_thread(state.wire_messages)
            turn, reply = await self.provider.converse(task.system, messages, state.offered, self.sampling)  # type: ignore[attr-defined]
        except BaseException as exc:
            if reserved and self.budget is not None:
                self.budget.release(estimate)
            if not isinstance(exc, InfrastructureError):
                raise
            return str(exc) or type(exc).__name__
        turn_cost = self._account(reply, turn.to_json(), estimate, key, index, task.fingerprint, time.monotonic() - t0)
        usage = (reply.input_tokens, reply.output_tokens, reply.cache_read_tokens, reply.cache_write_tokens)
        return turn, usage, turn_cost, reply.model

    async def _wait_turn(self, position: int) -> None:
        async with self._turn_cond:
            await self._turn_cond.wait_for(lambda: self._turn == position)

    async def _end_turn(self, position: int) -> None:
        async with self._turn_cond:
            self._turns_done.add(position)
            while self._turn in self._turns_done:
                self._turns_done.discard(self._turn)
                self._turn += 1
            self._turn_cond.notify_all()

    async def _item(self, position: int, tid: str) -> ItemResult:
        started = time.monotonic()
        tasks: list[asyncio.Task[ReplicateResult]] = []
        turn_ended = False
        try:
            async with self._prep_slots:
                if self.agentic:
                    agentic = await asyncio.to_thread(self._agentic_task, tid)
                    notes = agentic.notes
                    # A conversation looks up each of its turns in the cache itself (`_converse`).
                    looked_up: list[tuple[str, ReplicateResult | None]] = [
                        (agentic.fingerprint, None) for _ in range(self.replicates)
                    ]
                    calls = [functools.partial(self._converse, agentic, i) for i in range(self.replicates)]
                else:
                    request, fingerprint, notes, looked_up = await self._direct_lookups(tid)
                    calls = [
                        functools.partial(self._call, request, fingerprint, key, i)
                        for i, (key, hit) in enumerate(looked_up)
                        if hit is None
                    ]
            if calls:
                # Paid calls take their semaphore slots strictly in item order.
                await self._wait_turn(position)
                for call in calls:
                    await self.semaphore.acquire()
                    tasks.append(asyncio.create_task(call()))
            await self._end_turn(position)
            turn_ended = True
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if not turn_ended:
                await asyncio.shield(self._end_turn(position))
        # Every sibling call has finished (a successful one is cached) before anything is raised.
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, _BudgetStop | _Stopped):
                raise outcome
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        fresh = iter(o for o in outcomes if isinstance(o, ReplicateResult))
        reps = [hit if hit is not None else next(fresh) for _, hit in looked_up]
        self.cache_hits += sum(1 for r in reps if r.cached)
        failed = [r for r in reps if r.infra_error is not None]
        if failed:
            return ItemResult(
                trajectory_id=tid,
                replicates=reps,
                answer=Answer(success=None, status="infra_error"),
                unstable=False,
                infra_error=True,
                error=failed[0].infra_error,
                notes=notes,
                duration_s=time.monotonic() - started,
            )
        answer, verdict, unstable = _majority(reps)
        return ItemResult(
            trajectory_id=tid,
            replicates=reps,
            answer=answer,
            unstable=unstable,
            infra_error=False,
            verdict=verdict,
            notes=notes,
            duration_s=time.monotonic() - started,
        )

    # -- scheduling ------------------------------------------------------------------------------
    def _snapshot(self) -> ProgressSnapshot:
        return ProgressSnapshot(
            done=len(self.results),
            total=self.total,
            infra_errors=sum(1 for r in self.results.values() if r.infra_error),
            parse_errors=self.parse_errors,
            calls_made=self.calls_made,
            cache_hits=self.cache_hits,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_usd,
            elapsed_s=time.monotonic() - self.started,
        )

    async def _worker(self, queue: deque[tuple[int, str]]) -> None:
        while queue and self.stop_reason is None:
            position, tid = queue.popleft()
            try:
                result = await self._item(position, tid)
            except _BudgetStop as exc:
                if self.stop_reason is None:
                    self.stop_reason = str(exc)
                return
            except _Stopped:
                return
            self.results[tid] = result
            if result.answer.status == "invalid":
                self.parse_errors += 1
            if self.progress is not None:
                self.progress(self._snapshot())
            if self.on_item is not None and self.on_item(result) and self.stop_reason is None:
                self.stop_reason = "stopped early: the caller's stopping rule was met"
                self.stopped_early = True
                me = asyncio.current_task()
                for task in self._workers:
                    if task is not me:
                        task.cancel()
                return

    async def run(self, item_ids: Sequence[str]) -> None:
        """Judge ``item_ids`` (again, for items judged before: their results are replaced)."""
        self._turn, self._turns_done = 0, set()  # paid calls claim slots in this run's item order
        queue = deque(enumerate(item_ids))
        # A few more workers than call slots, so the next items are rendered while calls are in flight.
        n_workers = min(len(queue), self.concurrency + max(2, self.concurrency // 2))
        self._workers = [asyncio.create_task(self._worker(queue)) for _ in range(n_workers)]
        try:
            pending: set[asyncio.Task[None]] = set(self._workers)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
        finally:
            for task in self._workers:
                task.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)


@functools.cache
def _render_code_version() -> str:
    """A hash of the source of the modules that turn a trajectory into a request; part of the
    render-memo key, so a judgeloop upgrade that renders differently never reuses an old request's
    fingerprint. The modules are imported, not named as files: a module that moves is still hashed,
    and a source file that cannot be read is an error, never a silently constant hash."""
    from optimizer import models
    from optimizer.devset import markdown, split
    from optimizer.judge import prompts, render, types

    h = hashlib.sha256()
    for module in (render, prompts, markdown, types, models, split):
        source = inspect.getsourcefile(module)
        if source is None:
            raise RuntimeError(f"cannot hash the render code: {module.__name__} has no source file")
        h.update(module.__name__.encode() + b"\0" + Path(source).read_bytes())
    return h.hexdigest()


def sampling_from(prompts: Any) -> Sampling:
    """The judge's `Sampling` from the prompt set's ``judge.toml`` settings."""
    return prompts.settings.sampling()


async def evaluate_items(
    ws: Any,
    split: Any,
    prompts: Any,
    judge: JudgeSection,
    *,
    item_ids: Sequence[str],
    replicates: int,
    on_item: Callable[[ItemResult], bool] | None = None,
    budget: Budget | None = None,
    progress: Callable[[ProgressSnapshot], None] | None = None,
    provider: Provider | None = None,
    cache: JudgeCache | None = None,
    infra_retry_rounds: int = 0,
    infra_retry_pause_s: float = 0.0,
) -> EvalRun:
    """Judge ``item_ids`` of ``split`` with ``prompts``; ``replicates`` calls per item.

    ``provider``/``cache`` default to `make_provider(judge)` and the workspace cache, both closed at
    the end; pass your own to share them across evaluations (then you close them). ``on_item`` is
    called as each item completes; returning True cancels items in flight and starts no more.
    A `UserError` from rendering or the provider stops everything and is raised as is.
    Items whose calls still failed after the SDK's retries are judged again in up to
    ``infra_retry_rounds`` more rounds, round r after a pause of ``infra_retry_pause_s * r``.
    """
    if replicates < 1:
        raise UserError(f"replicates must be at least 1 (got {replicates}); pass --replicates 1 or more")
    item_ids = list(item_ids)
    if len(set(item_ids)) != len(item_ids):
        raise ValueError("evaluate_items: duplicate trajectory ids in item_ids")
    own_provider = provider is None
    own_cache = cache is None
    if provider is None:
        from optimizer.judge.providers import make_provider

        provider = make_provider(judge)
    started = time.monotonic()
    retried_notes: list[str] = []
    try:
        if prompts.settings.mode == "agentic" and not callable(getattr(provider, "converse", None)):
            raise UserError(
                f'judge.toml sets mode = "agentic", which needs a provider that can use tools (anthropic or '
                f'openai); the {provider.name} provider supports mode = "direct" only: set mode = "direct"'
            )
        if cache is None:
            cache = JudgeCache(ws.cache_path)
        sampling = sampling_from(prompts)
        prices = dict(ws.config.prices)
        evaluator = _Evaluator(
            split,
            prompts,
            provider,
            cache,
            sampling=sampling,
            replicates=replicates,
            concurrency=judge.max_concurrency,
            prices=prices,
            on_item=on_item,
            budget=budget,
            progress=progress,
            total=len(item_ids),
            image_cache_dir=ws.experiments_dir / IMAGE_CACHE_DIRNAME,
        )
        await evaluator.run(item_ids)
        for round_no in range(1, infra_retry_rounds + 1):
            failed = [t for t in item_ids if t in evaluator.results and evaluator.results[t].infra_error]
            if not failed or evaluator.stop_reason is not None:
                break
            retried_notes.append(f"round {round_no}: {len(failed)} item(s) with infrastructure errors judged again")
            await asyncio.sleep(infra_retry_pause_s * round_no)
            await evaluator.run(failed)
    finally:
        if own_cache and cache is not None:
            cache.close()
        if own_provider:
            await provider.aclose()
    items = [evaluator.results[tid] for tid in item_ids if tid in evaluator.results]
    not_evaluated = [tid for tid in item_ids if tid not in evaluator.results]
    notes: list[str] = []
    if evaluator.text_only:
        notes.append(f"provider {provider.name} is text-only: screenshots were dropped from every request")
    if evaluator.agentic:
        reps = [r for item in items for r in item.replicates if r.infra_error is None]
        if reps:
            tools = Counter(str(t).split("(")[0] for r in reps for t in r.trace)
            used = ", ".join(f"{name} {n / len(reps):.1f}" for name, n in sorted(tools.items()))
            notes.append(f"agentic judge: {sum(r.turns for r in reps) / len(reps):.1f} model calls per verdict; "
                         f"tool calls per verdict: {used or 'none'}")
    threads = getattr(provider, "threads", None)
    if isinstance(threads, int):
        notes.append(f"local judge ran with {threads} inference thread(s) (set [judge] local_threads to change)")
    if evaluator.stop_reason is not None:
        notes.append(evaluator.stop_reason)
    if retried_notes:
        still = sum(1 for item in items if item.infra_error)
        notes.append("; ".join(retried_notes) + f"; {still} still failing")
    return EvalRun(
        items=items,
        calls_made=evaluator.calls_made,
        cache_hits=evaluator.cache_hits,
        input_tokens=evaluator.input_tokens,
        output_tokens=evaluator.output_tokens,
        cost_usd=evaluator.cost_usd,
        duration_s=time.monotonic() - started,
        stopped_early=evaluator.stop_reason is not None,
        stop_reason=evaluator.stop_reason,
        notes=notes,
        not_evaluated=not_evaluated,
        item_ids=item_ids,
        meta={
            "provider": provider.name,
            "model": provider.model,
            # The offline SmolLM2 judge says what it is wherever its results go.
            "judge_label": getattr(provider, "label", None),
            "base_url": _redacted_url(judge.base_url),
            "text_only": evaluator.text_only,
            "split": getattr(split, "name", None),
            "split_fingerprint": getattr(split, "fingerprint", None),
            "prompt_hash": prompts.prompt_hash(),
            "sampling": sampling.as_dict(),
            "replicates": replicates,
            "max_concurrency": judge.max_concurrency,
            "timeout_s": judge.timeout_s,
            "max_retries": judge.max_retries,
            "settings": _settings_dict(prompts),
            "budget_usd": None if budget is None else budget.max_usd,
        },
    )


def _settings_dict(prompts: Any) -> dict[str, Any]:
    settings = prompts.settings
    dump = getattr(settings, "model_dump", None)
    return dump(mode="json") if callable(dump) else dict(vars(settings))


def _redacted_url(url: str | None) -> str | None:
    """The base URL without any user:password part (never write credentials to a file)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


# ---------------------------------------------------------------------------------------------------
# Result files


def _verdict_file(item: ItemResult, run: EvalRun) -> dict[str, Any]:
    reps = item.replicates
    meta: dict[str, Any] = {
        "model": reps[0].model if reps else run.meta.get("model"),
        "provider": run.meta.get("provider"),
        "prompt_hash": run.meta.get("prompt_hash"),
        "input_tokens": sum(r.input_tokens for r in reps),
        "output_tokens": sum(r.output_tokens for r in reps),
        "cost_usd": round(item.cost_usd, 8),
        "duration_s": round(sum(r.duration_s for r in reps), 3),
        "parse_status": "ok" if item.verdict is not None else "parse_error",
        "cached": all(r.cached for r in reps),
        "unstable": item.unstable,
        "replicates": [
            {
                "index": r.index,
                "success": r.success,
                "parse_status": r.status,
                "cached": r.cached,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
                "cost_usd": round(r.cost_usd, 8),
                "duration_s": round(r.duration_s, 3),
                **({"parse_error": r.parse_error, "raw_response": r.reply_text} if r.status == "parse_error" else {}),
                **({"turns": r.turns, "tool_calls": [str(t) for t in r.trace]} if r.trace else {}),
            }
            for r in reps
        ],
        "preprocessing": list(item.notes),
    }
    if item.verdict is None:
        failed = next((r for r in reps if r.status == "parse_error"), None)
        return {
            "raw_response": failed.reply_text if failed is not None else "",
            "parse_error": failed.parse_error if failed is not None else "no majority verdict",
            "_meta": meta,
        }
    v = item.verdict
    return {
        "success": v.success,
        "reasoning": v.reasoning,
        "confidence": v.confidence,
        "mistake_type": v.mistake_type,
        "_meta": meta,
    }


def write_results(out_dir: Path | str, run: EvalRun) -> Path:
    """Write one AgentHorizon verdict file per evaluated item and ``_summary.json``; return the folder.

    Infrastructure errors and items not evaluated get no file; they are listed in the summary.
    The folder must be new or empty, so stale verdict files can never be scored by mistake.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists and is not an empty folder; choose a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    parse_failures = 0
    for item in run.items:
        if item.infra_error:
            continue
        if item.verdict is None:
            parse_failures += 1
        body = _verdict_file(item, run)
        (out / f"{item.trajectory_id}.json").write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    notes = Counter(note for item in run.items for note in item.notes)
    summary = {
        **{
            k: run.meta.get(k)
            for k in ("prompt_hash", "provider", "model", "judge_label", "base_url", "split", "split_fingerprint")
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "parameters": {
            k: run.meta.get(k)
            for k in ("sampling", "replicates", "max_concurrency", "timeout_s", "max_retries", "budget_usd", "settings")
        },
        "preprocessing": {
            "text_only": run.meta.get("text_only"),
            "run_notes": run.notes,
            "item_notes": [{"note": note, "items": count} for note, count in notes.most_common(50)],
        },
        "counts": {
            "items": len(run.item_ids),
            "evaluated": len(run.items) - len(run.infra_error_ids),
            "verdict_files": len(run.items) - len(run.infra_error_ids),
            "parse_failures": parse_failures,
            "unstable": sum(1 for item in run.items if item.unstable),
            "infra_errors": len(run.infra_error_ids),
            "not_evaluated": len(run.not_evaluated),
            "calls_made": run.calls_made,
            "cache_hits": run.cache_hits,
        },
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cost_usd": round(run.cost_usd, 8),
        "cached_cost_usd": round(run.cached_cost_usd, 8),
        "duration_s": round(run.duration_s, 3),
        "stopped_early": run.stopped_early,
        "stop_reason": run.stop_reason,
        "infra_error_ids": run.infra_error_ids,
        "infra_errors": {item.trajectory_id: item.error for item in run.items if item.infra_error},
        "not_evaluated_ids": run.not_evaluated,
    }
    (out / "_summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


# The contract name in docs/ARCHITECTURE.md.
write_verdict_files = write_results


# ---------------------------------------------------------------------------------------------------
# `judgeloop eval`


# The judge model used when --provider switches providers without --model.
DEFAULT_JUDGE_MODELS: dict[str, str] = {
    "local": "smollm2-135m",
    "anthropic": "claude-sonnet-5-5",
    "openai": "gpt-5",
}


def judge_with_overrides(judge: JudgeSection, args: argparse.Namespace) -> JudgeSection:
    """``[judge]`` with the command line's --provider/--model/--base-url/--concurrency applied."""
    update: dict[str, Any] = {}
    if getattr(args, "provider", None):
        update["provider"] = args.provider
        if args.provider != judge.provider and not getattr(args, "model", None):
            # The configured model belongs to the configured provider; switching providers without
            # --model takes that provider's default judge model instead of sending a foreign name.
            update["model"] = DEFAULT_JUDGE_MODELS[args.provider]
    if getattr(args, "model", None):
        update["model"] = args.model
    if getattr(args, "base_url", None):
        update["base_url"] = args.base_url
    if getattr(args, "concurrency", None) is not None:
        if args.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1 (got {args.concurrency})")
        update["max_concurrency"] = args.concurrency
    return JudgeSection.model_validate({**judge.model_dump(), **update})


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_metrics(metrics: Any) -> str:
    """The protocol metrics as a small aligned table."""
    rows = [
        ("items", str(metrics.n)),
        ("balanced accuracy", _fmt(metrics.balanced_accuracy)),
        ("TPR (positive acc.)", _fmt(metrics.tpr)),
        ("TNR (negative acc.)", _fmt(metrics.tnr)),
        ("FPR", _fmt(metrics.fpr)),
        ("FNR", _fmt(metrics.fnr)),
        ("Cohen's kappa", _fmt(metrics.kappa)),
        ("invalid (parse failures)", str(metrics.invalid)),
        ("missing", str(metrics.missing)),
    ]
    for kind, value in metrics.mistake_type_recall.items():
        rows.append((f"recall: {kind}", _fmt(value)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def cmd_eval(args: argparse.Namespace) -> int:
    """`judgeloop eval`: judge a split with the prompts at a revision, write verdict files, print metrics."""
    from optimizer.devset.labels import load_labels
    from optimizer.devset.split import open_split
    from optimizer.judge.prompts import PromptSet
    from optimizer.metrics import score
    from optimizer.workspace import Workspace

    ws = Workspace.open(args.workspace)
    judge = judge_with_overrides(ws.config.judge, args)
    split = open_split(ws, args.split or ws.config.workspace.dev_split)
    prompts = PromptSet.from_rev(ws, args.rev) if args.rev else PromptSet.from_dir(ws.prompts_dir)
    replicates = args.replicates if args.replicates is not None else prompts.settings.replicates
    item_ids = list(split.ids)
    if args.limit is not None:
        if args.limit < 1:
            raise UserError(f"--limit must be at least 1 (got {args.limit})")
        item_ids = item_ids[: args.limit]
    prompt_hash = prompts.prompt_hash()
    if args.out:
        out = Path(args.out)
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        out = ws.experiments_dir / "evals" / f"{stamp}-{prompt_hash[:8]}"
        n = 1
        while out.exists():  # two evaluations of one revision within a second get two folders
            n += 1
            out = ws.experiments_dir / "evals" / f"{stamp}-{prompt_hash[:8]}-{n}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists and is not an empty folder; choose a new --out folder")

    print(
        f"judgeloop eval: split {split.name!r} ({len(item_ids)} items), prompts {args.rev or 'working tree'} "
        f"[{prompt_hash[:8]}], {judge.provider}:{judge.model}, {replicates} replicate(s), "
        f"concurrency {judge.max_concurrency}",
        file=sys.stderr,
    )
    if args.rev is None:
        from optimizer.workspace import lock_holder

        holder = lock_holder(ws)
        if holder is not None:
            print(f"judgeloop eval: note: {holder} is working in this workspace, so the working tree may be one of "
                  "its candidates; pass --rev to evaluate a fixed revision", file=sys.stderr)
    if judge.provider == "local":
        print(
            "judgeloop eval: the local judge (SmolLM2-135M, text only) is demonstration-quality: "
            "its numbers show the mechanics, not a useful judge",
            file=sys.stderr,
        )
    progress = StderrProgress()
    try:
        run = asyncio.run(
            evaluate_items(ws, split, prompts, judge, item_ids=item_ids, replicates=replicates, progress=progress)
        )
    finally:
        progress.close()
    write_results(out, run)
    labels = load_labels(split)
    metrics = score({tid: labels[tid] for tid in item_ids}, run.answers())
    if args.json:
        print(json.dumps(metrics.protocol_dict()))
    else:
        print(format_metrics(metrics))
        print(
            f"calls: {run.calls_made} new, {run.cache_hits} cached · tokens: {run.input_tokens:,} in / "
            f"{run.output_tokens:,} out · cost: ${run.cost_usd:.4f} (cached calls saved ${run.cached_cost_usd:.4f})"
        )
        if run.infra_error_ids:
            print(f"infrastructure errors: {len(run.infra_error_ids)} item(s), not scored as verdicts; re-run to retry them:")
            for item in run.items:
                if item.infra_error:
                    print(f"  {item.trajectory_id}: {item.error}")
        print(f"results: {out}")
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    if run.infra_error_ids:
        print(
            f"judgeloop eval: {len(run.infra_error_ids)} item(s) hit infrastructure errors; they count as missing",
            file=sys.stderr,
        )
    return 0
