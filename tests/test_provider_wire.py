"""The pre-encoded request bodies the SDK providers send instead of calling ``create``.

The providers call the SDK clients' ``post`` with bytes they encoded themselves (the base64 images
spliced in), skipping ``chat.completions.create``'s parameter transform and the SDK's JSON encoding.
These tests prove that shortcut changes nothing on the wire: the bytes are exactly what the SDK
would have encoded, the transform would have been the identity, and the SDK still sends its own
headers, key and retries.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, cast

import pytest
from anthropic._utils._json import openapi_dumps as anthropic_dumps
from openai._utils import async_maybe_transform
from openai._utils._json import openapi_dumps as openai_dumps
from openai.types.chat import completion_create_params

from optimizer.judge.providers._common import _BLOB_NONCE, BodyBlobs, encode_json_body, http_client_options
from optimizer.judge.providers.anthropic_provider import AnthropicProvider
from optimizer.judge.providers.openai_provider import OpenAIProvider
from optimizer.judge.types import VERDICT_SCHEMA, ImagePart, JudgeRequest, Sampling, TextPart
from optimizer.workspace.config import JudgeSection
from tests.support.fakeserver import FakeLLMServer, rate_limited
from tests.support.fakeserver import fake_llm as _fake_llm_fixture

fake_llm = _fake_llm_fixture

ANTHROPIC_KEY = "sk-ant-bodies-SECRET-1"
OPENAI_KEY = "sk-proj-bodies-SECRET-2"
SAMPLINGS = [Sampling(max_tokens=64), Sampling(max_tokens=9, temperature=0.25, top_p=0.5)]


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)


def tricky_request() -> JudgeRequest:
    """Images of both media types, non-ASCII and control characters, quotes, an empty text part and
    a text imitating a splice marker (with a wrong nonce, and with NULs around it)."""
    return JudgeRequest(
        system='Judge — "strictly".\nRubric: ü, 漢字, tab\t, NUL \x00 end',
        parts=(
            TextPart("Goal: open ‘report.pdf’ \\ backslash"),
            ImagePart(bytes(range(256)) * 3, media_type="image/png", step_ids=(1,)),
            TextPart(""),
            TextPart("\x00" + "0" * 16 + ":0\x00 and \x00" + _BLOB_NONCE[::-1] + ":1\x00"),
            ImagePart(b"\xff\xd8\xff jpeg bytes", media_type="image/jpeg", step_ids=(2,)),
            TextPart("Step 2: done 🙂"),
        ),
    )


def text_only_request() -> JudgeRequest:
    return JudgeRequest(system="judge", parts=(TextPart("Goal: x"), TextPart("Step 1: click é")))


def providers() -> list[OpenAIProvider | AnthropicProvider]:
    return [
        OpenAIProvider(JudgeSection(provider="openai", model="gpt-4o")),
        OpenAIProvider(JudgeSection(provider="openai", model="qwen", base_url="http://127.0.0.1:9/v1")),
        AnthropicProvider(JudgeSection(provider="anthropic", model="claude-sonnet-4-6")),
    ]


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("request_", [tricky_request(), text_only_request()])
def test_encoded_body_is_byte_identical_to_the_sdk_encoding_of_build_params(
    keys: None, request_: JudgeRequest, sampling: Sampling
) -> None:
    for provider in providers():
        params = provider.build_params(request_, sampling, VERDICT_SCHEMA)
        dumps = anthropic_dumps if isinstance(provider, AnthropicProvider) else openai_dumps
        body = provider.encode_body(request_, sampling, VERDICT_SCHEMA)
        assert body == dumps(params), provider
        assert json.loads(body) == params


def test_openai_parameter_transform_is_the_identity_on_our_bodies(keys: None) -> None:
    # The reason calling client.post directly is safe: create() would send exactly this body.
    for provider in providers()[:2]:
        for request_ in (tricky_request(), text_only_request()):
            params = provider.build_params(request_, SAMPLINGS[1], VERDICT_SCHEMA)
            transformed = asyncio.run(
                async_maybe_transform(params, completion_create_params.CompletionCreateParamsNonStreaming)
            )
            assert transformed == params


def test_splicing_replaces_only_real_placeholders_even_when_text_imitates_one() -> None:
    blobs = BodyBlobs()
    first = blobs.placeholder('pre"fix/', b"\x00\x01binary")
    second = blobs.placeholder("", b"xy")
    imitation = "\x00" + _BLOB_NONCE + ":1\x00 is text, not an image"
    for body in (
        {"a": [first, {"b": second}], "c": "plain"},
        {"a": [first, imitation, {"b": second}], "c": "plain"},  # takes the slow path
    ):
        decoded = json.loads(encode_json_body(body, blobs.blobs))
        assert decoded["a"][0] == 'pre"fix/AAFiaW5hcnk='
        assert decoded["a"][-1] == {"b": "eHk="}
        assert decoded["a"][1:-1] == body["a"][1:-1]
        assert decoded["c"] == "plain"


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_posted_bodies_keep_sdk_headers_key_and_retries(
    keys: None, fake_llm: FakeLLMServer, wire: str
) -> None:
    fake_llm.script(rate_limited(retry_after=0.01))
    if wire == "anthropic":
        provider: OpenAIProvider | AnthropicProvider = AnthropicProvider(
            JudgeSection(
                provider="anthropic", model="claude-sonnet-4-6", base_url=fake_llm.anthropic_base_url
            )
        )
    else:
        provider = OpenAIProvider(
            JudgeSection(provider="openai", model="gpt-4o", base_url=fake_llm.openai_base_url)
        )

    async def call() -> str:
        try:
            return (await provider.complete(tricky_request(), SAMPLINGS[1], VERDICT_SCHEMA)).text
        finally:
            await provider.aclose()

    text = asyncio.run(call())
    assert json.loads(text)["success"] is True
    first, second = fake_llm.inference_requests()  # the 429 and its retry
    expected = provider.build_params(tricky_request(), SAMPLINGS[1], VERDICT_SCHEMA)
    for seen in (first, second):
        assert seen.body == expected
        assert seen.api_key_present
        assert seen.headers["content-type"] == "application/json"
        if wire == "anthropic":
            assert "anthropic-version" in seen.headers
    assert second.headers.get("x-stainless-retry-count") == "1"


def test_sdk_clients_share_one_verifying_ssl_context_and_pool_at_least_the_concurrency(keys: None) -> None:
    wide = JudgeSection(provider="openai", model="gpt-4o", max_concurrency=256)
    options = http_client_options(256)
    assert options["verify"] is http_client_options(4)["verify"]  # built once per process
    assert options["verify"].verify_mode == ssl.CERT_REQUIRED and options["verify"].check_hostname
    assert options["limits"].max_connections >= 256 and options["limits"].max_keepalive_connections >= 256
    for provider in (
        OpenAIProvider(wide),
        AnthropicProvider(JudgeSection(provider="anthropic", model="claude-sonnet-4-6", max_concurrency=256)),
    ):
        pool = cast(
            Any, provider._client._client._transport
        )._pool  # the SDK's httpx client's connection pool
        assert pool._max_connections >= 256 and pool._max_keepalive_connections >= 256
        assert pool._ssl_context is options["verify"]
