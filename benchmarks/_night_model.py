"""The night benchmark's world (`benchmarks/night.py`): the simulated judge's items, the edits an optimiser
proposes (drawn from an effect distribution, `Dist`) and the true metrics of a prompt. Pure numpy.

Items. The dev split has AH-D's composition (62 positives; 100 negatives: 33 Critical Mistake (the
untyped one counted here), 26 Bad Side Effect, 41 Misunderstanding); the held-out set three times that
(486 items). Each item has a *kind* (positive, or its negative's mistake type) and a base logit of a right
judgement drawn as the decision-power judge's odds (`benchmarks._judge_model`): 30% unstable with
q ~ U(0.3, 0.7), the stable rest right with q = 0.99 (80%) or wrong with q = 0.01 (20%).

Edits. A prompt is the base prompt plus the edits kept so far; an item's logit is its base logit plus
the shifts of those edits (effects add in logit space). An edit is

- ``helpful``: it raises the logit of ``m`` dev items of one kind, chosen among the items of that kind the
  base judge tends to get wrong (q < 0.5), by a shift s ~ U(``shift``). ``m`` is drawn from ``small``, or
  from ``large`` with probability ``large_share``. With probability ``transfer`` it transfers: each
  held-out item of the same kind that the base judge tends to get wrong gets the same shift with
  probability m / (that dev pool's size), so it fixes the same share of them; otherwise it fits dev items
  only (no held-out effect);
- ``harmful``: it lowers the logit of ``m`` ~ ``harm`` dev items of one kind the base judge tends to get
  right, by s; with probability ``fpr`` it is lenient instead (FPR-raising): it lowers negatives of one
  mistake type and raises ceil(m/3) positives the judge tends to get wrong, a trade that raises FPR.
  Harm always transfers (same rule as above);
- ``neutral``: no effect (its requests differ, so every judgement is a fresh draw).

True metrics are computed from each item's probability of a right judgement: the expected confusion
counts of one judgement per item and Cohen's kappa of those counts (`true_metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Literal

import numpy as np

Direction = Literal["helpful", "harmful", "neutral"]

# Kinds: 0 = positive, then the negatives' mistake types.
KINDS = ("positive", "Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction")
DEV_KIND_COUNTS = (62, 33, 26, 41)  # AH-D: 62 positives; 32 + 1 untyped / 26 / 41 negatives
HELD_OUT_FACTOR = 3
STABLE_LOGIT = math.log(0.99 / 0.01)
UNSTABLE_SHARE, STABLE_RIGHT_SHARE, UNSTABLE_RANGE = 0.3, 0.8, (0.3, 0.7)


@dataclass(frozen=True)
class Dist:
    """An effect distribution: what share of edits is helpful / harmful (the rest neutral), how many dev
    items they act on (inclusive ranges), how far they move a logit, and how many transfer."""

    name: str
    helpful: float
    harmful: float
    small: tuple[int, int] = (1, 5)
    large_share: float = 0.0
    large: tuple[int, int] = (8, 15)
    harm: tuple[int, int] = (1, 4)
    fpr: float = 0.5
    transfer: float = 0.7
    shift: tuple[float, float] = (3.0, 7.0)

    def describe(self) -> str:
        """One line: the shares and sizes, as `parse_dist` reads them back."""
        neutral = max(0.0, 1 - self.helpful - self.harmful)
        return (
            f"{self.name}: helpful {self.helpful:.0%} (m {self.small[0]}-{self.small[1]}"
            + (
                f", {self.large_share:.0%} large m {self.large[0]}-{self.large[1]}"
                if self.large_share
                else ""
            )
            + f"; transfer {self.transfer:.0%}), harmful {self.harmful:.0%} (m {self.harm[0]}-{self.harm[1]}; "
            f"FPR-raising {self.fpr:.0%}), neutral {neutral:.0%}; logit shift {self.shift[0]:g}-{self.shift[1]:g}"
        )


PRESETS: dict[str, Dist] = {
    "small": Dist("small", helpful=0.2, harmful=0.4),
    "large": Dist("large", helpful=0.15, harmful=0.35, small=(1, 3), large_share=0.4),
    "harmful": Dist("harmful", helpful=0.1, harmful=0.7, harm=(2, 8)),
    "null": Dist("null", helpful=0.0, harmful=0.0),
}
DEFAULT_DISTS = ("small", "large", "harmful")


def parse_dist(text: str) -> Dist:
    """``NAME[,key=value...]``: a preset (`PRESETS`) with fields overridden, e.g.
    ``small,helpful=0.3,transfer=0.5,small=1-3``. Ranges are ``LO-HI``. Raises ValueError on a bad spec."""
    name, *pairs = text.split(",")
    if name not in PRESETS:
        raise ValueError(f"unknown distribution {name!r}; presets: {', '.join(PRESETS)}")
    dist = PRESETS[name]
    known = {f.name for f in fields(Dist)} - {"name"}
    changes: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise ValueError(f"bad distribution field {pair!r}; fields: {', '.join(sorted(known))}")
        if isinstance(getattr(dist, key), tuple):
            lo, dash, hi = value.partition("-")
            if not dash:
                raise ValueError(f"{key} takes a range LO-HI, got {value!r}")
            cast = int if key in ("small", "large", "harm") else float
            changes[key] = (cast(lo), cast(hi))
        else:
            changes[key] = float(value)
    out = replace(dist, **changes, name=text if pairs else name)  # type: ignore[arg-type]
    if out.helpful < 0 or out.harmful < 0 or out.helpful + out.harmful > 1:
        raise ValueError(f"{text}: helpful and harmful shares must be >= 0 and sum to at most 1")
    return out


@dataclass(frozen=True)
class Items:
    """A set of items: each one's kind (index into `KINDS`), label and base logit of a right judgement."""

    kind: np.ndarray
    positive: np.ndarray
    logit: np.ndarray

    def pool(self, kind: int, wrong: bool) -> np.ndarray:
        """Indices of ``kind``'s items the base judge tends to get wrong (``wrong``) or right."""
        return np.flatnonzero((self.kind == kind) & ((self.logit < 0) == wrong))


