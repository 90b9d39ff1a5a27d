"""Part 3 of `benchmarks/cache_cost.py`, warm-up: a trajectory-first first pass on a cold fake before and
after single-flight per item prefix, its paid cache writes per item and billed tokens."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._cache_common import FAST_POLLS, MODELS, MODES, PacedClock, build, prompt_sets
from optimizer.devset.split import Split
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.judge.providers import make_provider
from optimizer.judge.providers.pricing import price_for
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.fakecache import PromptCache
from tests.support.fakeserver import FakeLLMServer


@dataclass
class WriteFigures:
    writes: list[int]  # the fake's paid cache writes per item prefix, first pass
    write_tokens: int  # cache-write tokens billed
    read_tokens: int
    planned_reads: int
    equivalents: float  # billed input-token equivalents of the pass (as in part 1)
    warned: bool  # the pass's telemetry warning fired

    @property
    def per_item(self) -> float:
        return sum(self.writes) / len(self.writes) if self.writes else 0.0


@contextlib.contextmanager
def single_flight(on: bool) -> Any:
    """``on=False``: the engine as it was before single-flight (every prefix looks uncached to it)."""
    from optimizer.evaluation.judging import ItemJudge

    original = ItemJudge.prefix_key
    if not on:
        ItemJudge.prefix_key = lambda _self, _request: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        ItemJudge.prefix_key = original  # type: ignore[method-assign]


async def first_pass_writes(
    ws: Workspace, split: Split, wire: str, mode: str, replicates: int, *, new: bool
) -> WriteFigures:
    """One trajectory-first first pass with ``replicates`` calls per item on a cold fake (replies after
    50 ms, so an item's calls sent together overlap in the server, as they do at a provider). ``new``
    False: direct calls without single-flight (the engine before it), a batch with ``--batch-cold``
    (today's engine, so its telemetry plans the reads the batch then does not get)."""
    from tests.support.fakeserver import verdict_reply

    model = MODELS[wire]
    price = price_for(model)
    assert price is not None
    multiplier = price.batch_multiplier if mode == "batch" else 1.0
    cache_store = PromptCache(clock=PacedClock(0.01))
    with (
        FakeLLMServer(
            lambda _r: verdict_reply(delay_s=0.05), prompt_cache=cache_store, keep_alive=True, batch_polls=1
        ) as server,
        single_flight(new or mode == "batch"),
    ):
        base_url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        judge = JudgeSection(provider=wire, model=model, base_url=base_url, max_concurrency=16)  # type: ignore[arg-type]
        provider = make_provider(judge)
        cache = JudgeCache(ws.cache_path)
        try:
            [prompts] = prompt_sets(ws, "trajectory-first", 0)
            batch = dataclasses.replace(FAST_POLLS, cold=not new) if mode == "batch" else None
            run = await evaluate_items(
                ws,
                split,
                prompts,
                judge,
                item_ids=split.ids,
                replicates=replicates,
                options=PassOptions(provider=provider, cache=cache, batch=batch),
            )
        finally:
            cache.close()
            await provider.aclose()
    input_usd = run.cost_usd - run.output_tokens * price.output * multiplier / 1e6
    return WriteFigures(
        cache_store.write_counts(),
        run.cache_write_tokens,
        run.cache_read_tokens,
        run.cache_reads.planned,
        input_usd * 1e6 / price.input,
        run.cache_reads.low,
    )


def measure_writes(
    root: Path,
    n: int,
    steps: int,
    replicates: int,
    *,
    wires: tuple[str, ...] = tuple(MODELS),
    say: Any = print,
) -> dict[tuple[str, str, str], WriteFigures]:
    """(wire, mode, "old"/"new") -> the first pass's cache writes, before and after single-flight."""
    ws, split = build(root, n, steps)
    out: dict[tuple[str, str, str], WriteFigures] = {}
    for wire in wires:
        for mode in MODES:
            for variant in ("old", "new"):
                ws.cache_path.unlink(missing_ok=True)
                from optimizer.evaluation.warmup import WARM_PREFIXES

                WARM_PREFIXES.forget()  # each configuration starts cold
                out[(wire, mode, variant)] = asyncio.run(
                    first_pass_writes(ws, split, wire, mode, replicates, new=variant == "new")
                )
                say(
                    f"  warm-up {wire:9} {mode:6} {variant}: {out[(wire, mode, variant)].per_item:.2f} writes per item"
                )
    return out


def writes_table(results: dict[tuple[str, str, str], WriteFigures], n: int, replicates: int) -> str:
    lines = [
        f"cache writes per item, first pass, trajectory-first, --replicates {replicates}, {n} items; old = the "
        "calls of an item sent together (batch: --batch-cold), new = single-flight (batch: one direct warm-up "
        "per cold item, then the batch)",
        f"  {'wire':9} {'mode':6} {'writes/item old':>15} {'new':>5} {'write tok old':>13} {'new':>9} "
        f"{'read tok old':>12} {'new':>9} {'in-equiv old':>12} {'new':>9} {'warned old':>10} {'new':>5}",
    ]
    for wire in MODELS:
        for mode in MODES:
            if (wire, mode, "old") not in results:
                continue
            o, w = results[(wire, mode, "old")], results[(wire, mode, "new")]
            lines.append(
                f"  {wire:9} {mode:6} {o.per_item:>15.2f} {w.per_item:>5.2f} {o.write_tokens:>13,} "
                f"{w.write_tokens:>9,} {o.read_tokens:>12,} {w.read_tokens:>9,} {o.equivalents:>12,.0f} "
                f"{w.equivalents:>9,.0f} {o.warned!s:>10} {w.warned!s:>5}"
            )
    lines.append(
        '  (openai: no write surcharge; a "write" is a request that stored the prefix because it missed it)'
    )
    return "\n".join(lines)
