"""Judging one item: rendering (memoised), the judge-call cache, paid calls under the budget, and the
item's majority answer; the agentic conversation is `optimizer.evaluation.conversation`'s. `JudgeSetup`
(`optimizer.evaluation.prepared`) says how an `ItemJudge` judges; what judge.toml asks that a provider
cannot judge with is refused by `optimizer.evaluation.refusals`. Judge-input side: never reads labels."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import inspect
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.evaluation.budget import BudgetStop, estimate_cost_usd
from optimizer.evaluation.cache import JudgeCache, NewCall, cache_key, cached_usage, provider_endpoint
from optimizer.evaluation.conversation import Conversations
from optimizer.evaluation.prepared import JudgeSetup, PreparedItem
from optimizer.evaluation.refusals import judge_refusal
from optimizer.evaluation.results import ItemResult, ReplicateResult, parsed_result
from optimizer.evaluation.stopping import Stopped
from optimizer.evaluation.warmup import WARM_PREFIXES
from optimizer.judge.memory import Selection
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import (
    VERDICT_SCHEMA,
    InfrastructureError,
    JudgeRequest,
    Provider,
    ProviderReply,
    stable_json,
)
from optimizer.models import Trajectory, Verdict
from optimizer.stats.metrics import Answer

# Encoded screenshots shared across processes (see render.build_request's image_cache_dir).
IMAGE_CACHE_DIRNAME = "images"
# (event loop id, cache key) -> set when the call paying for that key ends (`ItemJudge._call`); per
# loop, as `PrefixWarmth`'s leaders.
_IN_FLIGHT: dict[tuple[int, str], asyncio.Event] = {}


def _majority(replicates: Sequence[ReplicateResult]) -> tuple[Answer, Verdict | None, bool]:
    """The scored answer, its representative verdict, and whether the replicates disagree."""
    from optimizer.judge.verdicts import majority

    chosen, unstable = majority([r.verdict for r in replicates])
    if chosen is None:
        return Answer(success=None, status="invalid"), None, unstable
    return Answer(success=chosen.success, mistake_type=chosen.mistake_type), chosen, unstable


class _Derivation:
    """One item's derived criteria, shared by its replicates: derived once, under the lock."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.result: ReplicateResult | None = None
        self.owner: int | None = None  # the replicate that made (or looked up) the derivation


