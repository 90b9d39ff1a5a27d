"""Decision power of the keep/rollback policies: the real loop against a noisy fake judge, beside the
pure simulation of the same judge.

The judge (benchmarks/_judge_model.py) answers through the test suite's fake server, in the OpenAI
wire format, to the real SDK client: 162 items (62 positives, 100 negatives, AH-D's sizes), each
judged correctly with a fixed probability q_i and a fresh draw on every call (30% unstable items,
q ~ U(0.3, 0.7); the rest q = 0.99, or 0.01 for the 20% of them the judge gets wrong). A candidate is
a real rubric edit proposed by a benchmark strategy:

- ``noop``: a new visible line with a unique tag — nothing real changes, the requests differ, so
  every draw is fresh; every keep is a false discovery;
- ``fixD`` (D = 4, 8, 12): a line holding a marker that the judge answers by getting D chosen items
  (among those it tends to get wrong, q < 0.5, not fixed yet) right every time.

Each run is `optimizer.loop.session.start_run` on the workspace — baseline (one full pass), then
``--candidates`` candidates in a shuffled schedule (``--fixes-per-run`` of each D, no-ops for the
rest), the incumbent kept across candidates as in a real run (a keep, real or not, replaces it;
under ``adaptive`` the incumbent's extra judgements are cached and paid once per incumbent). The
rubric gets a fresh salt line before every run so its baseline is a fresh draw too. Each policy runs
in its own workspace and process; ``--workers`` processes at a time.

Figures per policy: share of no-op candidates kept; share of D-item fixes kept; mean judge calls per
decided candidate / 162 (from the ledger's experiment rows; the fake server's count is checked
against the ledger's total). Loop rates carry 95% intervals from a bootstrap over runs (candidates
of one run share incumbents, so they are not independent trials). The simulation replays the same
runs (same item odds, same schedule, same incumbent handling, first pass without early stopping) with
numpy and the real decision functions of `optimizer.stats.decision`; its calls figure has no early stop,
so it is an upper bound for literal and paired. A second simulated row, ``sim1``, gives every
candidate a fresh incumbent, as the issue's table did. The two differ for a reason that matters: in a
run, a kept no-op becomes the incumbent with the lucky first pass that won its comparison, and the
next candidates are compared with that lucky draw (only ``adaptive`` re-judges it, on the items that
disagree), so in-run keep rates sit below the fresh-incumbent ones.

Measured (default run, seed 0, x86_64 Linux, 2 cores shared with other work, load average ~5-6;
774 s wall), adaptive with rejudge = 2 in the loop: no-op kept 1.5% [0%, 4%] (n = 135), fixes of
4 / 8 / 12 items kept 31% / 56% / 87% (n = 45 each), 1.47 judge calls per candidate per full pass;
the in-run simulation says 4.4% / 26% / 62% / 88% and 1.48; with a fresh incumbent per candidate
(the issue's setting) 7.3% / 31% / 68% / 91% and 1.71. Issue 10's targets hold for no-ops, 12-item
fixes and calls in a run, not for 8-item fixes (>= 70%): 20% of fixed items go unseen because the
incumbent's first pass happened to get them right (not re-judged, d = 0), and ~23 noise items are
re-judged beside ~6 visible fixes; most misses are p >= alpha, few are the literal rule.
``--rejudge 4`` reaches 77% on 8-item fixes at 1.95 calls per pass.

Two further sections (issue 19). *Structure moves*: ``--structural-runs`` adaptive loop runs whose
candidates are judge.toml moves (``[optimizer] structure_moves = ["screenshots", "max_images"]``):
``screenshots = "spaced"`` with a fresh ``max_images`` M, which changes the ``{{screenshots}}``
sentence of the instructions; the judge plants the effect on that sentence (``s-fix8``/``s-fix12``:
8 / 12 wrong items made right; ``s-noop``: only the incumbent's own fixes carried). *Cheaper, not
worse*: ``--cheaper-trials`` simulated cheaper candidates per cell, decided by
`optimizer.stats.decision.decide_cheaper` (worse by 2 positives, or equal; noisy and steady judge; margins
1 and 2). Measured (seed 0, 2 loaded cores; 10 structural runs of 4 moves, 236 s): structure
moves: no-op moves kept 5.0% [0%, 15%] (n = 20), 8-item fixes 70% [40%, 90%], 12-item fixes 90%
[70%, 100%] (n = 10 each), 1.54 judge calls per candidate per full pass; cheaper: worse by 2 kept 2.2% / 5.7%
(margin 1 / 2) on the noisy judge, 0.1% / 0.6% on the steady one; equal kept 19% / 30% noisy, 65% /
94% steady (README, "Structure moves and cheaper judges").

Panel rows (issue 19, ``--panel-runs`` adaptive loop runs): each run's candidates are two judge.toml
moves to a unanimous ``[panel]`` of three named members (``structure_moves = ["panel.members",
"panel.vote"]``), against the judge in panel mode (`benchmarks._judge_model`: a prompt answers an
item the same way on every call): ``p-noop``, members x, y, z that err identically (their vote is a
fresh draw beside the single judge, no gain), then ``p-fix12``, members a, b, c that err
independently on 12 planted negatives the single judge tends to get wrong (their unanimous vote gets
them right: a lower FPR). Figures: kept share per kind (no-op keeps are false keeps) and judge calls
per candidate per full pass (every member's call counted).
Measured (``--runs 0 --sim-runs 20 --structural-runs 0 --cheaper-trials 0 --futility-runs 0
--panel-runs 40 --workers 1``, seed 0, 2 loaded cores, 358 s): no-op panels kept 5.0% [0%, 12%],
planted panels 65% [50%, 80%] (n = 40 each), 4.27 / 4.20 judge calls per candidate per full pass.

Futility rows (`simulate_futility`, ``--futility-runs`` simulated runs, 300 by default): the adaptive
runs again, each candidate also screened as the loop screens it (`optimizer.stats.futility.make_looks`,
each look's disagreements re-judged, `p_clear_rejudged` after each look), and by the earlier
first-pass screen (`p_clear`, one look at 30%, no re-judging) for comparison; coupled (the same draws
with and without), so the rows differ by the screen alone: calls per no-op candidate and kept shares
of no-ops and fixes, off and at several thresholds. Measured (``--no-loop --policies adaptive
--sim-runs 20 --futility-runs 300``, seed 0, 511 s for these rows on 2 loaded cores): a no-op costs
1.42 passes off, 1.20 with the first-pass screen at T = 0.02, 0.84 with the looks at T = 0.01; fixes
of 4 / 8 / 12 items kept 32.7% / 75.0% / 95.0% off, 32.0% / 74.3% / 94.7% at T = 0.01. The last
row is the floor: an oracle (`oracle_p_clear`) that draws the unjudged items from the true odds of
both prompts, with the same looks, at T = 0.01: 0.77 of a pass per no-op (432 s for all these rows,
oracle included). The loop variant ``adaptive+futility`` runs the real loop with ``[loop] futility =
true`` (on by default since; the other loop variants pin it off).

Waves (``run --wave K``, `wave_trials`): runs of one wave each through the real loop, adaptive: K
no-ops (the share of waves that keep one must stay <= alpha: Holm per wave) and one 8-item fix
among K-1 no-ops (the share that keeps the fix, and that keeps a no-op instead); beside them
`simulate_wave_null`, the same no-op waves simulated and decided by `optimizer.stats.decision.holm`.
Measured (alpha 0.1; loop no-op waves pooled over seeds 0 and 1, 16 + 40 runs; planted 16 runs;
sim 2,000 waves): no-op waves with a keep 6.2% (n=16) / 8.9% / 8.9% (n=56) for waves of 1 / 4 / 8,
simulated 7.1% / 7.2% / 6.2%; the planted 8-item fix kept 81% / 44% / 19% (Holm's levels alpha/K..alpha
cost power); 1.66 / 1.59 / 1.57 judge calls per candidate per pass; ~400 s each on 2 cores.

Run:  python benchmarks/decision_power.py [--quick] [--runs 45] [--candidates 6] [--sim-runs 3000]
      [--workers 2] [--policies literal paired adaptive adaptive+futility] [--rejudge 2]
      [--fix-pool wrong|wrong-or-unstable] [--structural-runs 10] [--panel-runs 10] [--cheaper-trials 1000]
      [--futility-runs 300] [--waves 1 4 8] [--wave-runs 30] [--waves-only]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._figures import with_docs_figure
from benchmarks._judge_model import KEYED_DRAWS_ENV, item_q
from benchmarks._power_common import (
    FIX_SIZES,
    FUTILITY,
    KINDS,
    PANEL_PLANTED,
    PolicyResult,
    RunPlan,
    SimJudge,
    calls_per_pass,
    keep_rate,
    labels_only,
    policies_available,
    rejudge_default,
    run_bootstrap,
)
from benchmarks._power_loop import (
    WAVE_FIX,
    _loop_task,
    _wave_task,
    merge_wave_rows,
    panel_rows,
    simulate_wave_null,
    structural_rows,
    wave_table,
)
from benchmarks._power_sim import cheaper_rows, futility_table, simulate, simulate_fresh, simulate_futility

# --- the table ----------------------------------------------------------------------------------


def table(
    loop_results: dict[str, PolicyResult],
    sim_results: dict[str, PolicyResult],
    n_items: int,
    fresh_results: dict[str, PolicyResult] | None = None,
) -> list[str]:
    """The side-by-side table: one row per policy and source (``loop``, ``sim``, and ``sim1``: the
    simulation with a fresh incumbent for every candidate, as in the issue's table)."""
    every = set(loop_results) | set(sim_results) | set(fresh_results or {})
    w = max([9, *map(len, every)])
    head = (
        f"{'policy':<{w}} {'source':<6} {'no-op kept':>22} "
        + " ".join(f"{f'fix {d} kept':>22}" for d in FIX_SIZES)
        + f" {'calls/162 all':>13} {'no-op':>6} {'fixes':>6}"
    )
    lines = [head, "-" * len(head)]
    for policy in sorted(every, key=lambda p: (p != "literal", p != "paired", p)):
        for source, res in (
            ("loop", loop_results.get(policy)),
            ("sim", sim_results.get(policy)),
            ("sim1", (fresh_results or {}).get(policy)),
        ):
            if res is None:
                continue
            cells = []
            for kind in KINDS:
                k, total = keep_rate(res.trials, kind)
                if total == 0:
                    cells.append(f"{'—':>22}")
                elif source == "loop":
                    lo, hi = run_bootstrap(res.trials, kind)
                    cells.append(f"{k / total:>6.1%} [{lo:>4.0%},{hi:>4.0%}] n={total:<4}")
                else:
                    cells.append(f"{k / total:>6.1%} {'':>10}n={total:<4}")
            fixes = [t for t in res.trials if t.kind != "noop"]
            lines.append(
                f"{policy:<{w}} {source:<6} "
                + " ".join(cells)
                + f" {calls_per_pass(res.trials, n_items):>13.2f} {calls_per_pass(res.trials, n_items, 'noop'):>6.2f}"
                + f" {calls_per_pass(fixes, n_items):>6.2f}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 runs of 4 candidates per policy")
    parser.add_argument(
        "--runs", type=int, default=45, help="loop runs per policy (each: baseline + candidates)"
    )
    parser.add_argument("--candidates", type=int, default=6, help="candidates per run")
    parser.add_argument("--fixes-per-run", type=int, default=1, help="fixes of each size D per run")
    parser.add_argument("--sim-runs", type=int, default=3000, help="simulated runs per policy")
    parser.add_argument(
        "--policies",
        nargs="+",
        default=None,
        help="default: every policy LoopSection accepts; POLICY+fdr0.1 adds online FDR (LORD++)",
    )
    parser.add_argument("--workers", type=int, default=2, help="loop processes at a time")
    parser.add_argument("--runs-per-task", type=int, default=5, help="loop runs per worker task")
    parser.add_argument("--concurrency", type=int, default=8, help="judge calls in flight per loop")
    parser.add_argument(
        "--rejudge", type=int, default=None, help="adaptive: extra judgements (default: config's)"
    )
    parser.add_argument("--fix-pool", choices=["wrong", "wrong-or-unstable"], default="wrong")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-loop", action="store_true", help="the simulation only")
    parser.add_argument(
        "--structural-runs",
        type=int,
        default=10,
        help="loop runs of the structural rows (judge.toml moves; 0: none)",
    )
    parser.add_argument(
        "--panel-runs",
        type=int,
        default=10,
        help="loop runs of the panel rows (a no-op panel, a panel with a planted effect; 0: none)",
    )
    parser.add_argument(
        "--cheaper-trials",
        type=int,
        default=1000,
        help="simulated cheaper candidates per row of the non-inferiority table (0: none)",
    )
    parser.add_argument(
        "--futility-runs",
        type=int,
        default=300,
        help="simulated adaptive runs screened by optimizer.stats.futility (0: no futility rows)",
    )
    parser.add_argument(
        "--waves",
        type=int,
        nargs="*",
        default=[1, 4, 8],
        help="wave sizes of the wave rows (`run --wave K`; none: skip them)",
    )
    parser.add_argument(
        "--wave-runs", type=int, default=30, help="loop runs of one wave per wave size and case"
    )
    parser.add_argument("--waves-only", action="store_true", help="the wave rows only")
    parser.add_argument("--wave-sim-runs", type=int, default=2000, help="simulated no-op waves per wave size")
    parser.add_argument(
        "--wave-cases",
        nargs="+",
        choices=["null", "planted"],
        default=["null", "planted"],
        help="which wave rows to run (null: K no-ops; planted: a fix among K-1 no-ops)",
    )
    parser.add_argument(
        "--wave-futility",
        action="store_true",
        help="the wave rows with [loop] futility = true (the default since; off: judged in full)",
    )
    parser.add_argument(
        "--keyed-draws",
        action="store_true",
        help="the fake judge's draws keyed by item, prompt and repeat, not by arrival order: with "
        "--concurrency 1 the loop rows are the same on every run (to compare two versions of the loop)",
    )
    args = parser.parse_args(argv)
    if args.keyed_draws:
        os.environ[KEYED_DRAWS_ENV] = "1"
    if args.quick:
        args.runs, args.candidates, args.sim_runs, args.cheaper_trials, args.structural_runs = (
            2,
            4,
            200,
            100,
            1,
        )
        args.panel_runs = min(args.panel_runs, 1)
        args.futility_runs = min(args.futility_runs, 20)
        args.wave_runs, args.wave_sim_runs = 2, 100
    if args.waves_only:
        return waves_main(args)
    policies = args.policies or policies_available()
    rejudge = args.rejudge if args.rejudge is not None else rejudge_default()
    started = time.monotonic()
    print("decision power: keep rates of no-op edits and of real D-item fixes, real loop vs simulation")
    print(
        f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        f"; policies {', '.join(policies)}; adaptive re-judges {rejudge}x; alpha 0.1"
    )
    print(
        f"judge: 162 items (62 pos / 100 neg), 30% unstable q~U(0.3,0.7), stable q=0.99 (80%) / 0.01 (20%); "
        f"fixes chosen among {'q < 0.5' if args.fix_pool == 'wrong' else 'q < 0.9'}"
    )
    print(
        f"runs: baseline + {args.candidates} candidates ({args.fixes_per_run} fix of each D per run, the rest "
        f"no-ops), {args.runs} loop runs / {args.sim_runs} simulated runs per policy"
    )

    positive = np.array(labels_only()[1])
    q, fixable = item_q(len(positive), 0, fix_pool=args.fix_pool)
    t_sim = time.monotonic()
    # The simulation also shows online FDR (LORD++ at 0.1) beside the plain adaptive policy.
    sim_policies = sorted(
        {p for p in policies if not p.endswith(FUTILITY)}
        | {"literal", "paired", "adaptive", "adaptive+fdr0.1"}
    )
    judge = SimJudge(q, fixable, positive)
    sim_results = {
        p: simulate(
            p,
            judge,
            RunPlan(args.sim_runs, args.candidates, args.fixes_per_run, args.seed + 1),
            rejudge=rejudge,
            check_engine=200,
        )
        for p in sim_policies
    }
    fresh_results = {
        p: simulate_fresh(p, judge, args.sim_runs, args.seed + 2, rejudge=rejudge) for p in sim_policies
    }
    sim_s = time.monotonic() - t_sim

    loop_results: dict[str, PolicyResult] = {}
    if not args.no_loop:
        # Tasks of a few runs each (one workspace and server per task) keep both workers busy to the end.
        chunks = max(1, math.ceil(args.runs / args.runs_per_task))
        tasks = []
        for p in sorted(policies, key=lambda p: p != "adaptive"):  # the slowest first
            per = [args.runs // chunks + (1 if i < args.runs % chunks else 0) for i in range(chunks)]
            tasks += [
                (
                    p,
                    r,
                    args.candidates,
                    args.fixes_per_run,
                    args.seed * 1000 + i,
                    args.concurrency,
                    rejudge,
                    args.fix_pool,
                )
                for i, r in enumerate(per)
                if r
            ]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for res in pool.map(_loop_task, tasks):
                loop_results.setdefault(res.policy, PolicyResult(res.policy)).merge(res)
    print()
    for line in table(loop_results, sim_results, len(positive), fresh_results):
        print(line)
    print()
    for p, res in loop_results.items():
        print(
            f"{p}: loop worker time {res.wall_s:.0f} s; judge calls at the fake server {res.server_calls}, "
            f"in the ledger {res.ledger_calls} (baselines {res.baseline_calls}); undecided candidates {res.undecided}"
        )
    if args.structural_runs and not args.no_loop:
        print()
        print(
            'structure moves: adaptive loop runs whose candidates are judge.toml moves (screenshots = "spaced", '
            "a fresh max_images), no-ops or planted fixes of 8 / 12 items"
        )
        for line in structural_rows(
            args.structural_runs, args.seed + 4, rejudge=rejudge, concurrency=args.concurrency
        ):
            print(line)
    if args.panel_runs and not args.no_loop:
        print()
        print(
            f"panels: adaptive loop runs of two judge.toml moves to a unanimous panel of 3 (no-op: members err "
            f"identically; p-fix: they err independently on {PANEL_PLANTED} planted negatives)"
        )
        for line in panel_rows(args.panel_runs, args.seed + 5, rejudge=rejudge, concurrency=args.concurrency):
            print(line)
    if args.cheaper_trials:
        t_cheap = time.monotonic()
        print()
        print(
            "cheaper, not worse: keeps of cheaper candidates (50% saving) decided by optimizer.stats.decision."
            "decide_cheaper, re-judging disagreements"
        )
        for line in cheaper_rows(q, positive, args.cheaper_trials, args.seed + 3, rejudge=rejudge):
            print(line)
        print(f"  ({time.monotonic() - t_cheap:.0f} s)")
    if args.futility_runs:
        t_fut = time.monotonic()
        base, screened = simulate_futility(
            judge,
            RunPlan(args.futility_runs, args.candidates, args.fixes_per_run, args.seed + 3),
            rejudge=rejudge,
        )
        print()
        print(
            f"futility screening (simulated, {args.futility_runs} runs, coupled: the same draws with and "
            f"without; screen = the incumbent's wrong items + a stratified share of the rest), "
            f"{time.monotonic() - t_fut:.0f} s:"
        )
        for line in futility_table(base, screened, len(positive)):
            print(line)
    for p, res in sorted(loop_results.items()):
        if p.endswith(FUTILITY) or f"{p}{FUTILITY}" in loop_results:
            print(
                f"{p} (loop): no-op calls/162 {calls_per_pass(res.trials, len(positive), 'noop'):.2f}, kept "
                + ", ".join(
                    f"{kind} {keep_rate(res.trials, kind)[0]}/{keep_rate(res.trials, kind)[1]}"
                    for kind in KINDS
                )
            )
    print(
        f"simulated adaptive decisions replayed by optimizer.stats.decision.decide_adaptive: "
        f"{sim_results['adaptive'].engine_checked}, all agree"
    )
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"simulation {sim_s:.1f} s; total wall time {time.monotonic() - started:.0f} s; load average at the end "
        f"{load} (1 / 5 / 15 min) on {os.cpu_count()} cores"
    )
    if args.waves and not args.no_loop:
        print()
        waves_main(args)
    return 0


def waves_main(args: argparse.Namespace) -> int:
    """The wave rows: per wave size, no-op waves' false keeps (<= alpha per wave, Holm) and a planted fix's share."""
    started = time.monotonic()
    rejudge = args.rejudge if args.rejudge is not None else rejudge_default()
    print(
        f"waves (adaptive{', futility on' if args.wave_futility else ''}, alpha 0.1, Holm per wave): "
        f"{args.wave_runs} runs of one wave per size and case; "
        f"no-op waves: K no-ops; planted: one {WAVE_FIX[3:]}-item fix among K-1 no-ops"
    )
    # Tasks of a few runs each, the largest waves first, keep every worker busy to the end.
    chunks = max(1, math.ceil(args.wave_runs / args.runs_per_task))
    per = [args.wave_runs // chunks + (1 if i < args.wave_runs % chunks else 0) for i in range(chunks)]
    tasks = [
        (k, r, args.seed * 1000 + 17 * k + 101 * i, args.concurrency, rejudge, case, args.wave_futility)
        for k in sorted(args.waves, reverse=True)
        for case in args.wave_cases
        for i, r in enumerate(per)
        if r
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        done = list(pool.map(_wave_task, tasks))
    rows = [merge_wave_rows([r for r in done if r.wave == k]) for k in args.waves]
    for line in wave_table(rows):
        print(line)
    positive = np.array(labels_only()[1])
    q, _ = item_q(len(positive), 0, fix_pool=args.fix_pool)
    sims = [
        (k, *simulate_wave_null(q, positive, k, args.wave_sim_runs, args.seed + k, rejudge=rejudge))
        for k in args.waves
    ]
    print(
        "simulated no-op waves with a keep (same judge, Holm by optimizer.stats.decision): "
        + ", ".join(f"wave {k}: {kept / n:.1%} of {n}" for k, kept, n in sims)
    )
    print(f"wave rows wall time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(with_docs_figure(main))
