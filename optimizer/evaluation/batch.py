"""Batch evaluation: one pass of a prompt revision over items sent through a provider's batch API
(Anthropic Message Batches, OpenAI Batch) at half price, instead of one direct call per replicate.

`judge_batch_pass` is what `evaluate_items(..., batch=BatchOptions(...))` runs. It renders every item
(or recalls its rendering), looks every replicate up in the judge-call cache exactly as a direct
evaluation does, and sends only the missing calls — each under its cache key, which is also its
``custom_id`` — as one batch (or, for a pass beyond the provider's limits on requests or bytes per
batch, the fewest batches that fit: `split_for_limits`):

1. Batches recorded earlier for any of these calls and not yet collected (the previous process was
   killed while it waited) are collected first instead of submitting anything again.
2. The whole batch's estimated cost, at the batch price, is reserved against the budget *before*
   submission; a batch that would cross it is not sent (the evaluation stops with a budget reason).
3. The batch is recorded in the `BatchStore` (`optimizer.evaluation.batchstore`) just before
   submission and its provider id right after (the judge cache's table for ``eval``/``confirm``, the
   ledger for ``run``).
4. The batch is polled with backoff (``poll_s`` growing ``backoff`` times per poll up to
   ``poll_max_s``); each poll's state goes to ``on_state``.
5. Answers are priced at the batch rate and stored in the cache, counted and turned into replicate
   results exactly as direct calls are (a later direct evaluation of the same prompts is all hits).
   Entries that errored, expired or were canceled are re-submitted alone, as a follow-up batch, up to
   ``retry_rounds`` times; what still fails is an infrastructure error, as after a direct call's retries.

Early stopping cannot apply: every call of a batch is paid for once it is submitted.
Judge-input side: never reads labels.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from optimizer.evaluation.batchstore import BatchStore
from optimizer.evaluation.budget import BudgetStop
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.files import redacted_url
from optimizer.evaluation.judging import ItemJudge
from optimizer.evaluation.prepared import PreparedItem
from optimizer.evaluation.results import ItemResult, ReplicateResult
from optimizer.evaluation.stopping import Stopped
from optimizer.events import StopKind, StopReason
from optimizer.judge.estimate import estimate_cost_usd
from optimizer.judge.types import (
    VERDICT_SCHEMA,
    BatchEntry,
    BatchingProvider,
    BatchState,
    ImagePart,
    InfrastructureError,
    JudgeRequest,
    Provider,
    ProviderReply,
    ProviderTraits,
    Sampling,
    TextPart,
    batches,
    stable_json,
)
from optimizer.workspace.config import JudgeSection

# Consecutive failed status polls (each after the SDK's own retries) before a pass gives up waiting;
# the batch stays recorded as submitted, so the same command later collects it.
MAX_POLL_FAILURES = 5

EARLY_STOP_NOTE = (
    "batch mode: early stopping does not apply (every call of a batch is paid for once it is sent)"
)


@dataclass(frozen=True)
class BatchOptions:
    """How a batch pass polls and retries (seconds), where it records its batches (None: the judge
    cache), and who hears each polled state."""

    poll_s: float = 30.0
    poll_max_s: float = 600.0
    backoff: float = 1.5
    retry_rounds: int = 2
    store: BatchStore | None = None
    on_state: Callable[[BatchState], None] | None = None
    # --batch-cold: submit without warming the cold items first (see `_warm_up`).
    cold: bool = False

    @classmethod
    def from_judge(
        cls,
        judge: JudgeSection,
        *,
        store: BatchStore | None = None,
        on_state: Callable[[BatchState], None] | None = None,
    ) -> BatchOptions:
        """The options ``[judge] batch_poll_s, batch_poll_max_s, batch_retry_rounds`` set."""
        return cls(
            poll_s=judge.batch_poll_s,
            poll_max_s=max(judge.batch_poll_s, judge.batch_poll_max_s),
            retry_rounds=judge.batch_retry_rounds,
            store=store,
            on_state=on_state,
            cold=judge.batch_cold,
        )


@dataclass(frozen=True)
class _Call:
    """One missing replicate: its item, index, request fingerprint and rendered request."""

    trajectory_id: str
    index: int
    fingerprint: str
    request: JudgeRequest


@dataclass
class BatchPassOutcome:
    results: dict[str, ItemResult]
    stop: StopReason | None
    notes: list[str]
    batches_submitted: list[str]


class _BatchPass:
    def __init__(
        self, judge: ItemJudge, provider: BatchingProvider, options: BatchOptions, store: BatchStore
    ) -> None:
        self.judge = judge
        self.provider = provider
        self.options = options
        self.store = store
        self.endpoint = redacted_url(provider.where) or ""
        self.calls: dict[str, _Call] = {}
        self.answered: dict[str, ReplicateResult] = {}
        self.failed: dict[str, str] = {}
        self.notes: list[str] = []
        self.submitted: list[str] = []
        # Per call on a cached prefix: the cache-read tokens the plan expects it to be billed.
        self.planned: dict[str, int] = {}

    def _state(self, state: BatchState) -> None:
        if self.options.on_state is not None:
            self.options.on_state(state)

    async def collect(
        self, record_id: int, batch_id: str, custom_ids: Sequence[str], estimates: dict[str, float]
    ) -> None:
        """Wait for batch ``batch_id`` to end, then account every answer it holds for a call still
        wanted. ``estimates``: what this process reserved per call (0 for a batch collected after a kill)."""
        t0 = time.monotonic()
        delay = self.options.poll_s
        failures = 0
        status = "unknown"
        while True:
            state: BatchState | None
            try:
                state = await self.provider.batch_state(batch_id)
                failures = 0
            except InfrastructureError as exc:
                failures += 1
                if failures >= MAX_POLL_FAILURES:
                    self._release(custom_ids, estimates)
                    for key in custom_ids:
                        self.failed.setdefault(key, f"batch {batch_id} could not be polled: {exc}")
                    self.notes.append(
                        f"batch {batch_id} could not be polled ({exc}); it stays recorded, so the "
                        "same command later collects it"
                    )
                    raise _GiveUp from None
                state = None
            if state is not None:
                status = state.status
                self._state(state)
                if state.ended:
                    break
            await asyncio.sleep(delay)
            delay = min(delay * self.options.backoff, self.options.poll_max_s)
        entries = await self.provider.batch_results(batch_id)
        duration = time.monotonic() - t0
        by_id: dict[str, BatchEntry] = {e.custom_id: e for e in entries}
        for key in custom_ids:
            estimate = estimates.get(key, 0.0)
            call = self.calls.get(key)
            entry = by_id.get(key)
            if call is None or key in self.answered:
                # Answered meanwhile (a later batch, or a direct evaluation): nothing to count twice.
                self._release_one(estimate)
                continue
            if entry is None or entry.outcome != "succeeded" or entry.reply is None:
                self._release_one(estimate)
                why = (
                    f"no result in batch {batch_id} (status {status})"
                    if entry is None
                    else f"batch entry {entry.outcome}: {entry.error or 'no detail'}"
                )
                self.failed[key] = why
                continue
            self.failed.pop(key, None)
            # A wave sibling sharing this batch (`WaveBatches`) took this answer first: it paid for it, and
            # here it is a cache hit, so the call and its cost land on one experiment's row.
            shared = self.judge.recall(key, call.index)
            if shared is not None:
                self._release_one(estimate)
                self.answered[key] = shared
                continue
            self.answered[key] = self.judge.account_batch_reply(
                entry.reply,
                estimate,
                key,
                call.index,
                call.fingerprint,
                duration,
                discounted=not self.provider.traits.batch_offline,
            )
            self.judge.planned_cache_reads += self.planned.get(key, 0)
            prefix = self.judge.prefix_key(call.request)
            if prefix is not None:  # the batch wrote it (or read it): later passes find it warm
                self.judge.warmth.mark_warm(prefix, call.request.cache_ttl)
        self.store.update_batch(record_id, status="collected")

    def _release(self, custom_ids: Sequence[str], estimates: dict[str, float]) -> None:
        for key in custom_ids:
            self._release_one(estimates.get(key, 0.0))

    def _release_one(self, estimate: float) -> None:
        if self.judge.budget is not None and estimate:
            self.judge.budget.release(estimate)

    async def resume_open(self) -> None:
        """Collect every batch recorded earlier for a call still wanted."""
        provider = self.provider
        for record in self.store.open_batches(
            provider=provider.name, endpoint=self.endpoint, model=provider.model
        ):
            mine = [k for k in record.custom_ids if k in self.calls and k not in self.answered]
            if not mine:
                continue
            if record.batch_id is None:
                self.store.update_batch(record.record_id, status="abandoned")
                self.notes.append(
                    f"a batch of {len(record.custom_ids)} call(s) was being submitted when an earlier process "
                    "stopped; its id was never recorded, so it is submitted again (if the provider had "
                    "accepted the first one, it is billed and not collected)"
                )
                continue
            self.notes.append(
                f"collected batch {record.batch_id}, submitted by an earlier process "
                f"({len(record.custom_ids)} call(s)), instead of submitting it again"
            )
            await self.collect(record.record_id, record.batch_id, record.custom_ids, {})

    async def submit_round(self, keys: list[str]) -> StopReason | None:
        """Submit ``keys`` (budget reserved first, for all of them) as the fewest batches that fit the
        provider's limits — one, unless the pass is too large — and collect them; a budget stop or None."""
        judge = self.judge
        estimates = {
            k: estimate_cost_usd(
                self.calls[k].request,
                judge.sampling,
                self.provider.model,
                judge.prices,
                batch=not self.provider.traits.batch_offline,
            )
            for k in keys
        }
        total = sum(estimates.values())
        if judge.budget is not None and not judge.budget.reserve(total):
            budget = judge.budget
            return StopReason(
                StopKind.BUDGET,
                f"budget of ${budget.max_usd:.2f}: a batch of {len(keys)} call(s) (estimated ${total:.4f} at the "
                f"batch price) would cross it (${budget.spent_usd:.4f} spent); nothing was sent",
            )
        limits = self.provider.traits.batch
        chunks = split_for_limits(
            keys,
            {k: request_bytes(self.calls[k].request) for k in keys},
            max_requests=None if limits is None else limits.max_requests,
            max_bytes=None if limits is None else limits.max_bytes,
        )
        if len(chunks) > 1:
            self.notes.append(
                f"{len(keys)} call(s) sent as {len(chunks)} batches to stay within the provider's "
                "batch size limits"
            )
        sent: list[tuple[int, str, list[str]]] = []
        for chunk in chunks:
            record_id = self.store.record_batch(
                provider=self.provider.name,
                endpoint=self.endpoint,
                model=self.provider.model,
                custom_ids=chunk,
                estimate_usd=sum(estimates[k] for k in chunk),
            )
            try:
                state = await self.provider.submit_batch(
                    [(k, self.calls[k].request) for k in chunk], judge.sampling, VERDICT_SCHEMA
                )
            except BaseException as exc:
                self._release(chunk, estimates)
                self.store.update_batch(record_id, status="abandoned")
                if not isinstance(exc, InfrastructureError):
                    for _, _, later in sent:  # still collected by the same command later: they stay recorded
                        self._release(later, estimates)
                    self._release([k for c in chunks[len(sent) + 1 :] for k in c], estimates)
                    raise
                for key in chunk:
                    self.failed[key] = f"the batch could not be submitted: {exc}"
                continue
            self.store.update_batch(record_id, status="submitted", batch_id=state.batch_id)
            self.submitted.append(state.batch_id)
            self._state(state)
            sent.append((record_id, state.batch_id, chunk))
        for i, (record_id, batch_id, chunk) in enumerate(sent):  # submitted together: worked on at once
            try:
                await self.collect(record_id, batch_id, chunk, estimates)
            except _GiveUp:
                for _, later_id, later in sent[i + 1 :]:  # not waited for: released, and failed for now
                    self._release(later, estimates)
                    for key in later:
                        self.failed.setdefault(
                            key,
                            f"batch {later_id} was not collected (polling failed); it stays "
                            "recorded, so the same command later collects it",
                        )
                raise
        return None


