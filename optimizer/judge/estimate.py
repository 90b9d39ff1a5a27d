"""The one token and cost estimator: what rendering fits a request to (``token_budget``), what the
budget reserves before a paid call, and what a batch reserves before submission.

Units and rules (nothing else in the engine counts tokens):
- A text is ``ceil(characters / CHARS_PER_TOKEN)`` tokens, rounded up once per text counted:
  rendering counts each piece it may drop (`text_tokens`), a request counts its system prompt and
  all its text parts as one text (`chars_tokens` of their summed length).
- An image of ``width`` x ``height`` pixels is ``max(MIN_IMAGE_TOKENS, ceil(width*height /
  PIXELS_PER_IMAGE_TOKEN))`` tokens (Anthropic's published rule; 227 at 512x332, 907 for a 1024x664
  tile; the floor is the least any provider bills for an image, OpenAI's 85-token base). An encoded
  image is measured from its header (`image_data_tokens`; 512x332 when the header cannot be read).
- Costs are US dollars: tokens times the price table's dollars per million tokens
  (`optimizer.judge.providers.pricing`), an upper bound (`estimate_cost_usd`).

The tests' fake servers bill with their own rules (tests/fakecache.py), checked against the
providers' documented usage, so a test that a reservation covers a bill compares two things.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from PIL import Image

from optimizer.judge.types import ImagePart, JudgeRequest, Sampling, TextPart

CHARS_PER_TOKEN = 4
PIXELS_PER_IMAGE_TOKEN = 750
MIN_IMAGE_TOKENS = 85
# What an image whose header cannot be read is counted as (the default screenshot size).
FALLBACK_IMAGE_SIZE = (512, 332)


def chars_tokens(chars: int) -> int:
    """Estimated tokens of ``chars`` characters of text: ceil(chars / 4)."""
    return math.ceil(chars / CHARS_PER_TOKEN)


def text_tokens(text: str) -> int:
    """Estimated tokens of a text: ceil(characters / 4)."""
    return chars_tokens(len(text))


def image_tokens(width: int, height: int) -> int:
    """Estimated tokens of one image of ``width`` x ``height`` pixels: ceil(w*h / 750), at least 85."""
    return max(MIN_IMAGE_TOKENS, math.ceil(width * height / PIXELS_PER_IMAGE_TOKEN))


def image_data_tokens(part: ImagePart) -> int:
    """Estimated tokens of an encoded image, its size read from its header only."""
    try:
        with Image.open(io.BytesIO(part.data)) as img:  # reads the header only
            width, height = img.size
    except (OSError, ValueError):
        width, height = FALLBACK_IMAGE_SIZE
    return image_tokens(width, height)


def _parts_tokens(parts: Sequence[TextPart | ImagePart]) -> tuple[int, int]:
    """(characters of text, image tokens) of ``parts``."""
    chars = images = 0
    for part in parts:
        if isinstance(part, TextPart):
            chars += len(part.text)
        else:
            images += image_data_tokens(part)
    return chars, images


def request_input_tokens(request: JudgeRequest) -> int:
    """Estimated input tokens of ``request``: its system prompt and text parts as one text, plus each image."""
    chars, images = _parts_tokens(request.parts)
    return images + chars_tokens(len(request.system) + chars)


def request_token_split(request: JudgeRequest) -> tuple[int, int]:
    """(cacheable prefix, rest) of ``request``'s estimated input tokens. The prefix is what carries a
    cache breakpoint: the system prompt (every layout) and, under trajectory-first, the trajectory."""
    end = request.cache_prefix or 0
    head_chars, head_images = _parts_tokens(request.parts[:end])
    prefix = head_images + chars_tokens(len(request.system) + head_chars)
    return prefix, max(0, request_input_tokens(request) - prefix)


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


def estimate_turn_cost_usd(
    input_tokens: int, sampling: Sampling, model: str, prices: dict[str, Any], ttl: str | None
) -> float:
    """An upper bound on one agentic turn's cost (US dollars): a turn caches the whole conversation so
    far, so every input token is priced at the dearest of input, cache write (``ttl`` for the opening
    breakpoint, 5 minutes for the rest) and read; plus ``sampling.max_tokens`` of output."""
    from optimizer.judge.providers.pricing import price_for

    price = price_for(model, prices)
    if price is None:
        return 0.0
    per_token = max(_worst_prefix_price(price, ttl), _worst_prefix_price(price, None))
    return (input_tokens * per_token + sampling.max_tokens * price.output) / 1_000_000


def steady_cost_usd(request: JudgeRequest, output_tokens: int, price: Any) -> float:
    """One call's expected cost once its cacheable prefix is in the provider's cache (US dollars): the
    prefix (`request_token_split`) at the cache-read price, the rest at the input price, and
    ``output_tokens`` of output. Compares two prompt sets' cost per verdict before evaluation
    (``[optimizer] max_cost_ratio``, ``[loop] cheaper_min_saving``); never a reservation."""
    prefix, rest = request_token_split(request)
    return (prefix * price.cache_read_price + rest * price.input + output_tokens * price.output) / 1_000_000
