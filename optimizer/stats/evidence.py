"""The adaptive policy's test and its record: each item's evidence d·|d|, the one-sided sign-flip test on
it (`adaptive_test`), and what a decision stores of it (`ItemShares`, `AdaptiveTest`) to show and
replay it. Pure. The policy itself is `optimizer.stats.adaptive`."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from optimizer.stats.signflip import (
    DEFAULT_DRAWS,
    MAX_EXACT_BITS,
    SignFlipResult,
    sign_flip_test,
)


class ItemShares(BaseModel):
    """One item's judgements in an adaptive decision: correct / total under each prompt."""

    model_config = ConfigDict(frozen=True)

    trajectory_id: str
    incumbent_correct: int
    incumbent_total: int
    candidate_correct: int
    candidate_total: int
    rejudged: bool = False

    @property
    def difference(self) -> Fraction:
        """Candidate share of correct judgements minus the incumbent's (in items, −1 … 1)."""
        return Fraction(self.candidate_correct, self.candidate_total) - Fraction(
            self.incumbent_correct, self.incumbent_total
        )

    def draws(self) -> str:
        """How it reads in a report: "1/3 → 3/3" (incumbent → candidate)."""
        return (
            f"{self.incumbent_correct}/{self.incumbent_total} → "
            f"{self.candidate_correct}/{self.candidate_total}"
        )


class AdaptiveTest(BaseModel):
    """What an adaptive decision tested, stored with it so it can be shown and replayed.

    ``items``: every item with a non-zero difference or that was re-judged, by id; the rest have
    d = 0. ``statistic``: Σ d_i, the candidate's gain in items. ``draws`` 0 means the p-value was
    enumerated exactly; otherwise it is Monte Carlo from ``seed``.
    """

    model_config = ConfigDict(frozen=True)

    first_pass: int
    rejudge: int
    alpha: float
    statistic: float
    p_value: float
    seed: int
    draws: int
    mcnemar_p: float
    items: list[ItemShares]

    @property
    def rejudged(self) -> list[ItemShares]:
        return [item for item in self.items if item.rejudged]

    def differences(self) -> list[Fraction]:
        return [item.difference for item in self.items]

    def replay(self) -> SignFlipResult:
        """The test again from what was stored: the same p-value, exact or from the same draws."""
        if self.draws == 0:
            return adaptive_test(self.differences(), seed=self.seed)
        return adaptive_test(self.differences(), seed=self.seed, draws=self.draws, max_exact_bits=-1)


def evidence(difference: Fraction) -> Fraction:
    """An item's score in the adaptive test: its difference weighted by its own size, d·|d| (odd and
    increasing in d, so the sign-flip test stays exact and the p-value monotone in every d)."""
    return difference * abs(difference)


def adaptive_test(
    differences: Sequence[Fraction],
    *,
    seed: int = 0,
    draws: int = DEFAULT_DRAWS,
    max_exact_bits: int = MAX_EXACT_BITS,
) -> SignFlipResult:
    """The adaptive policy's one-sided sign-flip test on per-item differences (statistic Σ d·|d|)."""
    return sign_flip_test(
        [evidence(d) for d in differences], seed=seed, draws=draws, max_exact_bits=max_exact_bits
    )
