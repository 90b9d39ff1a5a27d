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

Run:  .venv/bin/python benchmarks/cache_cost.py [--quick] [--n 162] [--steps 100] [--candidates 10]
      [--loop-candidates 10] [--replicates 3] [--warmup-only] [--structures-only] [--structures NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._figures import with_docs_figure
from optimizer.devset.importer import import_split
from optimizer.devset.split import Split
from optimizer.evaluation.batch import BatchOptions
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD, PromptSet
from optimizer.judge.providers import make_provider
from optimizer.judge.providers.pricing import price_for
from optimizer.ledger import Ledger
from optimizer.loop.session import RunOptions, start_run
from optimizer.scaffold import init_workspace
from optimizer.structure import set_key
from optimizer.workspace.config import JudgeOverrides, JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.config import with_layout
from tests.support.data import make_items, write_release
from tests.support.fakecache import PromptCache
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, reply, verdict_reply
from tests.support.loop import FakeJudge, add_small_dev_split, commit_all, make_workspace

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5"}
LAYOUTS = ("rubric-first", "trajectory-first")
MINUTES_PER_CANDIDATE = 20.0
# How the calls are sent: one request per call, or each pass as one batch through the batch API.
MODES = ("direct", "batch")
TODAY = ("rubric-first", "direct")  # what every cell's ratio is to
# Batches on the fake end at the first status poll; poll fast so the benchmark times the judge work.
FAST_POLLS = BatchOptions(poll_s=0.01, poll_max_s=0.05)


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
    batches: int = 0  # batches the fake server created (batch mode: one per pass)
    calls_after: int = 0  # batch mode: calls a direct evaluation of the last prompts made afterwards

    @property
    def mean(self) -> float:
        return sum(self.per_candidate) / len(self.per_candidate)


# --- part 1: billing ------------------------------------------------------------------------------


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
                        provider=provider, cache=cache, batch=FAST_POLLS if mode == "batch" else None,
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
    return Figures(per_candidate=equivalents[1:], baseline=equivalents[0], seconds=time.perf_counter() - started,
                   batches=batches, calls_after=calls_after)


def measure_costs(root: Path, n: int, steps: int, candidates: int, *, wires: tuple[str, ...] = tuple(MODELS),
                  say: Any = print) -> dict[tuple[str, str, str], Figures]:
    """Every (wire, layout, mode) configuration on one freshly built split of ``n`` items."""
    t0 = time.perf_counter()
    ws, split = build(root, n, steps)
    say(f"split: {len(split.ids)} items x {steps} steps, a screenshot per step "
        f"(built in {time.perf_counter() - t0:.0f} s)")
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
    lines = [f"billed input-token equivalents per candidate after the baseline ({n} items, mean of {candidates} "
             "candidates; uncached 1, cache read 0.1, 1-hour write 2, 5-minute write 1.25; x0.5 in a batch)"]
    for wire in dict.fromkeys(w for w, _, _ in results):
        lines.append(f"{wire} / {MODELS[wire]}" + (' (cache_ttl = "1h")' if wire == "anthropic" else ""))
        lines.append(f"  {'layout':<17} {'mode':<7} {'per candidate':>14} {'per item':>9} {'/ today':>8}"
                     f" {'baseline':>10} {'range per candidate':>21}")
        today = results[(wire, *TODAY)].mean
        for layout in LAYOUTS:
            for mode in MODES:
                f = results[(wire, layout, mode)]
                spread = f"{min(f.per_candidate) / 1000:,.0f}k-{max(f.per_candidate) / 1000:,.0f}k"
                lines.append(f"  {layout:<17} {mode:<7} {f.mean / 1000:>13,.0f}k {f.mean / n / 1000:>8,.1f}k "
                             f"{f.mean / today:>8.3f} {f.baseline / 1000:>9,.0f}k {spread:>21}")
    batch_runs = [f for (_, _, mode), f in results.items() if mode == "batch"]
    lines.append(f"batch mode: {sum(f.batches for f in batch_runs)} batches for {len(batch_runs)} x "
                 f"{candidates + 1} passes; a direct evaluation of the last prompts after each batch run made "
                 f"{sum(f.calls_after for f in batch_runs)} calls (answers shared through the judge-call cache)")
    return "\n".join(lines)


# --- part 2: decisions ----------------------------------------------------------------------------


@dataclass
class BothWiresJudge(FakeJudge):
    """`FakeJudge` (which reads OpenAI chat bodies) for Anthropic requests too: their top-level system
    prompt becomes a system message, so the verdict depends on the same item and rubric text."""

    def __call__(self, request: RecordedRequest) -> Behaviour:
        body = request.body
        if request.wire == "anthropic" and isinstance(body, dict):
            system = body.get("system") or ""
            text = system if isinstance(system, str) else "".join(b.get("text") or "" for b in system)
            body = {**body, "messages": [{"role": "system", "content": text}, *body.get("messages", [])]}
            request = dataclasses.replace(request, body=body)
        return super().__call__(request)


@dataclass(frozen=True)
class Decision:
    """One experiment of a loop run, as its ledger has it."""

    seq: int
    status: str  # baseline | kept | rolled_back | guard_rejected | error
    rationale: str
    items: int  # items evaluated (fewer when a direct candidate stopped early)
    calls: int  # judge calls made (re-judging included)
    cost_usd: float  # the judge's billed dollars
    answers: dict[str, list[tuple[bool | None, str | None, str]]]  # per item, each replicate's verdict


@dataclass
class LoopRun:
    decisions: list[Decision]
    calls_answered: int  # judge calls the fake server answered, batch entries included
    batches: int
    seconds: float


def loop_template(root: Path) -> Path:
    """``judgeloop init --sample`` with the 32-item dev split, batches polled every 10-40 ms, futility off."""
    with contextlib.redirect_stdout(io.StringIO()):
        ws = make_workspace(root)
        add_small_dev_split(ws)
    config = ws / "judgeloop.toml"
    text = config.read_text(encoding="utf-8")
    assert "\n[judge]\n" in text
    text = text.replace("\n[judge]\n", "\n[judge]\nbatch_poll_s = 0.01\nbatch_poll_max_s = 0.04\n", 1)
    # Futility screening runs on direct passes only (a batch pays every call once sent): off, so both
    # runs judge every candidate in full and their decisions can be compared one for one.
    assert "\nfutility = true" in text
    config.write_text(text.replace("\nfutility = true", "\nfutility = false", 1), encoding="utf-8")
    commit_all(ws, "poll batches fast; futility off")
    return ws


def run_loop(template: Path, dest: Path, wire: str, candidates: int, *, batch: bool) -> LoopRun:
    """The real loop (`start_run`, library strategy) on a copy of ``template`` against a fresh fake."""
    shutil.copytree(template, dest, symlinks=True)
    started = time.perf_counter()
    with FakeLLMServer(default=BothWiresJudge(dest), prompt_cache=PromptCache(), batch_polls=1) as server:
        url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        options = RunOptions(strategy="library", max_experiments=candidates, patience=candidates, batch=batch,
                             judge=JudgeOverrides(provider=wire, model=MODELS[wire], base_url=url,  # type: ignore[arg-type]
                                                  concurrency=8))
        start_run(Workspace.open(dest), options)
        answered = len(server.inference_requests())
        batches = len(server.batch_creations)
    with Ledger(dest / "experiments" / "ledger.sqlite") as ledger:
        run = ledger.latest_run()
        assert run is not None
        decisions = [
            Decision(e.seq, e.status, e.rationale or "", e.items_evaluated, e.calls, e.judge_cost_usd,
                     {tid: [(a.success, a.mistake_type, a.status) for a in answers]
                      for tid, answers in ledger.item_judgements(e.id).items()})
            for e in ledger.experiments(run.id)
        ]
    return LoopRun(decisions, answered, batches, time.perf_counter() - started)


def same_decisions(direct: LoopRun, batch: LoopRun) -> bool:
    """Every experiment the same candidate (rationale) with the same decision, in the same order."""
    def key(run: LoopRun) -> list[tuple[int, str, str]]:
        return [(d.seq, d.rationale, d.status) for d in run.decisions]

    return key(direct) == key(batch)


def verdicts_compared(direct: LoopRun, batch: LoopRun) -> tuple[int, int]:
    """(items both runs judged in the same experiment, of which with identical replicate verdicts)."""
    both = same = 0
    for d, b in zip(direct.decisions, batch.decisions, strict=False):
        for tid in d.answers.keys() & b.answers.keys():
            both += 1
            same += d.answers[tid] == b.answers[tid]
    return both, same


def compare_loops(root: Path, candidates: int, *, wires: tuple[str, ...] = tuple(MODELS),
                  say: Any = print) -> dict[str, tuple[LoopRun, LoopRun]]:
    """Per wire: the loop run direct, then the same run with ``batch=True``, on copies of one workspace."""
    template = loop_template(root / "template")
    out: dict[str, tuple[LoopRun, LoopRun]] = {}
    for wire in wires:
        direct = run_loop(template, root / f"{wire}-direct", wire, candidates, batch=False)
        batch = run_loop(template, root / f"{wire}-batch", wire, candidates, batch=True)
        say(f"  loop {wire:9}: direct {direct.seconds:.0f} s, batch {batch.seconds:.0f} s")
        out[wire] = (direct, batch)
    return out


def decision_table(loops: dict[str, tuple[LoopRun, LoopRun]], candidates: int) -> str:
    lines = [f"keep/rollback decisions, the real loop (start_run, strategy library) direct vs RunOptions(batch=True), "
             f"{candidates} candidates on the 32-item sample dev split, fake judge keyed by item and rubric"]
    for wire, (direct, batch) in loops.items():
        lines.append(f"{wire} / {MODELS[wire]}")
        lines.append(f"  {'seq':>3} {'direct':<15} {'items':>5} {'calls':>5} {'$':>7}   {'batch':<15} {'items':>5}"
                     f" {'calls':>5} {'$':>7}   candidate")
        for d, b in zip(direct.decisions, batch.decisions, strict=False):
            mark = "" if (d.rationale, d.status) == (b.rationale, b.status) else "  <- DIFFERENT"
            lines.append(f"  {d.seq:>3} {d.status:<15} {d.items:>5} {d.calls:>5} {d.cost_usd:>7.4f}   "
                         f"{b.status:<15} {b.items:>5} {b.calls:>5} {b.cost_usd:>7.4f}   {d.rationale.split(' (')[0]}{mark}")
        n = max(len(direct.decisions), len(batch.decisions))
        agree = sum((d.rationale, d.status) == (b.rationale, b.status)
                    for d, b in zip(direct.decisions, batch.decisions, strict=False))
        verdict = "identical" if same_decisions(direct, batch) else "DIFFERENT"
        both, same = verdicts_compared(direct, batch)
        lines.append(f"  decisions {verdict} ({agree} of {n} experiments); verdicts identical on {same} of {both} "
                     "items both judged")
        lines.append(f"  judge calls answered by the fake: "
                     f"direct {direct.calls_answered}, batch {batch.calls_answered} in {batch.batches} batches; "
                     f"judge $ direct {sum(d.cost_usd for d in direct.decisions):.4f}, "
                     f"batch {sum(b.cost_usd for b in batch.decisions):.4f}")
    return "\n".join(lines)


# --- part 3: warm-up (single-flight per item prefix) ---------------------------------------------


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


async def first_pass_writes(ws: Workspace, split: Split, wire: str, mode: str, replicates: int, *, new: bool) -> WriteFigures:
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
    with FakeLLMServer(lambda _r: verdict_reply(delay_s=0.05), prompt_cache=cache_store, keep_alive=True,
                       batch_polls=1) as server, single_flight(new or mode == "batch"):
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
    return WriteFigures(cache_store.write_counts(), run.cache_write_tokens, run.cache_read_tokens,
                        run.cache_reads.planned, input_usd * 1e6 / price.input, run.cache_reads.low)


def measure_writes(root: Path, n: int, steps: int, replicates: int, *, wires: tuple[str, ...] = tuple(MODELS),
                   say: Any = print) -> dict[tuple[str, str, str], WriteFigures]:
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
                    first_pass_writes(ws, split, wire, mode, replicates, new=variant == "new"))
                say(f"  warm-up {wire:9} {mode:6} {variant}: {out[(wire, mode, variant)].per_item:.2f} writes per item")
    return out


