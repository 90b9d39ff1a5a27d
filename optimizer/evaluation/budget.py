"""Spending caps in US dollars. `Budget.reserve` is checked with an estimate before every paid call;
the estimate is `optimizer.judge.estimate`'s (the one token and cost estimator), re-exported here for
the evaluation's callers."""

from __future__ import annotations

from typing import Any

from optimizer.judge.estimate import estimate_cost_usd, estimate_turn_cost_usd
from optimizer.judge.types import ProviderReply

__all__ = ["Budget", "BudgetStop", "call_cost_usd", "estimate_cost_usd", "estimate_turn_cost_usd"]


class BudgetStop(Exception):
    """A paid call would cross the budget; the item is not evaluated and evaluation stops."""


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
