"""The noise floor of the keep/rollback decision: how often a no-op candidate is kept.

A no-op candidate changes nothing real: it has exactly the incumbent's per-item accuracies, and the
only difference between the two evaluations is the judge's run-to-run instability. Every keep is
therefore a false discovery. For each split size the script simulates many incumbent/candidate
pairs and applies both policies with the real `optimizer.stats.decision.decide_counts`.

Per-item accuracy model (a Beta mixture, drawn afresh for every simulated pair):

- with probability 1 − u an item is *stable*: the judge almost always gets it right
  (q ~ Beta(c, 1), c = ``--concentration`` = 40 by default, mean 0.976) with probability ``--right``,
  otherwise almost always wrong (q ~ Beta(1, c));
- with probability u it is *unstable*: q ~ Beta(2, 2) (mean 0.5, wide).

The incumbent and the candidate answer item i correctly with independent draws of Bernoulli(q_i).
The reported "flip share" is the mean share of items whose correctness differs between the two
runs — the measurable instability to compare with your own judge (run the same prompt twice).
Split composition follows AH-D: 62/162 positives.

Measured (seed 0, 4000 pairs per cell, x86_64 Linux): with any per-item flip share from 5% to 22%,
the literal policy keeps 38–40% of no-op candidates at every size (162, 528, 1000) — a symmetric
coin on "kappa up" intersected with "FP not up" does not shrink with n — and the paired policy
keeps 5–9%, below alpha = 0.1. Only a nearly deterministic judge (flip share 0.2%, e.g.
``--unstable 0 --concentration 1000``) lowers literal to ~12% on 162 items, through ties.

Usage: python benchmarks/noise_floor.py [--trials 4000] [--seed 0] [--unstable 0.02 0.1 ...]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._figures import with_docs_figure
from optimizer.stats.decision import Counts, decide_counts
from optimizer.stats.metrics import cohen_kappa
from optimizer.workspace.config import LoopSection

POSITIVE_SHARE = 62 / 162


def simulate(
    n: int,
    unstable: float,
    right: float,
    trials: int,
    rng: np.random.Generator,
    loop_alpha: float,
    concentration: float = 40.0,
) -> dict[str, float]:
    """Keep rates of both policies over ``trials`` no-op pairs on an ``n``-item split."""
    n_pos = round(n * POSITIVE_SHARE)
    is_unstable = rng.random((trials, n)) < unstable
    leans_right = rng.random((trials, n)) < right
    q = np.where(
        is_unstable,
        rng.beta(2, 2, (trials, n)),
        np.where(
            leans_right, rng.beta(concentration, 1, (trials, n)), rng.beta(1, concentration, (trials, n))
        ),
    )
    inc = rng.random((trials, n)) < q
    cand = rng.random((trials, n)) < q
    improved = (~inc & cand).sum(axis=1)
    worsened = (inc & ~cand).sum(axis=1)

    def counts(correct: np.ndarray, t: int) -> Counts:
        tp = int(correct[t, :n_pos].sum())
        tn = int(correct[t, n_pos:].sum())
        return Counts(tp, n_pos - tp, tn, n - n_pos - tn)

    literal = LoopSection(policy="literal", alpha=loop_alpha)
    kept_literal = kept_paired = 0
    kappas: list[float] = []
    for t in range(trials):
        c_inc, c_cand = counts(inc, t), counts(cand, t)
        d = decide_counts(c_inc, c_cand, int(improved[t]), int(worsened[t]), literal)
        kept_literal += d.literal_keep
        kept_paired += d.paired_keep
        kappas.append(cohen_kappa(*c_inc) or 0.0)
    return {
        "literal": kept_literal / trials,
        "paired": kept_paired / trials,
        "accuracy": float(inc.mean()),
        "kappa": float(np.mean(kappas)),
        "flip_share": float((inc != cand).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000, help="simulated no-op pairs per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[162, 528, 1000])
    parser.add_argument("--unstable", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.3, 0.5],
                        help="share u of unstable items (q ~ Beta(2,2))")  # fmt: skip
    parser.add_argument(
        "--right", type=float, default=0.85, help="share of stable items the judge gets right"
    )
    parser.add_argument(
        "--concentration",
        type=float,
        default=40.0,
        help="stable items: q~Beta(c,1) or Beta(1,c); higher = steadier",
    )
    parser.add_argument("--alpha", type=float, default=0.1, help="paired policy's alpha")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    print("noise floor: share of no-op candidates kept (every keep is a false discovery)")
    print(
        f"settings: trials={args.trials} per cell, seed={args.seed}, positives 62/162 of each split, "
        f"stable items right with p={args.right} (q~Beta({args.concentration:g},1)) else wrong "
        f"(q~Beta(1,{args.concentration:g})), "
        f"unstable items q~Beta(2,2); literal: min_kappa_delta=0, fpr_tolerance=0; paired: + McNemar "
        f"alpha={args.alpha}"
    )
    print(f"machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}")
    header = f"{'unstable u':>10} {'flip share':>10} {'accuracy':>8} {'kappa':>6} {'n':>5} {'literal':>8} {'paired':>7}"
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    for u in args.unstable:
        for n in args.sizes:
            r = simulate(n, u, args.right, args.trials, rng, args.alpha, args.concentration)
            print(
                f"{u:>10.2f} {r['flip_share']:>10.3f} {r['accuracy']:>8.3f} {r['kappa']:>6.3f} {n:>5} "
                f"{r['literal']:>8.1%} {r['paired']:>7.1%}"
            )
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(with_docs_figure(main))