def writes_table(results: dict[tuple[str, str, str], WriteFigures], n: int, replicates: int) -> str:
    lines = [f"cache writes per item, first pass, trajectory-first, --replicates {replicates}, {n} items; old = the "
             "calls of an item sent together (batch: --batch-cold), new = single-flight (batch: one direct warm-up "
             "per cold item, then the batch)",
             f"  {'wire':9} {'mode':6} {'writes/item old':>15} {'new':>5} {'write tok old':>13} {'new':>9} "
             f"{'read tok old':>12} {'new':>9} {'in-equiv old':>12} {'new':>9} {'warned old':>10} {'new':>5}"]
    for wire in MODELS:
        for mode in MODES:
            if (wire, mode, "old") not in results:
                continue
            o, w = results[(wire, mode, "old")], results[(wire, mode, "new")]
            lines.append(f"  {wire:9} {mode:6} {o.per_item:>15.2f} {w.per_item:>5.2f} {o.write_tokens:>13,} "
                         f"{w.write_tokens:>9,} {o.read_tokens:>12,} {w.read_tokens:>9,} {o.equivalents:>12,.0f} "
                         f"{w.equivalents:>9,.0f} {o.warned!s:>10} {w.warned!s:>5}")
    lines.append("  (openai: no write surcharge; a \"write\" is a request that stored the prefix because it missed it)")
    return "\n".join(lines)


