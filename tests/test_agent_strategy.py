"""The `agent` strategy drives a real tool-using conversation through the SDKs against the fake server."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import pytest
from PIL import Image

from optimizer.errors import UserError
from optimizer.loop.strategies import ProposalError
from optimizer.loop.strategies.agent import AgentStrategy
from optimizer.workspace.config import OptimizerSection, Price
from tests.support.fakeserver import FakeLLMServer, ToolCall, Usage, error, reply
from tests.support.strategies import DevFixture, disagreements_for, make_context, make_dev

OLD = "## Decision rules"
NEW = "## Decision rules\n\n- A clean execution of a neighbouring request is a failure."


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> DevFixture:
    """One read-only dev workspace for the module (the agent never writes files)."""
    return make_dev(tmp_path_factory.mktemp("agent"))


def _conversation(dev: DevFixture) -> list[Any]:
    """list disagreements → read trajectory → view screenshot → edit_file → submit."""
    tid = dev.items[2].trajectory_id  # a negative (pair 0, recording A with B's instruction)
    return [
        reply(
            "Let me look at the missed failures.",
            tool_calls=[ToolCall("list_disagreements", {"direction": "missed_failure"}, id="t1")],
            usage=Usage(1000, 50),
        ),
        reply(
            tool_calls=[ToolCall("read_trajectory", {"trajectory_id": tid, "start": 0, "end": 3}, id="t2")],
            usage=Usage(1200, 40),
        ),
        reply(
            tool_calls=[ToolCall("view_screenshot", {"trajectory_id": tid, "step": 2}, id="t3")],
            usage=Usage(1500, 30),
        ),
        reply(
            "The judge accepts near-miss executions.",
            tool_calls=[
                ToolCall("edit_file", {"path": "prompts/rubric.md", "old": OLD, "new": NEW}, id="t4")
            ],
            usage=Usage(1600, 80),
        ),
        reply(
            tool_calls=[
                ToolCall("submit", {"rationale": "Fail neighbouring-request executions explicitly."}, id="t5")
            ],
            usage=Usage(1700, 20),
        ),
    ]


def _anthropic_cfg(server: FakeLLMServer, **kw: Any) -> OptimizerSection:
    return OptimizerSection(
        strategy="agent", provider="anthropic", model="opt-model", base_url=server.anthropic_base_url, **kw
    )


def _tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    last = body["messages"][-1]
    assert last["role"] == "user"
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def test_agent_full_tool_conversation_through_anthropic_sdk(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    tid = dev.items[2].trajectory_id
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    rubric_before = (dev.ws.root / "prompts/rubric.md").read_text(encoding="utf-8")
    with FakeLLMServer() as server:
        server.script(*_conversation(dev))
        strategy = AgentStrategy(_anthropic_cfg(server), {"opt-model": Price(input=3.0, output=15.0)})
        proposal = asyncio.run(strategy.propose(ctx))
        requests = server.inference_requests()

    assert set(proposal.files) == {"prompts/rubric.md"}
    assert proposal.files["prompts/rubric.md"] == rubric_before.replace(OLD, NEW, 1)
    assert proposal.rationale == "Fail neighbouring-request executions explicitly."
    assert (dev.ws.root / "prompts/rubric.md").read_text(encoding="utf-8") == rubric_before  # never on disk
    assert proposal.calls == 5 and proposal.tool_errors == 0
    assert proposal.input_tokens == 7000 and proposal.output_tokens == 220
    assert proposal.cost_usd == pytest.approx((7000 * 3.0 + 220 * 15.0) / 1e6)

    assert len(requests) == 5
    first = requests[0].body
    assert {t["name"] for t in first["tools"]} >= {
        "list_disagreements",
        "read_trajectory",
        "view_screenshot",
        "read_history",
        "read_guidance",
        "read_file",
        "edit_file",
        "write_file",
        "submit",
    }
    assert "Allowed files: prompts/judge.md, prompts/rubric.md" in first["messages"][0]["content"][0]["text"]

    # 1: list_disagreements result went back as a tool_result for t1, after the assistant's tool_use.
    body = requests[1].body
    assistant = body["messages"][-2]
    assert assistant["role"] == "assistant"
    assert assistant["content"][0] == {"type": "text", "text": "Let me look at the missed failures."}
    assert assistant["content"][1]["type"] == "tool_use" and assistant["content"][1]["id"] == "t1"
    (result,) = _tool_results(body)
    assert result["tool_use_id"] == "t1" and not result.get("is_error")
    listed = json.loads(result["content"][0]["text"])
    assert listed["summary"]["matching"] == 2
    assert {i["label"] for i in listed["items"]} == {"negative"}

    # 2: read_trajectory → action lines of steps 0..3.
    (result,) = _tool_results(requests[2].body)
    text = result["content"][0]["text"]
    assert result["tool_use_id"] == "t2" and dev.items[2].instruction in text
    assert "step 0: left-click (10, 20)" in text and "step 2: hotkey Ctrl+s" in text

    # 3: view_screenshot → a text caption and a base64 JPEG image block.
    (result,) = _tool_results(requests[3].body)
    assert result["tool_use_id"] == "t3"
    caption, image = result["content"]
    assert "before step 2" in caption["text"] and tid in caption["text"]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/jpeg"
    assert Image.open(io.BytesIO(base64.b64decode(image["source"]["data"]))).format == "JPEG"

    # 4: edit_file confirmed; the conversation history is complete (3 user/assistant pairs before).
    (result,) = _tool_results(requests[4].body)
    assert result["tool_use_id"] == "t4" and result["content"][0]["text"].startswith(
        "edited prompts/rubric.md"
    )
    assert [m["role"] for m in requests[4].body["messages"]] == ["user"] + ["assistant", "user"] * 4


def test_agent_full_tool_conversation_through_openai_sdk(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    with FakeLLMServer() as server:
        server.script(*_conversation(dev))
        cfg = OptimizerSection(provider="openai", model="gpt-opt", base_url=server.openai_base_url)
        proposal = asyncio.run(AgentStrategy(cfg, {}).propose(ctx))
        requests = server.inference_requests()

    assert proposal.files["prompts/rubric.md"].count("neighbouring request is a failure") == 1
    assert proposal.calls == 5 and proposal.input_tokens == 7000
    assert all(r.wire == "openai" for r in requests)
    assert requests[0].body["tools"][0]["type"] == "function"
    msgs = requests[1].body["messages"]
    assert msgs[-2]["role"] == "assistant" and msgs[-2]["tool_calls"][0]["id"] == "t1"
    assert msgs[-1]["role"] == "tool" and msgs[-1]["tool_call_id"] == "t1"
    assert json.loads(msgs[-1]["content"])["summary"]["matching"] == 2
    # A screenshot: the tool message says so, then a user message carries the image as a data URL.
    msgs = requests[3].body["messages"]
    assert (
        msgs[-2]["role"] == "tool"
        and msgs[-2]["tool_call_id"] == "t3"
        and "follow in the next user message" in msgs[-2]["content"]
    )
    assert msgs[-1]["role"] == "user"
    url = msgs[-1]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).format == "JPEG"


def test_agent_heldout_id_and_forbidden_file_are_tool_errors(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    foreign = dev.heldout[0].trajectory_id
    with FakeLLMServer() as server:
        server.script(
            reply(
                tool_calls=[
                    ToolCall("read_trajectory", {"trajectory_id": foreign}, id="h1"),
                    ToolCall("write_file", {"path": "devset/dev/labels.jsonl", "text": "{}"}, id="h2"),
                ]
            ),
            reply(
                tool_calls=[
                    ToolCall(
                        "edit_file",
                        {"path": "prompts/judge.md", "old": "# Role", "new": "# Role of the judge"},
                        id="h3",
                    )
                ]
            ),
            reply(tool_calls=[ToolCall("submit", {"rationale": "Clearer role."}, id="h4")]),
        )
        proposal = asyncio.run(AgentStrategy(_anthropic_cfg(server), {}).propose(make_context(dev, [])))
        requests = server.inference_requests()
    results = _tool_results(requests[1].body)
    assert [r["tool_use_id"] for r in results] == ["h1", "h2"]
    assert all(r["is_error"] is True for r in results)
    assert "not in the dev split" in results[0]["content"][0]["text"]
    assert "not an allowed file" in results[1]["content"][0]["text"]
    assert foreign not in json.dumps(requests[0].body)  # never offered to the model
    assert proposal.tool_errors == 2
    assert set(proposal.files) == {"prompts/judge.md"}


def test_agent_without_submit_within_max_turns_is_a_proposal_error(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeLLMServer(default=lambda _r: reply(tool_calls=[ToolCall("read_guidance", {})])) as server:
        cfg = _anthropic_cfg(server, max_agent_turns=3)
        with pytest.raises(ProposalError, match="did not submit within 3 turns") as info:
            asyncio.run(AgentStrategy(cfg, {}).propose(make_context(dev, [])))
        assert len(server.inference_requests()) == 3  # bounded: never more calls than turns
    assert info.value.calls == 3


def test_agent_prose_only_replies_are_nudged_then_fail(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with FakeLLMServer(default=lambda _r: reply("I think the rubric is fine.")) as server:
        cfg = OptimizerSection(
            provider="openai", model="m", base_url=server.openai_base_url, max_agent_turns=2
        )
        with pytest.raises(ProposalError, match="did not submit"):
            asyncio.run(AgentStrategy(cfg, {}).propose(make_context(dev, [])))
        second = server.inference_requests()[1].body["messages"]
    assert second[-1] == {"role": "user", "content": "Use the tools; call submit when your edit is ready."}


def test_agent_submit_without_an_edit_is_refused_to_the_model(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeLLMServer() as server:
        server.script(
            reply(tool_calls=[ToolCall("submit", {"rationale": "nothing"}, id="s1")]),
            reply(tool_calls=[ToolCall("submit", {"rationale": "still nothing"}, id="s2")]),
        )
        cfg = _anthropic_cfg(server, max_agent_turns=2)
        with pytest.raises(ProposalError, match="did not submit"):
            asyncio.run(AgentStrategy(cfg, {}).propose(make_context(dev, [])))
        (result,) = _tool_results(server.inference_requests()[1].body)
    assert result["is_error"] and "edit a file before submitting" in result["content"][0]["text"]


def test_agent_outage_is_a_proposal_error_and_unknown_model_a_user_error(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeLLMServer() as server:
        server.script(reply(tool_calls=[ToolCall("read_history", {})], usage=Usage(100, 10)), error(500))
        with pytest.raises(ProposalError, match="HTTP 500") as info:
            asyncio.run(
                AgentStrategy(_anthropic_cfg(server, max_retries=0), {}).propose(make_context(dev, []))
            )
        assert info.value.calls == 1 and info.value.input_tokens == 100  # the spend before the outage is kept
    with (
        FakeLLMServer(models=["other-model"]) as server,
        pytest.raises(UserError, match="does not know model 'opt-model'"),
    ):
        asyncio.run(AgentStrategy(_anthropic_cfg(server, max_retries=0), {}).propose(make_context(dev, [])))
