"""Judge providers behind one small interface (`optimizer.judge_types.Provider`).

- ``anthropic`` — `AnthropicProvider` (the ``anthropic`` SDK, key from ``ANTHROPIC_API_KEY``).
- ``openai`` — `OpenAIProvider` (the ``openai`` SDK, key from ``OPENAI_API_KEY``; ``base_url`` for any
  OpenAI-compatible server).
- ``local`` — `LocalProvider`, the offline demonstration-quality judge (SmolLM2-135M via xllamacpp).

Errors: transport failures that survive the SDK's retries raise `InfrastructureError`; a missing or
rejected key, an unknown model (HTTP 404), a server that cannot be reached before any call has
succeeded, or missing local runtime/weights raise `UserError`. Keys never appear in messages or reprs.
"""

from __future__ import annotations

from optimizer.config import JudgeSection
from optimizer.judge.providers.pricing import BUILTIN_PRICES, cost_usd, price_for
from optimizer.judge.types import Provider

__all__ = ["BUILTIN_PRICES", "Provider", "cost_usd", "make_provider", "price_for"]


def make_provider(judge: JudgeSection) -> Provider:
    """The provider named by ``judge.provider``, configured from the section (model, base_url,
    timeout_s, max_retries). Raises `UserError` at once for a missing key, runtime or weights.
    Concurrency (``max_concurrency``) is the caller's to enforce."""
    if judge.provider == "anthropic":
        from optimizer.judge.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider(judge)
    if judge.provider == "openai":
        from optimizer.judge.providers.openai_provider import OpenAIProvider

        return OpenAIProvider(judge)
    if judge.provider == "local":
        from optimizer.judge.providers.local_provider import LocalProvider

        return LocalProvider(judge)
    raise ValueError(f"unknown provider {judge.provider!r}")  # config validation makes this unreachable