# --- part 4: cost per verdict per structure -------------------------------------------------------


def with_panel(files: dict[str, str], members: int, vote: str = "unanimous") -> dict[str, str]:
    """``files`` with judge.toml's ``[panel]`` of ``members`` identical members (appended last: TOML
    puts every key after a table header inside the table)."""
    return {**files, JUDGE_TOML: files[JUDGE_TOML] + f'\n[panel]\nmembers = {members}\nvote = "{vote}"\n'}


def structures(files: dict[str, str]) -> dict[str, dict[str, str]]:
    """The judge structures part 4 prices: a name -> the prompt files (trajectory-first already set):
    the single call, panels of 2 and 3, ``structure = "criteria"``, ``review = "success"`` and both."""
    def keyed(**keys: str) -> dict[str, str]:
        text = files[JUDGE_TOML]
        for key, value in keys.items():
            text = set_key(text, key, value)
        return {**files, JUDGE_TOML: text}

    return {"single": dict(files), "panel of 2": with_panel(files, 2), "panel of 3": with_panel(files, 3),
            "criteria": keyed(structure="criteria"), "review": keyed(review="success"),
            "criteria+review": keyed(structure="criteria", review="success")}


def _schema_properties(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body["response_format"]["json_schema"] if "response_format" in body else body["output_config"]["format"]
    return dict(fmt["schema"]["properties"])


def _first_user_block(body: dict[str, Any]) -> str:
    """The user message's first block: under trajectory-first, the item's trajectory (the cached prefix)."""
    content = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return json.dumps(content if isinstance(content, str) else content[0], sort_keys=True)


REVIEW_SHARE_MOD = 2  # the structure judge finds every other item (by hash) a success


def structure_judge(request: RecordedRequest) -> Behaviour:
    """Answers a derivation, a criteria check, a review or a single call (told apart by the JSON schema
    the request sends) with a reply of the shape each expects. An item is a success on half the items
    (by a hash of its trajectory block), so a review runs on about half the verdicts; a review never
    finds a violation (the verdicts, hence the calls, stay those of the first judgement). The
    reasoning names the request it answers, so each candidate's review re-examines a new verdict."""
    body = request.body
    if not isinstance(body, dict):
        return verdict_reply()
    props = _schema_properties(body)
    if "violation" in props:
        return reply(json.dumps({"violation": False, "reasoning": "no violation", "steps": [], "mistake_type": None}))
    if "criteria" in props and "success" not in props:
        return reply(json.dumps({"criteria": [{"text": f"Requirement {i} of the instruction holds", "required": True}
                                              for i in range(3)]}))
    success = hashlib.sha256(_first_user_block(body).encode()).digest()[0] % REVIEW_SHARE_MOD == 0
    # The reasoning differs per request (as a model's does), so a candidate's review call is a new request.
    said = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    answer: dict[str, Any] = {"success": success, "reasoning": f"checked {said}", "confidence": "high",
                              "mistake_type": None if success else "Critical Mistake"}
    if "criteria" in props:
        answer.update(criteria=[{"text": f"Requirement {i} of the instruction holds", "met": success or i > 0,
                                 "steps": [0]} for i in range(3)], evidence_steps=[0])
    return reply(json.dumps(answer))


@dataclass
class StructureFigures:
    calls_per_verdict: float
    writes_per_item: list[int]  # the fake's paid cache writes per item prefix, first pass
    first_usd: float  # dollars per verdict, first pass (cold trajectories)
    candidate_usd: list[float]  # dollars per verdict of each candidate pass (trajectories cached)
    candidate_calls: list[float] = dataclasses.field(default_factory=list)  # calls per verdict, each candidate

    @property
    def candidate_mean(self) -> float:
        return sum(self.candidate_usd) / len(self.candidate_usd)


async def price_structure(ws: Workspace, split: Split, wire: str, files: dict[str, str], candidates: int, *,
                          minutes_per_candidate: float = MINUTES_PER_CANDIDATE) -> StructureFigures:
    """A first pass and ``candidates`` rubric edits of one structure on a fresh fake with its prompt cache on
    (its clock: ``minutes_per_candidate`` simulated minutes per pass, spread over the pass's requests)."""
    from optimizer.evaluation.warmup import WARM_PREFIXES

    n = len(split.ids)
    WARM_PREFIXES.forget()  # each structure starts cold
    store = PromptCache(clock=PacedClock(minutes_per_candidate * 60.0 / n))
    usd: list[float] = []
    calls = 0
    per_candidate_calls: list[float] = []
    with FakeLLMServer(default=structure_judge, prompt_cache=store, keep_alive=True) as server:
        base_url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        judge = JudgeSection(provider=wire, model=MODELS[wire], base_url=base_url, max_concurrency=16)  # type: ignore[arg-type]
        provider = make_provider(judge)
        cache = JudgeCache(ws.cache_path)
        try:
            for k in range(candidates + 1):
                edited = dict(files)
                if k:
                    edited[RUBRIC_MD] = files[RUBRIC_MD] + f"\n- Candidate rule {k}: re-check requirement {k}.\n"
                run = await evaluate_items(
                    ws,
                    split,
                    PromptSet.from_files(edited),
                    judge,
                    item_ids=split.ids,
                    replicates=1,
                    options=PassOptions(provider=provider, cache=cache),
                )
                if k == 0:
                    writes = store.write_counts()
                    calls = run.calls_made
                else:
                    per_candidate_calls.append(run.calls_made / n)
                usd.append(run.cost_usd / n)
        finally:
            cache.close()
            await provider.aclose()
    return StructureFigures(calls / n, writes, usd[0], usd[1:], per_candidate_calls)


def measure_structures(root: Path, n: int, steps: int, candidates: int, *, wires: tuple[str, ...] = tuple(MODELS),
                       say: Any = print, names: Sequence[str] | None = None,
                       minutes_per_candidate: float = MINUTES_PER_CANDIDATE) -> dict[tuple[str, str], StructureFigures]:
    """(wire, structure) -> its calls, cache writes and dollars per verdict (see part 4); ``names``: only
    these of `structures()` (the single judge always, the ratios' reference). With few items, a small
    ``minutes_per_candidate`` keeps each simulated step well inside the cache's 5-minute TTL (else an
    entry's age at a member's read depends on how the items' calls interleaved)."""
    ws, split = build(root, n, steps)
    files = dict(PromptSet.from_dir(ws.prompts_dir).files)
    files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], "trajectory-first")
    out: dict[tuple[str, str], StructureFigures] = {}
    for wire in wires:
        for name, structure_files in structures(files).items():
            if names is not None and name != "single" and name not in names:
                continue
            ws.cache_path.unlink(missing_ok=True)
            out[(wire, name)] = asyncio.run(price_structure(ws, split, wire, structure_files, candidates,
                                                            minutes_per_candidate=minutes_per_candidate))
            say(f"  structure {wire:9} {name:15}: ${out[(wire, name)].candidate_mean:.5f} per verdict per candidate")
    return out


