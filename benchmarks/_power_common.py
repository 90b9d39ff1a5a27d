"""What the decision-power benchmark's parts share (`benchmarks/decision_power.py`): the kinds of candidate,
the policies, the plan of the runs and the simulated judge (`RunPlan`, `SimJudge`), and the trials with
their summary (`Trial`, `PolicyResult`, keep rates with bootstrap intervals, calls per pass)."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, get_args

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.stats.decision import Counts
from optimizer.workspace.config import LoopSection
from tests.support.data import pair_items

RUBRIC = "prompts/rubric.md"
JUDGE_TOML = "prompts/judge.toml"
STRUCTURAL_KINDS = ("s-noop", "s-fix8", "s-fix12")
# The panel rows: a judge.toml move to a unanimous [panel] of three named members, whose members err
# independently on PANEL_PLANTED planted negatives (p-fix) or identically everywhere (p-noop).
PANEL_PLANTED = 12
PANEL_KINDS = ("p-noop", f"p-fix{PANEL_PLANTED}")
EFFECT_MEMBERS, NOOP_MEMBERS = ("a", "b", "c"), ("x", "y", "z")
N_PAIRS, N_DOUBLE = 50, 12  # 50 pairs: 100 negatives; 12 pairs keep both positives, 38 one: 62
FIX_SIZES = (4, 8, 12)
KINDS = ("noop", *(f"fix{d}" for d in FIX_SIZES))
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]


def policies_available() -> list[str]:
    """The keep policies `LoopSection` accepts (``adaptive`` once issue 10 has landed)."""
    return list(get_args(LoopSection.model_fields["policy"].annotation))


def parse_policy(name: str) -> tuple[str, float | None]:
    """``adaptive`` → ("adaptive", None); ``adaptive+fdr0.1`` → ("adaptive", 0.1): online FDR on."""
    base, _, extra = name.partition("+")
    if not extra:
        return base, None
    if not extra.startswith("fdr"):
        raise ValueError(f"unknown policy variant {name!r} (use POLICY or POLICY+fdrLEVEL)")
    return base, float(extra[3:])


def rejudge_default() -> int:
    return int(LoopSection.model_fields["rejudge"].default)


FUTILITY = "+futility"  # a loop policy variant: adaptive with ``[loop] futility = true`` (off by default)


def schedule_for(rng: random.Random, candidates: int, fixes_per_run: int) -> list[str]:
    """One run's candidate kinds: ``fixes_per_run`` of each fix size, no-ops for the rest, shuffled."""
    fixes = [f"fix{d}" for d in FIX_SIZES for _ in range(fixes_per_run)]
    if len(fixes) > candidates:
        raise ValueError(f"{candidates} candidates per run cannot hold {len(fixes)} fixes")
    kinds = fixes + ["noop"] * (candidates - len(fixes))
    rng.shuffle(kinds)
    return kinds


@dataclass(frozen=True)
class RunPlan:
    """What runs to make: ``runs`` runs of ``candidates`` candidates, ``fixes_per_run`` fixes of each size D
    per run (no-ops for the rest), from ``seed``; ``schedule``, when given, is every run's candidate kinds
    in order instead of a shuffled one (tests, and the structural, panel and wave rows)."""

    runs: int
    candidates: int
    fixes_per_run: int
    seed: int
    schedule: Sequence[str] | None = None

    def kinds(self, rng: random.Random) -> list[str]:
        """One run's candidate kinds: the fixed schedule, or a shuffle drawn from ``rng``."""
        return (
            list(self.schedule) if self.schedule else schedule_for(rng, self.candidates, self.fixes_per_run)
        )


@dataclass(frozen=True)
class SimJudge:
    """The simulated judge's items, arrays over the split: the chance ``q`` of a right judgement, whether
    a fix may pick the item (``fixable``), and its label (``positive``)."""

    q: np.ndarray
    fixable: np.ndarray
    positive: np.ndarray