def make_items(rng: np.random.Generator, factor: int = 1) -> Items:
    """AH-D's composition times ``factor`` (kinds in `KINDS` order), base logits as the module docstring says."""
    kind = np.repeat(np.arange(len(KINDS)), [c * factor for c in DEV_KIND_COUNTS])
    n = len(kind)
    unstable = rng.random(n) < UNSTABLE_SHARE
    q_unstable = rng.uniform(*UNSTABLE_RANGE, n)
    right = rng.random(n) < STABLE_RIGHT_SHARE
    logit = np.where(
        unstable, np.log(q_unstable / (1 - q_unstable)), np.where(right, STABLE_LOGIT, -STABLE_LOGIT)
    )
    return Items(kind=kind, positive=kind == 0, logit=logit)


@dataclass(frozen=True)
class Edit:
    """One proposed edit: its direction, whether it raises FPR (a lenient harmful edit) and whether it
    transfers, and its logit shift on every dev and held-out item."""

    direction: Direction
    fpr_raising: bool
    transfers: bool
    dev: np.ndarray
    held: np.ndarray

    @property
    def dev_only(self) -> bool:
        """A helpful edit that fits dev items only."""
        return self.direction == "helpful" and not self.transfers


def _act(
    rng: np.random.Generator, items: tuple[Items, Items], target: tuple[int, bool, int], shift: float
) -> tuple[np.ndarray, np.ndarray]:
    """The shifts of an edit acting on ``m`` dev items of ``kind`` among those the base judge gets wrong
    (``wrong``) or right, and on the same share of such held-out items: (dev shifts, held-out shifts)."""
    dev, held = items
    kind, wrong, m = target
    out_dev, out_held = np.zeros(len(dev.kind)), np.zeros(len(held.kind))
    pool = dev.pool(kind, wrong)
    if len(pool) == 0:
        return out_dev, out_held
    chosen = rng.choice(pool, min(m, len(pool)), replace=False)
    out_dev[chosen] = shift
    held_pool = held.pool(kind, wrong)
    out_held[held_pool[rng.random(len(held_pool)) < len(chosen) / len(pool)]] = shift
    return out_dev, out_held


def draw_edit(rng: np.random.Generator, dist: Dist, items: tuple[Items, Items]) -> Edit:
    """One edit drawn from ``dist`` (module docstring) on the night's dev and held-out ``items``."""
    u = rng.random()
    shift = float(rng.uniform(*dist.shift))
    dev, held = items
    if u < dist.helpful:
        sizes = dist.large if rng.random() < dist.large_share else dist.small
        m = int(rng.integers(sizes[0], sizes[1] + 1))
        weights = np.array([len(dev.pool(k, True)) for k in range(len(KINDS))], float)
        kind = int(rng.choice(len(KINDS), p=weights / weights.sum()))
        d, h = _act(rng, items, (kind, True, m), shift)
        transfers = bool(rng.random() < dist.transfer)
        return Edit("helpful", False, transfers, d, h if transfers else np.zeros_like(h))
    if u < dist.helpful + dist.harmful:
        m = int(rng.integers(dist.harm[0], dist.harm[1] + 1))
        if rng.random() < dist.fpr:
            kind = int(rng.integers(1, len(KINDS)))
            d, h = _act(rng, items, (kind, False, m), -shift)
            d_pos, h_pos = _act(rng, items, (0, True, math.ceil(m / 3)), shift)
            return Edit("harmful", True, True, d + d_pos, h + h_pos)
        d, h = _act(rng, items, (0, False, m), -shift)
        return Edit("harmful", False, True, d, h)
    return Edit("neutral", False, True, np.zeros(len(dev.kind)), np.zeros(len(held.kind)))


def right_odds(logit: np.ndarray) -> np.ndarray:
    """The probability of a right judgement per item from its logit."""
    return 1 / (1 + np.exp(-logit))


@dataclass(frozen=True)
class TrueMetrics:
    """A prompt's true kappa and FPR on a set of items (expected counts, one judgement per item)."""

    kappa: float
    fpr: float


def true_metrics(logit: np.ndarray, positive: np.ndarray) -> TrueMetrics:
    """Kappa and FPR of the expected confusion counts of one judgement per item (``logit``: per item)."""
    q = right_odds(logit)
    n = len(q)
    tp, tn = float(q[positive].sum()), float(q[~positive].sum())
    n_pos = int(positive.sum())
    fn, fp = n_pos - tp, n - n_pos - tn
    observed = (tp + tn) / n
    expected = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / n**2
    kappa = (observed - expected) / (1 - expected) if expected < 1 else 0.0
    return TrueMetrics(kappa=kappa, fpr=fp / (n - n_pos))