# The providers' documented limits per batch (Anthropic Message Batches: 100,000 requests or 256 MB;
# OpenAI Batch: 50,000 requests, a 200 MB input file), with a margin for the wire format's overhead.
BATCH_BYTES_MARGIN = 0.85


def request_bytes(request: JudgeRequest) -> int:
    """About how many bytes ``request`` takes in a batch file: its text, its images base64-encoded
    (4/3 of their size) and a kilobyte of JSON around them."""
    text = len(request.system.encode()) + sum(
        len(p.text.encode()) for p in request.parts if isinstance(p, TextPart)
    )
    images = sum(len(p.data) for p in request.parts if isinstance(p, ImagePart))
    return text + (images * 4 + 2) // 3 + 1024


def split_for_limits(
    keys: Sequence[str], sizes: dict[str, int], *, max_requests: int | None, max_bytes: int | None
) -> list[list[str]]:
    """``keys`` in order, cut into consecutive chunks of at most ``max_requests`` calls and
    ``BATCH_BYTES_MARGIN`` x ``max_bytes`` bytes (a call larger than that alone is a chunk of its own:
    the provider will say so for that one)."""
    byte_cap = None if max_bytes is None else int(max_bytes * BATCH_BYTES_MARGIN)
    chunks: list[list[str]] = []
    current: list[str] = []
    used = 0
    for key in keys:
        size = sizes[key]
        full = (max_requests is not None and len(current) >= max_requests) or (
            byte_cap is not None and current and used + size > byte_cap
        )
        if full:
            chunks.append(current)
            current, used = [], 0
        current.append(key)
        used += size
    if current:
        chunks.append(current)
    return chunks


