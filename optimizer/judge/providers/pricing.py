"""Token prices and the cost of one judge call, in US dollars.

Prices are US dollars per million tokens (`optimizer.workspace.config.Price`). The built-in table covers a
few current models and can be stale: ``[prices."<model>"]`` in ``judgeloop.toml`` always wins.

Token convention (the one `ProviderReply` uses): ``input_tokens`` are the uncached input tokens;
``cache_read_tokens`` and ``cache_write_tokens`` are billed apart at their own prices (see
`optimizer.workspace.config.Price` for the fall-backs when a price entry leaves them unset), the
``cache_write_1h_tokens`` part of the writes at the 1-hour price. A call made through a batch API is
priced with ``batch=True``: every price times ``Price.batch``, cache prices included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from optimizer.judge.types import ProviderReply
from optimizer.workspace.config import Price

# USD per million tokens, list prices from the providers' pricing pages (2026). Stale entries are
# harmless only if the user overrides them; keep this table short.
# Anthropic: a cache write costs 1.25x input with the 5-minute TTL, 2x with the 1-hour TTL; a cache
# read 0.1x input (0.05x on 5.5); the Message Batches API halves every price, cache prices included.
# OpenAI: automatic prompt caching, no write surcharge before GPT-5.6 (this wire reports no writes,
# so a GPT-5.6 write is billed here as input; `judgeloop plan` prices it at 1.25x); the Batch API
# halves the prices.
_A, _O = 0.5, 0.5  # batch multipliers
BUILTIN_PRICES: dict[str, Price] = {
    "claude-opus-5-5": Price(
        input=4.0, output=20.0, cache_read=0.20, cache_write=5.0, cache_write_1h=8.0, batch=_A
    ),
    "claude-sonnet-5-5": Price(
        input=2.0, output=10.0, cache_read=0.10, cache_write=2.5, cache_write_1h=4.0, batch=_A
    ),
    "claude-opus-5": Price(
        input=5.0, output=25.0, cache_read=0.50, cache_write=6.25, cache_write_1h=10.0, batch=_A
    ),
    "claude-sonnet-5": Price(
        input=2.0, output=10.0, cache_read=0.20, cache_write=2.5, cache_write_1h=4.0, batch=_A
    ),
    "claude-opus-4-8": Price(
        input=5.0, output=25.0, cache_read=0.50, cache_write=6.25, cache_write_1h=10.0, batch=_A
    ),
    "claude-opus-4-7": Price(
        input=5.0, output=25.0, cache_read=0.50, cache_write=6.25, cache_write_1h=10.0, batch=_A
    ),
    "claude-opus-4-6": Price(
        input=5.0, output=25.0, cache_read=0.50, cache_write=6.25, cache_write_1h=10.0, batch=_A
    ),
    "claude-opus-4-5": Price(
        input=5.0, output=25.0, cache_read=0.50, cache_write=6.25, cache_write_1h=10.0, batch=_A
    ),
    "claude-sonnet-4-6": Price(
        input=3.0, output=15.0, cache_read=0.30, cache_write=3.75, cache_write_1h=6.0, batch=_A
    ),
    "claude-sonnet-4-5": Price(
        input=3.0, output=15.0, cache_read=0.30, cache_write=3.75, cache_write_1h=6.0, batch=_A
    ),
    "claude-haiku-4-5": Price(
        input=1.0, output=5.0, cache_read=0.10, cache_write=1.25, cache_write_1h=2.0, batch=_A
    ),
    # GPT-5.6 (Sol, Terra, Luna): cached input 0.1x, cache writes 1.25x input. From third-party
    # copies of OpenAI's list (laxima.tech; coder/mux#3705 for the 1.25x writes), not verified
    # against OpenAI's page here; one other copy gives Sol $4/$20. Override with [prices."gpt-5.6-sol"].
    "gpt-5.6-sol": Price(
        input=5.0, output=30.0, cache_read=0.50, cache_write=6.25, cache_write_1h=6.25, batch=_O
    ),
    "gpt-5.6-terra": Price(
        input=2.5, output=15.0, cache_read=0.25, cache_write=3.125, cache_write_1h=3.125, batch=_O
    ),
    "gpt-5.6-luna": Price(
        input=1.0, output=6.0, cache_read=0.10, cache_write=1.25, cache_write_1h=1.25, batch=_O
    ),
    "gpt-5": Price(
        input=1.25, output=10.0, cache_read=0.125, cache_write=1.25, cache_write_1h=1.25, batch=_O
    ),
    "gpt-5-mini": Price(
        input=0.25, output=2.0, cache_read=0.025, cache_write=0.25, cache_write_1h=0.25, batch=_O
    ),
    "gpt-4.1": Price(input=2.0, output=8.0, cache_read=0.50, cache_write=2.0, cache_write_1h=2.0, batch=_O),
    "gpt-4.1-mini": Price(
        input=0.40, output=1.60, cache_read=0.10, cache_write=0.40, cache_write_1h=0.40, batch=_O
    ),
    "gpt-4o": Price(
        input=2.50, output=10.0, cache_read=1.25, cache_write=2.50, cache_write_1h=2.50, batch=_O
    ),
    "gpt-4o-mini": Price(
        input=0.15, output=0.60, cache_read=0.075, cache_write=0.15, cache_write_1h=0.15, batch=_O
    ),
    # The offline demonstration judge runs on this machine.
    "smollm2-135m": Price(input=0.0, output=0.0, cache_read=0.0, cache_write=0.0, cache_write_1h=0.0),
}

FREE = Price(input=0.0, output=0.0, cache_read=0.0, cache_write=0.0, cache_write_1h=0.0)


def price_for(model: str, overrides: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model``: an override by exact name, else the built-in table by exact name, else
    the longest built-in name that prefixes it (``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``).
    A local GGUF file costs nothing. None when the model is unknown."""
    if overrides and model in overrides:
        return overrides[model]
    if model.endswith(".gguf"):
        return FREE
    if model in BUILTIN_PRICES:
        return BUILTIN_PRICES[model]
    prefixes = [name for name in BUILTIN_PRICES if model.startswith(name + "-")]
    return BUILTIN_PRICES[max(prefixes, key=len)] if prefixes else None


