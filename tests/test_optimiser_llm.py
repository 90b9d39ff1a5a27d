"""The optimiser's model goes through the judge's provider layer: one token convention, one price
table, one error mapping (worded for the optimiser), keys kept out of every message.

Everything runs the real SDK clients against the fake server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from optimizer.errors import UserError
from optimizer.evaluation.budget import call_cost_usd
from optimizer.judge.providers import make_provider
from optimizer.judge.providers.pricing import cost_usd
from optimizer.judge.types import VERDICT_SCHEMA, JudgeRequest, ProviderReply, Sampling, TextPart
from optimizer.loop.strategies import ProposalError
from optimizer.loop.strategies.agent import AgentStrategy
from optimizer.loop.strategies.reflect import ReflectStrategy
from optimizer.workspace.config import JudgeSection, OptimizerSection, Price, ProviderName
from tests.support.fakeserver import FakeLLMServer, ToolCall, Usage, error, reply, unauthorized, verdict_reply
from tests.support.strategies import DevFixture, disagreements_for, make_context, make_dev

ANTHROPIC_KEY = "sk-ant-test-SECRET-0123456789"
OPENAI_KEY = "sk-proj-test-SECRET-9876543210"
# A reply that read and wrote the provider's prompt cache (OpenAI has no cache writes to report).
CACHED = {
    "anthropic": Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=3000, cache_write_tokens=400),
    "openai": Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=3000),
}
# Models of the built-in price table: claude-sonnet-4-5 ($3 in, $15 out, $0.30 read, $3.75 write per
# million tokens) and gpt-4o-mini ($0.15 in, $0.60 out, $0.075 cached read).
MODEL = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o-mini"}
EXPECTED_COST = {
    "anthropic": (1000 * 3.0 + 200 * 15.0 + 3000 * 0.30 + 400 * 3.75) / 1e6,
    "openai": (1000 * 0.15 + 200 * 0.60 + 3000 * 0.075) / 1e6,
}


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> DevFixture:
    return make_dev(tmp_path_factory.mktemp("optimiser-llm"))


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)


def _base_url(server: FakeLLMServer, provider: str) -> str:
    return server.anthropic_base_url if provider == "anthropic" else server.openai_base_url


def _optimiser(server: FakeLLMServer, provider: str, **kw: Any) -> OptimizerSection:
    values: dict[str, Any] = {
        "provider": provider,
        "model": MODEL[provider],
        "base_url": _base_url(server, provider),
        "max_retries": 0,
        "timeout_s": 10.0,
    }
    values.update(kw)
    return OptimizerSection(**values)


def _section_reply(**usage: Any) -> Any:
    text = json.dumps(
        {
            "file": "prompts/rubric.md",
            "section_heading": "## Decision rules",
            "new_section": "## Decision rules\n\n- The instruction is the reference; check every parameter.",
            "rationale": "Tighten the decision rules.",
        }
    )
    return reply(text, **usage)


async def _judge_reply(
    server: FakeLLMServer, provider: ProviderName, prices: dict[str, Price]
) -> tuple[ProviderReply, float]:
    judge = make_provider(
        JudgeSection(
            provider=provider,
            model=MODEL[provider],
            base_url=_base_url(server, provider),
            max_retries=0,
            timeout_s=10.0,
        )
    )
    try:
        got = await judge.complete(
            JudgeRequest(system="judge", parts=(TextPart("Goal: x"),)), Sampling(), VERDICT_SCHEMA
        )
    finally:
        await judge.aclose()
    return got, call_cost_usd(got, prices)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_optimiser_counts_a_cached_reply_like_the_judge_and_prices_it_from_the_same_table(
    provider: ProviderName, keys: None, dev: DevFixture
) -> None:
    with FakeLLMServer() as server:
        server.script(verdict_reply(usage=CACHED[provider]), _section_reply(usage=CACHED[provider]))
        judge_reply, judge_cost = asyncio.run(_judge_reply(server, provider, {}))
        proposal = asyncio.run(
            ReflectStrategy(_optimiser(server, provider), {}).propose(
                make_context(dev, disagreements_for(dev.items, missed=1, rejected=1))
            )
        )

    # The providers' convention: input tokens exclude cache reads and writes, for judge and optimiser.
    assert judge_reply.input_tokens == 1000
    assert (proposal.calls, proposal.input_tokens, proposal.output_tokens) == (
        1,
        judge_reply.input_tokens,
        judge_reply.output_tokens,
    )
    # One price table: cache reads and writes billed at their own rates, the same dollars for both.
    assert judge_cost == pytest.approx(EXPECTED_COST[provider])
    assert proposal.cost_usd == pytest.approx(judge_cost)
    assert proposal.cost_usd == pytest.approx(cost_usd(MODEL[provider], judge_reply))


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_price_overrides_apply_to_the_optimiser_as_to_the_judge(
    provider: ProviderName, keys: None, dev: DevFixture
) -> None:
    prices = {MODEL[provider]: Price(input=1.0, output=2.0, cache_read=0.5, cache_write=1.5)}
    with FakeLLMServer() as server:
        server.script(verdict_reply(usage=CACHED[provider]), _section_reply(usage=CACHED[provider]))
        _, judge_cost = asyncio.run(_judge_reply(server, provider, prices))
        proposal = asyncio.run(
            ReflectStrategy(_optimiser(server, provider), prices).propose(make_context(dev, []))
        )
    write = 400 * 1.5 if provider == "anthropic" else 0
    assert judge_cost == pytest.approx((1000 * 1.0 + 200 * 2.0 + 3000 * 0.5 + write) / 1e6)
    assert proposal.cost_usd == pytest.approx(judge_cost)


def test_agent_spend_sums_every_turn_in_the_providers_convention(keys: None, dev: DevFixture) -> None:
    with FakeLLMServer() as server:
        server.script(
            reply(tool_calls=[ToolCall("read_guidance", {}, id="g1")], usage=CACHED["anthropic"]),
            reply(
                tool_calls=[
                    ToolCall(
                        "edit_file",
                        {"path": "prompts/judge.md", "old": "# Role", "new": "# Role of the judge"},
                        id="e1",
                    )
                ],
                usage=Usage(500, 50, cache_read_tokens=4000),
            ),
            reply(
                tool_calls=[ToolCall("submit", {"rationale": "Clearer role."}, id="s1")], usage=Usage(100, 10)
            ),
        )
        proposal = asyncio.run(
            AgentStrategy(_optimiser(server, "anthropic"), {}).propose(make_context(dev, []))
        )
        bodies = [r.body for r in server.inference_requests()]
    assert (proposal.calls, proposal.input_tokens, proposal.output_tokens) == (3, 1600, 260)
    expected = (1600 * 3.0 + 260 * 15.0 + 7000 * 0.30 + 400 * 3.75) / 1e6
    assert proposal.cost_usd == pytest.approx(expected)
    # The conversation's end is marked for the prompt cache, so each turn re-reads the previous ones.
    assert bodies[1]["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_reflect_is_one_plain_call_without_tools_or_a_cache_mark_on_its_message(
    keys: None, dev: DevFixture
) -> None:
    with FakeLLMServer() as server:
        server.script(_section_reply(), _section_reply())
        asyncio.run(ReflectStrategy(_optimiser(server, "anthropic"), {}).propose(make_context(dev, [])))
        asyncio.run(ReflectStrategy(_optimiser(server, "openai"), {}).propose(make_context(dev, [])))
        anthropic_body, openai_body = (r.body for r in server.inference_requests())
    assert "tools" not in anthropic_body and "tools" not in openai_body
    # No turn follows a one-off call: caching its large message would only pay the write surcharge.
    assert "cache_control" not in anthropic_body["messages"][0]["content"][0]
    assert anthropic_body["max_tokens"] == 4096


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_rejected_key_and_unknown_model_stop_the_run_naming_the_optimiser(
    provider: str, keys: None, dev: DevFixture
) -> None:
    env = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
    with FakeLLMServer() as server:
        server.script(unauthorized())
        with pytest.raises(
            UserError, match=rf"the optimiser's {provider} key was rejected .*HTTP 401.*check {env}"
        ):
            asyncio.run(ReflectStrategy(_optimiser(server, provider), {}).propose(make_context(dev, [])))
    with (
        FakeLLMServer(models=["other-model"]) as server,
        pytest.raises(UserError, match=r"the optimiser's .* does not know model .*fix \[optimizer\] model"),
    ):
        asyncio.run(ReflectStrategy(_optimiser(server, provider), {}).propose(make_context(dev, [])))


def test_an_unreachable_optimiser_server_is_a_proposal_error_not_a_user_error(
    keys: None, dev: DevFixture
) -> None:
    """The loop records a failed proposal and carries on (as before the optimiser used providers);
    only the judge treats a server that refuses its very first call as a setup error."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = OptimizerSection(
        provider="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
    )
    with pytest.raises(ProposalError, match=r"the optimiser's openai model 'm' .*connection failed") as info:
        asyncio.run(ReflectStrategy(cfg, {}).propose(make_context(dev, [])))
    assert info.value.calls == 0 and info.value.cost_usd == 0.0


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_the_key_never_reaches_a_proposal_error(provider: str, keys: None, dev: DevFixture) -> None:
    key = ANTHROPIC_KEY if provider == "anthropic" else OPENAI_KEY
    with FakeLLMServer() as server:
        server.script(error(400, error_type="invalid_request_error", message=f"bad request for key {key}"))
        with pytest.raises(ProposalError) as info:
            asyncio.run(ReflectStrategy(_optimiser(server, provider), {}).propose(make_context(dev, [])))
    assert "HTTP 400" in info.value.reason and "[redacted]" in info.value.reason
    assert key not in str(info.value) and key not in repr(info.value)


def test_missing_keys_are_refused_at_construction_naming_the_optimiser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError) as info:
        ReflectStrategy(OptimizerSection(provider="anthropic"), {})
    assert str(info.value) == (
        "the optimiser uses provider 'anthropic' but ANTHROPIC_API_KEY is not set; "
        "export it, or run with --strategy library (no key needed)"
    )
    with pytest.raises(UserError) as info:
        AgentStrategy(OptimizerSection(provider="openai"), {})
    assert str(info.value) == (
        "the optimiser uses provider 'openai' but OPENAI_API_KEY is not set; export it, "
        "set [optimizer] base_url for a local server, or run with --strategy library"
    )
    # An OpenAI-compatible server at base_url may need no key, as for the judge.
    AgentStrategy(OptimizerSection(provider="openai", base_url="http://127.0.0.1:9/v1"), {})