class _GiveUp(Exception):
    """Polling failed too often; the pass ends with the batch's calls as infrastructure errors."""


async def _prepare_all(judge: ItemJudge, item_ids: Sequence[str]) -> list[PreparedItem]:
    slots = asyncio.Semaphore(max(2, os.cpu_count() or 2))

    async def one(tid: str) -> PreparedItem:
        async with slots:
            return await judge.prepare(tid)

    return list(await asyncio.gather(*(one(t) for t in item_ids)))


# A cold item gets a warm-up before its batch when the batch holds at least this many of its calls
# (a batch runs its entries together, so each would write the item's prefix; one entry writes it once anyway).
WARMUP_MIN_CALLS = 2


async def _warm_up(judge: ItemJudge, prepared: Sequence[PreparedItem], work: _BatchPass) -> StopReason | None:
    """Make the first missing call of every cold item with `WARMUP_MIN_CALLS` or more calls in the
    batch as a direct call (a real replicate, at the direct price: it writes the prefix the batch's
    entries then read), under the call slots and the budget like any call. A warm-up that fails
    leaves its call in the batch."""
    tasks: list[tuple[str, asyncio.Task[ReplicateResult]]] = []
    firsts: dict[str, str] = {}  # prefix -> the key of the call that warms it
    for item in prepared:
        missing = [key for key, hit in item.looked_up if hit is None]
        if item.request is None or len(missing) < WARMUP_MIN_CALLS or not item.calls:
            continue
        prefix = judge.prefix_key(item.request)
        if prefix is None or judge.warmth.is_warm(prefix) or prefix in firsts:
            continue
        firsts[prefix] = missing[0]
    stop: StopReason | None = None
    try:
        for item in prepared:
            if item.request is None or not item.calls:
                continue
            key = firsts.get(judge.prefix_key(item.request) or "")
            if key is None or key != next(k for k, hit in item.looked_up if hit is None):
                continue
            await judge.semaphore.acquire()
            tasks.append((key, asyncio.create_task(item.calls[0]())))
        outcomes = await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
    except BaseException:
        for _, task in tasks:
            task.cancel()
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        raise
    for (key, _), outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, BudgetStop):
            stop = stop or StopReason(StopKind.BUDGET, str(outcome))
        elif isinstance(outcome, Stopped):
            stop = stop or StopReason(StopKind.INTERRUPTED, judge.stop_reason or "stopped")
        elif isinstance(outcome, BaseException):
            raise outcome
        elif outcome.infra_error is None:
            work.answered[key] = outcome
    if tasks:
        work.notes.append(
            f"warmed {sum(1 for k, _ in tasks if k in work.answered)} cold item(s) with one direct "
            "call each before the batch (--batch-cold skips this)"
        )
    return stop


