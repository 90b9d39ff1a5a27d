"""The one-sided paired sign-flip permutation test on per-item differences. Pure.

Each item i has a difference d_i (the candidate's share of correct judgements minus the
incumbent's). Under the null hypothesis (the edit changes nothing) the two prompts are exchangeable
on every item, so each d_i is as likely to have come out as −d_i. The statistic is T = Σ d_i, the
candidate's gain in items; the p-value is P(Σ s_i·|d_i| ≥ T) over independent fair signs s_i.

Exact when it can be: with every d_i a fraction, scaled to integers a_i = d_i·L (L the least common
denominator), P(Σ s_i·|a_i| ≥ Σ a_i) = #{subsets S : Σ_{i∈S} |a_i| ≤ (A − Σ a_i)/2} / 2^m with
A = Σ |a_i| and m the number of non-zero differences (S = the items whose sign is flipped). The
subsets are counted exactly with the generating function ∏(1 + x^|a_i|), kept as one packed big
integer truncated above the threshold. Shares of k + r judgements give L ≤ lcm(k, k + r), so on
162 items this is exact and takes milliseconds. Only when the packed polynomial would be huge does
the test fall back to Monte Carlo: ``draws`` sign vectors from ``seed`` (numpy's PCG64), p =
(1 + #{T* ≥ T}) / (1 + draws), so a stored (seed, draws) replays the same p.

Monotonicity (used by the early-stopping bound in `optimizer.stats.decision`): the exact p-value never
rises when one d_i rises, whatever the others are. Write R = Σ_{j≠i} s_j|d_j| and T' = Σ_{j≠i} d_j;
p = ½·P(R ≥ T' + d_i − |d_i|) + ½·P(R ≥ T' + d_i + |d_i|), and both thresholds are non-decreasing
in d_i (d − |d| is 0 for d ≥ 0 and 2d below; d + |d| is 2d for d ≥ 0 and 0 below).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

DEFAULT_DRAWS = 20_000
# Above this many bits the packed generating function is not built; Monte Carlo instead.
MAX_EXACT_BITS = 40_000_000


@dataclass(frozen=True)
class SignFlipResult:
    """The test's outcome. ``p_exact`` is set when the p-value was enumerated exactly (then
    ``draws`` is 0); ``statistic`` is Σ d_i; ``nonzero`` the number of items with d_i ≠ 0."""

    p_value: float
    statistic: Fraction
    nonzero: int
    p_exact: Fraction | None
    seed: int
    draws: int

    def below(self, alpha: Fraction) -> bool:
        """p < alpha, exactly when the p-value is exact."""
        if self.p_exact is not None:
            return self.p_exact < alpha
        return Fraction(self.p_value) < alpha


def _packed_tail(magnitudes: Sequence[int], threshold: int) -> int:
    """#{subsets S of the items : Σ_{i∈S} magnitudes[i] ≤ threshold}, exactly."""
    if threshold < 0:
        return 0
    m = len(magnitudes)
    width = 8 * ((m + 1 + 7) // 8)  # one coefficient ≤ 2^m per field, byte-aligned for the read-out
    keep = (1 << ((threshold + 1) * width)) - 1
    poly = 1  # the constant polynomial 1: the empty subset
    for a in magnitudes:
        if a <= threshold:
            poly = (poly + (poly << (a * width))) & keep
    raw = poly.to_bytes((threshold + 1) * width // 8, "little")
    step = width // 8
    return sum(int.from_bytes(raw[i : i + step], "little") for i in range(0, len(raw), step))


def _grouped_tail(groups: Sequence[tuple[int, int]], threshold: int) -> int:
    """`_packed_tail` of the items given as (magnitude, how many items have it). An item above the
    threshold is in no counted subset, so whole groups are skipped without touching their items."""
    return _packed_tail([a for a, c in groups if a <= threshold for _ in range(c)], threshold)


def _grouped_sizes(counts: Mapping[Fraction, int]) -> tuple[list[tuple[Fraction, int]], int, int, int, int]:
    """(non-zero groups, items, scale, Σ|a_i|, Σ a_i) of differences given as value → count."""
    groups = [(v, c) for v, c in counts.items() if v and c]
    m = sum(c for _, c in groups)
    scale = math.lcm(*(v.denominator for v, _ in groups)) if groups else 1
    total = sum(c * int(abs(v) * scale) for v, c in groups)
    stat = sum(c * int(v * scale) for v, c in groups)
    return groups, m, scale, total, stat


def exact_bits_grouped(counts: Mapping[Fraction, int]) -> int:
    """`exact_bits` of the differences given as value → how many items have it (in O(distinct values))."""
    groups, m, _, total, stat = _grouped_sizes(counts)
    if not groups:
        return 0
    return (max((total - stat) // 2, 0) + 1) * 8 * ((m + 8) // 8)


def sign_flip_test_grouped(counts: Mapping[Fraction, int], *, seed: int = 0) -> SignFlipResult:
    """The exact `sign_flip_test` of the differences given as value → how many items have it: the same
    result, at a cost that depends on the distinct values, not on the items (the incremental
    early-stopping bound keeps such counts). Exact whatever the size: check `exact_bits_grouped` first."""
    groups, m, scale, total, stat_scaled = _grouped_sizes(counts)
    stat = sum((c * v for v, c in groups), Fraction(0))
    if not groups:
        return SignFlipResult(1.0, stat, 0, Fraction(1), seed, 0)
    magnitudes = [(int(abs(v) * scale), c) for v, c in groups]
    p = Fraction(_grouped_tail(magnitudes, (total - stat_scaled) // 2), 2**m)
    return SignFlipResult(float(p), stat, m, p, seed, 0)


def _log_cosh(x: float) -> float:
    return x + math.log1p(math.exp(-2 * x)) - math.log(2)  # x ≥ 0, without overflow


def sign_flip_upper_bound(counts: Mapping[Fraction, int]) -> float:
    """A number never below the exact p-value of the differences given as value → count, in
    O(distinct values): the Chernoff bound P(Σ s_i|d_i| ≥ T) ≤ exp(−λT)·∏ cosh(λ|d_i|) for any λ ≥ 0
    (λ from Newton's method; any λ is a valid bound), plus far more slack than float rounding can
    account for. Lets the early-stopping bound skip the exact test wherever the p-value is clearly
    below alpha; near alpha it is not sharp, and the exact test decides."""
    groups = [(abs(float(v)), c) for v, c in counts.items() if v and c]
    stat = float(sum((c * v for v, c in counts.items()), Fraction(0)))
    if not groups or stat <= 0:
        return 1.0
    spread = sum(c * b * b for b, c in groups)
    lam = stat / spread  # Hoeffding's λ: exp(−T²/2Σd²); Newton steps towards the Chernoff optimum
    for _ in range(4):
        slope = -stat + sum(c * b * math.tanh(lam * b) for b, c in groups)
        curve = sum(c * b * b * (1 - math.tanh(lam * b) ** 2) for b, c in groups)
        if curve <= 0 or not math.isfinite(slope / curve):
            break
        lam = max(lam - slope / curve, 0.0)
    log_p = -lam * stat + sum(c * _log_cosh(lam * b) for b, c in groups)
    if not math.isfinite(log_p):
        return 1.0
    # Each term is off by a few units of 2^-53 of its size, plus ~1e-16 per item where log cosh
    # cancels near 0: 1e-9 of their size, and per item, is ample.
    slack = 1e-9 * (1.0 + lam * stat + sum(c * (1.0 + lam * b) for b, c in groups))
    return min(1.0, math.exp(min(log_p + slack, 0.0)) * (1 + 1e-9))


def exact_bits(differences: Sequence[Fraction]) -> int:
    """The size in bits of the packed polynomial the exact test would build (0: trivially exact)."""
    nonzero = [d for d in differences if d]
    if not nonzero:
        return 0
    scale = math.lcm(*(d.denominator for d in nonzero))
    total = sum(int(abs(d) * scale) for d in nonzero)
    stat = int(sum(nonzero, Fraction(0)) * scale)
    threshold = max((total - stat) // 2, 0)
    return (threshold + 1) * 8 * ((len(nonzero) + 8) // 8)


def sign_flip_test(
    differences: Sequence[Fraction],
    *,
    seed: int = 0,
    draws: int = DEFAULT_DRAWS,
    max_exact_bits: int = MAX_EXACT_BITS,
) -> SignFlipResult:
    """One-sided p-value for "the differences are shifted upwards" (see the module docstring).

    ``differences`` in a fixed order (the Monte Carlo signs are drawn per position); zeros are
    allowed and change nothing. No non-zero difference: p = 1.
    """
    diffs = [Fraction(d) for d in differences]
    stat = sum(diffs, Fraction(0))
    nonzero = [d for d in diffs if d]
    if not nonzero:
        return SignFlipResult(1.0, stat, 0, Fraction(1), seed, 0)
    if exact_bits(diffs) <= max_exact_bits:
        scale = math.lcm(*(d.denominator for d in nonzero))
        magnitudes = [int(abs(d) * scale) for d in nonzero]
        total, scaled_stat = sum(magnitudes), int(stat * scale)
        # Σ s_i|a_i| ≥ T  ⇔  Σ_{flipped}|a_i| ≤ (A − T)/2  (A − T is even when T is reachable).
        threshold = (total - scaled_stat) // 2
        p = Fraction(_packed_tail(magnitudes, threshold), 2 ** len(magnitudes))
        return SignFlipResult(float(p), stat, len(nonzero), p, seed, 0)
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    values = np.array([float(d) for d in diffs])
    magnitudes_f = np.abs(values)
    observed = float(stat)
    rng = np.random.default_rng(seed)
    hits, done, chunk = 0, 0, 2_000
    while done < draws:
        n = min(chunk, draws - done)
        signs = rng.integers(0, 2, size=(n, len(values)), dtype=np.int8) * 2 - 1
        totals = signs @ magnitudes_f
        # A hair of tolerance: the observed arrangement itself must count as "as extreme".
        hits += int(np.count_nonzero(totals >= observed - 1e-9))
        done += n
    p_mc = (1 + hits) / (1 + draws)
    return SignFlipResult(p_mc, stat, len(nonzero), None, seed, draws)
