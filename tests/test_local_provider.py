"""The offline demonstration judge for real: SmolLM2-135M in-process via xllamacpp, driven through the
openai SDK code path, with JSON-schema constrained output."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from optimizer.judge.providers import make_provider
from optimizer.judge.providers.local_provider import LocalProvider
from optimizer.judge.types import VERDICT_SCHEMA, ImagePart, JudgeRequest, Sampling, TextPart
from optimizer.judge.verdicts import parse_verdict
from optimizer.models import Verdict
from optimizer.workspace.config import JudgeSection

pytest.importorskip("xllamacpp", reason="the local judge needs xllamacpp")

SYSTEM = (
    "You judge whether a computer-use agent completed the user's instruction. "
    'Answer only JSON: {"success": bool, "reasoning": str, "confidence": "low"|"medium"|"high", '
    '"mistake_type": null or one of "Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction"}.'
)

TINY_TRAJECTORIES = [
    JudgeRequest(
        system=SYSTEM,
        parts=(
            TextPart("Instruction: Rename the file report.txt to summary.txt on the Desktop."),
            TextPart("Step 1: right_click(desktop icon 'report.txt')"),
            ImagePart(b"not-a-real-jpeg", step_ids=(1,)),  # must be dropped, never sent
            TextPart("Step 2: click('Rename'); type('summary.txt'); press('enter')"),
        ),
    ),
    JudgeRequest(
        system=SYSTEM,
        parts=(
            TextPart("Instruction: Set the display brightness to 50% in Settings."),
            TextPart("Step 1: click('Settings')"),
            TextPart("Step 2: click('Sound'); drag(volume slider to 50%)"),
        ),
    ),
]


@pytest.mark.slow
@pytest.mark.local_model
def test_local_smollm2_returns_schema_valid_verdicts_and_stops_its_server() -> None:
    threads_before = threading.active_count()

    async def scenario() -> list[str]:
        provider = make_provider(JudgeSection(provider="local", timeout_s=600, max_retries=0))
        assert isinstance(provider, LocalProvider) and provider.traits.text_only
        texts = []
        try:
            for request in TINY_TRAJECTORIES:
                reply = await provider.complete(
                    request, Sampling(max_tokens=160, temperature=0.0), VERDICT_SCHEMA
                )
                assert reply.model == "smollm2-135m" and reply.input_tokens > 0 and reply.output_tokens > 0
                texts.append(reply.text)
            assert provider.base_url is not None and provider.base_url.startswith("http://127.0.0.1:")
            assert provider.threads is not None and 1 <= provider.threads <= 4
        finally:
            await provider.aclose()
        assert provider.base_url is None
        return texts

    texts = asyncio.run(scenario())
    for text in texts:
        data = json.loads(text)
        assert set(data) == set(VERDICT_SCHEMA["required"])  # constrained decoding: exactly the schema's keys
        assert data["confidence"] in ("low", "medium", "high")
        # The engine's own parser takes every reply as a usable verdict (a strict bool success, a known type).
        parsed = parse_verdict(text)
        assert parsed.ok and parsed.verdict == Verdict.model_validate(data), parsed.error
    assert threading.active_count() == threads_before


@pytest.mark.slow
@pytest.mark.local_model
def test_a_real_llama_cpp_server_accepts_the_agentic_conversation_wire_format() -> None:
    """The agentic judge's OpenAI-wire conversation (tools, an assistant turn with tool_calls, a tool
    answer) is accepted by a real OpenAI-compatible server — llama.cpp's, in-process via xllamacpp
    with its Jinja chat templates on — not only by the test suite's fake server. (SmolLM2-135M does
    not call tools itself; the point is the server parsing and templating what we send.)"""
    import xllamacpp

    from optimizer.judge.agentic import _tool_specs
    from optimizer.judge.providers.local_provider import resolve_gguf
    from optimizer.judge.providers.openai_provider import OpenAIProvider
    from optimizer.judge.types import (
        AssistantTurn,
        ConversationMessage,
        ToolCall,
        ToolResult,
        ToolResults,
        UserMessage,
    )

    params = xllamacpp.CommonParams()
    params.model.path = str(resolve_gguf("smollm2-135m"))
    params.n_ctx = 4096
    params.n_parallel = 1
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    params.verbosity = 0
    params.use_jinja = True  # llama.cpp needs it for `tools`
    server = xllamacpp.Server(params)
    base_url = str(server.listening_address).rstrip("/") + "/v1"
    messages: list[ConversationMessage] = [
        UserMessage(
            (
                TextPart(
                    "## Goal\n\nRename a.txt to b.txt.\n\n- Step 0: `click(a.txt)`\n- Step 1: `type(b.txt)`"
                ),
            )
        ),
        AssistantTurn(
            text="", tool_calls=(ToolCall("call_1", "read_steps", json.dumps({"first": 0, "last": 1})),)
        ),
        ToolResults(
            (ToolResult("call_1", (TextPart("### Step 0\n\nclick(a.txt)\n\n### Step 1\n\ntype(b.txt)"),)),)
        ),
    ]

    async def scenario() -> list[int]:
        provider = OpenAIProvider(
            JudgeSection(
                provider="openai", model="smollm2-135m", base_url=base_url, timeout_s=300, max_retries=0
            ),
            use_env_key=False,
        )
        try:
            outputs = []
            for conversation in (messages[:1], messages):
                turn, reply = await provider.converse(
                    SYSTEM, conversation, _tool_specs(True, 4), Sampling(max_tokens=16, temperature=0.0)
                )
                assert isinstance(turn, AssistantTurn) and reply.model
                outputs.append(reply.output_tokens)
            return outputs
        finally:
            await provider.aclose()

    try:
        outputs = asyncio.run(scenario())
    finally:
        del server
    assert all(n > 0 for n in outputs)