class ItemJudge:
    """Judges one item at a time: renders it (or recalls its rendering), looks every replicate up in
    the cache, makes the missing calls (direct or agentic) under the budget, stores them in the cache
    and counts what they cost. Scheduling items belongs to `optimizer.evaluation.evaluator`.

    ``slots`` bounds the calls in flight (``concurrency``); a call releases its slot when it ends.
    Setting ``stop_reason`` makes every later paid call refuse to start. Direct calls on a cold
    cached prefix go one first (`optimizer.evaluation.warmup`): the others hand their slot back
    while they wait, so they re-claim one after later items' calls may have started.
    """

    def __init__(
        self, split: Split, prompts: PromptSet, provider: Provider, cache: JudgeCache, setup: JudgeSetup
    ) -> None:
        sampling, replicates, budget = setup.sampling, setup.replicates, setup.budget
        self.split = split
        # Judging with memory: each item's principles and cross-fitted cases (None: memory off).
        self.memory = setup.memory
        self.prompts = prompts
        self.provider = provider
        self.cache = cache
        self.endpoint = provider_endpoint(provider)  # a second server under the same model name: other keys
        self.sampling = sampling
        self.replicates = replicates
        # Replicate indices first_replicate … first_replicate + replicates − 1: a re-judging pass
        # asks for the judgements after the first pass's, each its own cache entry.
        self.indices = range(setup.first_replicate, setup.first_replicate + replicates)
        self.prices = setup.prices
        self.budget = budget
        self.text_only = provider.traits.text_only
        self.agentic = prompts.settings.mode == "agentic"
        self.token_budget = prompts.settings.token_budget
        # A provider may prefer a layout over judge.toml's (the local judge: see its traits).
        self.layout: str | None = provider.traits.layout
        self.image_cache_dir = setup.image_cache_dir
        # A harness judge reads the trajectory as files in its sandbox (`optimizer.judge.harness`).
        self.sandbox = provider.traits.sandbox
        traits = provider.traits
        if budget is not None and traits.priced_per_call and traits.call_price_usd is None:
            from optimizer.judge.harness import BUDGET_REFUSAL

            raise UserError(BUDGET_REFUSAL.format(name=provider.name))
        refusal = judge_refusal(prompts, provider)
        if refusal is not None:
            raise UserError(refusal)
        self.panel = prompts.settings.panel
        self.member_labels: tuple[str, ...] = tuple(self.panel.labels()) if self.panel is not None else ()
        self.member_prompts = [prompts.for_member(m) for m in range(len(self.member_labels))]
        # criteria / review: several calls per verdict, each cached on its own (`_structured_call`).
        self.structured = prompts.settings.structure != "single" or prompts.settings.review != "off"
        self.semaphore = asyncio.Semaphore(setup.concurrency)
        self.stop_reason: str | None = None
        self.usage = Usage()  # the paid calls made so far
        self.cache_hits = 0
        self.warmth = setup.warmth if setup.warmth is not None else WARM_PREFIXES
        # Cache-read tokens the paid calls on cached prefixes planned to be billed (warmup.CacheReads).
        self.planned_cache_reads = 0
        # The agentic judge's conversations (`optimizer.evaluation.conversation`).
        self.conversations = Conversations(self)

    # -- one call --------------------------------------------------------------------------------
    def member_tag(self, member: int | None) -> str | None:
        """What the cache key of panel member ``member``'s calls holds (None: the single judge)."""
        return None if member is None else f"{member}:{self.member_labels[member]}"

    def _lookup(
        self, fingerprint: str, index: int, member: int | None = None
    ) -> tuple[str, ReplicateResult | None]:
        """The cache key of replicate ``index`` (of panel member ``member``) and its cached result,
        if any (cached calls are free)."""

        key = cache_key(
            provider=self.provider.name,
            model=self.provider.model,
            sampling=self.sampling,
            schema=VERDICT_SCHEMA,
            request=fingerprint,
            replicate=index,
            endpoint=self.endpoint,
            member=self.member_tag(member),
        )
        hit = self.cache.get(key)
        if hit is None:
            return key, None
        result = parsed_result(
            index, key, True, hit.reply_text, hit.reply_model, cached_usage(hit), hit.duration_s
        )
        return key, result if member is None else dataclasses.replace(
            result, member=self.member_labels[member]
        )

    def reserve(self, estimate: float, basis: str = "") -> float:
        """Reserve ``estimate`` dollars of the budget for the next call, or stop: it would cross it.
        ``basis`` says where the figure comes from, in the stop's message (default: an estimate)."""
        assert self.budget is not None
        if not self.budget.reserve(estimate):
            figure = f"up to ${estimate:.4f}, {basis}" if basis else f"estimated ${estimate:.4f}"
            raise BudgetStop(
                f"budget of ${self.budget.max_usd:.2f} reached: the next call ({figure}) would cross it "
                f"(${self.budget.spent_usd:.4f} spent)"
            )
        return estimate

    async def _reserve_call(self, request: JudgeRequest) -> tuple[float, bool]:
        """Reserve the next call's dollars: a harness's call ceiling (waiting, while its first cost
        report is due, for it), a per-call price, or the token estimate. Also whether this call goes
        alone to prove the ceiling (then `CallCeiling.done` is due when it ends)."""
        traits = self.provider.traits
        ceiling = traits.call_ceiling
        if ceiling is None:
            return self.reserve(
                traits.call_price_usd or 0.0
                if traits.priced_per_call
                else estimate_cost_usd(request, self.sampling, self.provider.model, self.prices)
            ), False
        lead = await ceiling.turn()
        try:
            if self.stop_reason is not None:
                raise Stopped
            return self.reserve(ceiling.usd, ceiling.describe()), lead
        except BaseException:
            if lead:
                ceiling.done()
            raise

    def prefix_key(self, request: JudgeRequest) -> str | None:
        """The key of ``request``'s cached trajectory prefix (provider, endpoint, model and the
        prefix's content), or None when the provider caches no prefix or the layout has none."""
        if not self.provider.traits.prompt_cache or not request.cache_prefix:
            return None
        head = JudgeRequest(system=request.system, parts=request.parts[: request.cache_prefix])
        material = stable_json([self.provider.name, self.endpoint, self.provider.model, head.fingerprint()])
        return hashlib.sha256(material.encode()).hexdigest()

    async def _member_call(
        self, request: JudgeRequest, fingerprint: str, key: str, index: int, member: int
    ) -> ReplicateResult:
        """One paid call of panel member ``member`` (see `_call`), labelled with the member."""
        result = await self._call(request, fingerprint, key, index)
        return dataclasses.replace(result, member=self.member_labels[member])

    async def _call(
        self,
        request: JudgeRequest,
        fingerprint: str,
        key: str,
        index: int,
        schema: dict[str, Any] = VERDICT_SCHEMA,
    ) -> ReplicateResult:
        """One paid call (`_paid_call`), or none: while another evaluation in this process pays for the
        same key (a wave sibling's identical call, such as the incumbent's re-judging of an item both
        candidates disagree on), this one waits without its slot and then takes the answer from the
        cache, a hit. The caller holds a semaphore slot; it is released here, whatever happens."""
        slot = (id(asyncio.get_running_loop()), key)
        while True:
            # (Also answered since this item was looked up, by a call that has ended.)
            answered = self.recall(key, index)
            if answered is not None:
                self.semaphore.release()
                return answered
            flight = _IN_FLIGHT.get(slot)
            if flight is None:
                break
            self.semaphore.release()  # (cancelled while it waits, it holds no slot: nothing to give back)
            await flight.wait()
            await self.semaphore.acquire()
        _IN_FLIGHT[slot] = asyncio.Event()
        try:
            return await self._paid_call(request, fingerprint, key, index, schema)
        finally:
            _IN_FLIGHT.pop(slot).set()

    async def _paid_call(
        self,
        request: JudgeRequest,
        fingerprint: str,
        key: str,
        index: int,
        schema: dict[str, Any],
    ) -> ReplicateResult:
        """One paid call. The caller holds a semaphore slot; it is released here, whatever happens.
        On a cold cached prefix the first call goes alone; the others give their slot back until
        its response has returned (`optimizer.evaluation.warmup`)."""

        estimate = 0.0
        reserved = proving = False  # proving: this call goes alone to prove a harness's cost ceiling
        holding = True
        prefix = self.prefix_key(request)
        lead = answered = False  # lead: this call goes first on a cold cached prefix
        try:
            if self.stop_reason is not None:
                raise Stopped
            lead = prefix is not None and self.warmth.try_lead(prefix)
            if prefix is not None and not lead and not self.warmth.is_warm(prefix):
                # Another call is writing this prefix: wait for its answer without holding a slot.
                self.semaphore.release()
                holding = False
                lead = await self.warmth.wait_turn(prefix)
                await self.semaphore.acquire()
                holding = True
                if self.stop_reason is not None:
                    raise Stopped
            if self.budget is not None:
                estimate, proving = await self._reserve_call(request)
                reserved = True
            started = time.monotonic()
            try:
                reply = await self.provider.complete(request, self.sampling, schema)
                answered = True
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
            if proving and self.provider.traits.call_ceiling is not None:
                self.provider.traits.call_ceiling.done()
            if lead and prefix is not None:
                self.warmth.done(prefix, answered=answered, ttl=request.cache_ttl)
            if holding:
                self.semaphore.release()
        if prefix is not None and not lead:  # the plan: this call reads the prefix another one wrote
            from optimizer.judge.estimate import request_token_split

            self.planned_cache_reads += request_token_split(request)[0]
        usage = self.account(reply, reply.text, estimate, key, index, fingerprint, duration)
        return parsed_result(index, key, False, reply.text, reply.model, usage, duration)

    def account_batch_reply(
        self,
        reply: ProviderReply,
        estimate: float,
        key: str,
        index: int,
        fingerprint: str,
        duration: float,
        *,
        discounted: bool = True,
    ) -> ReplicateResult:
        """A call answered through a batch: priced at the batch rate (``discounted``; else as a direct call,
        as `vllm run-batch` is), settled against ``estimate``, counted and cached under ``key`` exactly as
        a direct call would be; its replicate result."""
        usage = self.account(reply, reply.text, estimate, key, index, fingerprint, duration, batch=discounted)
        return parsed_result(index, key, False, reply.text, reply.model, usage, duration)

    def recall(self, key: str, index: int) -> ReplicateResult | None:
        """Replicate ``index`` under ``key`` as a cache hit (free), if the cache holds it now."""
        hit = self.cache.get(key)
        if hit is None:
            return None
        return parsed_result(
            index, key, True, hit.reply_text, hit.reply_model, cached_usage(hit), hit.duration_s
        )

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
    ) -> Usage:
        """Settle the budget, count one paid call and store it in the cache; return its usage
        (priced at the batch rate when it went through a batch API, ``batch``)."""
        usage = Usage.of(reply, self.prices, batch=batch)
        cost = usage.cost_usd
        if self.budget is not None:
            self.budget.settle(estimate, cost)
        self.usage += usage
        self.cache.put(
            key,
            NewCall(
                provider=self.provider.name,
                model=self.provider.model,
                replicate=index,
                request_fingerprint=fingerprint,
                reply_text=text,
                reply_model=reply.model,
                input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens,
                cache_read_tokens=reply.cache_read_tokens,
                cache_write_tokens=reply.cache_write_tokens,
                cost_usd=cost,
                duration_s=duration,
            ),
        )
        return usage

    async def prepare(self, tid: str) -> PreparedItem:
        """Load and render ``tid`` (or recall its rendering) and look its replicates up in the cache."""
        if self.agentic:
            agentic = await asyncio.to_thread(self.conversations.task, tid)
            # A conversation looks up each of its turns in the cache itself (`Conversations.converse`).
            looked_up: list[tuple[str, ReplicateResult | None]] = [
                (agentic.fingerprint, None) for _ in self.indices
            ]
            calls = [functools.partial(self.conversations.converse, agentic, i) for i in self.indices]
            return PreparedItem(tid, agentic.notes, looked_up, calls)
        if self.panel is not None:
            return await self._prepare_panel(tid)
        if self.structured:
            traj, _ = await asyncio.to_thread(self._load, tid)
            request = await asyncio.to_thread(self._render, traj)
            shared = _Derivation()
            # Each replicate looks its calls up in the cache itself (`_structured_call`).
            return PreparedItem(
                tid,
                request.notes,
                [(request.fingerprint(), None) for _ in self.indices],
                [functools.partial(self._structured_call, traj, request, i, shared) for i in self.indices],
            )
        request, fingerprint, notes, looked_up = await self._direct_lookups(tid)
        calls = [
            functools.partial(self._call, request, fingerprint, key, i)
            for i, (key, hit) in zip(self.indices, looked_up, strict=True)
            if hit is None
        ]
        return PreparedItem(tid, notes, looked_up, calls, request, fingerprint)

    async def _prepare_panel(self, tid: str) -> PreparedItem:
        """A panel's item: every member's replicates looked up (member-major) and the missing calls.
        Under trajectory-first the members' requests differ only after the cache breakpoint, so they
        share one cached prefix and its single-flight (the first call writes it, the rest read it)."""
        looked_up: list[tuple[str, ReplicateResult | None]] = []
        calls: list[Callable[[], Coroutine[Any, Any, ReplicateResult]]] = []
        notes: tuple[str, ...] = ()
        for member in range(len(self.member_labels)):
            request, fingerprint, member_notes, lookups = await self._direct_lookups(tid, member)
            notes = notes or member_notes
            looked_up += lookups
            calls += [
                functools.partial(self._member_call, request, fingerprint, key, i, member)
                for i, (key, hit) in zip(self.indices, lookups, strict=True)
                if hit is None
            ]
        return PreparedItem(tid, notes, looked_up, calls, members=self.member_labels)

    def _panel_replicates(self, item: PreparedItem, calls: list[ReplicateResult]) -> list[ReplicateResult]:
        """One replicate per index from the members' calls (member-major in ``calls``): the vote."""
        from optimizer.judge.verdicts import panel_vote

        assert self.panel is not None
        n = len(self.indices)
        out: list[ReplicateResult] = []
        for j, index in enumerate(self.indices):
            members = tuple(calls[m * n + j] for m in range(len(item.members)))
            failed = next((r for r in members if r.infra_error is not None), None)
            verdict = (
                None
                if failed is not None
                else panel_vote(
                    item.members, [r.verdict for r in members], self.panel.required(), self.panel.vote
                )
            )
            parse_error = None
            if failed is None and verdict is None:
                parse_error = "no panel member's reply parsed: " + "; ".join(
                    f"{r.member}: {r.parse_error}" for r in members
                )
            out.append(
                ReplicateResult(
                    index=index,
                    cache_key=hashlib.sha256("\0".join(r.cache_key for r in members).encode()).hexdigest(),
                    cached=all(r.cached for r in members),
                    reply_text=None
                    if verdict is not None
                    else "\n\n".join(f"[{r.member}] {r.reply_text or ''}" for r in members),
                    verdict=verdict,
                    parse_error=parse_error,
                    model=members[0].model,
                    usage=sum((r.usage for r in members), Usage()),
                    duration_s=max(r.duration_s for r in members),
                    infra_error=None if failed is None else f"member {failed.member}: {failed.infra_error}",
                    members=members,
                )
            )
        return out

    def assemble(
        self, item: PreparedItem, outcomes: Sequence[ReplicateResult | BaseException], started: float
    ) -> ItemResult:
        """The item's result from its cached replicates and the outcomes of its calls (in order).

        Every sibling call has finished (a successful one is cached) before anything is raised: a
        bug first, then a budget or stop signal.
        """
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, BudgetStop | Stopped):
                raise outcome
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        fresh = iter(o for o in outcomes if isinstance(o, ReplicateResult))
        reps = [hit if hit is not None else next(fresh) for _, hit in item.looked_up]
        self.cache_hits += sum(1 for r in reps if r.cached)
        if item.members:
            reps = self._panel_replicates(item, reps)
        tid, notes = item.trajectory_id, item.notes
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

    # -- criteria and review (several calls per verdict) ----------------------------------------------
    async def _sub_call(
        self, request: JudgeRequest, schema: dict[str, Any], tag: str | None, index: int, holding: bool
    ) -> ReplicateResult:
        """One call of a structured verdict, from the cache when it holds it. ``tag`` None: keyed
        exactly as a single-call verdict (so review = "success" reuses the verdicts cached without it).
        ``holding``: whether the caller holds a slot; it is released here either way."""
        from optimizer.judge.criteria import STRUCTURE_VERSION

        fingerprint = request.fingerprint()
        key = cache_key(
            provider=self.provider.name,
            model=self.provider.model,
            sampling=self.sampling,
            schema=schema if tag is None else {"structure": tag, "v": STRUCTURE_VERSION, "schema": schema},
            request=fingerprint,
            replicate=index,
            endpoint=self.endpoint,
        )
        hit = self.cache.get(key)
        if hit is not None:
            if holding:
                self.semaphore.release()
            return parsed_result(
                index, key, True, hit.reply_text, hit.reply_model, cached_usage(hit), hit.duration_s
            )
        if not holding:
            await self.semaphore.acquire()
        return await self._call(request, fingerprint, key, index, schema)

    async def _structured_call(
        self, traj: Trajectory, request: JudgeRequest, index: int, shared: _Derivation
    ) -> ReplicateResult:
        """Replicate ``index`` of a criteria and/or reviewed verdict (see `optimizer.judge.criteria`):
        derive the criteria (once per item, from the instruction alone), check them (or make the
        single call), then review a success. The caller holds a slot; it is released here."""
        from optimizer.judge import criteria as crit
        from optimizer.judge.verdicts import parse_verdict

        settings = self.prompts.settings
        n_steps = len(traj.steps)
        holding = True
        done: list[ReplicateResult] = []

        def result(last: ReplicateResult, **update: Any) -> ReplicateResult:
            usage = sum((r.usage for r in done), Usage())
            return dataclasses.replace(
                last,
                cached=all(r.cached for r in done),
                usage=usage,
                duration_s=sum(r.duration_s for r in done),
                **update,
            )

        try:
            derived: tuple[crit.Criterion, ...] | None = None
            if settings.structure == "criteria":
                async with shared.lock:
                    if shared.result is None:
                        ask = crit.derive_request(self.prompts, traj.task.instruction, traj.trajectory_id)
                        # The slot passes to the call, which releases it whatever happens.
                        slot, holding = holding, False
                        # Cached per item: the id is in the key, never in what the model reads.
                        shared.result = await self._sub_call(
                            ask, crit.DERIVE_SCHEMA, f"derive {traj.trajectory_id}", 0, slot
                        )
                        shared.owner = index
                derivation = shared.result
                if shared.owner == index:  # the item's usage counts the shared derivation once
                    done.append(derivation)
                if derivation.infra_error is not None:
                    return result(derivation, index=index, verdict=None, parse_error=None)
                derived, error = crit.parse_derived(derivation.reply_text or "")
                if error is not None:
                    return result(
                        derivation, index=index, verdict=None, parse_error=f"criteria derivation: {error}"
                    )
                check = await asyncio.to_thread(
                    functools.partial(self._render, traj, extra=crit.check_instructions(derived))
                )
                slot, holding = holding, False
                first = await self._sub_call(check, crit.CHECK_SCHEMA, "check", index, slot)
            else:
                slot, holding = holding, False
                first = await self._sub_call(request, VERDICT_SCHEMA, None, index, slot)
            done.append(first)
            if first.infra_error is not None:
                return result(first)
            parsed = parse_verdict(first.reply_text or "", n_steps=n_steps, criteria=derived)
            verdict = parsed.verdict
            if verdict is None or settings.review != "success" or not verdict.success:
                return result(first, verdict=verdict, parse_error=parsed.error)
            shown = {
                k: v for k, v in verdict.model_dump().items() if k in ("success", "reasoning", "criteria")
            }
            ask_review = await asyncio.to_thread(
                functools.partial(self._render, traj, replace=crit.review_instructions(self.prompts, shown))
            )
            reviewed = await self._sub_call(ask_review, crit.REVIEW_SCHEMA, "review", index, False)
            done.append(reviewed)
            if reviewed.infra_error is not None:
                return result(reviewed)
            review = crit.parse_review(reviewed.reply_text or "", n_steps)
            data = verdict.model_dump()
            data["review"] = review.as_json()
            if review.applied:
                data["first_verdict"] = {
                    k: data[k] for k in ("success", "reasoning", "confidence", "mistake_type")
                }
                data.update(success=False, mistake_type=review.mistake_type)
            return result(first, verdict=Verdict.model_validate(data), parse_error=None)
        finally:
            if holding:
                self.semaphore.release()

    # -- one item --------------------------------------------------------------------------------
    def _load(self, tid: str, member: int | None = None) -> tuple[Trajectory, str | None]:
        """Load the trajectory and compute its render-memo key (None when the split cannot say); a
        panel member's rendering has its own key."""
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
            "code": render_code_version(),
            "prompts": self.prompts.prompt_hash(),
            "text_only": self.text_only,
            "token_budget": self.token_budget,
            "layout": self.layout,
            "sandbox": self.sandbox,
            "trajectory": hashlib.sha256(Path(json_path(tid)).read_bytes()).hexdigest(),
            "screens": screens,
        }
        if self.memory is not None:
            # The cases an item gets depend on its split's folds, not only on its own files.
            chosen = self._memory_for(traj)
            payload["memory"] = [chosen.principles, [c.id for c in chosen.cases], chosen.fold]
        if member is not None:
            payload["member"] = self.member_tag(member)
        return traj, hashlib.sha256(stable_json(payload).encode()).hexdigest()

    def _memory_for(self, traj: Trajectory) -> Selection:
        assert self.memory is not None
        return self.memory.select(traj.trajectory_id, traj.task.instruction)

    def _render_for(self, traj: Trajectory, member: int | None) -> JudgeRequest:
        """`_render`, or panel member ``member``'s rendering (its instructions after the trajectory)."""
        return self._render(traj) if member is None else self._render(traj, self.member_prompts[member])

    def _render(
        self,
        traj: Trajectory,
        member_prompts: PromptSet | None = None,
        *,
        extra: str = "",
        replace: str | None = None,
    ) -> JudgeRequest:
        from optimizer.judge.render import RenderOptions, build_request

        prompts = self.prompts if member_prompts is None else member_prompts
        if self.sandbox is not None:
            from optimizer.judge.harness import sandbox_request

            return sandbox_request(traj, self.split, self.prompts, self.sandbox)

        chosen = self._memory_for(traj) if self.memory is not None else None
        request = build_request(
            traj,
            self.split,
            prompts,
            options=RenderOptions(
                text_only=self.text_only,
                token_budget=self.token_budget,
                image_cache_dir=self.image_cache_dir,
                layout=self.layout,
                memory="" if chosen is None else chosen.block(),
                extra_instructions=extra,
                replace_instructions=replace,
            ),
        )
        if chosen is None:
            return request
        return dataclasses.replace(request, notes=(*request.notes, chosen.note()))

    async def _direct_lookups(
        self, tid: str, member: int | None = None
    ) -> tuple[Any, str, tuple[str, ...], list[tuple[str, ReplicateResult | None]]]:
        """Render ``tid`` (or recall its rendering) and look its replicates up in the cache:
        (request — None when every replicate is cached and the memo was enough —, fingerprint,
        notes, [(cache key, cached result or None)] per replicate)."""
        traj, memo_key = await asyncio.to_thread(self._load, tid, member)
        # A fully cached item whose rendering inputs are unchanged needs no rendering at all.
        memo = self.cache.get_request(memo_key) if memo_key is not None else None
        request: JudgeRequest | None = None
        if memo is None:
            request = await asyncio.to_thread(self._render_for, traj, member)
            fingerprint, notes = request.fingerprint(), request.notes
            if memo_key is not None:
                self.cache.put_request(memo_key, fingerprint, notes)
        else:
            fingerprint, notes = memo
        looked_up = [self._lookup(fingerprint, i, member) for i in self.indices]
        if request is None and any(hit is None for _, hit in looked_up):
            request = await asyncio.to_thread(self._render_for, traj, member)
            if request.fingerprint() != fingerprint:  # a stale memo: trust the rendering
                fingerprint, notes = request.fingerprint(), request.notes
                if memo_key is not None:
                    self.cache.put_request(memo_key, fingerprint, notes)
                looked_up = [self._lookup(fingerprint, i, member) for i in self.indices]
        return request, fingerprint, notes, looked_up


@functools.cache
def render_code_version() -> str:
    """A hash of the source of the modules that turn a trajectory into a request; part of the
    render-memo key, so a judgeloop upgrade that renders differently never reuses an old request's
    fingerprint. The modules are imported, not named as files: a module that moves is still hashed,
    and a source file that cannot be read is an error, never a silently constant hash."""
    from optimizer import models
    from optimizer.devset import markdown, split
    from optimizer.judge import harness, memory, prompts, render, types

    h = hashlib.sha256()
    for module in (render, prompts, markdown, types, models, split, harness, memory):
        source = inspect.getsourcefile(module)
        if source is None:
            raise RuntimeError(f"cannot hash the render code: {module.__name__} has no source file")
        h.update(module.__name__.encode() + b"\0" + Path(source).read_bytes())
    return h.hexdigest()
