"""What prompt caching and batch evaluation save per candidate: old layout (rubric-first) vs new
(trajectory-first), direct calls vs one batch per pass, both wires (a script that prints figures).

Part 1, billing. Builds a 162-item split of long items (STEPS steps, a screenshot per step: ~26k input
tokens each, like AH-D's ~33k), then for each wire (Anthropic Messages with claude-sonnet-4-5, OpenAI
Chat Completions with gpt-5), each layout and each mode runs a baseline and 10 candidates — each
candidate adds one rubric rule — with `evaluate_items` through the real SDK against the fake server
with its prompt cache on (`tests.support.fakecache.PromptCache`: breakpoints, longest cached prefix, minimum
length and TTL for Anthropic; 128-token prefix matching and prompt_cache_key routing for OpenAI).
``direct``: one request per item. ``batch``: each pass is one batch (Anthropic Message Batches; OpenAI
Batch with a JSONL input file), `evaluate_items(batch=...)`. The fake runs batch entries through the
same caching rules as direct calls, all priced before any of their writes becomes readable (an entry
is readable only once the writing response has begun; a batch's entries run together). Anthropic applies prompt caching to Message
Batches requests on a best-effort basis (a batch's requests run concurrently and in any order, so a hit
is not guaranteed; its docs advise the 1-hour TTL for batches, and most batches end within the hour), so
the batch figures are what a batch reaches when the cache serves it as it serves direct calls, not a
promise. The fake's clock moves MINUTES_PER_CANDIDATE simulated minutes per candidate (a real judge
takes that long over 162 items), spread over its calls, so TTLs and OpenAI's per-minute routing see a
realistic pace in both modes.

Billed input-token equivalents of a candidate = what judgeloop accounted for its judge calls
(`EvalRun.cost_usd`, from the usage the SDK parsed, at the batch price for a batch), minus the output,
divided by the model's direct input price: uncached input counts 1, a cache read 0.1, a 5-minute write
1.25, a 1-hour write 2, each times 0.5 in a batch (`Price.batch`; on Anthropic cache prices stack with
it). Each cell's ratio is to today's: rubric-first, direct.

Part 2, decisions. The real loop (`optimizer.loop.session.start_run`, strategy ``library``, the
configured adaptive policy, patience = the candidates asked for) twice on copies of one sample
workspace (a 32-item dev split), once direct and once with ``RunOptions(batch=True)`` (what
``judgeloop run --batch`` passes), per wire, against the fake with a deterministic judge (`tests.support.loop.FakeJudge`: the verdict is a function of the item
and the library entries in the rubric). Prints every candidate's decision and the judge calls each
made, whether every decision is identical, and whether every verdict both runs recorded is (a direct
candidate can stop early, judging fewer items, though calls already in flight still finish and are paid;
a batch judges every item).

Each batch configuration of part 1 ends with a direct evaluation of its last prompts: it must make no
call (the batch's answers sit in the judge-call cache under the keys direct calls use).

Part 3, warm-up. One trajectory-first first pass with ``--replicates`` (3) calls per item on a cold
fake, per wire and mode, old (an item's calls sent together; a batch as ``--batch-cold``) vs new
(single-flight per item prefix; a batch after one direct warm-up per cold item): the fake's paid cache
writes per item, the write and read tokens billed, the pass's input-token equivalents, and whether
the telemetry warning (billed reads below 80% of planned) fired.

Part 4, cost per verdict per structure. The judge as a single call, and as a panel of 2 and of 3
(judge.toml ``[panel] members = N``, issue 19), trajectory-first, direct calls, per wire: a first pass
on a cold fake and ``--candidates`` candidates (one rubric rule each), each as in part 1. Per
structure: judge calls per verdict, the fake's paid cache writes per item on the first pass (a
panel's members share the item's prefix: one write), and dollars per verdict (`EvalRun.cost_usd`
over the items, output included) on the first pass and per candidate, with the ratio to the single
judge. The structures priced are `structures()`'s: also ``structure = "criteria"`` (a derivation per
item, cached per item, then a check), ``review = "success"`` (a review call on each success verdict;
`structure_judge` finds half the items successes) and both; "cand calls" is calls per verdict of a
candidate pass (the criteria derivation is then served by judgeloop's cache).

Part 1 is here; parts 2-4 are `benchmarks/_cache_loop.py`, `_cache_warmup.py` and `_cache_structures.py`,
what the parts share `_cache_common.py`.

Run:  .venv/bin/python benchmarks/cache_cost.py [--quick] [--n 162] [--steps 100] [--candidates 10]
      [--loop-candidates 10] [--replicates 3] [--warmup-only] [--structures-only] [--structures NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._cache_common import (
    FAST_POLLS,
    LAYOUTS,
    MINUTES_PER_CANDIDATE,
    MODELS,
    MODES,
    TODAY,
    PacedClock,
    build,
    prompt_sets,
)
from benchmarks._cache_loop import compare_loops, decision_table
from benchmarks._cache_structures import measure_structures, structures_table
from benchmarks._cache_warmup import measure_writes, writes_table
from benchmarks._figures import with_docs_figure
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
class Figures:
    per_candidate: list[float]  # billed input-token equivalents of each candidate after the baseline
    baseline: float
    seconds: float
    batches: int = 0  # batches the fake server created (batch mode: one per pass)
    calls_after: int = 0  # batch mode: calls a direct evaluation of the last prompts made afterwards

    @property
    def mean(self) -> float:
        return sum(self.per_candidate) / len(self.per_candidate)


# --- part 1: billing ------------------------------------------------------------------------------


async def evaluate_layout(
    ws: Workspace, split: Split, wire: str, layout: str, candidates: int, mode: str
) -> Figures:
    """Baseline + candidates through the real SDK against a fresh fake with its prompt cache on;
    ``mode`` "batch" sends each pass as one batch, billed at the batch price."""
    assert mode in MODES
    n = len(split.ids)
    clock = PacedClock(MINUTES_PER_CANDIDATE * 60.0 / n)
    model = MODELS[wire]
    price = price_for(model)
    assert price is not None
    multiplier = price.batch_multiplier if mode == "batch" else 1.0
    equivalents: list[float] = []
    started = time.perf_counter()
    with FakeLLMServer(prompt_cache=PromptCache(clock=clock), keep_alive=True, batch_polls=1) as server:
        base_url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        judge = JudgeSection(provider=wire, model=model, base_url=base_url, max_concurrency=16)  # type: ignore[arg-type]
        provider = make_provider(judge)
        cache = JudgeCache(ws.cache_path)
        try:
            passes = prompt_sets(ws, layout, candidates)
            for prompts in passes:
                run = await evaluate_items(
                    ws,
                    split,
                    prompts,
                    judge,
                    item_ids=split.ids,
                    replicates=1,
                    options=PassOptions(
                        provider=provider,
                        cache=cache,
                        batch=FAST_POLLS if mode == "batch" else None,
                    ),
                )
                assert run.calls_made == n, f"{run.calls_made} calls for {n} items"
                input_usd = run.cost_usd - run.output_tokens * price.output * multiplier / 1e6
                equivalents.append(input_usd * 1e6 / price.input)
            calls_after = 0
            if mode == "batch":
                after = await evaluate_items(
                    ws,
                    split,
                    passes[-1],
                    judge,
                    item_ids=split.ids,
                    replicates=1,
                    options=PassOptions(provider=provider, cache=cache),
                )
                calls_after = after.calls_made
        finally:
            cache.close()
            await provider.aclose()
        batches = len(server.batch_creations)
        answered = len(server.inference_requests())
    expected_batches = candidates + 1 if mode == "batch" else 0
    assert batches == expected_batches, f"{batches} batches for {candidates + 1} passes ({mode})"
    assert answered == n * (candidates + 1), f"the fake answered {answered} calls"
    return Figures(
        per_candidate=equivalents[1:],
        baseline=equivalents[0],
        seconds=time.perf_counter() - started,
        batches=batches,
        calls_after=calls_after,
    )


def measure_costs(
    root: Path,
    n: int,
    steps: int,
    candidates: int,
    *,
    wires: tuple[str, ...] = tuple(MODELS),
    say: Any = print,
) -> dict[tuple[str, str, str], Figures]:
    """Every (wire, layout, mode) configuration on one freshly built split of ``n`` items."""
    t0 = time.perf_counter()
    ws, split = build(root, n, steps)
    say(
        f"split: {len(split.ids)} items x {steps} steps, a screenshot per step "
        f"(built in {time.perf_counter() - t0:.0f} s)"
    )
    results: dict[tuple[str, str, str], Figures] = {}
    for wire in wires:
        for layout in LAYOUTS:
            for mode in MODES:
                # Each configuration starts with an empty judge-call cache: every call is paid.
                ws.cache_path.unlink(missing_ok=True)
                figures = asyncio.run(evaluate_layout(ws, split, wire, layout, candidates, mode))
                results[(wire, layout, mode)] = figures
                say(f"  {wire:9} {layout:16} {mode:6}: {figures.seconds:.0f} s")
    return results


def cost_table(results: dict[tuple[str, str, str], Figures], n: int, candidates: int) -> str:
    """Per wire: billed input-token equivalents per candidate after the baseline (mean over the
    candidates; per item) for each layout x mode, and each cell's ratio to today's (rubric-first, direct)."""
    lines = [
        f"billed input-token equivalents per candidate after the baseline ({n} items, mean of {candidates} "
        "candidates; uncached 1, cache read 0.1, 1-hour write 2, 5-minute write 1.25; x0.5 in a batch)"
    ]
    for wire in dict.fromkeys(w for w, _, _ in results):
        lines.append(f"{wire} / {MODELS[wire]}" + (' (cache_ttl = "1h")' if wire == "anthropic" else ""))
        lines.append(
            f"  {'layout':<17} {'mode':<7} {'per candidate':>14} {'per item':>9} {'/ today':>8}"
            f" {'baseline':>10} {'range per candidate':>21}"
        )
        today = results[(wire, *TODAY)].mean
        for layout in LAYOUTS:
            for mode in MODES:
                f = results[(wire, layout, mode)]
                spread = f"{min(f.per_candidate) / 1000:,.0f}k-{max(f.per_candidate) / 1000:,.0f}k"
                lines.append(
                    f"  {layout:<17} {mode:<7} {f.mean / 1000:>13,.0f}k {f.mean / n / 1000:>8,.1f}k "
                    f"{f.mean / today:>8.3f} {f.baseline / 1000:>9,.0f}k {spread:>21}"
                )
    batch_runs = [f for (_, _, mode), f in results.items() if mode == "batch"]
    lines.append(
        f"batch mode: {sum(f.batches for f in batch_runs)} batches for {len(batch_runs)} x "
        f"{candidates + 1} passes; a direct evaluation of the last prompts after each batch run made "
        f"{sum(f.calls_after for f in batch_runs)} calls (answers shared through the judge-call cache)"
    )
    return "\n".join(lines)


# --- the script -----------------------------------------------------------------------------------


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {load}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small configuration (24 items x 20 steps, 3 candidates; loop 3 candidates)",
    )
    parser.add_argument("--n", type=int, default=None, help="items (default 162)")
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per item, a screenshot each (default 100)"
    )
    parser.add_argument(
        "--candidates", type=int, default=None, help="candidates after the baseline (default 10)"
    )
    parser.add_argument(
        "--loop-candidates", type=int, default=None, help="loop candidates per run (default 10)"
    )
    parser.add_argument(
        "--warmup-only",
        action="store_true",
        help="only part 3: cache writes per item before/after single-flight (default: every part)",
    )
    parser.add_argument("--replicates", type=int, default=3, help="part 3: calls per item (default 3)")
    parser.add_argument(
        "--structures-only",
        action="store_true",
        help="only part 4: cost per verdict per structure (single judge, panels of 2 and 3, criteria, "
        "review)",
    )
    parser.add_argument(
        "--structures",
        nargs="+",
        default=None,
        metavar="NAME",
        help="part 4: only these structures besides the single judge (e.g. criteria review criteria+review)",
    )
    args = parser.parse_args(argv)
    quick = {"n": 24, "steps": 20, "candidates": 3, "loop_candidates": 3}
    full = {"n": 162, "steps": 100, "candidates": 10, "loop_candidates": 10}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    os.environ.setdefault("ANTHROPIC_API_KEY", "benchmark-key")
    os.environ.setdefault("OPENAI_API_KEY", "benchmark-key")
    print(f"machine: {machine()}", flush=True)
    t0 = time.perf_counter()
    if args.structures_only:
        with tempfile.TemporaryDirectory(prefix="judgeloop-cache-cost-") as tmp:
            priced = measure_structures(
                Path(tmp) / "structures",
                args.n,
                args.steps,
                args.candidates,
                say=lambda m: print(m, flush=True),
                names=args.structures,
            )
        print(f"total {time.perf_counter() - t0:.0f} s\n")
        print(structures_table(priced, args.n, args.steps, args.candidates))
        return
    if args.warmup_only:
        with tempfile.TemporaryDirectory(prefix="judgeloop-cache-cost-") as tmp:
            writes = measure_writes(
                Path(tmp) / "writes", args.n, args.steps, args.replicates, say=lambda m: print(m, flush=True)
            )
        print(f"total {time.perf_counter() - t0:.0f} s\n")
        print(writes_table(writes, args.n, args.replicates))
        return
    with tempfile.TemporaryDirectory(prefix="judgeloop-cache-cost-") as tmp:
        writes = measure_writes(
            Path(tmp) / "writes", args.n, args.steps, args.replicates, say=lambda m: print(m, flush=True)
        )
        results = measure_costs(
            Path(tmp) / "costs", args.n, args.steps, args.candidates, say=lambda m: print(m, flush=True)
        )
        loops = compare_loops(Path(tmp) / "loops", args.loop_candidates, say=lambda m: print(m, flush=True))
        priced = measure_structures(
            Path(tmp) / "structures", args.n, args.steps, args.candidates, say=lambda m: print(m, flush=True)
        )
    print(f"total {time.perf_counter() - t0:.0f} s\n")
    print(cost_table(results, args.n, args.candidates))
    print()
    print(writes_table(writes, args.n, args.replicates))
    print()
    print(decision_table(loops, args.loop_candidates))
    print()
    print(structures_table(priced, args.n, args.steps, args.candidates))


if __name__ == "__main__":
    sys.exit(with_docs_figure(main))