def priced_usd(price: Price, reply: ProviderReply, *, batch: bool = False) -> float:
    """The cost in US dollars of ``reply``'s usage at ``price``: uncached input, cache reads, cache
    writes by TTL (``cache_write_1h_tokens`` at the 1-hour price, the rest at the 5-minute price) and
    output, all times the batch multiplier when the call went through a batch API (``batch``)."""
    written_5m = max(0, reply.cache_write_tokens - reply.cache_write_1h_tokens)
    total = (
        reply.input_tokens * price.input
        + reply.output_tokens * price.output
        + reply.cache_read_tokens * price.cache_read_price
        + written_5m * price.cache_write_price
        + reply.cache_write_1h_tokens * price.cache_write_1h_price
    )
    return total / 1_000_000 * (price.batch_multiplier if batch else 1.0)


def cost_usd(
    model: str, reply: ProviderReply, overrides: Mapping[str, Price] | None = None, *, batch: bool = False
) -> float:
    """The cost of one call in US dollars (`priced_usd` at ``model``'s price; ``batch``: made through a
    batch API). An unknown model (no override, not in the table) costs 0.0 — callers that must know
    should ask `price_for` first (e.g. to note "price unknown" in a run)."""
    price = price_for(model, overrides)
    if price is None:
        return 0.0
    return priced_usd(price, reply, batch=batch)


# Both batch APIs (Anthropic Message Batches, OpenAI Batch) bill every token at half the direct price.
def batch_multiplier(model: str, overrides: Mapping[str, Price] | None = None) -> float:
    """What a batch API multiplies ``model``'s token prices by (0.5 on Anthropic and OpenAI; 1.0 when
    the model's price sets no batch discount or is unknown)."""
    price = price_for(model, overrides)
    return 1.0 if price is None else price.batch_multiplier


def batch_cost_usd(model: str, reply: ProviderReply, overrides: Mapping[str, Price] | None = None) -> float:
    """The cost of one call answered through a provider's batch API, in US dollars: `cost_usd` with
    the batch multiplier on every token class, so on Anthropic the prompt-cache prices (reads,
    writes) stack with it: a cache read in a batch costs 0.1 x 0.5 of the input price."""
    return cost_usd(model, reply, overrides, batch=True)


@dataclass(frozen=True)
class Usage:
    """Calls, tokens and dollars summed over replies, in the `ProviderReply` token convention:
    ``input_tokens`` exclude cache reads and writes, which are counted apart."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    cache_write_1h_tokens: int = 0

    @classmethod
    def of(
        cls, reply: ProviderReply, overrides: Mapping[str, Price] | None = None, *, batch: bool = False
    ) -> Usage:
        """One call: the reply's tokens, priced by `cost_usd` for the model that answered (``batch``:
        at the batch price), or the cost the provider reported itself (``reply.cost_usd``, a harness CLI)."""
        reported = reply.cost_usd
        return cls(
            calls=1,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cache_read_tokens=reply.cache_read_tokens,
            cache_write_tokens=reply.cache_write_tokens,
            cost_usd=reported
            if reported is not None
            else cost_usd(reply.model, reply, overrides, batch=batch),
            cache_write_1h_tokens=reply.cache_write_1h_tokens,
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cache_write_1h_tokens=self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )


def warm_cost_usd(usage: Usage, price: Price) -> float:
    """What ``usage``'s billed tokens cost with every cache write priced as a cache read, US dollars: the
    steady state of a loop, where a trajectory is written to the prompt cache once and read by every
    later candidate (so a baseline that paid the writes compares fairly with candidates that read them)."""
    cached = usage.cache_read_tokens + usage.cache_write_tokens
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + cached * price.cache_read_price
    ) / 1_000_000


@dataclass(frozen=True)
class CpuSpeed:
    """What a call costs in time on the bundled CPU judge (the ``local`` provider), tokens per second.

    Measured with SmolLM2-135M (Q4_1) through xllamacpp on a 2-core machine (a 620-token prompt, 80
    tokens out; `optimizer.judge.providers.local_provider` picks the threads): with both cores idle, 2
    threads read the prompt at ~170 tokens/s and write at ~63 tokens/s; with the other core busy, 1
    thread reads at ~86 and writes at ~40. A verdict is typically ~80 tokens long (its reasoning is
    capped to fit ``max_tokens``). Another model or machine differs: the ledger's measured seconds
    replace this estimate after one run."""

    prompt_tokens_per_s: float
    output_tokens_per_s: float
    typical_output_tokens: int = 80

    def call_seconds(self, prompt_tokens: float) -> float:
        """Seconds for one call that reads ``prompt_tokens`` new tokens and writes a typical verdict."""
        return (
            prompt_tokens / self.prompt_tokens_per_s + self.typical_output_tokens / self.output_tokens_per_s
        )


CPU_IDLE = CpuSpeed(prompt_tokens_per_s=170.0, output_tokens_per_s=63.0)
CPU_ONE_BUSY = CpuSpeed(prompt_tokens_per_s=86.0, output_tokens_per_s=40.0)
