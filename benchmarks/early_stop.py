"""Cost of the loop's early-stopping checks per candidate, old (full recomputation) vs new (incremental)
(a script that prints figures).

For each split size (162, 1,000, 2,000 items by default; 38% positives, AH-D's share) and each
policy path, replays one candidate's first pass item by item in the loop's order (negatives first,
then positives) and times the stopping checks the loop makes after every judged item:

- ``old``: what `optimizer.loop.evaluate`'s ``on_item`` did before the bound became incremental — the
  pure reference functions (`stopped_decision` for paired, `adaptive_stopped_decision` for adaptive)
  over everything judged so far, after every item;
- ``new``: the incremental `EarlyStopper` fed one item at a time (when the checkout has it).

The judge: the incumbent answers each item correctly with probability 0.8 and gives no usable verdict
on 2% of items (a parse failure, scored wrong). The candidate is the incumbent except a few flips:

- ``near``: fixes 4 of the incumbent's wrong positives, breaks 1 right positive (FPR unchanged, the
  McNemar p-value 6/32). Under paired it is rolled back, but only once too few unjudged items remain
  to make it a keep — near the end;
- ``better``: fixes 12 wrong positives, breaks none: a keep, never stopped (every item checked, the
  worst case for the checks' cost). Under adaptive (rejudge 2, one judgement per item) neither
  candidate is stopped in the first pass: every disagreement may still go its way on re-judging;
- ``noisy`` (not in the default table): a no-op edit under this judge, every judgement drawn again.
  With ``--replicates 3`` items both prompts judge alike by majority still differ in their shares
  (d = ±1/3, ±2/3), the case where the adaptive bound's exact tail is not trivial.

Both columns run on the same items; "same" says whether old and new returned the same answer (None or
an equal `Decision`) after every item. Times are the checks alone (the loop's own bookkeeping of the
judged items included on both sides), not judging; they depend on the machine's other load, printed
with them.

Measured (default run, x86_64 Linux, 2 cores shared with other work, load average 3-5), old → new
seconds of checks per candidate: paired 0.06 → 0.004 / 3.0 → 0.03 / 9.9 → 0.07 at 162 / 1,000 /
2,000 items (near), adaptive 0.41 → 0.016 / 24 → 0.06 / 74 → 0.19; the same answer after every item
in every row. With ``--replicates 3`` the noisy candidate's adaptive checks at 1,000 items: 85 s → 0.1 s.

Run:  .venv/bin/python benchmarks/early_stop.py [--sizes 162 1000 2000] [--scenarios near better]
      [--policies paired adaptive] [--replicates 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.loop.records import evaluation_order
from optimizer.models import Label
from optimizer.stats import decision as decision_mod
from optimizer.stats.decision import Decision, adaptive_stopped_decision, stopped_decision
from optimizer.stats.metrics import Answer, is_correct, majority_answer
from optimizer.workspace.config import LoopSection

POSITIVE_SHARE = 62 / 162
ACCURACY = 0.8
UNUSABLE = 0.02
SCENARIOS = {"near": (4, 1), "better": (12, 0)}  # (wrong positives fixed, right positives broken)
INVALID = Answer(success=None, status="invalid")


@dataclass
class Case:
    labels: dict[str, Label]
    order: list[str]
    incumbent: dict[str, list[Answer]]  # each item's judgements (``--replicates`` of them)
    candidate: dict[str, list[Answer]]


def _judgement(rng: random.Random, label: Label) -> Answer:
    u = rng.random()
    if u < UNUSABLE:
        return INVALID
    right = u < UNUSABLE + ACCURACY
    return Answer(success=label.is_positive == right)


def make_case(n: int, scenario: str, seed: int = 0, replicates: int = 1) -> Case:
    rng = random.Random(seed * 100_003 + n)
    n_pos = round(n * POSITIVE_SHARE)
    labels = {}
    for i in range(n):
        tid = f"t{i:05d}"
        labels[tid] = Label(trajectory_id=tid, label="positive" if i < n_pos else "negative", original_id=tid)
    ids = list(labels)
    rng.shuffle(ids)  # manifest order: classes interleaved
    incumbent = {tid: [_judgement(rng, labels[tid]) for _ in range(replicates)] for tid in ids}
    if scenario == "noisy":  # a no-op edit: every judgement drawn again with the same odds
        candidate = {tid: [_judgement(rng, labels[tid]) for _ in range(replicates)] for tid in ids}
    else:
        candidate = dict(incumbent)
        fixes, breaks = SCENARIOS[scenario]
        inc_right = {t: is_correct(labels[t], majority_answer(incumbent[t])) for t in ids}
        wrong_pos = [t for t in ids if labels[t].is_positive and not inc_right[t]]
        right_pos = [t for t in ids if labels[t].is_positive and inc_right[t]]
        for tid in rng.sample(wrong_pos, fixes):
            candidate[tid] = [Answer(success=True)] * replicates
        for tid in rng.sample(right_pos, breaks):
            candidate[tid] = [Answer(success=False)] * replicates
    return Case(labels, evaluation_order(labels, ids), incumbent, candidate)


@dataclass
class Timing:
    seconds: float
    checks: int
    answers: list[Decision | None]

    @property
    def stop(self) -> int | None:
        """Items judged when the bound fired (None: it never did)."""
        return self.checks if self.answers and self.answers[-1] is not None else None


def run_old(case: Case, loop: LoopSection) -> Timing:
    adaptive = loop.policy == "adaptive"
    inc_answers = {t: majority_answer(js) for t, js in case.incumbent.items()}
    so_far: dict[str, Answer] = {}
    so_far_judgements: dict[str, list[Answer]] = {}
    answers: list[Decision | None] = []
    t0 = time.perf_counter()
    for tid in case.order:
        so_far[tid] = majority_answer(case.candidate[tid])
        so_far_judgements[tid] = case.candidate[tid]
        if adaptive:
            d = adaptive_stopped_decision(
                case.labels, so_far_judgements, case.incumbent, loop, alpha=loop.alpha
            )
        else:
            d = stopped_decision(case.labels, so_far, inc_answers, loop, alpha=loop.alpha)
        answers.append(d)
        if d is not None:
            break
    return Timing(time.perf_counter() - t0, len(answers), answers)


def run_new(case: Case, loop: LoopSection) -> Timing | None:
    stopper_cls = getattr(decision_mod, "EarlyStopper", None)
    if stopper_cls is None:
        return None  # a checkout from before the incremental bound
    inc_answers = {t: majority_answer(js) for t, js in case.incumbent.items()}
    so_far: dict[str, Answer] = {}
    answers: list[Decision | None] = []
    t0 = time.perf_counter()
    stopper = stopper_cls(case.labels, inc_answers, case.incumbent, loop, alpha=loop.alpha)
    for tid in case.order:
        so_far[tid] = answer = majority_answer(case.candidate[tid])
        d = stopper.add(tid, answer, case.candidate[tid])
        answers.append(d)
        if d is not None:
            break
    return Timing(time.perf_counter() - t0, len(answers), answers)


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {load}"
    )


def fmt_s(t: Timing | None) -> str:
    return "—" if t is None else f"{t.seconds:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--sizes", type=int, nargs="+", default=[162, 1000, 2000])
    parser.add_argument("--scenarios", nargs="+", choices=[*SCENARIOS, "noisy"], default=["near", "better"])
    parser.add_argument("--replicates", type=int, default=1, help="judgements per item on each side")
    parser.add_argument(
        "--policies", nargs="+", choices=["paired", "adaptive"], default=["paired", "adaptive"]
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(
        "early-stopping checks per candidate: old (full recomputation after every item) vs new (incremental)"
    )
    print(f"machine: {machine()}")
    print(
        f"judge: incumbent right on {ACCURACY:.0%} of items, no usable verdict on {UNUSABLE:.0%}; "
        + "; ".join(f"{s}: fixes {f}, breaks {b}" for s, (f, b) in SCENARIOS.items())
        + f"; noisy: every judgement drawn again; alpha 0.1, adaptive rejudge 2, "
        f"{args.replicates} judgement(s) per item"
    )
    header = (
        f"{'items':>6} {'policy':<9} {'candidate':<9} {'checks':>7} {'stopped at':>10} "
        f"{'old s':>9} {'new s':>8} {'old/new':>8} {'same':>5}"
    )
    print()
    print(header)
    print("-" * len(header))
    failures = 0
    runners: list[tuple[str, Callable[[Case, LoopSection], Timing | None]]] = [
        ("old", run_old),
        ("new", run_new),
    ]
    for n in args.sizes:
        for policy in args.policies:
            loop = LoopSection(policy="paired" if policy == "paired" else "adaptive")
            for scenario in args.scenarios:
                case = make_case(n, scenario, args.seed, args.replicates)
                old, new = (fn(case, loop) for _, fn in runners)
                assert old is not None
                same = "—" if new is None else ("yes" if new.answers == old.answers else "NO")
                failures += same == "NO"
                ratio = "—" if new is None or new.seconds == 0 else f"{old.seconds / new.seconds:.0f}x"
                stop = "never" if old.stop is None else str(old.stop)
                print(
                    f"{n:>6} {policy:<9} {scenario:<9} {old.checks:>7} {stop:>10} "
                    f"{fmt_s(old):>9} {fmt_s(new):>8} {ratio:>8} {same:>5}",
                    flush=True,
                )
    print()
    print(f"machine at the end: {machine()}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
