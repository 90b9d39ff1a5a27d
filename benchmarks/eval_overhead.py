"""Harness overhead of `judgeloop eval` against the fake server (a script that prints figures).

Builds a synthetic 162-item split (every item STEPS steps, one 640x400 PNG screenshot per step,
recordings shared by a pair's positive and negative as in the real release), starts the fake
OpenAI-compatible server with a fixed per-call latency L, and runs `evaluate_items` through the
real `openai` SDK with concurrency C:

1. first evaluation of the split: every screenshot is decoded, resized and encoded once (kept on
   disk in experiments/images/) and every call is new;
2. a new prompt revision (judge.md edited), fresh process state: every call is new but the encoded
   screenshots come from disk — wall time / (ceil(n/C)·L), target ≤ 1.15. This is what each
   candidate of the loop and each `judgeloop eval` of an edited prompt costs;
3. the same revision again, fresh process state: fully cached — target < 2 s;
4. the same again in a warm process (the loop re-evaluating in one process).

``--agentic`` runs the same phases with ``mode = "agentic"``: every verdict is a two-turn
conversation (read all steps and view the first and last screenshots, then submit), so the ideal
is ceil(n/C)·2L, and the cached phases replay every turn from the cache.

The fake server runs in its own process, keeps connections alive (as real servers do) and does not
JSON-decode request bodies: on a 2-core machine its CPU is taken from the harness being measured.
``--reconnect`` (a new connection per call) and ``--parse-bodies`` restore the heavier server.
The figures depend on the machine's other load; nproc and the load averages are printed with them.

Run:  .venv/bin/python benchmarks/eval_overhead.py [--n 162] [--latency 0.2] [--concurrency 16] [--steps 12]
      [--reconnect] [--parse-bodies] [--agentic]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.devset.importer import import_split
from optimizer.evaluation.evaluator import evaluate_items
from optimizer.evaluation.results import EvalRun
from optimizer.judge import render
from optimizer.judge.prompts import PromptSet
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.data import make_items, write_manifest, write_release
from tests.support.fakeserver import DEFAULT_VERDICT, FakeLLMServer, ToolCall, Usage, reply, verdict_reply


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
    from optimizer.devset.split import open_split

    split = open_split(ws, "bench")
    prompts = PromptSet.from_dir(ws.prompts_dir)  # read each time: phase 2 edits judge.md
    return await evaluate_items(ws, split, prompts, judge, item_ids=ids, replicates=1)


def timed(
    ws: Workspace, judge: JudgeSection, ids: list[str], *, fresh_process: bool
) -> tuple[float, EvalRun]:
    if fresh_process:
        render.clear_image_cache()  # a new `judgeloop eval` process starts with no in-memory images
    t0 = time.perf_counter()
    run = asyncio.run(evaluate(ws, judge, ids))
    return time.perf_counter() - t0, run


def agentic_judge(latency: float, usage: Usage, steps: int):
    """Turn 1: read every step and view the first and last screenshots; turn 2: submit a verdict."""

    def behave(request):
        turns = sum(1 for m in request.body["messages"] if m["role"] == "assistant")
        if turns == 0:
            calls = [
                ToolCall("read_steps", {"first": 0, "last": steps - 1}),
                ToolCall("view_screenshots", {"steps": [0, steps - 1]}),
            ]
        else:
            calls = [ToolCall("submit_verdict", DEFAULT_VERDICT)]
        return reply(None, tool_calls=calls, delay_s=latency, usage=usage)

    return behave


def serve(latency: float, *, keep_alive: bool, parse_bodies: bool, agentic_steps: int | None) -> int:
    """Run the fake server in this process: print its URL, answer "count" lines, stop at EOF."""
    usage = Usage(input_tokens=3000, output_tokens=80)
    default = (
        agentic_judge(latency, usage, agentic_steps)
        if agentic_steps
        else (lambda _r: verdict_reply(delay_s=latency, usage=usage))
    )
    with FakeLLMServer(
        default=default,
        max_hang_s=30,
        keep_alive=keep_alive,
        parse_bodies=parse_bodies or bool(agentic_steps),  # the agentic judge reads the conversation
    ) as server:
        print(server.openai_base_url, flush=True)
        for line in sys.stdin:
            if line.strip() == "count":
                print(len(server.inference_requests()), flush=True)
    return 0


class ServerProcess:
    """The fake server in its own process, as a real server would be (no GIL shared with the harness)."""

    def __init__(
        self,
        latency: float,
        *,
        reconnect: bool = False,
        parse_bodies: bool = False,
        agentic_steps: int | None = None,
    ) -> None:
        flags = [
            *(["--reconnect"] if reconnect else []),
            *(["--parse-bodies"] if parse_bodies else []),
            *(["--agentic", "--steps", str(agentic_steps)] if agentic_steps else []),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--latency", str(latency), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.url = self.proc.stdout.readline().strip()

    def count(self) -> int:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (other work on the machine skews every figure here)."""
    return [round(x, 2) for x in os.getloadavg()]


