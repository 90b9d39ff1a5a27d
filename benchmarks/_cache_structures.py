"""Part 4 of `benchmarks/cache_cost.py`, cost per verdict per structure: the single judge, panels of 2 and 3,
``structure = "criteria"``, ``review = "success"`` and both, each a first pass and candidates on a fake with
its prompt cache on."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._cache_common import MINUTES_PER_CANDIDATE, MODELS, PacedClock, build
from optimizer.devset.split import Split
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD, PromptSet
from optimizer.judge.providers import make_provider
from optimizer.structure import set_key
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.config import with_layout
from tests.support.fakecache import PromptCache
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, reply, verdict_reply


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

    return {
        "single": dict(files),
        "panel of 2": with_panel(files, 2),
        "panel of 3": with_panel(files, 3),
        "criteria": keyed(structure="criteria"),
        "review": keyed(review="success"),
        "criteria+review": keyed(structure="criteria", review="success"),
    }


def _schema_properties(body: dict[str, Any]) -> dict[str, Any]:
    fmt = (
        body["response_format"]["json_schema"]
        if "response_format" in body
        else body["output_config"]["format"]
    )
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
        return reply(
            json.dumps({"violation": False, "reasoning": "no violation", "steps": [], "mistake_type": None})
        )
    if "criteria" in props and "success" not in props:
        return reply(
            json.dumps(
                {
                    "criteria": [
                        {"text": f"Requirement {i} of the instruction holds", "required": True}
                        for i in range(3)
                    ]
                }
            )
        )
    success = hashlib.sha256(_first_user_block(body).encode()).digest()[0] % REVIEW_SHARE_MOD == 0
    # The reasoning differs per request (as a model's does), so a candidate's review call is a new request.
    said = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    answer: dict[str, Any] = {
        "success": success,
        "reasoning": f"checked {said}",
        "confidence": "high",
        "mistake_type": None if success else "Critical Mistake",
    }
    if "criteria" in props:
        answer.update(
            criteria=[
                {"text": f"Requirement {i} of the instruction holds", "met": success or i > 0, "steps": [0]}
                for i in range(3)
            ],
            evidence_steps=[0],
        )
    return reply(json.dumps(answer))


@dataclass
class StructureFigures:
    calls_per_verdict: float
    writes_per_item: list[int]  # the fake's paid cache writes per item prefix, first pass
    first_usd: float  # dollars per verdict, first pass (cold trajectories)
    candidate_usd: list[float]  # dollars per verdict of each candidate pass (trajectories cached)
    candidate_calls: list[float] = dataclasses.field(
        default_factory=list
    )  # calls per verdict, each candidate

    @property
    def candidate_mean(self) -> float:
        return sum(self.candidate_usd) / len(self.candidate_usd)


async def price_structure(
    ws: Workspace,
    split: Split,
    wire: str,
    files: dict[str, str],
    candidates: int,
    *,
    minutes_per_candidate: float = MINUTES_PER_CANDIDATE,
) -> StructureFigures:
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
                    edited[RUBRIC_MD] = (
                        files[RUBRIC_MD] + f"\n- Candidate rule {k}: re-check requirement {k}.\n"
                    )
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


def measure_structures(
    root: Path,
    n: int,
    steps: int,
    candidates: int,
    *,
    wires: tuple[str, ...] = tuple(MODELS),
    say: Any = print,
    names: Sequence[str] | None = None,
    minutes_per_candidate: float = MINUTES_PER_CANDIDATE,
) -> dict[tuple[str, str], StructureFigures]:
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
            out[(wire, name)] = asyncio.run(
                price_structure(
                    ws, split, wire, structure_files, candidates, minutes_per_candidate=minutes_per_candidate
                )
            )
            say(
                f"  structure {wire:9} {name:15}: ${out[(wire, name)].candidate_mean:.5f} per verdict per candidate"
            )
    return out


def structures_table(
    results: dict[tuple[str, str], StructureFigures], n: int, steps: int, candidates: int
) -> str:
    lines = [
        f"cost per verdict per structure: trajectory-first, direct, {n} items x {steps} steps (a screenshot "
        f"each), first pass cold, then {candidates} candidates (one rubric rule each; trajectories cached)",
        f"  {'wire':9} {'structure':15} {'calls/verdict':>13} {'cand calls':>10} {'writes/item':>11} "
        f"{'first pass $/verdict':>21} {'/ single':>8} {'candidate $/verdict':>20} {'/ single':>8}",
    ]
    for wire in dict.fromkeys(w for w, _ in results):
        single = results[(wire, "single")]
        for (w, name), f in results.items():
            if w != wire:
                continue
            writes = sum(f.writes_per_item) / len(f.writes_per_item) if f.writes_per_item else 0.0
            cand_calls = sum(f.candidate_calls) / len(f.candidate_calls) if f.candidate_calls else 0.0
            lines.append(
                f"  {wire:9} {name:15} {f.calls_per_verdict:>13.2f} {cand_calls:>10.2f} {writes:>11.2f} "
                f"{f.first_usd:>21.5f} "
                f"{f.first_usd / single.first_usd:>8.2f} {f.candidate_mean:>20.5f} "
                f"{f.candidate_mean / single.candidate_mean:>8.2f}"
            )
    lines.append(
        "  (a panel's members share each item's cached trajectory: one write per item, the other members "
        "read it; after the first pass every call reads it, so a panel of k costs about k single verdicts;"
    )
    lines.append(
        "   criteria: one derivation per item from the instruction alone, cached per item, so a candidate that "
        "leaves criteria.md alone pays only the check; review: one more call on each success verdict, "
        f"here 1/{REVIEW_SHARE_MOD} of the items by hash)"
    )
    return "\n".join(lines)
