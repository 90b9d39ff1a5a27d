"""What a night buys: the true gain of the final prompts after a night of candidates, per keep rule, at a
fixed budget of judge calls.

Each night: a dev split of AH-D's composition (162 items: 62 positives, 100 negatives) and a held-out set
of the same kinds (486 items, three times as many), a baseline pass, then candidates until the budget of
judge calls is spent. Each candidate is the incumbent plus one edit drawn from an effect distribution
(`--dist`; `benchmarks._night_model`): helpful edits fix a few dev items of one kind the judge tends to get
wrong (some transfer to held-out items of that kind, some fit dev items only), harmful ones break items
it gets right (some lenient: negatives called successes, an FPR rise), neutral ones change nothing. Every
rule sees the same items and the same edits in the same order; the judge's draws are its own.

Real: the decisions and stops of the loop, through the public API of `optimizer.stats` — the early
stopping (`EarlyStopper`), futility's looks (`make_looks`, `screen_decision_rejudged`), the re-judging of
disagreements and `decide_adaptive`, with the ``[loop]`` defaults (alpha 0.1, rejudge 2, futility
threshold 0.01); see `benchmarks._night_loop`. Simulated: the judge (each call a fresh draw with the
item's probability of a right answer: per-item logits plus the kept edits' shifts), the edits and the
true metrics (kappa and FPR of the expected counts); no git, ledger or provider.

Rules: `literal`, `paired`, `adaptive`, `adaptive+futility` (the default) and stacking (`stack3`: adaptive
without futility and `[loop] stack = 3`; `stack3+futility`): a rolled-back candidate that points the right
way (`optimizer.stats.pooling.points_right_way`, the real rule) joins the incumbent's pool, and a full pool
is tested as one merged candidate (its edits' shifts add; the simulation has no text, so nothing conflicts),
counted as a test; `benchmarks._night_loop.run_night`.

Figures per distribution and rule, averaged over nights: true kappa gain and FPR change (pp) of the final
prompt on dev and held-out items, candidates decided and kept, helpful / harmful / dev-only (helpful but
non-transferring) edits kept, judge calls used. The null night (`--null`, every edit neutral) reports the
share of decided candidates kept over at least 200 nights: a rule that tests at alpha must keep at most
alpha's share (the literal rule has no test; its share is shown for comparison).

Run:  python benchmarks/night.py [--quick] [--json] [--seed 0] [--nights 6] [--budget 6480]
      [--null-nights 200] [--null-budget 648] [--dist small large harmful ...] [--null | --no-null]
      [--rules literal paired adaptive adaptive+futility stack3] [--workers 1] [--write-docs night]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._figures import with_docs_figure
from benchmarks._night_loop import RULES, NightPlan, NightResult, loop_for, night_world, run_night
from benchmarks._night_model import DEFAULT_DISTS, Dist, parse_dist
from optimizer.stats.policies import policy_for

N_DEV = 162
# 40 full passes of the dev split a night, the baseline's included (~28 adaptive candidates); a null night is
# shorter: its figure is a share of tests, and futility's screen makes every candidate slow to simulate.
DEFAULT_BUDGET, NULL_BUDGET = 40 * N_DEV, 4 * N_DEV


@dataclass(frozen=True)
class Row:
    """One distribution under one rule, averaged over its nights (gains: final prompt minus baseline;
    FPR in percentage points, negative = better)."""

    dist: str
    rule: str
    nights: int
    dev_kappa_gain: float
    held_out_kappa_gain: float
    held_out_kappa_se: float  # the standard error of the nights' mean held-out gain
    dev_fpr_change_pp: float
    held_out_fpr_change_pp: float
    decided: float
    kept: float
    helpful_kept: float
    harmful_kept: float
    dev_only_kept: float
    calls: float
    budget: int
    kept_share: float  # of decided candidates (the null night's false-keep share)
    alpha: float | None  # the level a rule's keeps are tested at (None: no test)
    pooled: float = 0.0  # stacking: rolled-back candidates that pointed the right way and were pooled
    merged: float = 0.0  # stacking: merged candidates tested (counted in decided)
    merged_kept: float = 0.0  # stacking: merged candidates kept (counted in kept)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (nan below two values)."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def summarise(dist: str, rule: str, results: Sequence[NightResult], budget: int) -> Row:
    """The row of ``results`` (one per night)."""
    loop = loop_for(rule)
    decided = sum(r.decided for r in results)
    return Row(
        dist=dist,
        rule=rule,
        nights=len(results),
        dev_kappa_gain=_mean([r.dev_kappa for r in results]),
        held_out_kappa_gain=_mean([r.held_kappa for r in results]),
        held_out_kappa_se=_standard_error([r.held_kappa for r in results]),
        dev_fpr_change_pp=100 * _mean([r.dev_fpr for r in results]),
        held_out_fpr_change_pp=100 * _mean([r.held_fpr for r in results]),
        decided=_mean([r.decided for r in results]),
        kept=_mean([r.kept for r in results]),
        helpful_kept=_mean([r.helpful_kept for r in results]),
        harmful_kept=_mean([r.harmful_kept for r in results]),
        dev_only_kept=_mean([r.dev_only_kept for r in results]),
        calls=_mean([r.calls for r in results]),
        budget=budget,
        kept_share=sum(r.kept for r in results) / decided if decided else float("nan"),
        alpha=loop.alpha if policy_for(loop).tests_at_alpha else None,
        pooled=_mean([r.pooled for r in results]),
        merged=_mean([r.merged for r in results]),
        merged_kept=_mean([r.merged_kept for r in results]),
    )


def _nights_task(task: tuple[Dist, int, Sequence[int], tuple[str, ...]]) -> dict[str, list[NightResult]]:
    """Nights ``seeds`` of one distribution under every rule (a worker's share)."""
    dist, budget, seeds, rules = task
    out: dict[str, list[NightResult]] = {rule: [] for rule in rules}
    for seed in seeds:
        plan = NightPlan(dist, budget, seed)
        for rule in rules:
            out[rule].append(run_night(plan, rule, night_world(plan)))
    return out


def run_dist(dist: Dist, nights: int, budget: int, args: argparse.Namespace) -> list[Row]:
    """Every rule's row of ``dist`` over ``nights`` nights of ``budget`` judge calls (seeds from ``args.seed``)."""
    seeds = [args.seed * 1_000_003 + hash_name(dist.name) * 10_007 + k for k in range(nights)]
    chunks = [seeds[i :: args.workers] for i in range(args.workers)]
    tasks = [(dist, budget, chunk, tuple(args.rules)) for chunk in chunks if chunk]
    merged: dict[str, list[NightResult]] = {rule: [] for rule in args.rules}
    if args.workers > 1:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            parts = list(pool.map(_nights_task, tasks))
    else:
        parts = [_nights_task(t) for t in tasks]
    for part in parts:
        for rule, results in part.items():
            merged[rule] += results
    return [summarise(dist.name, rule, merged[rule], budget) for rule in args.rules]


def hash_name(name: str) -> int:
    """A stable small number for a distribution's name (Python's hash() is salted per process)."""
    return sum((k + 1) * ord(c) for k, c in enumerate(name)) % 997


def _finite_or_none(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every NaN (a figure with no data, e.g. a standard error of one night) as None, so
    ``--json`` prints strict JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def table(rows: Sequence[Row]) -> list[str]:
    """The side-by-side table: one line per distribution and rule."""
    w = max(len(r.rule) for r in rows)
    head = (
        f"{'dist':<8} {'rule':<{w}} {'kappa dev':>9} {'held-out ± se':>14} {'FPR pp dev':>10} {'held-out':>8} "
        f"{'decided':>7} {'kept':>5} {'helpful':>7} {'harmful':>7} {'dev-only':>8} {'calls':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.dist:<8} {r.rule:<{w}} {r.dev_kappa_gain:>+9.3f} "
            f"{f'{r.held_out_kappa_gain:+.3f} ± {r.held_out_kappa_se:.3f}':>14} "
            f"{r.dev_fpr_change_pp:>+10.2f} {r.held_out_fpr_change_pp:>+8.2f} {r.decided:>7.1f} {r.kept:>5.2f} "
            f"{r.helpful_kept:>7.2f} {r.harmful_kept:>7.2f} {r.dev_only_kept:>8.2f} {r.calls:>6.0f}"
        )
    return lines


def stack_lines(rows: Sequence[Row]) -> list[str]:
    """Per stacking row: candidates pooled, merged candidates tested and kept, per night."""
    return [
        f"  {r.dist:<8} {r.rule:<8} pooled {r.pooled:5.2f}, merged candidates tested {r.merged:5.2f}, "
        f"kept {r.merged_kept:4.2f} (of {r.kept:.2f} keeps)"
        for r in rows
        if loop_for(r.rule).stack > 0
    ]


def null_lines(rows: Sequence[Row]) -> list[str]:
    """The null night: per rule, the share of decided candidates kept, against alpha."""
    lines = []
    for r in rows:
        total = round(r.decided * r.nights)
        if r.alpha is None:
            verdict = "no test (literal rule): shown for comparison"
        else:
            verdict = f"{'<=' if r.kept_share <= r.alpha else '>'} alpha {r.alpha:g}"
        lines.append(
            f"  {r.rule:<18} kept {r.kept_share:6.2%} of {total} tests over {r.nights} nights: {verdict}"
        )
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run: few nights, a small budget")
    parser.add_argument("--json", action="store_true", help="print one JSON object (a row per dist and rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nights", type=int, default=6, help="nights per distribution")
    parser.add_argument("--null-nights", type=int, default=200, help="nights of the null distribution")
    parser.add_argument(
        "--budget", type=int, default=DEFAULT_BUDGET, help="judge calls per night, the baseline pass included"
    )
    parser.add_argument("--null-budget", type=int, default=NULL_BUDGET, help="judge calls per null night")
    parser.add_argument(
        "--dist",
        nargs="+",
        default=list(DEFAULT_DISTS),
        help="effect distributions: NAME[,key=value...] (presets small, large, harmful, null; e.g. "
        "small,helpful=0.3,transfer=0.5)",
    )
    parser.add_argument("--null", action="store_true", help="the null night only (every edit neutral)")
    parser.add_argument("--no-null", action="store_true", help="skip the null night")
    parser.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    parser.add_argument("--workers", type=int, default=1, help="processes at a time")
    args = parser.parse_args(argv)
    if args.quick:
        args.nights, args.budget = 1, 5 * N_DEV
        args.null_nights, args.null_budget = 10, 3 * N_DEV
    try:
        dists = [] if args.null else [parse_dist(d) for d in args.dist]
    except ValueError as err:
        parser.error(str(err))
    args.dists = [d for d in dists if d.name != "null"]
    args.with_null = args.null or (not args.no_null)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    rows: list[Row] = []
    for dist in args.dists:
        rows += run_dist(dist, args.nights, args.budget, args)
    null_rows = (
        run_dist(parse_dist("null"), args.null_nights, args.null_budget, args) if args.with_null else []
    )
    wall = time.monotonic() - started
    if args.json:
        print(
            json.dumps(
                {
                    "benchmark": "night",
                    "seed": args.seed,
                    "budget": args.budget,
                    "nights": args.nights,
                    "null_nights": args.null_nights if args.with_null else 0,
                    "null_budget": args.null_budget,
                    "dists": {d.name: asdict(d) for d in args.dists},
                    "rows": [_finite_or_none(asdict(r)) for r in rows + null_rows],
                    "wall_s": round(wall, 1),
                }
            )
        )
        return 0
    print("night: the true gain of a night's final prompt per keep rule, at a fixed budget of judge calls")
    print(
        f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; seed {args.seed}; budget {args.budget} judge calls a night "
        f"({args.budget / N_DEV:.0f} passes of the 162 dev items, the baseline's included); "
        f"{args.nights} nights per distribution, {args.null_nights if args.with_null else 0} null nights"
    )
    print(
        "dev: 162 items (62 pos / 100 neg); held-out: 486 of the same kinds; rules: "
        + ", ".join(args.rules)
        + " ([loop] defaults: alpha 0.1, rejudge 2, futility threshold 0.01)"
    )
    for dist in args.dists:
        print(f"  {dist.describe()}")
    if rows:
        print()
        print(
            "per night, averaged: true kappa gain (held-out: ± the standard error over nights) and FPR change "
            "(pp) of the final prompt, candidates decided, edits kept by kind, judge calls"
        )
        for line in table(rows):
            print(line)
        stacked = stack_lines(rows)
        if stacked:
            print()
            print("stacking, per night (a merged keep's edits are each counted above by kind):")
            for line in stacked:
                print(line)
    if null_rows:
        print()
        print(
            f"null nights (every edit neutral; {args.null_budget} judge calls each): share of decided "
            f"candidates kept, {args.null_nights} nights"
        )
        for line in null_lines(null_rows):
            print(line)
        for line in stack_lines(null_rows):
            print(line)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"wall time {wall:.0f} s; load average at the end {load} (1 / 5 / 15 min)")
    return 0


ROW_FIELDS = tuple(f.name for f in fields(Row))
if __name__ == "__main__":
    sys.exit(with_docs_figure(main))
