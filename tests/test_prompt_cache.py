"""Cache-friendly judge requests (``layout = "trajectory-first"``) and their accounting, through the
real SDKs against the fake server with its prompt cache on (`tests.support.fakecache`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from optimizer.devset.importer import import_split
from optimizer.evaluation.budget import estimate_cost_usd
from optimizer.evaluation.cache import JudgeCache, cache_key
from optimizer.evaluation.evaluator import evaluate_items
from optimizer.evaluation.results import EvalRun
from optimizer.judge.estimate import request_input_tokens
from optimizer.judge.prompts import (
    JUDGE_TOML,
    RUBRIC_MD,
    STATIC_AGENTIC_SYSTEM_PROMPT,
    STATIC_SYSTEM_PROMPT,
    PromptSet,
)
from optimizer.judge.providers import make_provider
from optimizer.judge.providers.pricing import cost_usd, price_for
from optimizer.judge.render import RenderOptions, build_request
from optimizer.judge.types import VERDICT_SCHEMA, ProviderReply, Sampling, TextPart
from optimizer.loop.guards import DevMaterial, check_candidate
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.config import with_layout
from tests.support.data import make_items, write_release
from tests.support.fakecache import ManualClock, PromptCache, _openai_boundaries, text_tokens
from tests.support.fakeserver import FakeLLMServer, Usage, verdict_reply
from tests.support.fakeserver import fake_llm as _fake_llm_fixture

fake_llm = _fake_llm_fixture

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5"}
SECRET = "sk-test-cache-0123456789"


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.ws = init_workspace(tmp_path / "ws")
        items = make_items(2, n_steps=14)
        for i, item in enumerate(items):
            item.instruction = f"{item.instruction} Task number {i:03d}."
        release = write_release(tmp_path / "release", items)
        self.split = import_split(self.ws, release.root, "long", all_items=True, warn=lambda _msg: None)

    def prompts(self, layout: str, rubric_note: str = "") -> PromptSet:
        files = dict(PromptSet.from_dir(self.ws.prompts_dir).files)
        files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], layout)
        files[RUBRIC_MD] = files[RUBRIC_MD] + rubric_note
        return PromptSet.from_files(files)

    def evaluate(self, server: FakeLLMServer, wire: str, prompts: PromptSet) -> EvalRun:
        base_url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        judge = JudgeSection(provider=wire, model=MODELS[wire], base_url=base_url, max_concurrency=2)  # type: ignore[arg-type]
        return asyncio.run(
            evaluate_items(self.ws, self.split, prompts, judge, item_ids=self.split.ids, replicates=1)
        )


def _candidate_replies(setup: Setup, wire: str, layout: str) -> tuple[list[tuple[Any, Usage]], EvalRun]:
    """Evaluate the baseline, then a candidate that edits the rubric; the candidate's replies."""
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock())) as server:
        setup.evaluate(server, wire, setup.prompts(layout))
        before = len(server.replies)
        run = setup.evaluate(
            server, wire, setup.prompts(layout, "\n- A new rule: check the final state twice.\n")
        )
        return server.replies[before:], run


