"""The fake server's prompt cache follows the providers' documented rules (tests/support/fakecache.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fakecache import CacheRequestError, ManualClock, PromptCache

EPH_1H = {"type": "ephemeral", "ttl": "1h"}
EPH = {"type": "ephemeral"}


def _anthropic(
    model: str, prefix_chars: int, tail: str = "question", *, ttl: dict[str, Any] = EPH_1H
) -> dict[str, Any]:
    return {
        "model": model,
        "system": [{"type": "text", "text": "static system", "cache_control": ttl}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "t" * prefix_chars, "cache_control": ttl},
                    {"type": "text", "text": tail},
                ],
            }
        ],
    }


def test_anthropic_writes_then_reads_the_prefix_up_to_the_breakpoint() -> None:
    cache = PromptCache(clock=ManualClock())
    first = cache.anthropic(_anthropic("claude-sonnet-4-5", 8000, "rubric one"))
    assert (first.cache_read_tokens, first.cache_write_1h_tokens, first.cache_write_5m_tokens) == (0, 2004, 0)
    assert first.input_tokens == 3  # "rubric one": after the last breakpoint
    second = cache.anthropic(_anthropic("claude-sonnet-4-5", 8000, "another rubric entirely"))
    assert (second.cache_read_tokens, second.cache_write_tokens, second.input_tokens) == (2004, 0, 6)
    other_model = cache.anthropic(_anthropic("claude-opus-4-5", 8000))
    assert other_model.cache_read_tokens == 0  # caches are per model


def test_anthropic_minimum_cacheable_length_depends_on_the_model() -> None:
    cache = PromptCache(clock=ManualClock())
    sonnet = cache.anthropic(_anthropic("claude-sonnet-4-5", 6000))  # ~1504 tokens: above 1024
    haiku = cache.anthropic(_anthropic("claude-haiku-4-5", 6000))  # below Haiku's 2048
    assert sonnet.cache_write_tokens == 1504 and haiku.cache_write_tokens == 0
    assert haiku.input_tokens == haiku.prompt_tokens


def test_anthropic_ttl_expires_on_the_injected_clock() -> None:
    clock = ManualClock()
    cache = PromptCache(clock=clock)
    cache.anthropic(_anthropic("claude-sonnet-4-5", 8000, ttl=EPH))  # 5 minutes
    cache.anthropic(_anthropic("claude-sonnet-4-5", 9000, ttl=EPH_1H))
    clock.advance(6 * 60)
    assert cache.anthropic(_anthropic("claude-sonnet-4-5", 8000, ttl=EPH)).cache_read_tokens == 0
    assert cache.anthropic(_anthropic("claude-sonnet-4-5", 9000)).cache_read_tokens == 2254
    clock.advance(59 * 60)  # a read refreshed the hour
    assert cache.anthropic(_anthropic("claude-sonnet-4-5", 9000)).cache_read_tokens == 2254
    clock.advance(61 * 60)
    assert cache.anthropic(_anthropic("claude-sonnet-4-5", 9000)).cache_read_tokens == 0


def test_anthropic_rejects_more_than_four_breakpoints_and_a_1h_after_a_5m() -> None:
    cache = PromptCache(clock=ManualClock())
    body = _anthropic("claude-sonnet-4-5", 100)
    body["messages"][0]["content"] = [
        {"type": "text", "text": f"b{i}", "cache_control": EPH} for i in range(4)
    ]
    with pytest.raises(CacheRequestError, match="maximum of 4"):
        cache.anthropic(body)
    with pytest.raises(CacheRequestError, match="1h"):
        cache.anthropic(
            _anthropic("claude-sonnet-4-5", 100)
            | {"system": [{"type": "text", "text": "s", "cache_control": EPH}]}
        )


def _openai(prefix_chars: int, tail: str, key: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-5",
        "messages": [
            {"role": "system", "content": "static"},
            {"role": "user", "content": "x" * prefix_chars + tail},
        ],
    }
    if key:
        body["prompt_cache_key"] = key
    return body


def test_openai_caches_prefixes_of_1024_tokens_and_more_in_128_token_steps() -> None:
    cache = PromptCache(clock=ManualClock())
    assert cache.openai(_openai(3000, "a")).cache_read_tokens == 0
    assert cache.openai(_openai(3000, "b")).cache_read_tokens == 0  # 750 tokens: too short to cache
    cache.openai(_openai(6000, "first tail"))
    hit = cache.openai(_openai(6000, "a different tail"))
    assert hit.cache_read_tokens == 1408 and hit.cache_read_tokens % 128 == 0
    assert hit.input_tokens + hit.cache_read_tokens == hit.prompt_tokens


def test_openai_routes_by_prompt_cache_key_and_spills_over_15_requests_a_minute() -> None:
    cache = PromptCache(clock=ManualClock(), openai_machines=4)
    # Twenty items sharing their first 256 tokens, each asked twice within a minute: without a key the
    # shared route overflows and many second calls land on a machine without the item's prefix.
    shared = "s" * 2000

    def item(i: int, key: str | None) -> dict[str, Any]:
        return _openai(0, shared + f"item {i} " + "y" * 6000 + "rubric", key)

    for key_mode in (None, "per-item"):
        cache.clear()
        for i in range(20):
            cache.openai(item(i, None if key_mode is None else f"k{i}"))
        hits = [
            cache.openai(item(i, None if key_mode is None else f"k{i}")).cache_read_tokens > 0
            for i in range(20)
        ]
        if key_mode is None:
            assert not all(hits)
        else:
            assert all(hits)