def call_latency(run: EvalRun) -> dict[str, float]:
    """Median and max of the time each call spent inside the provider (SDK + HTTP + server delay)."""
    times = sorted(r.duration_s for item in run.items for r in item.replicates if not r.cached)
    if not times:
        return {}
    return {"median": round(times[len(times) // 2], 3), "max": round(times[-1], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=162)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per fake call")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12, help="steps (= screenshots) per trajectory")
    parser.add_argument(
        "--reconnect",
        action="store_true",
        help="the fake server closes every connection after answering (default: keep-alive, as real servers)",
    )
    parser.add_argument(
        "--parse-bodies",
        action="store_true",
        help="the fake server JSON-decodes every request body (default: not, to keep its CPU off the machine)",
    )
    parser.add_argument(
        "--agentic", action="store_true", help='judge.toml mode = "agentic" (two turns per verdict)'
    )
    args = parser.parse_args()
    agentic_steps = args.steps if args.agentic else None
    if args.serve:
        return serve(
            args.latency,
            keep_alive=not args.reconnect,
            parse_bodies=args.parse_bodies,
            agentic_steps=agentic_steps,
        )

    os.environ.setdefault("OPENAI_API_KEY", "benchmark-key")
    server = ServerProcess(
        args.latency, reconnect=args.reconnect, parse_bodies=args.parse_bodies, agentic_steps=agentic_steps
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures = run_phases(server, Path(tmp), args)
    finally:
        server.close()
    print(json.dumps(figures))
    return 0


def run_phases(server: ServerProcess, tmp: Path, args: argparse.Namespace) -> dict[str, object]:
    t0 = time.perf_counter()
    ws, ids = build_workspace(tmp, args.n, args.steps)
    setup_s = time.perf_counter() - t0
    judge = JudgeSection(
        provider="openai",
        model="gpt-4o-mini",
        base_url=server.url,
        max_concurrency=args.concurrency,
        max_retries=0,
        timeout_s=30,
    )
    turns = 2 if args.agentic else 1
    if args.agentic:
        toml = ws.prompts_dir / "judge.toml"
        toml.write_text(toml.read_text().replace('\nmode = "direct"\n', '\nmode = "agentic"\n'))
        assert PromptSet.from_dir(ws.prompts_dir).settings.mode == "agentic"
    ideal = math.ceil(args.n / args.concurrency) * args.latency * turns

    load_before = load_average()
    first_s, first = timed(ws, judge, ids, fresh_process=True)
    # A new prompt revision: every judge call is new, screenshots are already on disk encoded.
    judge_md = ws.prompts_dir / "judge.md"
    judge_md.write_text(judge_md.read_text() + "\nBe strict about the instruction's details.\n")
    load_cold = load_average()
    cold_s, cold = timed(ws, judge, ids, fresh_process=True)
    calls = server.count()
    cached_s, cached = timed(ws, judge, ids, fresh_process=True)
    warm_s, warm = timed(ws, judge, ids, fresh_process=False)
    extra_calls = server.count() - calls

    figures = {
        "machine": f"{platform.machine()} {platform.system()}, nproc={os.cpu_count()}, Python {platform.python_version()}",
        "nproc": os.cpu_count(),
        "load_average_1_5_15": {
            "before": load_before,
            "before_cold_phase": load_cold,
            "after": load_average(),
        },
        "server": "reconnect per call" if args.reconnect else "keep-alive",
        "server_parses_bodies": args.parse_bodies or args.agentic,
        "mode": "agentic (2 turns per verdict)" if args.agentic else "direct",
        "n": args.n,
        "latency_s": args.latency,
        "concurrency": args.concurrency,
        "steps_per_item": args.steps,
        "setup_s": round(setup_s, 2),
        "ideal_s": round(ideal, 3),
        "first_eval_s": round(first_s, 3),
        "first_eval_ratio": round(first_s / ideal, 3),
        "cold_wall_s": round(cold_s, 3),
        "overhead_ratio": round(cold_s / ideal, 3),
        "cold_calls": cold.calls_made,
        "cold_call_latency_s": call_latency(cold),
        "cached_fresh_process_s": round(cached_s, 3),
        "cached_warm_process_s": round(warm_s, 3),
        "cached_hits": cached.cache_hits,
        "http_calls_during_cached_runs": extra_calls,
        "warm_hits": warm.cache_hits,
    }
    print(
        f"machine: {figures['machine']}; load average (1/5/15 min) before: {load_before}, "
        f"before the new-revision phase: {load_cold}, after: {figures['load_average_1_5_15']['after']}"
    )
    print(
        f"fake server: own process, {figures['server']}, "
        f"{'decodes' if args.parse_bodies or args.agentic else 'does not decode'} request bodies"
    )
    print(
        f"split: n={args.n} items x {args.steps} steps/screenshots; fake latency L={args.latency}s; C={args.concurrency}; "
        f"judge mode {figures['mode']}"
    )
    print(
        f"first evaluation of the split (screenshots decoded, resized, encoded): {first_s:.3f} s for "
        f"{first.calls_made} calls = {first_s / ideal:.3f} x ideal"
    )
    print(
        f"new prompt revision (all calls new, encoded screenshots on disk): {cold_s:.3f} s for "
        f"{cold.calls_made} calls; ideal ceil(n/C)*L*turns = {ideal:.3f} s; overhead ratio = {cold_s / ideal:.3f} "
        f"(target <= 1.15); time inside the provider per call: {call_latency(cold)}"
    )
    print(
        f"fully cached re-evaluation (fresh image cache): {cached_s:.3f} s (target < 2 s), "
        f"{cached.cache_hits} hits, {extra_calls} HTTP calls"
    )
    print(f"fully cached re-evaluation (warm process): {warm_s:.3f} s")
    return figures


if __name__ == "__main__":
    sys.exit(main())
