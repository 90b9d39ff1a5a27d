"""Exact (Clopper–Pearson) bounds of a binomial proportion. Pure, no dependency.

The Clopper–Pearson one-sided lower bound at confidence 1 − α for x successes in n trials is the p
at which P(X ≥ x | n, p) = α, which is the α-quantile of Beta(x, n − x + 1); the upper bound is the
(1 − α)-quantile of Beta(x + 1, n − x). The beta quantile is found by bisection on the regularized
incomplete beta function I_z(a, b), evaluated by its continued fraction (modified Lentz), so the
bounds need no scipy. x = 0 gives a lower bound of 0, x = n an upper bound of 1.
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300


def _beta_cf(a: float, b: float, z: float) -> float:
    """The continued fraction of I_z(a, b) (Numerical Recipes' betacf, modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * z / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * z / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * z / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"the incomplete beta fraction did not converge for a={a}, b={b}, z={z}")


def regularized_beta(z: float, a: float, b: float) -> float:
    """I_z(a, b) for a, b > 0 and 0 ≤ z ≤ 1: the Beta(a, b) distribution function at z."""
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be positive, got a={a}, b={b}")
    if z <= 0.0:
        return 0.0
    if z >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(z) + b * math.log1p(-z)
    front = math.exp(log_front)
    # The fraction converges fast below the mean; above it, use the symmetry I_z(a, b) = 1 − I_{1−z}(b, a).
    if z < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, z) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - z) / b


def beta_quantile(q: float, a: float, b: float) -> float:
    """The z with I_z(a, b) = q (0 < q < 1), by bisection to double precision."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if regularized_beta(mid, a, b) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _check(successes: int, trials: int, alpha: float) -> None:
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def clopper_pearson_lower(successes: int, trials: int, alpha: float = 0.05) -> float:
    """One-sided exact lower bound at confidence 1 − ``alpha`` (0 when there is no success or no trial)."""
    _check(successes, trials, alpha)
    if successes == 0:
        return 0.0
    return beta_quantile(alpha, successes, trials - successes + 1)


def clopper_pearson_upper(successes: int, trials: int, alpha: float = 0.05) -> float:
    """One-sided exact upper bound at confidence 1 − ``alpha`` (1 when every trial succeeded, or none was made)."""
    _check(successes, trials, alpha)
    if successes == trials:
        return 1.0
    return beta_quantile(1.0 - alpha, successes + 1, trials - successes)


def clopper_pearson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The two-sided exact interval at ``level`` (each side at (1 − level) / 2)."""
    alpha = (1.0 - level) / 2
    return clopper_pearson_lower(successes, trials, alpha), clopper_pearson_upper(successes, trials, alpha)
