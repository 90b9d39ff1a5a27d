"""Spending caps and cost estimates (US dollars). `Budget.reserve` is checked with an estimate before
every paid call; the estimate counts text as characters / 4 tokens and an image as width·height / 750."""

from __future__ import annotations

import io
import math
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


def call_cost_usd(reply: ProviderReply, prices: dict[str, Any]) -> float:
    """Dollar cost of one reply from its usage fields and the price table (`[prices]` overrides)."""
    from optimizer.judge.providers.pricing import cost_usd

    return cost_usd(reply.model, reply, prices)


def estimate_input_tokens(request: JudgeRequest) -> int:
    """Input tokens of ``request`` as the budget estimates them (text chars/4 + per-image pixels/750)."""
    chars = len(request.system)
    tokens = 0
    for part in request.parts:
        if isinstance(part, TextPart):
            chars += len(part.text)
        else:
            tokens += _image_tokens(part)
    return tokens + math.ceil(chars / CHARS_PER_TOKEN)


def _image_tokens(part: ImagePart) -> int:
    try:
        with Image.open(io.BytesIO(part.data)) as img:  # reads the header only
            width, height = img.size
    except (OSError, ValueError):
        width, height = 512, 332
    return max(MIN_IMAGE_TOKENS, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN))


def estimate_cost_usd(request: JudgeRequest, sampling: Sampling, model: str, prices: dict[str, Any]) -> float:
    """Upper-bound-ish estimate of one call: estimated input tokens + ``sampling.max_tokens`` output."""
    reply = ProviderReply(text="", model=model, input_tokens=estimate_input_tokens(request), output_tokens=sampling.max_tokens)
    return call_cost_usd(reply, prices)
