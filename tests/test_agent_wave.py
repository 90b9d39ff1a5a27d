"""`AgentStrategy.propose_wave`: a wave's candidates in one tool-using conversation through the real SDK
against the fake server — after each submit the files are back to the incumbent's, the model is asked
for a different edit, and each candidate carries its own turns' spend."""

from __future__ import annotations

import asyncio
import json

import pytest

from optimizer.loop.strategies import Proposal, ProposalError, proposes_waves
from optimizer.loop.strategies.agent import AgentStrategy
from optimizer.workspace.config import OptimizerSection
from tests.support.fakeserver import FakeLLMServer, ToolCall, Usage, reply
from tests.support.strategies import DevFixture, disagreements_for, make_context, make_dev

OLD = "## Decision rules"
RULE_A = "## Decision rules\n\n- A clean execution of a neighbouring request is a failure."
RULE_B = "## Decision rules\n\n- Check every typed value against the instruction."


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> DevFixture:
    return make_dev(tmp_path_factory.mktemp("agent-wave"))


def test_agent_proposes_a_wave_in_one_conversation(dev: DevFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    with FakeLLMServer() as server:
        server.script(
            reply(
                tool_calls=[
                    ToolCall("edit_file", {"path": "prompts/rubric.md", "old": OLD, "new": RULE_A}, id="a1")
                ],
                usage=Usage(1000, 50),
            ),
            reply(
                tool_calls=[ToolCall("submit", {"rationale": "neighbouring requests fail"}, id="a2")],
                usage=Usage(1100, 20),
            ),
            # Candidate 2: the model tries to submit with nothing edited (the files were reset), then edits.
            reply(tool_calls=[ToolCall("submit", {"rationale": "again"}, id="b0")], usage=Usage(1200, 10)),
            reply(
                tool_calls=[
                    ToolCall("edit_file", {"path": "prompts/rubric.md", "old": OLD, "new": RULE_B}, id="b1")
                ],
                usage=Usage(1300, 40),
            ),
            reply(
                tool_calls=[ToolCall("submit", {"rationale": "typed values"}, id="b2")], usage=Usage(1400, 20)
            ),
        )
        cfg = OptimizerSection(
            strategy="agent", provider="anthropic", model="opt-model", base_url=server.anthropic_base_url
        )
        strategy = AgentStrategy(cfg, {})
        assert proposes_waves(strategy)
        out = asyncio.run(strategy.propose_wave(ctx, 2))
        requests = server.inference_requests()
    first, second = out
    assert isinstance(first, Proposal) and isinstance(second, Proposal)
    assert first.rationale == "neighbouring requests fail" and second.rationale == "typed values"
    assert "neighbouring request is a failure" in first.files["prompts/rubric.md"]
    # The second candidate starts from the incumbent: it holds its own rule only.
    assert "typed value" in second.files["prompts/rubric.md"]
    assert "neighbouring request" not in second.files["prompts/rubric.md"]
    assert (first.calls, first.input_tokens) == (2, 2100) and (second.calls, second.input_tokens) == (3, 3900)
    assert second.tool_errors == 1  # the empty submit was refused to the model
    # One conversation: the third request answers the first submit and asks for candidate 2.
    assert len(requests) == 5
    opening = json.dumps(requests[0].body["messages"][0])
    assert "Candidate 1 of 2" in opening
    third = requests[2].body["messages"]
    # (two user turns in a row: the Messages API joins consecutive turns of one role)
    assert any(b.get("type") == "tool_result" and b.get("tool_use_id") == "a2" for b in third[-2]["content"])
    assert "Candidate 2 of 2: the files are back to the incumbent" in json.dumps(third[-1])


def test_an_agent_that_stops_submitting_fails_the_rest_of_its_wave(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    ctx = make_context(dev, disagreements_for(dev.items, missed=1, rejected=1))
    with FakeLLMServer() as server:
        server.script(
            reply(
                tool_calls=[
                    ToolCall("edit_file", {"path": "prompts/rubric.md", "old": OLD, "new": RULE_A}, id="a1")
                ]
            ),
            reply(tool_calls=[ToolCall("submit", {"rationale": "one"}, id="a2")]),
            *[reply("thinking") for _ in range(4)],
        )
        cfg = OptimizerSection(
            strategy="agent",
            provider="anthropic",
            model="opt-model",
            base_url=server.anthropic_base_url,
            max_agent_turns=2,
        )
        out = asyncio.run(AgentStrategy(cfg, {}).propose_wave(ctx, 3))
    assert isinstance(out[0], Proposal)
    assert isinstance(out[1], ProposalError) and "did not submit candidate 2 within 2 turns" in out[1].reason
    assert out[1].calls == 2
    assert isinstance(out[2], ProposalError) and out[2].calls == 0