def structures_table(results: dict[tuple[str, str], StructureFigures], n: int, steps: int, candidates: int) -> str:
    lines = [f"cost per verdict per structure: trajectory-first, direct, {n} items x {steps} steps (a screenshot "
             f"each), first pass cold, then {candidates} candidates (one rubric rule each; trajectories cached)",
             f"  {'wire':9} {'structure':15} {'calls/verdict':>13} {'cand calls':>10} {'writes/item':>11} "
             f"{'first pass $/verdict':>21} {'/ single':>8} {'candidate $/verdict':>20} {'/ single':>8}"]
    for wire in dict.fromkeys(w for w, _ in results):
        single = results[(wire, "single")]
        for (w, name), f in results.items():
            if w != wire:
                continue
            writes = sum(f.writes_per_item) / len(f.writes_per_item) if f.writes_per_item else 0.0
            cand_calls = sum(f.candidate_calls) / len(f.candidate_calls) if f.candidate_calls else 0.0
            lines.append(f"  {wire:9} {name:15} {f.calls_per_verdict:>13.2f} {cand_calls:>10.2f} {writes:>11.2f} "
                         f"{f.first_usd:>21.5f} "
                         f"{f.first_usd / single.first_usd:>8.2f} {f.candidate_mean:>20.5f} "
                         f"{f.candidate_mean / single.candidate_mean:>8.2f}")
    lines.append("  (a panel's members share each item's cached trajectory: one write per item, the other members "
                 "read it; after the first pass every call reads it, so a panel of k costs about k single verdicts;")
    lines.append("   criteria: one derivation per item from the instruction alone, cached per item, so a candidate that "
                 "leaves criteria.md alone pays only the check; review: one more call on each success verdict, "
                 f"here 1/{REVIEW_SHARE_MOD} of the items by hash)")
    return "\n".join(lines)


