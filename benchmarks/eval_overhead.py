"""Harness overhead of `judgeloop eval` against the fake server (a script that prints figures).

Builds a synthetic 162-item split (every item STEPS steps, one 640x400 PNG screenshot per step,
recordings shared by a pair's positive and negative as in the real release), starts the fake
OpenAI-compatible server with a fixed per-call latency L, and runs `evaluate_items` through the
real `openai` SDK with concurrency C:

1. cold: empty judge-call cache and empty in-process image cache — wall time / (ceil(n/C)·L),
   target ≤ 1.15;
2. cached, fresh process state: the image cache cleared, as a second `judgeloop eval` would start —
   target < 2 s;
3. cached, warm process: what the loop sees when it re-evaluates a revision in the same process.

Run:  .venv/bin/python benchmarks/eval_overhead.py [--n 162] [--latency 0.2] [--concurrency 16] [--steps 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer import render  # noqa: E402
from optimizer.config import JudgeSection  # noqa: E402
from optimizer.devset import import_split  # noqa: E402
from optimizer.evaluate import EvalRun, evaluate_items  # noqa: E402
from optimizer.prompts import PromptSet  # noqa: E402
from optimizer.workspace import Workspace, init_workspace  # noqa: E402
from tests.data_helpers import make_items, write_manifest, write_release  # noqa: E402
from tests.fakeserver import FakeLLMServer, Usage, verdict_reply  # noqa: E402


def screenshot(rng: random.Random, path: Path) -> None:
    """A 640x400 desktop-like picture: a title bar, panels and text-like bars (compresses like a UI)."""
    img = Image.new("RGB", (640, 400), (236, 239, 244))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, 640, 28), fill=(46, 52, 64))
    for _ in range(14):
        x, y = rng.randrange(0, 560), rng.randrange(36, 360)
        w, h = rng.randrange(40, 200), rng.randrange(10, 60)
        draw.rectangle((x, y, x + w, y + h), fill=tuple(rng.randrange(60, 250) for _ in range(3)))
    for row in range(40, 390, 14):
        draw.line((12, row, 12 + rng.randrange(50, 300), row), fill=(90, 90, 90), width=3)
    img.save(path, optimize=False)


def build_workspace(root: Path, n: int, steps: int) -> tuple[Workspace, list[str]]:
    ws = init_workspace(root / "ws")
    items = make_items(math.ceil(n / 4), n_steps=steps)
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} (benchmark task {i})"
    release = write_release(root / "release", items, markdown=False)
    rng = random.Random(0)
    done: set[Path] = set()
    for item in items:
        for k in range(steps):
            path = release.screenshot(item, k)
            if path not in done:
                screenshot(rng, path)
                done.add(path)
    ids = [item.trajectory_id for item in items[:n]]
    manifest = write_manifest(root / "manifest.txt", ids)
    import_split(ws, release.root, "bench", manifest=manifest, warn=lambda _m: None)
    return ws, ids


async def evaluate(ws: Workspace, judge: JudgeSection, ids: list[str]) -> EvalRun:
    from optimizer.devset import open_split

    split = open_split(ws, "bench")
    prompts = PromptSet.from_dir(ws.prompts_dir)
    return await evaluate_items(ws, split, prompts, judge, item_ids=ids, replicates=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=162)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per fake call")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12, help="steps (= screenshots) per trajectory")
    args = parser.parse_args()

    os.environ.setdefault("OPENAI_API_KEY", "benchmark-key")
    usage = Usage(input_tokens=3000, output_tokens=80)
    with tempfile.TemporaryDirectory() as tmp, FakeLLMServer(
        default=lambda _r: verdict_reply(delay_s=args.latency, usage=usage), max_hang_s=30
    ) as server:
        t0 = time.perf_counter()
        ws, ids = build_workspace(Path(tmp), args.n, args.steps)
        setup_s = time.perf_counter() - t0
        judge = JudgeSection(
            provider="openai", model="gpt-4o-mini", base_url=server.openai_base_url,
            max_concurrency=args.concurrency, max_retries=0, timeout_s=30,
        )
        ideal = math.ceil(args.n / args.concurrency) * args.latency

        render.clear_image_cache()
        t0 = time.perf_counter()
        cold = asyncio.run(evaluate(ws, judge, ids))
        cold_s = time.perf_counter() - t0
        calls = len(server.inference_requests())

        render.clear_image_cache()  # a new `judgeloop eval` process starts with no image cache
        t0 = time.perf_counter()
        cached = asyncio.run(evaluate(ws, judge, ids))
        cached_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        warm = asyncio.run(evaluate(ws, judge, ids))
        warm_s = time.perf_counter() - t0
        extra_calls = len(server.inference_requests()) - calls

    figures = {
        "machine": f"{platform.machine()} {platform.system()}, nproc={os.cpu_count()}, Python {platform.python_version()}",
        "n": args.n,
        "latency_s": args.latency,
        "concurrency": args.concurrency,
        "steps_per_item": args.steps,
        "setup_s": round(setup_s, 2),
        "ideal_s": round(ideal, 3),
        "cold_wall_s": round(cold_s, 3),
        "overhead_ratio": round(cold_s / ideal, 3),
        "cold_calls": cold.calls_made,
        "cached_fresh_process_s": round(cached_s, 3),
        "cached_warm_process_s": round(warm_s, 3),
        "cached_hits": cached.cache_hits,
        "http_calls_during_cached_runs": extra_calls,
        "warm_hits": warm.cache_hits,
    }
    print(f"machine: {figures['machine']}")
    print(f"split: n={args.n} items x {args.steps} steps/screenshots; fake latency L={args.latency}s; C={args.concurrency}")
    print(f"cold evaluation: {cold_s:.3f} s for {cold.calls_made} calls; ideal ceil(n/C)*L = {ideal:.3f} s; "
          f"overhead ratio = {cold_s / ideal:.3f} (target <= 1.15)")
    print(f"fully cached re-evaluation (fresh image cache): {cached_s:.3f} s (target < 2 s), "
          f"{cached.cache_hits} hits, {extra_calls} HTTP calls")
    print(f"fully cached re-evaluation (warm process): {warm_s:.3f} s")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