def _plan_reads(judge: ItemJudge, work: _BatchPass) -> None:
    """The plan's cache reads for the calls about to be batched: every call on a cached prefix reads
    it, except the first call of a prefix nobody warmed (it writes)."""
    from optimizer.judge.estimate import request_token_split

    writers: set[str] = set()
    for key, call in work.calls.items():
        if key in work.answered:
            continue
        prefix = judge.prefix_key(call.request)
        if prefix is None:
            continue
        if not judge.warmth.is_warm(prefix) and prefix not in writers:
            writers.add(prefix)
            continue
        work.planned[key] = request_token_split(call.request)[0]


async def judge_batch_pass(
    judge: ItemJudge,
    provider: BatchingProvider,
    item_ids: Sequence[str],
    options: BatchOptions,
    store: BatchStore,
) -> BatchPassOutcome:
    """Judge ``item_ids`` (each with ``judge.replicates`` replicates) through one batch of the calls
    the cache does not hold (plus follow-up batches of the entries that failed). Items whose calls
    could not all be paid for (a budget stop) are left out of the results."""
    started = time.monotonic()
    prepared = await _prepare_all(judge, item_ids)
    work = _BatchPass(judge, provider, options, store)
    for item in prepared:
        for index, (key, hit) in zip(judge.indices, item.looked_up, strict=True):
            if hit is None:
                assert item.request is not None  # a missing replicate always has its rendering
                work.calls[key] = _Call(item.trajectory_id, index, item.fingerprint, item.request)
    stop: StopReason | None = None
    # An offline engine (vllm run-batch) has a prefix cache of its own: a direct call would warm the server's.
    if work.calls and not options.cold and not provider.traits.batch_offline:
        stop = await _warm_up(judge, prepared, work)
    _plan_reads(judge, work)
    if work.calls and stop is None:
        work.notes.append(EARLY_STOP_NOTE)
        try:
            await work.resume_open()
            for round_no in range(options.retry_rounds + 1):
                todo = [k for k in work.calls if k not in work.answered]
                if not todo:
                    break
                if round_no:
                    work.notes.append(
                        f"re-submitted {len(todo)} failed batch entr{'y' if len(todo) == 1 else 'ies'} "
                        f"alone (round {round_no})"
                    )
                stop = await work.submit_round(todo)
                if stop is not None:
                    break
        except _GiveUp:
            # Polling failed too often: `collect` noted why and marked the unanswered calls as
            # infrastructure errors; the batches stay recorded for the same command to collect later.
            stop = None
    results: dict[str, ItemResult] = {}
    for item in prepared:
        outcomes: list[ReplicateResult] = []
        complete = True
        for index, (key, hit) in zip(judge.indices, item.looked_up, strict=True):
            if hit is not None:
                continue
            if key in work.answered:
                outcomes.append(work.answered[key])
            elif key in work.failed:
                outcomes.append(
                    ReplicateResult(
                        index=index,
                        cache_key=key,
                        cached=False,
                        reply_text=None,
                        verdict=None,
                        parse_error=None,
                        model=provider.model,
                        infra_error=work.failed[key],
                    )
                )
            else:
                complete = False  # never sent: the budget stopped the pass
        if complete:
            results[item.trajectory_id] = judge.assemble(item, outcomes, started)
    return BatchPassOutcome(results, stop, work.notes, work.submitted)