def _openai_prefix_tokens(body: dict[str, Any]) -> int:
    """Tokens of an OpenAI request up to (without) its last user content part: the trajectory prefix."""
    trimmed = json.loads(json.dumps(body))
    trimmed["messages"][-1]["content"] = trimmed["messages"][-1]["content"][:-1]
    return _openai_boundaries(trimmed)[1]


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_a_candidate_after_the_baseline_reads_the_trajectory_from_cache(
    wire: str, keys: None, tmp_path: Path
) -> None:
    setup = Setup(tmp_path)
    replies, run = _candidate_replies(setup, wire, "trajectory-first")
    assert len(replies) == len(setup.split.ids) and run.calls_made == len(replies)
    for recorded, usage in replies:
        last_part = recorded.body["messages"][-1]["content"][-1]
        assert "# Output contract" in last_part["text"] and "A new rule" in last_part["text"]
        if wire == "anthropic":
            # Everything up to the trajectory's breakpoint is read; only the instructions are new input.
            assert usage.cache_write_tokens == 0
            assert usage.input_tokens == text_tokens(last_part["text"])
            assert usage.cache_read_tokens > usage.input_tokens  # 14 steps with screenshots vs the rubric
        else:
            assert recorded.body["prompt_cache_key"].startswith("judgeloop-")
            assert usage.cache_read_tokens >= _openai_prefix_tokens(recorded.body) - 128
    # The evaluation counts the split as billed.
    assert run.cache_read_tokens == sum(u.cache_read_tokens for _, u in replies)
    assert run.input_tokens == sum(u.input_tokens for _, u in replies)


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_under_rubric_first_a_candidate_pays_every_trajectory_again(
    wire: str, keys: None, tmp_path: Path
) -> None:
    setup = Setup(tmp_path)
    replies, _ = _candidate_replies(setup, wire, "rubric-first")
    for recorded, usage in replies:
        trajectory = sum(
            text_tokens(p.get("text", ""))
            for p in recorded.body["messages"][-1]["content"]
            if p.get("type") == "text"
        )
        # At most the edited system prompt is read from the cache; the trajectory is paid in full.
        assert usage.input_tokens >= trajectory
        assert "prompt_cache_key" not in recorded.body
    first_first, _ = _candidate_replies(Setup(tmp_path / "again"), wire, "trajectory-first")
    billed_old = sum(u.input_tokens + 0.1 * u.cache_read_tokens for _, u in replies)
    billed_new = sum(u.input_tokens + 0.1 * u.cache_read_tokens for _, u in first_first)
    assert billed_new < 0.7 * billed_old  # short test items: the rubric is a large share of each request


def test_anthropic_cache_fields_are_parsed_and_priced_per_ttl_and_batch(
    keys: None, fake_llm: FakeLLMServer
) -> None:
    usage = Usage(
        input_tokens=1000,
        output_tokens=200,
        cache_read_tokens=5000,
        cache_write_tokens=3000,
        cache_write_1h_tokens=2000,
    )
    fake_llm.script(verdict_reply(usage=usage))
    judge = JudgeSection(
        provider="anthropic", model="claude-sonnet-4-5", base_url=fake_llm.anthropic_base_url
    )
    reply = asyncio.run(_one_call(judge))
    assert (
        reply.input_tokens,
        reply.cache_read_tokens,
        reply.cache_write_tokens,
        reply.cache_write_1h_tokens,
        reply.output_tokens,
    ) == (1000, 5000, 3000, 2000, 200)
    # claude-sonnet-4-5: 3 in, 15 out, 0.30 read, 3.75 5m write, 6.00 1h write ($ per million tokens)
    direct = (1000 * 3 + 200 * 15 + 5000 * 0.30 + 1000 * 3.75 + 2000 * 6.0) / 1e6
    assert cost_usd("claude-sonnet-4-5", reply) == pytest.approx(direct)
    assert cost_usd("claude-sonnet-4-5", reply, batch=True) == pytest.approx(
        direct * 0.5
    )  # the discounts stack


