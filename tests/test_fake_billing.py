"""The fake server's billing anchored to reality: the providers' own documented request/usage pairs,
sent through the real SDKs to the fake with its prompt cache on (how the cost tests and
benchmarks/cache_cost.py run it), must come back with the documented usage.

The fake counts what a request holds (text at characters / 4, tests/fakecache.py), not the
provider's framing of it (role and turn markers: a few tokens per message). Tolerance, stated once:
the fake's prompt tokens are at most FRAMING_TOKENS below the documented count and never above it;
every other usage field is exact. A change that makes the fake bill like the judge's own estimator
instead of like the provider (e.g. the whole JSON body at characters / 4: 35+ tokens here) fails.
"""

from __future__ import annotations

import anthropic
import openai

from tests.support.fakecache import ManualClock, PromptCache
from tests.support.fakeserver import FakeLLMServer, reply

FRAMING_TOKENS = 6

# platform.claude.com/docs/build-with-claude/token-counting ("Count tokens in basic messages"):
# this request counts {"input_tokens": 14}; a request this short is below every model's minimum
# cacheable length, so nothing is read from or written to the prompt cache.
ANTHROPIC_REQUEST = {
    "model": "claude-sonnet-5-5",
    "system": "You are a scientist",
    "messages": [{"role": "user", "content": "Hello, Claude"}],
}
ANTHROPIC_USAGE = {"input_tokens": 14, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

# platform.openai.com/docs/api-reference/chat/create (the "Default" example): this request and its
# answer "\n\nHello there, how may I assist you today?" come with this usage block.
OPENAI_REQUEST = {
    "model": "gpt-4o",
    "messages": [
        {"role": "developer", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
    ],
}
OPENAI_ANSWER = "\n\nHello there, how may I assist you today?"
OPENAI_USAGE = {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29, "cached_tokens": 0}
# (the documented block nests cached_tokens under prompt_tokens_details)


def _within_framing(billed: int, documented: int) -> bool:
    return documented - FRAMING_TOKENS <= billed <= documented


def test_the_fake_bills_anthropics_documented_request_as_anthropic_documents() -> None:
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock())) as server:
        server.script(reply("Hello"))
        client = anthropic.Anthropic(api_key="k", base_url=server.anthropic_base_url, max_retries=0)
        try:
            usage = client.messages.create(max_tokens=1024, **ANTHROPIC_REQUEST).usage  # type: ignore[call-overload]
        finally:
            client.close()
    assert _within_framing(usage.input_tokens, ANTHROPIC_USAGE["input_tokens"]), usage
    assert usage.cache_creation_input_tokens == ANTHROPIC_USAGE["cache_creation_input_tokens"]
    assert usage.cache_read_input_tokens == ANTHROPIC_USAGE["cache_read_input_tokens"]


def test_the_fake_bills_openais_documented_request_as_openai_documents() -> None:
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock())) as server:
        server.script(reply(OPENAI_ANSWER))
        client = openai.OpenAI(api_key="k", base_url=server.openai_base_url, max_retries=0)
        try:
            usage = client.chat.completions.create(**OPENAI_REQUEST).usage  # type: ignore[call-overload]
        finally:
            client.close()
    assert usage is not None and usage.prompt_tokens_details is not None
    assert _within_framing(usage.prompt_tokens, OPENAI_USAGE["prompt_tokens"]), usage
    assert usage.completion_tokens == OPENAI_USAGE["completion_tokens"]
    assert usage.prompt_tokens_details.cached_tokens == OPENAI_USAGE["cached_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens  # as documented: 19 + 10 = 29