BATCH_PROVIDERS = ("anthropic", "openai")


def check_batch_settings(provider: str, mode: str) -> None:
    """A `UserError` when a batch evaluation cannot run with judge ``provider`` (the configured name)
    in judge ``mode`` (checked before any provider is built, so a refusal costs nothing)."""
    if provider not in BATCH_PROVIDERS:
        _refuse_batchless(provider)
    _check_batch_mode(mode)


def batching_provider(provider: Provider, mode: str) -> BatchingProvider:
    """``provider`` as the `BatchingProvider` a batch evaluation in judge ``mode`` goes through; a
    `UserError` when it declares no batch API (``traits.batch``) or ``mode`` is agentic."""
    if not batches(provider):
        _refuse_batchless(provider.name)
    _check_batch_mode(mode)
    return provider


def _refuse_batchless(provider: str) -> NoReturn:
    from optimizer.errors import UserError

    raise UserError(
        f"--batch needs a provider with a batch API (anthropic or openai); the {provider} "
        "provider has none: drop --batch or use --provider anthropic|openai"
    )


def _check_batch_mode(mode: str) -> None:
    from optimizer.errors import UserError

    if mode == "agentic":
        raise UserError(
            '--batch supports mode = "direct" only: an agentic judge needs each answer before its '
            'next turn; drop --batch or set mode = "direct" in prompts/judge.toml'
        )


