"""The offline demonstration judge for real: SmolLM2-135M in-process via xllamacpp, driven through the
openai SDK code path, with JSON-schema constrained output."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from optimizer.config import JudgeSection
from optimizer.judge_types import VERDICT_SCHEMA, ImagePart, JudgeRequest, Sampling, TextPart
from optimizer.models import Verdict
from optimizer.providers import make_provider
from optimizer.providers.local_provider import LocalProvider

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


@pytest.mark.local_model
def test_local_smollm2_returns_schema_valid_verdicts_and_stops_its_server() -> None:
    threads_before = threading.active_count()

    async def scenario() -> list[str]:
        provider = make_provider(JudgeSection(provider="local", timeout_s=600, max_retries=0))
        assert isinstance(provider, LocalProvider) and provider.text_only
        texts = []
        try:
            for request in TINY_TRAJECTORIES:
                reply = await provider.complete(
                    request, Sampling(max_tokens=160, temperature=0.0), VERDICT_SCHEMA
                )
                assert reply.model == "smollm2-135m" and reply.input_tokens > 0 and reply.output_tokens > 0
                texts.append(reply.text)
            assert provider.base_url is not None and provider.base_url.startswith("http://127.0.0.1:")
            assert 1 <= provider.threads <= 4
        finally:
            await provider.aclose()
        assert provider.base_url is None
        return texts

    texts = asyncio.run(scenario())
    for text in texts:
        data = json.loads(text)
        assert set(data) == set(VERDICT_SCHEMA["required"])  # constrained decoding: exactly the schema's keys
        assert data["confidence"] in ("low", "medium", "high")
        verdict = Verdict.model_validate(data)  # success is a strict bool
        assert isinstance(verdict.success, bool)
    assert threading.active_count() == threads_before