# --- the script -----------------------------------------------------------------------------------


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {load}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small configuration (24 items x 20 steps, 3 candidates; loop 3 candidates)")
    parser.add_argument("--n", type=int, default=None, help="items (default 162)")
    parser.add_argument("--steps", type=int, default=None, help="steps per item, a screenshot each (default 100)")
    parser.add_argument("--candidates", type=int, default=None, help="candidates after the baseline (default 10)")
    parser.add_argument("--loop-candidates", type=int, default=None, help="loop candidates per run (default 10)")
    parser.add_argument("--warmup-only", action="store_true",
                        help="only part 3: cache writes per item before/after single-flight (default: every part)")
    parser.add_argument("--replicates", type=int, default=3, help="part 3: calls per item (default 3)")
    parser.add_argument("--structures-only", action="store_true",
                        help="only part 4: cost per verdict per structure (single judge, panels of 2 and 3, criteria, "
                             "review)")
    parser.add_argument("--structures", nargs="+", default=None, metavar="NAME",
                        help="part 4: only these structures besides the single judge (e.g. criteria review "
                             "criteria+review)")
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
            priced = measure_structures(Path(tmp) / "structures", args.n, args.steps, args.candidates,
                                        say=lambda m: print(m, flush=True), names=args.structures)
        print(f"total {time.perf_counter() - t0:.0f} s\n")
        print(structures_table(priced, args.n, args.steps, args.candidates))
        return
    if args.warmup_only:
        with tempfile.TemporaryDirectory(prefix="judgeloop-cache-cost-") as tmp:
            writes = measure_writes(Path(tmp) / "writes", args.n, args.steps, args.replicates,
                                    say=lambda m: print(m, flush=True))
        print(f"total {time.perf_counter() - t0:.0f} s\n")
        print(writes_table(writes, args.n, args.replicates))
        return
    with tempfile.TemporaryDirectory(prefix="judgeloop-cache-cost-") as tmp:
        writes = measure_writes(Path(tmp) / "writes", args.n, args.steps, args.replicates,
                                say=lambda m: print(m, flush=True))
        results = measure_costs(Path(tmp) / "costs", args.n, args.steps, args.candidates,
                                say=lambda m: print(m, flush=True))
        loops = compare_loops(Path(tmp) / "loops", args.loop_candidates, say=lambda m: print(m, flush=True))
        priced = measure_structures(Path(tmp) / "structures", args.n, args.steps, args.candidates,
                                    say=lambda m: print(m, flush=True))
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
