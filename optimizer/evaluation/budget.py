"""Spending caps and cost estimates (US dollars). `Budget.reserve` is checked with an estimate before
every paid call; the estimate counts text as characters / 4 tokens and an image as width·height / 750."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from PIL import Image

from optimizer.judge.types import (
    ImagePart,
    JudgeRequest,
    ProviderReply,
    Sampling,
    TextPart,
)

# The estimate the budget uses: text tokens ≈ characters / 4; an image ≈ width·height / 750 tokens
# (the Anthropic vision rule, within a few percent of OpenAI's tile rule at 512×332).
CHARS_PER_TOKEN = 4


IMAGE_PIXELS_PER_TOKEN = 750


MIN_IMAGE_TOKENS = 85


class Budget:
    """A spending cap in US dollars, checked before each paid call with an estimated cost.

    `reserve` holds the estimate while the call is in flight; `settle` replaces it with the actual
    cost; `release` drops it when the call failed. One Budget may span several evaluations.
    """

    def __init__(self, max_usd: float, spent_usd: float = 0.0) -> None:
        self.max_usd = max_usd
        self.spent_usd = spent_usd
        self.reserved_usd = 0.0

    @property
    def remaining_usd(self) -> float:
        return self.max_usd - self.spent_usd - self.reserved_usd

    def reserve(self, estimated_usd: float) -> bool:
        """Hold ``estimated_usd`` if it fits under the cap; False means "do not make this call"."""
        if self.spent_usd + self.reserved_usd + estimated_usd > self.max_usd + 1e-12:
            return False
        self.reserved_usd += estimated_usd
        return True

    def settle(self, estimated_usd: float, actual_usd: float) -> None:
        self.reserved_usd = max(0.0, self.reserved_usd - estimated_usd)
        self.spent_usd += actual_usd

    def release(self, estimated_usd: float) -> None:
        self.reserved_usd = max(0.0, self.reserved_usd - estimated_usd)


def call_cost_usd(reply: ProviderReply, prices: dict[str, Any], *, batch: bool = False) -> float:
    """Dollar cost of one reply from its usage fields and the price table (`[prices]` overrides);
    ``batch``: the call went through a batch API (its discount applies)."""
    from optimizer.judge.providers.pricing import cost_usd

    return cost_usd(reply.model, reply, prices, batch=batch)


def _image_tokens(part: ImagePart) -> int:
    try:
        with Image.open(io.BytesIO(part.data)) as img:  # reads the header only
            width, height = img.size
    except (OSError, ValueError):
        width, height = 512, 332
    return max(MIN_IMAGE_TOKENS, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN))


def _text_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def _parts_tokens(parts: Sequence[TextPart | ImagePart]) -> tuple[int, int]:
    """(characters of text, image tokens) of ``parts``."""
    chars = images = 0
    for part in parts:
        if isinstance(part, TextPart):
            chars += len(part.text)
        else:
            images += _image_tokens(part)
    return chars, images


def estimate_input_tokens(request: JudgeRequest) -> int:
    """Input tokens of ``request`` as the budget estimates them (text chars/4 + per-image pixels/750)."""
    chars, images = _parts_tokens(request.parts)
    return images + _text_tokens(len(request.system) + chars)


def request_token_split(request: JudgeRequest) -> tuple[int, int]:
    """(cacheable prefix, rest) of ``request``'s estimated input tokens. The prefix is what carries a
    cache breakpoint: the system prompt (every layout) and, under trajectory-first, the trajectory."""
    end = request.cache_prefix or 0
    head_chars, head_images = _parts_tokens(request.parts[:end])
    prefix = head_images + _text_tokens(len(request.system) + head_chars)
    return prefix, max(0, estimate_input_tokens(request) - prefix)


def _worst_prefix_price(price: Any, ttl: str | None) -> float:
    # A cached prefix is billed at the read price when the provider still has it, at the write price
    # when it does not (evicted, expired, another server): a reservation must assume the dearer one.
    write = price.cache_write_1h_price if ttl == "1h" else price.cache_write_price
    return max(price.input, write, price.cache_read_price)


def estimate_cost_usd(
    request: JudgeRequest, sampling: Sampling, model: str, prices: dict[str, Any], *, batch: bool = False
) -> float:
    """An upper bound on one call's cost, in US dollars, from the request's real split: the cacheable
    prefix (`request_token_split`) at the dearest price it can be billed at — a cache write with the
    request's TTL on Anthropic, the input price on OpenAI, whose cache has no write surcharge — the
    rest at the input price, and ``sampling.max_tokens`` of output; times the batch discount when
    ``batch``.

    Why not the expected price of a cached trajectory (0.1x input after an item's first call): a
    provider may evict a prefix before its TTL, and then the call costs the write price; reserving
    less could cross the budget. The reservation is held only while the call is in flight and is then
    settled at the call's billed cost (`Budget.settle`), so the bound only matters when the remaining
    budget is about one call.
    """
    from optimizer.judge.providers.pricing import price_for

    price = price_for(model, prices)
    if price is None:
        return 0.0
    prefix, rest = request_token_split(request)
    ttl = request.cache_ttl if request.cache_prefix is not None else None
    total = prefix * _worst_prefix_price(price, ttl) + rest * price.input + sampling.max_tokens * price.output
    return total / 1_000_000 * (price.batch_multiplier if batch else 1.0)


def estimate_turn_cost_usd(input_tokens: int, sampling: Sampling, model: str, prices: dict[str, Any],
                           ttl: str | None) -> float:
    """An upper bound on one agentic turn's cost (US dollars): a turn caches the whole conversation so
    far, so every input token is priced at the dearest of input, cache write (``ttl`` for the opening
    breakpoint, 5 minutes for the rest) and read; plus ``sampling.max_tokens`` of output."""
    from optimizer.judge.providers.pricing import price_for

    price = price_for(model, prices)
    if price is None:
        return 0.0
    per_token = max(_worst_prefix_price(price, ttl), _worst_prefix_price(price, None))
    return (input_tokens * per_token + sampling.max_tokens * price.output) / 1_000_000
