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

import asyncio
import contextlib
import dataclasses
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.evaluation.batch import (
    BatchOptions,
    batching_provider,
    cache_store,
    judge_batch_pass,
)
from optimizer.evaluation.batchstore import BatchStore
from optimizer.evaluation.budget import Budget, BudgetStop
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.cascade import evaluate_cascade
from optimizer.evaluation.files import redacted_url, settings_record
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME, ItemJudge
from optimizer.evaluation.prepared import JudgeSetup
from optimizer.evaluation.refusals import judge_refusal, memory_refusal
from optimizer.evaluation.results import EvalMeta, EvalRun, ItemResult, ReplicateResult
from optimizer.evaluation.stopping import Stopped, StopRequest
from optimizer.evaluation.warmup import CacheReads
from optimizer.events import ProgressSnapshot, StopKind, StopReason
from optimizer.judge.endpoints import EndpointReporting
from optimizer.judge.memory import Retriever, check_sources, split_folds
from optimizer.judge.prompts import PromptSet
from optimizer.judge.provenance import split_items
from optimizer.judge.types import (
    BatchingProvider,
    Provider,
    Sampling,
)
from optimizer.workspace.config import JudgeSection, Price
from optimizer.workspace.workspace import Workspace


class _Scheduler:
    """Runs an `ItemJudge` over items: workers, call slots claimed strictly in item order, progress,
    the caller's early-stopping rule, and the stop on a budget refusal."""

    def __init__(
        self,
        judge: ItemJudge,
        *,
        concurrency: int,
        on_item: Callable[[ItemResult], bool] | None,
        progress: Callable[[ProgressSnapshot], None] | None,
        total: int,
    ) -> None:
        self.judge = judge
        self.concurrency = concurrency
        self.on_item = on_item
        self.progress = progress
        self.total = total
        # Items loaded and rendered at once: about one per core. With one per worker, every worker's
        # load job queued ahead of the first item's render and delayed the first calls (~0.15 s at
        # concurrency 16 on 2 cores); rendering is mostly GIL-bound, so more threads buy nothing.
        self._prep_slots = asyncio.Semaphore(max(2, os.cpu_count() or 2))
        self.results: dict[str, ItemResult] = {}
        self.stop: StopReason | None = None
        self.parse_errors = 0
        self.started = time.monotonic()
        self._workers: list[asyncio.Task[None]] = []
        # Items take their turn to claim call slots in the order given (see `_item`).
        self._turn = 0
        self._turns_done: set[int] = set()
        self._turn_cond = asyncio.Condition()
        self._halted = asyncio.Event()  # wakes a retry round's pause

    def _halt(self, stop: StopReason) -> None:
        if self.stop is None:
            self.stop = stop
            self.judge.stop_reason = stop.message
            self._halted.set()

    def interrupt(self, who: str) -> None:
        """Someone outside asked to stop (`StopRequest`): no new paid call starts from here on; the
        calls in flight finish and their items count."""
        self._halt(StopReason(StopKind.INTERRUPTED, f"interrupted ({who}): no new judge call was started"))

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` unless the evaluation is halted meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._halted.wait(), timeout=seconds)

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
                prepared = await self.judge.prepare(tid)
            if prepared.calls:
                # Paid calls take their semaphore slots strictly in item order.
                await self._wait_turn(position)
                for call in prepared.calls:
                    await self.judge.semaphore.acquire()
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
        return self.judge.assemble(prepared, outcomes, started)

    def _snapshot(self) -> ProgressSnapshot:
        judge = self.judge
        return ProgressSnapshot(
            done=len(self.results),
            total=self.total,
            infra_errors=sum(1 for r in self.results.values() if r.infra_error),
            parse_errors=self.parse_errors,
            calls_made=judge.usage.calls,
            cache_hits=judge.cache_hits,
            input_tokens=judge.usage.input_tokens,
            output_tokens=judge.usage.output_tokens,
            cost_usd=judge.usage.cost_usd,
            elapsed_s=time.monotonic() - self.started,
        )

    async def _worker(self, queue: deque[tuple[int, str]]) -> None:
        while queue and self.stop is None:
            position, tid = queue.popleft()
            try:
                result = await self._item(position, tid)
            except BudgetStop as exc:
                self._halt(StopReason(StopKind.BUDGET, str(exc)))
                return
            except Stopped:
                return
            if self.stop is not None and self.stop.kind is StopKind.EARLY_STOP:
                # Judged after the caller's rule was met: its calls are paid for, so they are cached and
                # counted, but the decision was made without this item, and its result is left out.
                return
            self.results[tid] = result
            if result.answer.status == "invalid":
                self.parse_errors += 1
            if self.progress is not None:
                self.progress(self._snapshot())
            if self.on_item is not None and self.on_item(result) and self.stop is None:
                # No new paid call starts from here on. Calls already in flight are not cancelled: the
                # provider bills an answered call whether or not anyone reads it, so each one finishes
                # into the cache and into this evaluation's spend and budget.
                self._halt(
                    StopReason(StopKind.EARLY_STOP, "stopped early: the caller's stopping rule was met")
                )
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
                    if not task.cancelled():
                        error = task.exception()
                        if error is not None:
                            raise error
        finally:
            for task in self._workers:
                task.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)


@dataclass
class PassOutcome:
    """What one evaluation pass produced: each judged item's result, why it stopped (None: it ran to
    the end), the parse failures among the results, and notes on the retries it made."""

    results: dict[str, ItemResult]
    stop: StopReason | None
    parse_errors: int
    retry_notes: list[str] = field(default_factory=list)


class EvaluationPass(Protocol):
    """One pass over a list of items: direct calls (`DirectPass`) or one batch (`BatchPass`).
    `evaluate_items` builds one and turns its `PassOutcome` into an `EvalRun`."""

    batch: bool

    async def run(self, item_ids: Sequence[str]) -> PassOutcome: ...


class DirectPass:
    """Direct calls through the `_Scheduler`: early stopping by the caller's ``on_item``, then up to
    ``retry_rounds`` more rounds for items whose calls still failed, round r after ``pause_s * r``."""

    batch = False

    def __init__(self, scheduler: _Scheduler, *, retry_rounds: int, pause_s: float) -> None:
        self.scheduler = scheduler
        self.retry_rounds = retry_rounds
        self.pause_s = pause_s

    async def run(self, item_ids: Sequence[str]) -> PassOutcome:
        sched = self.scheduler
        notes: list[str] = []
        await sched.run(item_ids)
        for round_no in range(1, self.retry_rounds + 1):
            failed = [t for t in item_ids if t in sched.results and sched.results[t].infra_error]
            if not failed or sched.stop is not None:
                break
            notes.append(f"round {round_no}: {len(failed)} item(s) with infrastructure errors judged again")
            await sched.pause(self.pause_s * round_no)
            if sched.stop is not None:
                break
            await sched.run(failed)
        return PassOutcome(sched.results, sched.stop, sched.parse_errors, notes)


class BatchPass:
    """The calls the cache does not hold as one batch through the provider's batch API
    (`optimizer.evaluation.batch.judge_batch_pass`): no early stopping, and the failed entries are
    re-submitted by the batch pass itself. ``scheduler`` only carries the progress snapshot."""

    batch = True

    def __init__(
        self, scheduler: _Scheduler, batching: BatchingProvider, options: BatchOptions, store: BatchStore
    ) -> None:
        self.scheduler = scheduler
        self.batching = batching
        self.options = options
        self.store = store

    async def run(self, item_ids: Sequence[str]) -> PassOutcome:
        sched = self.scheduler
        outcome = await judge_batch_pass(sched.judge, self.batching, item_ids, self.options, self.store)
        sched.results, sched.stop = outcome.results, outcome.stop
        sched.parse_errors = sum(1 for r in outcome.results.values() if r.answer.status == "invalid")
        if sched.progress is not None:
            sched.progress(sched._snapshot())
        return PassOutcome(sched.results, sched.stop, sched.parse_errors, list(outcome.notes))


@dataclass(frozen=True)
class PassOptions:
    """How `evaluate_items` runs a pass, beyond what it judges (all optional; see its docstring):
    the caller's hooks (``on_item``, ``progress``, ``stop``), the ``budget``, a ``provider`` and
    ``cache`` shared across evaluations, the rounds of re-judging infrastructure errors (the pause
    in seconds), and ``batch`` to send the calls through the provider's batch API."""

    on_item: Callable[[ItemResult], bool] | None = None
    budget: Budget | None = None
    progress: Callable[[ProgressSnapshot], None] | None = None
    provider: Provider | None = None
    cache: JudgeCache | None = None
    infra_retry_rounds: int = 0
    infra_retry_pause_s: float = 0.0
    batch: BatchOptions | None = None
    stop: StopRequest | None = None
    # Prices per model over the workspace's [prices] (a cascade's second judge brings its own).
    prices: Mapping[str, Price] | None = None


def sampling_from(prompts: PromptSet) -> Sampling:
    """The judge's `Sampling` from the prompt set's ``judge.toml`` settings."""
    return prompts.settings.sampling()


async def evaluate_items(
    ws: Workspace,
    split: Split,
    prompts: PromptSet,
    judge: JudgeSection,
    *,
    item_ids: Sequence[str],
    replicates: int,
    first_replicate: int = 0,
    options: PassOptions | None = None,
) -> EvalRun:
    """Judge ``item_ids`` of ``split`` with ``prompts``; ``replicates`` calls per item, replicate
    indices ``first_replicate`` onwards (a re-judging pass asks for the judgements after a first
    pass's: each index is its own cache entry, so a judgement is paid once whoever asks for it).

    ``options`` (`PassOptions`): ``provider``/``cache`` default to `make_provider(judge)` and the
    workspace cache, both closed at the end; pass your own to share them across evaluations (then
    you close them). ``on_item`` is called as each item completes; returning True starts no more
    paid calls (calls already in flight finish into the cache and the spend, their items left out of
    the result) and no more items. A `UserError` from rendering or the provider stops everything and
    is raised as is. Items whose calls still failed after the SDK's retries are judged again in up
    to ``infra_retry_rounds`` more rounds, round r after a pause of ``infra_retry_pause_s * r``.

    ``batch``: send the calls the cache does not hold as one batch through the provider's batch API
    (`optimizer.evaluation.batch`; anthropic and openai, direct mode only) instead of direct calls —
    one pass, so a re-judging pass is its own call with its own ``item_ids``/``replicates``. Then
    ``on_item`` is never consulted (no early stopping inside a batch) and ``infra_retry_rounds`` is
    replaced by ``batch.retry_rounds`` follow-up batches of the failed entries alone.

    ``stop``: once requested, no new paid call starts (direct passes); the calls in flight finish, their
    items count, and the result's ``stop`` is `StopKind.INTERRUPTED` with the rest ``not_evaluated``.

    A cascade (judge.toml ``structure = "cascade"``) runs as two passes, `optimizer.evaluation.cascade`.
    """
    options = options if options is not None else PassOptions()
    if prompts.settings.structure == "cascade":
        later = dataclasses.replace(options, on_item=None)

        async def stage(
            stage_prompts: PromptSet,
            stage_judge: JudgeSection,
            ids: Sequence[str],
            provider: Provider | None,
            prices: Mapping[str, Price] | None,
        ) -> EvalRun:
            chosen = dataclasses.replace(later, provider=provider or later.provider, prices=prices)
            return await evaluate_single(
                ws, split, stage_prompts, stage_judge,
                item_ids=ids, replicates=replicates, first_replicate=first_replicate, options=chosen,
            )  # fmt: skip

        return await evaluate_cascade(
            prompts, judge, item_ids, stage, on_item=options.on_item, batch=options.batch is not None
        )
    return await evaluate_single(
        ws, split, prompts, judge,
        item_ids=item_ids, replicates=replicates, first_replicate=first_replicate, options=options,
    )  # fmt: skip


async def evaluate_single(
    ws: Workspace,
    split: Split,
    prompts: PromptSet,
    judge: JudgeSection,
    *,
    item_ids: Sequence[str],
    replicates: int,
    first_replicate: int,
    options: PassOptions,
) -> EvalRun:
    """One judge's pass (`evaluate_items` without the cascade: each of a cascade's stages is one)."""
    budget, batch, stop = options.budget, options.batch, options.stop
    provider, cache = options.provider, options.cache
    if replicates < 1:
        raise UserError(f"replicates must be at least 1 (got {replicates}); pass --replicates 1 or more")
    item_ids = list(item_ids)
    if len(set(item_ids)) != len(item_ids):
        raise ValueError("evaluate_items: duplicate trajectory ids in item_ids")
    own_provider = provider is None
    own_cache = cache is None
    if provider is None:
        from optimizer.judge.providers import make_provider

        provider = make_provider(judge, root=ws.root)
    started = time.monotonic()
    try:
        traits = provider.traits
        if prompts.settings.mode == "agentic" and not traits.tool_use:
            raise UserError(
                f'judge.toml sets mode = "agentic", which needs a provider that can use tools (anthropic or '
                f'openai); the {provider.name} provider supports mode = "direct" only: set mode = "direct"'
            )
        batching: BatchingProvider | None = None
        if batch is not None:
            batching = batching_provider(provider, prompts.settings.mode)
        refusal = judge_refusal(prompts, provider, batch=batch is not None)
        if refusal is not None:
            raise UserError(refusal)
        if cache is None:
            cache = JudgeCache(ws.cache_path)
        sampling = sampling_from(prompts)
        prices = {**ws.config.prices, **(options.prices or {})}
        # A provider that runs one call at a time gets one call slot: calls queued inside it would
        # still run (and be paid for) after an early stop.
        concurrency = min(judge.max_concurrency, traits.max_parallel_calls or judge.max_concurrency)
        retriever = memory_retriever(ws, split, prompts, provider)
        judge_items = ItemJudge(
            split,
            prompts,
            provider,
            cache,
            JudgeSetup(
                sampling=sampling,
                replicates=replicates,
                concurrency=concurrency,
                prices=prices,
                budget=budget,
                image_cache_dir=ws.experiments_dir / IMAGE_CACHE_DIRNAME,
                first_replicate=first_replicate,
                memory=retriever,
            ),
        )
        scheduler = _Scheduler(
            judge_items,
            concurrency=concurrency,
            on_item=options.on_item,
            progress=options.progress,
            total=len(item_ids),
        )
        if stop is not None:
            loop = asyncio.get_running_loop()

            def on_stop(who: str) -> None:
                # Thread-safe: the request may come from a signal handler or another thread.
                with contextlib.suppress(RuntimeError):  # the loop closed: this evaluation is over anyway
                    loop.call_soon_threadsafe(scheduler.interrupt, who)

            unsubscribe = stop.subscribe(on_stop)
        evaluation_pass: EvaluationPass
        if batch is not None and batching is not None:
            evaluation_pass = BatchPass(
                scheduler, batching, batch, batch.store if batch.store is not None else cache_store(cache)
            )
        else:
            evaluation_pass = DirectPass(
                scheduler, retry_rounds=options.infra_retry_rounds, pause_s=options.infra_retry_pause_s
            )
        try:
            outcome = await evaluation_pass.run(item_ids)
        finally:
            if stop is not None:
                unsubscribe()
        retried_notes = outcome.retry_notes
    finally:
        if own_cache and cache is not None:
            cache.close()
        if own_provider:
            await provider.aclose()
    items = [outcome.results[tid] for tid in item_ids if tid in outcome.results]
    not_evaluated = [tid for tid in item_ids if tid not in outcome.results]
    notes: list[str] = []
    if judge_items.text_only:
        notes.append(f"provider {provider.name} is text-only: screenshots were dropped from every request")
    if judge_items.agentic:
        reps = [r for item in items for r in item.replicates if r.infra_error is None]
        if reps:
            tools = Counter(str(t).split("(")[0] for r in reps for t in r.trace)
            used = ", ".join(f"{name} {n / len(reps):.1f}" for name, n in sorted(tools.items()))
            notes.append(
                f"agentic judge: {sum(r.turns for r in reps) / len(reps):.1f} model calls per verdict; "
                f"tool calls per verdict: {used or 'none'}"
            )
    notes += provider.run_notes()
    endpoints = provider.take_endpoint_pass() if isinstance(provider, EndpointReporting) else {}
    reads = CacheReads(planned=judge_items.planned_cache_reads, billed=judge_items.usage.cache_read_tokens)
    if reads.warning() is not None:
        notes.append(str(reads.warning()))
    if outcome.stop is not None:
        notes.append(outcome.stop.message)
    if evaluation_pass.batch:
        notes += retried_notes
    elif retried_notes:
        still = sum(1 for item in items if item.infra_error)
        notes.append("; ".join(retried_notes) + f"; {still} still failing")
    return EvalRun(
        items=items,
        usage=judge_items.usage,
        cache_hits=judge_items.cache_hits,
        duration_s=time.monotonic() - started,
        stop=outcome.stop,
        notes=notes,
        not_evaluated=not_evaluated,
        item_ids=item_ids,
        cache_reads=reads,
        endpoints=endpoints,
        meta=EvalMeta(
            provider=provider.name,
            model=provider.model,
            judge_label=provider.traits.demo_label,
            judge_confinement=provider.traits.confinement,
            base_url=redacted_url(judge.base_url),
            base_urls=[redacted_url(url) for url in judge.base_urls] if judge.base_urls else None,
            text_only=judge_items.text_only,
            split=getattr(split, "name", None),
            split_fingerprint=getattr(split, "fingerprint", None),
            md_dir=str((split.sandbox_root / "data" / "markdowns").resolve()),
            prompt_hash=prompts.prompt_hash(),
            sampling=sampling.as_dict(),
            replicates=replicates,
            max_concurrency=judge.max_concurrency,
            timeout_s=judge.timeout_s,
            max_retries=judge.max_retries,
            settings=settings_record(prompts),
            budget_usd=None if budget is None else budget.max_usd,
            batch=batch is not None,
            memory=None if retriever is None else memory_record(retriever),
        ),
    )


def memory_retriever(ws: Workspace, split: Split, prompts: PromptSet, provider: Provider) -> Retriever | None:
    """The cross-fitted case retriever for judging ``split`` with ``prompts`` (None: ``memory = "off"``).

    Every case's ``source_items`` must be items of the dev split (``[workspace] dev_split``) and none an item of
    a held-out split being judged. Judging the dev split (or any split holding some source items), the split's
    items are dealt to pair-aware folds and no item gets a case whose sources share its fold (an item the case's
    text is about counts as a source: `optimizer.judge.provenance`, built once per split); a held-out split
    (`confirm`), which no case names, gets every case. Reads ids, instructions and screenshot folders only.
    """
    settings = prompts.settings
    if settings.memory == "off":
        return None
    refusal = memory_refusal(prompts, provider)
    if refusal is not None:
        raise UserError(refusal)
    cfg = ws.config.workspace
    dev_name = cfg.dev_split
    dev_ids = split.ids if split.name == dev_name else _dev_ids(ws, dev_name)
    held = split.name in cfg.heldout_splits
    check_sources(
        prompts.memory,
        dev_ids,
        dev_name,
        heldout_ids=split.ids if held else (),
        heldout_split=split.name if held else None,
        source=f"{prompts.source}/memory/cases.jsonl",
    )
    named = prompts.memory.source_items()
    folds = split_folds(split, settings.memory_folds) if named & set(split.ids) else None
    return Retriever(prompts.memory, settings.memory_k, folds, split_items(split))


def _dev_ids(ws: Workspace, name: str) -> list[str]:
    from optimizer.devset.split import open_split

    try:
        return open_split(ws, name).ids
    except UserError:
        raise UserError(
            f"the memory's cases name items of the dev split {name!r} ([workspace] dev_split), which "
            'is not imported; import it or set memory = "off"'
        ) from None


def memory_record(retriever: Retriever) -> dict[str, Any]:
    """What eval results record of the memory: k, the case ids, and the folds (k, digest, every item's fold)."""
    return {
        "k": retriever.k,
        "cases": [c.id for c in retriever.memory.cases],
        "principles": bool(retriever.memory.principles),
        # Withheld by content, beyond the declared sources: the judged items each case's text is about.
        "about": {case: sorted(items) for case, items in retriever.about.items() if items},
        "folds": None if retriever.folds is None else retriever.folds.as_record(),
    }


# ---------------------------------------------------------------------------------------------------
# Result files


# ---------------------------------------------------------------------------------------------------
# `judgeloop eval`