def cache_store(cache: JudgeCache) -> BatchStore:
    """The judge cache as the batch store of ``eval`` and ``confirm``."""
    return cache


# -- one batch per wave pass -----------------------------------------------------------------------------

# How long a wave's first batch submission waits for the wave's other candidates to submit theirs (a
# candidate may still be warming its items, or have nothing to send); against a batch's minutes to
# hours, a short wait. Only merging depends on it, never a result.
WAVE_BATCH_WINDOW_S = 10.0


class WaveBatches:
    """A wave's batching provider: the batch passes of its candidates, evaluated at once, submitted as
    one batch per wave pass. A submission waits until every candidate still evaluating has submitted
    (or ``window_s`` has passed); the waiting submissions with the same sampling go out as one batch
    (a call two candidates share, such as the incumbent's re-judging, once: its ``custom_id`` is its
    cache key). Each pass polls that batch and takes its own calls' answers from it; each records
    the batch under its own experiment, so a resume collects it. ``leave`` when a candidate is done."""

    def __init__(self, inner: BatchingProvider, members: int, window_s: float = WAVE_BATCH_WINDOW_S) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.where = inner.where
        self.live = members
        self.window_s = window_s
        self.submitted = 0  # batches sent to the provider
        self._pending: list[
            tuple[Sequence[tuple[str, JudgeRequest]], Sampling, dict[str, object], asyncio.Future[BatchState]]
        ] = []
        self._timer: asyncio.Task[None] | None = None

    @property
    def traits(self) -> ProviderTraits:
        return self.inner.traits

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        return await self.inner.complete(request, sampling, schema)

    async def aclose(self) -> None:  # the run closes the provider it owns
        return None

    def run_notes(self) -> tuple[str, ...]:
        return self.inner.run_notes()

    async def batch_state(self, batch_id: str) -> BatchState:
        return await self.inner.batch_state(batch_id)

    async def batch_results(self, batch_id: str) -> list[BatchEntry]:
        return await self.inner.batch_results(batch_id)

    async def submit_batch(
        self, requests: Sequence[tuple[str, JudgeRequest]], sampling: Sampling, schema: dict[str, Any]
    ) -> BatchState:
        future: asyncio.Future[BatchState] = asyncio.get_running_loop().create_future()
        self._pending.append((requests, sampling, schema, future))
        if len(self._pending) >= self.live:
            await self._flush()
        elif self._timer is None:
            self._timer = asyncio.create_task(self._flush_later())
        return await future

    def leave(self) -> None:
        """A candidate's evaluation ended: the wave's next submission no longer waits for it."""
        self.live -= 1
        if self._pending and len(self._pending) >= self.live:
            self._timer = self._timer or asyncio.create_task(self._flush_later(0.0))

    async def _flush_later(self, delay: float | None = None) -> None:
        await asyncio.sleep(self.window_s if delay is None else delay)
        self._timer = None
        await self._flush()

    async def _flush(self) -> None:
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        pending, self._pending = self._pending, []
        groups: dict[
            str,
            list[
                tuple[
                    Sequence[tuple[str, JudgeRequest]],
                    Sampling,
                    dict[str, object],
                    asyncio.Future[BatchState],
                ]
            ],
        ] = {}
        for entry in pending:
            groups.setdefault(stable_json([entry[1].as_dict(), entry[2]]), []).append(entry)
        for group in groups.values():
            merged: dict[str, JudgeRequest] = {}
            for requests, _, _, _ in group:
                for key, request in requests:
                    merged.setdefault(key, request)
            try:
                state = await self.inner.submit_batch(list(merged.items()), group[0][1], dict(group[0][2]))
            except InfrastructureError as exc:  # each pass handles the failure as its own
                for *_, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            except BaseException as exc:
                # Every waiting pass fails as it would alone (a fatal setup error, a cancel).
                for *_, future in group:
                    if not future.done():
                        if isinstance(exc, asyncio.CancelledError):
                            future.cancel()
                        else:
                            future.set_exception(exc)
                raise
            self.submitted += 1
            for *_, future in group:
                if not future.done():
                    future.set_result(state)
