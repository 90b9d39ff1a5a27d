"""Providers through the real ``anthropic`` and ``openai`` SDK clients against the fake HTTP server."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anthropic
import openai
import pytest
from pydantic import ValidationError

from optimizer.errors import UserError
from optimizer.judge.providers import make_provider
from optimizer.judge.providers.anthropic_provider import AnthropicProvider
from optimizer.judge.providers.local_provider import LocalProvider
from optimizer.judge.providers.openai_provider import PLACEHOLDER_KEY, OpenAIProvider
from optimizer.judge.providers.pricing import cost_usd, price_for
from optimizer.judge.types import (
    VERDICT_SCHEMA,
    ImagePart,
    InfrastructureError,
    JudgeRequest,
    ProviderReply,
    Sampling,
    TextPart,
)
from optimizer.workspace.config import JudgeSection, Price, ProviderName
from tests.support.fakeserver import (
    DEFAULT_VERDICT,
    FakeLLMServer,
    ToolCall,
    Usage,
    error,
    hang,
    malformed,
    rate_limited,
    reply,
    server_error,
    unauthorized,
    verdict_reply,
)
from tests.support.fakeserver import fake_llm as _fake_llm_fixture
from tests.support.fakeserver import fake_llm_factory as _fake_llm_factory_fixture

# The fake-server fixtures, made visible to pytest under their own names.
fake_llm = _fake_llm_fixture
fake_llm_factory = _fake_llm_factory_fixture

T = TypeVar("T")
ANTHROPIC_KEY = "sk-ant-test-SECRET-0123456789"
OPENAI_KEY = "sk-proj-test-SECRET-9876543210"
PNG_1 = b"\x89PNG-first-image"
PNG_2 = b"\x89PNG-second-image"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def request_with_images() -> JudgeRequest:
    return JudgeRequest(
        system="You are the judge. Rubric: ...",
        parts=(
            TextPart("Goal: open the file."),
            TextPart("Step 1: click"),
            ImagePart(PNG_1, media_type="image/png", step_ids=(1,)),
            TextPart("Step 2: type"),
            ImagePart(PNG_2, media_type="image/jpeg", step_ids=(2,)),
        ),
    )


def text_request() -> JudgeRequest:
    return JudgeRequest(system="judge", parts=(TextPart("Goal: x"), TextPart("Step 1: click")))


def section(provider: str, server: FakeLLMServer | None, **kw: Any) -> JudgeSection:
    base = None
    if server is not None:
        base = server.anthropic_base_url if provider == "anthropic" else server.openai_base_url
    values: dict[str, Any] = {
        "provider": provider,
        "model": "claude-sonnet-4-6" if provider == "anthropic" else "gpt-4o",
        "base_url": base,
        "timeout_s": 5.0,
        "max_retries": 2,
    }
    values.update(kw)
    return JudgeSection(**values)


async def one_call(
    judge: JudgeSection, request: JudgeRequest | None = None, sampling: Sampling | None = None
) -> ProviderReply:
    provider = make_provider(judge)
    try:
        return await provider.complete(request or text_request(), sampling or Sampling(), VERDICT_SCHEMA)
    finally:
        await provider.aclose()


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)


# -- round trips and request shape ----------------------------------------------------------------


def test_anthropic_round_trip_sends_cached_system_images_in_order_and_json_schema(
    keys: None, fake_llm: FakeLLMServer
) -> None:
    got = run(one_call(section("anthropic", fake_llm), request_with_images()))

    assert json.loads(got.text) == DEFAULT_VERDICT
    (sent,) = fake_llm.inference_requests()
    assert sent.path == "/v1/messages"
    # SDK 2.x sends the API key as a bearer token; the record keeps only the fact it was there.
    assert sent.api_key_present and sent.headers["authorization"] == "<redacted>"
    body = sent.body
    assert body["model"] == "claude-sonnet-4-6"
    assert body["system"] == [
        {"type": "text", "text": "You are the judge. Rubric: ...", "cache_control": {"type": "ephemeral"}}
    ]
    content = body["messages"][0]["content"]
    assert [b["type"] for b in content] == ["text", "text", "image", "text", "image"]
    assert content[2]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(PNG_1).decode(),
    }
    assert base64.b64decode(content[4]["source"]["data"]) == PNG_2
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": VERDICT_SCHEMA}}
    assert body["max_tokens"] == 1024
    assert "temperature" not in body and "top_p" not in body


def test_anthropic_sends_sampling_only_when_set(keys: None, fake_llm: FakeLLMServer) -> None:
    run(one_call(section("anthropic", fake_llm), sampling=Sampling(max_tokens=300, temperature=0.0)))
    body = fake_llm.inference_requests()[0].body
    assert body["temperature"] == 0.0
    assert body["max_tokens"] == 300
    assert "top_p" not in body


def test_openai_round_trip_sends_data_urls_and_strict_json_schema(
    keys: None, fake_llm: FakeLLMServer
) -> None:
    got = run(one_call(section("openai", fake_llm), request_with_images()))

    assert json.loads(got.text) == DEFAULT_VERDICT
    (sent,) = fake_llm.inference_requests()
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "<redacted>" and sent.api_key_present
    body = sent.body
    assert body["messages"][0] == {"role": "system", "content": "You are the judge. Rubric: ..."}
    user = body["messages"][1]["content"]
    assert [p["type"] for p in user] == ["text", "text", "image_url", "text", "image_url"]
    assert user[2]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG_1).decode()
    assert user[4]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True},
    }
    assert body["max_tokens"] == 1024  # a compatible server (base_url given) gets the classic name
    assert "temperature" not in body and "top_p" not in body


def test_openai_text_only_request_is_one_string_and_sampling_is_sent_when_set(
    keys: None, fake_llm: FakeLLMServer
) -> None:
    run(one_call(section("openai", fake_llm), text_request(), Sampling(temperature=0.3, top_p=0.9)))
    body = fake_llm.inference_requests()[0].body
    assert body["messages"][1]["content"] == "Goal: x\nStep 1: click"
    assert body["temperature"] == 0.3 and body["top_p"] == 0.9


def test_openai_official_api_uses_max_completion_tokens(keys: None) -> None:
    provider = OpenAIProvider(section("openai", None))
    params = provider.build_params(text_request(), Sampling(max_tokens=77), VERDICT_SCHEMA)
    assert params["max_completion_tokens"] == 77 and "max_tokens" not in params
    run(provider.aclose())


def test_openai_compatible_server_without_key_gets_a_placeholder(fake_llm: FakeLLMServer) -> None:
    got = run(one_call(section("openai", fake_llm)))
    assert json.loads(got.text)["success"] is True
    assert fake_llm.inference_requests()[0].api_key_present
    assert PLACEHOLDER_KEY  # documented placeholder, not a secret


# -- retries, timeouts and errors -----------------------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_rate_limit_with_retry_after_is_retried_then_succeeds(
    provider: str, keys: None, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(rate_limited(retry_after=0.05), rate_limited(retry_after=0.05), verdict_reply())
    got = run(one_call(section(provider, fake_llm, max_retries=2)))
    assert json.loads(got.text) == DEFAULT_VERDICT
    assert len(fake_llm.inference_requests()) == 3


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_server_error_is_retried_then_succeeds(provider: str, keys: None, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(server_error(500), verdict_reply())
    got = run(one_call(section(provider, fake_llm, max_retries=1)))
    assert json.loads(got.text)["confidence"] == "medium"
    assert len(fake_llm.inference_requests()) == 2


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_rate_limit_that_outlives_the_retries_is_an_infrastructure_error(
    provider: str, keys: None, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(*[rate_limited(retry_after=0.01)] * 3)
    with pytest.raises(InfrastructureError, match=r"rate limited \(HTTP 429\) after 2 retries"):
        run(one_call(section(provider, fake_llm, max_retries=2)))
    assert len(fake_llm.inference_requests()) == 3


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_timeout_after_retries_is_an_infrastructure_error(
    provider: str, keys: None, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(hang(4.0), hang(4.0))
    # A 1 s timeout, not less: on a loaded machine a shorter one can expire before the retry reaches the server.
    with pytest.raises(InfrastructureError, match="timed out after 1 retry"):
        run(one_call(section(provider, fake_llm, timeout_s=1.0, max_retries=1)))
    assert len(fake_llm.inference_requests()) == 2


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_unknown_model_404_is_a_user_error_naming_the_model(
    provider: str, keys: None, fake_llm_factory: Callable[..., FakeLLMServer]
) -> None:
    server = fake_llm_factory(models=["some-other-model"])
    with pytest.raises(UserError, match="model 'no-such-model' was not found") as info:
        run(one_call(section(provider, server, model="no-such-model")))
    assert "--model" in str(info.value)
    assert len(server.inference_requests()) == 1  # a 404 is not retried


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_persistent_500_is_an_infrastructure_error_quoting_the_status(
    provider: str, keys: None, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(server_error(503), server_error(503))
    with pytest.raises(InfrastructureError, match="HTTP 503 after 1 retry"):
        run(one_call(section(provider, fake_llm, max_retries=1)))


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_malformed_json_body_is_an_infrastructure_error(
    provider: str, keys: None, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(malformed())
    with pytest.raises(InfrastructureError, match="not valid JSON"):
        run(one_call(section(provider, fake_llm, max_retries=0)))


def test_missing_anthropic_key_is_a_user_error() -> None:
    with pytest.raises(UserError) as info:
        make_provider(JudgeSection(provider="anthropic", model="claude-sonnet-4-6"))
    assert str(info.value) == "ANTHROPIC_API_KEY is not set; export it or use --provider local"


def test_missing_openai_key_for_the_openai_api_is_a_user_error() -> None:
    with pytest.raises(UserError, match="OPENAI_API_KEY is not set; export it or use --provider local"):
        make_provider(JudgeSection(provider="openai", model="gpt-4o"))


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_rejected_key_is_a_user_error(provider: str, keys: None, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(unauthorized())
    with pytest.raises(UserError, match=r"was rejected .*HTTP 401"):
        run(one_call(section(provider, fake_llm)))


def test_keyless_compatible_server_that_wants_a_key_says_the_variable_is_unset(
    fake_llm: FakeLLMServer,
) -> None:
    fake_llm.script(unauthorized())
    with pytest.raises(UserError, match=r"OPENAI_API_KEY is not set but .* requires a key"):
        run(one_call(section("openai", fake_llm)))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_unreachable_base_url_on_the_first_call_is_a_user_error(provider: ProviderName, keys: None) -> None:
    url = f"http://127.0.0.1:{_closed_port()}" + ("/v1" if provider == "openai" else "")
    judge = JudgeSection(provider=provider, model="m", base_url=url, max_retries=0, timeout_s=2)
    with pytest.raises(UserError, match=r"cannot connect to .*start the server or fix --base-url"):
        run(one_call(judge))


def test_connection_lost_after_a_success_is_an_infrastructure_error(keys: None) -> None:
    async def scenario() -> None:
        with FakeLLMServer() as server:
            provider = make_provider(section("openai", server, max_retries=0))
            await provider.complete(text_request(), Sampling(), VERDICT_SCHEMA)
        # The server is gone now: the same provider can no longer connect.
        try:
            with pytest.raises(InfrastructureError, match="connection failed after 0 retries"):
                await provider.complete(text_request(), Sampling(), VERDICT_SCHEMA)
        finally:
            await provider.aclose()

    run(scenario())


# -- usage and cost -------------------------------------------------------------------------------


def test_anthropic_usage_including_cache_tokens_becomes_cost(keys: None, fake_llm: FakeLLMServer) -> None:
    usage = Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=5000, cache_write_tokens=300)
    fake_llm.script(verdict_reply(usage=usage))
    got = run(one_call(section("anthropic", fake_llm)))
    assert (got.input_tokens, got.output_tokens, got.cache_read_tokens, got.cache_write_tokens) == (
        1000,
        200,
        5000,
        300,
    )
    # claude-sonnet-4-6: 3 in, 15 out, 0.30 cache read, 3.75 cache write ($ per million tokens)
    expected = (1000 * 3 + 200 * 15 + 5000 * 0.30 + 300 * 3.75) / 1e6
    assert cost_usd("claude-sonnet-4-6", got, {}) == pytest.approx(expected)
    override = {"claude-sonnet-4-6": Price(input=1.0, output=2.0)}
    assert cost_usd("claude-sonnet-4-6", got, override) == pytest.approx((1000 + 400 + 5000 + 300) / 1e6)


def test_openai_cached_prompt_tokens_are_split_from_uncached(keys: None, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(verdict_reply(usage=Usage(input_tokens=700, output_tokens=50, cache_read_tokens=300)))
    got = run(one_call(section("openai", fake_llm)))
    assert (got.input_tokens, got.cache_read_tokens, got.output_tokens) == (700, 300, 50)
    expected = (700 * 2.50 + 300 * 1.25 + 50 * 10.0) / 1e6
    assert cost_usd("gpt-4o", got, None) == pytest.approx(expected)


def test_price_lookup_prefers_overrides_then_exact_then_longest_prefix() -> None:
    assert price_for("claude-sonnet-4-5-20250929") == price_for("claude-sonnet-4-5")
    assert price_for("gpt-4o-mini-2024-07-18") == price_for("gpt-4o-mini")
    assert price_for("totally-unknown") is None
    assert price_for("/models/x.gguf") == Price(
        input=0, output=0, cache_read=0, cache_write=0, cache_write_1h=0
    )
    mine = Price(input=9, output=9)
    assert price_for("gpt-4o", {"gpt-4o": mine}) is mine
    reply_ = ProviderReply(text="", model="x", input_tokens=10**6, output_tokens=10**6)
    assert cost_usd("totally-unknown", reply_) == 0.0
    assert cost_usd("smollm2-135m", reply_) == 0.0
    assert cost_usd("unknown", reply_, {"unknown": Price(input=1, output=2)}) == pytest.approx(3.0)


# -- keys never leak ------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_key_never_appears_in_errors_logs_reprs_or_replies(
    provider: str, keys: None, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    key = ANTHROPIC_KEY if provider == "anthropic" else OPENAI_KEY
    caplog.set_level(logging.DEBUG)
    # A hostile server echoes the key back in its error message.
    echo = error(400, error_type="invalid_request_error", message=f"bad request for key {key}")
    fake_llm.script(rate_limited(0.01), verdict_reply(), echo, rate_limited(0.01), rate_limited(0.01))

    async def scenario() -> list[str]:
        seen: list[str] = []
        p = make_provider(section(provider, fake_llm, max_retries=1))
        seen.append(repr(p))
        got = await p.complete(request_with_images(), Sampling(), VERDICT_SCHEMA)
        seen.append(repr(got))
        for _ in range(2):
            with pytest.raises(InfrastructureError) as info:
                await p.complete(text_request(), Sampling(), VERDICT_SCHEMA)
            seen.append(str(info.value))
            seen.append(repr(info.value))
            assert info.value.__cause__ is None and info.value.__context__ is not None
        await p.aclose()
        return seen

    seen = run(scenario())
    assert "[redacted]" in seen[2]  # the echoed key was scrubbed from the quoted server message
    assert all(key not in s for s in seen)
    assert key not in caplog.text
    assert caplog.records  # the SDKs did log at DEBUG; none of it carries the key
    assert all(key not in json.dumps(r.headers) for r in fake_llm.requests)


def test_provider_reprs_name_no_secret(keys: None) -> None:
    for p in (AnthropicProvider(section("anthropic", None)), OpenAIProvider(section("openai", None))):
        text = repr(p) + str(vars(p).get("_secret"))
        assert ANTHROPIC_KEY not in text and OPENAI_KEY not in text
        run(p.aclose())


# -- local provider set-up errors (the model itself runs in test_local_provider.py) ----------------


def test_local_provider_rejects_unknown_model_and_missing_gguf(tmp_path: Any) -> None:
    with pytest.raises(UserError, match="unknown local model 'tiny-llama'"):
        LocalProvider(JudgeSection(provider="local", model="tiny-llama"))
    with pytest.raises(UserError, match="does not exist"):
        LocalProvider(JudgeSection(provider="local", model=str(tmp_path / "nope.gguf")))


def test_local_provider_uses_a_user_gguf_path_and_is_text_only(tmp_path: Any) -> None:
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    provider = make_provider(JudgeSection(provider="local", model=str(gguf)))
    assert isinstance(provider, LocalProvider)
    assert provider.gguf == gguf.resolve() and provider.traits.text_only is True
    assert provider.base_url is None  # nothing started before the first call
    run(provider.aclose())


@pytest.mark.parametrize("cls", [AnthropicProvider, OpenAIProvider, LocalProvider])
def test_declared_traits_match_what_each_provider_implements(cls: type[Any]) -> None:
    """Callers trust ``traits`` instead of probing: tool use and a batch API are declared exactly when
    the methods behind them exist."""
    traits = cls.traits
    assert traits.tool_use == callable(getattr(cls, "converse", None))
    batch_methods = [
        callable(getattr(cls, m, None)) for m in ("submit_batch", "batch_state", "batch_results")
    ]
    assert (traits.batch is not None) == all(batch_methods) and (traits.batch is not None) == any(
        batch_methods
    )


def test_default_local_model_resolves_to_the_bundled_smollm2_gguf() -> None:
    provider = make_provider(JudgeSection())
    assert isinstance(provider, LocalProvider)
    assert provider.gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and provider.gguf.is_file()
    assert "demonstration" in (provider.traits.demo_label or "")


def test_local_threads_are_the_configured_count_or_the_idle_cores() -> None:
    import os

    from optimizer.judge.providers.local_provider import _inference_threads, idle_cores

    assert _inference_threads(3) == 3  # [judge] local_threads wins
    idle = idle_cores(0.05)
    assert idle is None or 0.0 <= idle <= (os.cpu_count() or 1)
    assert 1 <= _inference_threads() <= 4
    with pytest.raises(ValidationError):
        JudgeSection(provider="local", local_threads=0)


# -- the fake server itself (tool calls are what the optimiser agent will use) ---------------------


def test_fake_server_returns_tool_calls_through_both_sdks(fake_llm: FakeLLMServer) -> None:
    call = ToolCall(name="read_file", arguments={"path": "prompts/judge.md"}, id="t1")
    fake_llm.script(reply("let me look", tool_calls=[call]), reply(tool_calls=[call]))

    async def scenario() -> tuple[Any, Any]:
        a = anthropic.AsyncAnthropic(api_key="k", base_url=fake_llm.anthropic_base_url, max_retries=0)
        o = openai.AsyncOpenAI(api_key="k", base_url=fake_llm.openai_base_url, max_retries=0)
        try:
            msg = await a.messages.create(
                model="m",
                max_tokens=10,
                messages=[{"role": "user", "content": "hi"}],
                tools=[{"name": "read_file", "input_schema": {"type": "object"}}],
            )
            chat = await o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            models = await o.models.list()
            assert [m.id for m in models.data] == ["fake-model"]
            return msg, chat
        finally:
            await a.close()
            await o.close()

    msg, chat = run(scenario())
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert msg.content[1].name == "read_file" and msg.content[1].input == {"path": "prompts/judge.md"}
    tool_call = chat.choices[0].message.tool_calls[0]
    assert chat.choices[0].finish_reason == "tool_calls"
    assert tool_call.function.name == "read_file"
    assert json.loads(tool_call.function.arguments) == {"path": "prompts/judge.md"}
    assert fake_llm.requests[0].body["tools"][0]["name"] == "read_file"


def test_fake_server_default_callable_chooses_replies_from_the_request(
    fake_llm_factory: Callable[..., FakeLLMServer],
) -> None:
    def by_goal(req: Any) -> Any:
        text = json.dumps(req.body)
        return verdict_reply({**DEFAULT_VERDICT, "success": "negative" not in text})

    server = fake_llm_factory(default=by_goal)
    judge = section("openai", server)
    positive = run(one_call(judge, JudgeRequest(system="s", parts=(TextPart("a positive item"),))))
    negative = run(one_call(judge, JudgeRequest(system="s", parts=(TextPart("a negative item"),))))
    assert json.loads(positive.text)["success"] is True
    assert json.loads(negative.text)["success"] is False
    assert server.pending == 0


def test_local_schema_caps_reasoning_so_output_fits_the_token_limit() -> None:
    from optimizer.judge.providers.local_provider import bounded_schema

    capped = bounded_schema(VERDICT_SCHEMA, max_tokens=300)
    assert capped["properties"]["reasoning"] == {"type": "string", "maxLength": 236}
    assert capped["required"] == VERDICT_SCHEMA["required"]
    assert "maxLength" not in VERDICT_SCHEMA["properties"]["reasoning"]  # the shared schema is untouched
    assert bounded_schema({"type": "object"}, 300) == {"type": "object"}