class Odds(NamedTuple):
    """Per item, the chance of a right judgement under the incumbent (``q_i``) and the candidate (``q_c``)."""

    q_i: np.ndarray
    q_c: np.ndarray


class Tallies(NamedTuple):
    """One comparison's running judgements per item (arrays, updated in place by the re-judging): right
    judgements under the incumbent and the candidate, and judgements per item (each side)."""

    inc_total: np.ndarray
    cand_total: np.ndarray
    judgements: np.ndarray


class Extra(NamedTuple):
    """The re-judgements drawn so far, by item index: the incumbent's (drawn once per incumbent, reused
    by its later candidates) and this candidate's."""

    inc: dict[int, list[bool]]
    cand: dict[int, list[bool]]


def confusion_counts(correct: np.ndarray, positive: np.ndarray) -> Counts:
    """The confusion counts of per-item right answers ``correct`` on labels ``positive`` (boolean arrays)."""
    tp = int((correct & positive).sum())
    tn = int((correct & ~positive).sum())
    n_pos = int(positive.sum())
    return Counts(tp, n_pos - tp, tn, len(positive) - n_pos - tn)


# --- trials and their summary -------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One decided candidate."""

    kind: str
    kept: bool
    calls: int
    run: str = ""  # the run it belongs to: trials of one run share incumbents, so they are not independent


@dataclass
class PolicyResult:
    policy: str
    trials: list[Trial] = field(default_factory=list)
    baseline_calls: int = 0
    server_calls: int = 0
    ledger_calls: int = 0
    undecided: int = 0  # candidates that ended in error (never expected here)
    engine_checked: int = (
        0  # simulated adaptive decisions replayed with optimizer.stats.decision.decide_adaptive
    )
    wall_s: float = 0.0  # summed over the worker tasks

    def merge(self, other: PolicyResult) -> None:
        self.trials += other.trials
        self.baseline_calls += other.baseline_calls
        self.server_calls += other.server_calls
        self.ledger_calls += other.ledger_calls
        self.undecided += other.undecided
        self.engine_checked += other.engine_checked
        self.wall_s += other.wall_s


def run_bootstrap(
    trials: Sequence[Trial], kind: str, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of the keep rate of ``kind``, resampling whole runs (percentile bootstrap): the
    candidates of one run share incumbents, so a binomial interval would be too narrow."""
    per_run: dict[str, list[int]] = {}
    for t in trials:
        if t.kind == kind:
            k_n = per_run.setdefault(t.run, [0, 0])
            k_n[0] += t.kept
            k_n[1] += 1
    if not per_run:
        return (0.0, 1.0)
    k, n = np.array(list(per_run.values())).T
    picks = np.random.default_rng(seed).integers(0, len(k), (draws, len(k)))
    rates = k[picks].sum(axis=1) / n[picks].sum(axis=1)
    lo, hi = np.percentile(rates, [2.5, 97.5])
    return float(lo), float(hi)


def keep_rate(trials: Sequence[Trial], kind: str) -> tuple[int, int]:
    chosen = [t for t in trials if t.kind == kind]
    return sum(t.kept for t in chosen), len(chosen)


def calls_per_pass(trials: Sequence[Trial], n_items: int, kind: str | None = None) -> float:
    chosen = [t for t in trials if kind is None or t.kind == kind]
    return sum(t.calls for t in chosen) / len(chosen) / n_items if chosen else float("nan")


def spaced_sentence(max_images: object) -> str:
    """The words of the {{screenshots}} sentence that name ``max_images`` under ``screenshots = "spaced"``."""
    return f"Up to {max_images} evenly spaced steps"


def labels_only() -> tuple[list[str | None], list[bool]]:
    """The benchmark split's labels in item-index order, without building a workspace."""
    items = []
    for pair in range(N_PAIRS):
        items += pair_items(pair, positives=(True, pair < N_DOUBLE), tag="power")
    return [i.mistake_type for i in items], [i.label == "positive" for i in items]