def test_openai_cached_tokens_are_part_of_prompt_tokens_and_priced_with_batch(
    keys: None, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(verdict_reply(usage=Usage(input_tokens=700, output_tokens=50, cache_read_tokens=3000)))
    judge = JudgeSection(provider="openai", model="gpt-5", base_url=fake_llm.openai_base_url)
    reply = asyncio.run(_one_call(judge))
    assert (reply.input_tokens, reply.cache_read_tokens, reply.cache_write_tokens) == (700, 3000, 0)
    direct = (700 * 1.25 + 3000 * 0.125 + 50 * 10.0) / 1e6
    assert cost_usd("gpt-5", reply) == pytest.approx(direct)
    assert cost_usd("gpt-5", reply, batch=True) == pytest.approx(direct * 0.5)
    assert price_for("gpt-5") is not None and price_for("gpt-5").batch == 0.5  # type: ignore[union-attr]


async def _one_call(judge: JudgeSection) -> ProviderReply:
    provider = make_provider(judge)
    try:
        from optimizer.judge.types import JudgeRequest

        request = JudgeRequest(
            system="s", parts=(TextPart("trajectory"), TextPart("rubric")), cache_prefix=1, cache_ttl="1h"
        )
        return await provider.complete(request, Sampling(), VERDICT_SCHEMA)
    finally:
        await provider.aclose()


def test_the_layout_is_in_the_prompt_hash_and_the_judge_cache_key(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    old, new = setup.prompts("rubric-first"), setup.prompts("trajectory-first")
    assert old.prompt_hash() != new.prompt_hash()
    traj = setup.split.trajectory(setup.split.ids[0])
    keys = {
        cache_key(
            provider="anthropic",
            model="m",
            sampling=Sampling(),
            schema=VERDICT_SCHEMA,
            request=build_request(traj, setup.split, p),
            replicate=0,
        )
        for p in (old, new)
    }
    assert len(keys) == 2


def test_the_static_system_prompt_is_beyond_every_candidates_reach(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    base = setup.prompts("trajectory-first")
    edited = dict(base.files)
    edited["prompts/judge.md"] = "# Role\n\nYou are a lenient judge.\n\n" + edited["prompts/judge.md"]
    edited[RUBRIC_MD] += "\n- Another rule.\n"
    candidate = PromptSet.from_files(edited)
    traj = setup.split.trajectory(setup.split.ids[0])
    a, b = build_request(traj, setup.split, base), build_request(traj, setup.split, candidate)
    # Whatever the allowed files say, the system prompt and the cached trajectory are byte-identical.
    assert a.system == b.system == STATIC_SYSTEM_PROMPT
    assert a.cache_prefix == b.cache_prefix and a.parts[: a.cache_prefix] == b.parts[: b.cache_prefix]
    assert a.prefix_key() == b.prefix_key() and a.fingerprint() != b.fingerprint()
    # It lives in the code, in no file of the workspace the loop could write.
    for path in Path(setup.ws.root).rglob("*"):
        if path.is_file() and ".git" not in path.parts and path.suffix in (".md", ".toml"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert STATIC_SYSTEM_PROMPT.splitlines()[0][:60] not in text
            assert STATIC_AGENTIC_SYSTEM_PROMPT.splitlines()[0][:60] not in text
    # And the one file that picks the layout is outside the optimiser's default reach: with structure
    # moves off (the default) the structure guard refuses any judge.toml edit.
    ws = Workspace.open(setup.ws.root)
    toml = base.files[JUDGE_TOML]
    verdict = check_candidate(
        {JUDGE_TOML: (toml, with_layout(toml, "rubric-first"))},
        ws.config.optimizer.allowed_files,
        200,
        DevMaterial([], [], []),
    )
    assert not verdict.ok and verdict.guard == "structure"


def test_a_budget_reservation_covers_a_first_call_that_writes_the_cache(keys: None, tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    prompts = setup.prompts("trajectory-first")
    traj = setup.split.trajectory(setup.split.ids[0])
    request = build_request(traj, setup.split, prompts)
    sampling = prompts.settings.sampling()
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock())) as server:
        judge = JudgeSection(
            provider="anthropic", model="claude-sonnet-4-5", base_url=server.anthropic_base_url
        )
        first = asyncio.run(_complete(judge, request, sampling))
        second = asyncio.run(_complete(judge, request, sampling))
    assert first.cache_write_1h_tokens > 0 and second.cache_read_tokens == first.cache_write_tokens
    reserved = estimate_cost_usd(request, sampling, "claude-sonnet-4-5", {})
    assert cost_usd("claude-sonnet-4-5", first) <= reserved
    assert cost_usd("claude-sonnet-4-5", second) < 0.5 * cost_usd("claude-sonnet-4-5", first)


# How far the estimator's input count may be from the fake's bill of the same request: the fake also
# counts role markers and the response schema on OpenAI's wire (about 2% of a 6k-token request).
ESTIMATE_TOLERANCE = 0.05


@pytest.mark.parametrize(("wire", "model"), [("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-5")])
def test_the_estimator_agrees_with_the_fakes_independent_bill_and_its_reservation_covers_it(
    keys: None, tmp_path: Path, wire: Literal["anthropic", "openai"], model: str
) -> None:
    """The estimator (`optimizer.judge.estimate`) against the fake's own billing (tests/fakecache.py,
    anchored to the providers' documented usage in tests/test_fake_billing.py), uncached and cached."""
    setup = Setup(tmp_path)
    prompts = setup.prompts("trajectory-first")
    request = build_request(setup.split.trajectory(setup.split.ids[0]), setup.split, prompts)
    sampling = prompts.settings.sampling()
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock())) as server:
        url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        judge = JudgeSection(provider=wire, model=model, base_url=url)
        first = asyncio.run(_complete(judge, request, sampling))
        second = asyncio.run(_complete(judge, request, sampling))
    assert first.cache_read_tokens == 0 < second.cache_read_tokens
    billed = first.input_tokens + first.cache_read_tokens + first.cache_write_tokens
    assert abs(request_input_tokens(request) - billed) <= ESTIMATE_TOLERANCE * billed
    reserved = estimate_cost_usd(request, sampling, model, {})
    assert cost_usd(model, first) <= reserved and cost_usd(model, second) <= reserved


async def _complete(judge: JudgeSection, request: Any, sampling: Sampling) -> ProviderReply:
    provider = make_provider(judge)
    try:
        return await provider.complete(request, sampling, VERDICT_SCHEMA)
    finally:
        await provider.aclose()


def test_rubric_first_bodies_carry_no_cache_key_or_second_breakpoint(keys: None, tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    traj = setup.split.trajectory(setup.split.ids[0])
    request = build_request(traj, setup.split, setup.prompts("rubric-first"))
    anthropic = make_provider(JudgeSection(provider="anthropic", model="claude-sonnet-4-5"))
    openai = make_provider(JudgeSection(provider="openai", model="gpt-5"))
    try:
        a = anthropic.build_params(request, Sampling(), VERDICT_SCHEMA)  # type: ignore[attr-defined]
        o = openai.build_params(request, Sampling(), VERDICT_SCHEMA)  # type: ignore[attr-defined]
    finally:
        asyncio.run(anthropic.aclose())
        asyncio.run(openai.aclose())
    assert a["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert not [b for b in a["messages"][0]["content"] if "cache_control" in b]
    assert "prompt_cache_key" not in o


def test_cache_store_is_reused_by_the_judge_cache_not_the_provider(keys: None, tmp_path: Path) -> None:
    """Re-evaluating the same candidate costs nothing at all: the judge-call cache answers first."""
    setup = Setup(tmp_path)
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock())) as server:
        setup.evaluate(server, "anthropic", setup.prompts("trajectory-first"))
        n = len(server.replies)
        again = setup.evaluate(server, "anthropic", setup.prompts("trajectory-first"))
        assert len(server.replies) == n and again.calls_made == 0
    with JudgeCache(setup.ws.cache_path) as cache:
        assert cache.stats().entries == n


def test_the_local_judge_keeps_the_shared_judge_prompt_first(tmp_path: Path) -> None:
    """llama.cpp re-uses one prompt prefix per slot: the judge prompt every item shares must lead."""
    from optimizer.judge.providers.local_provider import LocalProvider

    setup = Setup(tmp_path)
    prompts = setup.prompts("trajectory-first")
    traj = setup.split.trajectory(setup.split.ids[0])
    request = build_request(
        traj,
        setup.split,
        prompts,
        options=RenderOptions(text_only=True, layout=LocalProvider.traits.layout),
    )
    assert request.system == prompts.system_prompt() and request.cache_prefix is None
    assert (
        request.fingerprint()
        == build_request(
            traj,
            setup.split,
            setup.prompts("rubric-first"),
            options=RenderOptions(text_only=True),
        ).fingerprint()
    )
