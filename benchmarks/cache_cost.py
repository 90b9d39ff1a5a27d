"""What prompt caching saves per candidate: old layout (rubric-first) vs new (trajectory-first), both
wires (a script that prints figures).

Builds a 162-item split of long items (STEPS steps, a screenshot per step: ~26k input tokens each, like
AH-D's ~33k), then for each wire (Anthropic Messages with claude-sonnet-4-5, OpenAI Chat Completions
with gpt-5) and each layout runs a baseline and 10 candidates — each candidate adds one rubric rule —
with `evaluate_items` through the real SDK against the fake server with its prompt cache on
(`tests.fakecache.PromptCache`: breakpoints, longest cached prefix, minimum length and TTL for
Anthropic; 128-token prefix matching and prompt_cache_key routing for OpenAI). The fake's clock moves
MINUTES_PER_CANDIDATE simulated minutes per candidate (a real judge takes that long over 162 items),
spread over its calls, so TTLs and OpenAI's per-minute routing see a realistic pace.

Billed input-token equivalents of a candidate = what judgeloop accounted for its judge calls
(`EvalRun.cost_usd`, from the usage the SDK parsed), minus the output, divided by the model's input
price: uncached input counts 1, a cache read 0.1, a 5-minute write 1.25, a 1-hour write 2.

Run:  .venv/bin/python benchmarks/cache_cost.py [--n 162] [--steps 100] [--candidates 10]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.config import JudgeSection
from optimizer.devset.importer import import_split
from optimizer.devset.split import Split
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import evaluate_items
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD, PromptSet
from optimizer.judge.providers import make_provider
from optimizer.judge.providers.pricing import price_for
from optimizer.scaffold import init_workspace
from optimizer.workspace import Workspace
from tests.config_helpers import with_layout
from tests.data_helpers import make_items, write_release
from tests.fakecache import PromptCache
from tests.fakeserver import FakeLLMServer

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5"}
LAYOUTS = ("rubric-first", "trajectory-first")
MINUTES_PER_CANDIDATE = 20.0
# Modes of sending the calls. The batch engineer adds "batch" here (issue 11 item 3): `evaluate_layout`
# then needs its batch path, and `table` prints a column per mode.
MODES = ("direct",)


class PacedClock:
    """The fake's clock: ``step_s`` simulated seconds pass with every request it bills."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


@dataclass
class Figures:
    per_candidate: list[float]  # billed input-token equivalents of each candidate after the baseline
    baseline: float
    seconds: float


def build(root: Path, n: int, steps: int) -> tuple[Workspace, Split]:
    ws = init_workspace(root / "ws")
    items = make_items(math.ceil(n / 4), n_steps=steps)[:n]
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} (benchmark task {i})"
    release = write_release(root / "release", items, markdown=False)
    split = import_split(ws, release.root, "long", all_items=True, warn=lambda _m: None)
    return ws, split


def prompt_sets(ws: Workspace, layout: str, candidates: int) -> list[PromptSet]:
    """The baseline and ``candidates`` rubric edits (one more rule each), all with ``layout``."""
    files = dict(PromptSet.from_dir(ws.prompts_dir).files)
    files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], layout)
    out = [PromptSet.from_files(files)]
    for k in range(1, candidates + 1):
        edited = dict(files)
        edited[RUBRIC_MD] = files[RUBRIC_MD] + f"\n- Candidate rule {k}: re-check requirement {k} in the final state.\n"
        out.append(PromptSet.from_files(edited))
    return out


async def evaluate_layout(ws: Workspace, split: Split, wire: str, layout: str, candidates: int, mode: str) -> Figures:
    """Baseline + candidates through the real SDK against a fresh fake with its prompt cache on."""
    assert mode == "direct"  # see MODES
    n = len(split.ids)
    clock = PacedClock(MINUTES_PER_CANDIDATE * 60.0 / n)
    model = MODELS[wire]
    price = price_for(model)
    assert price is not None
    equivalents: list[float] = []
    started = time.perf_counter()
    with FakeLLMServer(prompt_cache=PromptCache(clock=clock), keep_alive=True) as server:
        base_url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        judge = JudgeSection(provider=wire, model=model, base_url=base_url, max_concurrency=16)  # type: ignore[arg-type]
        provider = make_provider(judge)
        cache = JudgeCache(ws.cache_path)
        try:
            for prompts in prompt_sets(ws, layout, candidates):
                run = await evaluate_items(ws, split, prompts, judge, item_ids=split.ids, replicates=1,
                                           provider=provider, cache=cache)
                assert run.calls_made == n, f"{run.calls_made} calls for {n} items"
                input_usd = run.cost_usd - run.output_tokens * price.output / 1e6
                equivalents.append(input_usd * 1e6 / price.input)
        finally:
            cache.close()
            await provider.aclose()
    return Figures(per_candidate=equivalents[1:], baseline=equivalents[0], seconds=time.perf_counter() - started)


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {load}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=162)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--candidates", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("ANTHROPIC_API_KEY", "benchmark-key")
    os.environ.setdefault("OPENAI_API_KEY", "benchmark-key")
    print(f"machine: {machine()}")
    results: dict[tuple[str, str, str], Figures] = {}
    with tempfile.TemporaryDirectory(prefix="judgeloop-cache-cost-") as tmp:
        t0 = time.perf_counter()
        ws, split = build(Path(tmp), args.n, args.steps)
        print(f"split: {len(split.ids)} items x {args.steps} steps, a screenshot per step "
              f"(built in {time.perf_counter() - t0:.0f} s)")
        for wire in MODELS:
            for layout in LAYOUTS:
                for mode in MODES:
                    # Each configuration starts with an empty judge-call cache: every call is paid.
                    ws.cache_path.unlink(missing_ok=True)
                    figures = asyncio.run(evaluate_layout(ws, split, wire, layout, args.candidates, mode))
                    results[(wire, layout, mode)] = figures
                    print(f"  {wire:9} {layout:16} {mode:6}: {figures.seconds:.0f} s", flush=True)
    print()
    print(table(results, args.n))


def table(results: dict[tuple[str, str, str], Figures], n: int) -> str:
    """Billed input-token equivalents per candidate after the baseline (mean over candidates, per item
    in brackets), old vs new layout, per wire and mode; the new/old ratio is the target's figure."""
    lines = [
        f"billed input-token equivalents per candidate after the baseline ({n} items; thousands, per item in brackets)",
        f"{'wire / model':<28} {'mode':<7} {'rubric-first (old)':>22} {'trajectory-first (new)':>24} {'new / old':>10}",
    ]
    for wire, model in MODELS.items():
        for mode in MODES:
            old = results[(wire, "rubric-first", mode)]
            new = results[(wire, "trajectory-first", mode)]
            o = sum(old.per_candidate) / len(old.per_candidate)
            w = sum(new.per_candidate) / len(new.per_candidate)
            lines.append(
                f"{wire + ' / ' + model:<28} {mode:<7} {o / 1000:>11,.0f}k ({o / n:>6,.0f}) "
                f"{w / 1000:>13,.0f}k ({w / n:>6,.0f}) {w / o:>10.3f}"
            )
    lines.append("baseline (the first evaluation, everything written or read for the first time): " + ", ".join(
        f"{wire} {layout} {results[(wire, layout, 'direct')].baseline / 1000:,.0f}k"
        for wire in MODELS for layout in LAYOUTS))
    spread = ", ".join(
        f"{wire} {layout} {min(f.per_candidate) / 1000:,.0f}k-{max(f.per_candidate) / 1000:,.0f}k"
        for (wire, layout, _), f in results.items())
    lines.append(f"per-candidate range: {spread}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
