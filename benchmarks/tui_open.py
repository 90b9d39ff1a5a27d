"""How fast the TUI opens on a big ledger, and how smoothly the history scrolls.

Builds a ledger with 500 experiments (a baseline, kept, rolled-back, early-stopped and guard-rejected
candidates with metrics, intervals, flips, diffs) and 162 items × 3 replicates for every experiment (243,000 verdict rows),
then, headlessly at 120×40:

- times app start → first paint of the filled history table and curves (median of several starts);
- times scrolling: 300 cursor moves and 30 page-downs through the table, each followed by a repaint.

Usage: .venv/bin/python benchmarks/tui_open.py [--experiments 500] [--items 162] [--replicates 3] [--starts 5]
[--wave K] (``--wave``: the candidates' rows carry waves of K, so the history groups them and shows its wave column)
Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from optimizer.judge.providers.pricing import Usage
from optimizer.ledger import (
    ExperimentOutcome,
    ItemVerdict,
    LabelRow,
    Ledger,
    ProposedEdit,
    ReplicateVerdict,
    RunSpec,
)
from optimizer.scaffold import init_workspace

DIFF = """--- a/prompts/rubric.md
+++ b/prompts/rubric.md
@@ -89,4 +89,6 @@
 <!-- judgeloop:library:begin -->
+## Additional rules
+- Compare every typed string with the instruction character by character.
 <!-- judgeloop:library:end -->
"""


def build_ledger(
    path: Path, n_experiments: int, n_items: int, replicates: int, seed: int = 0, wave: int = 1
) -> str:
    """Write the synthetic run (``wave`` > 1: its candidates' rows in waves of that size); returns its id."""
    rng = random.Random(seed)
    ids = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(n_items)]
    positives = set(rng.sample(ids, n_items * 62 // 162))
    with Ledger(path) as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="library",
                policy="paired",
                split="AH-D",
                split_fingerprint="f" * 64,
                start_rev="0" * 40,
            )
        )
        ledger.set_labels(
            run.id,
            [
                LabelRow(
                    trajectory_id=t,
                    positive=t in positives,
                    mistake_type=None if t in positives else "Critical Mistake",
                )
                for t in ids
            ],
        )
        incumbent = None
        skill = 0.7
        for seq in range(n_experiments):
            exp = ledger.start_experiment(
                run.id,
                parent_id=incumbent,
                strategy="library" if seq else None,
                edit=ProposedEdit(
                    diff_text=DIFF if seq else None,
                    rationale=f"candidate {seq}: enable one library rule",
                    insertions=2,
                    deletions=0,
                    files_changed=["prompts/rubric.md"] if seq else [],
                    proposal_meta={
                        "wave": {
                            "size": wave,
                            "alpha": 0.1,
                            "incumbent": incumbent,
                            "number": (seq - 1) // wave + 1,
                        }
                    }
                    if seq and wave > 1
                    else None,
                ),
            )
            cand_skill = skill + rng.uniform(-0.03, 0.02)
            items = []
            tp = fn = tn = fp = 0
            for t in ids:
                pos = t in positives
                reps = []
                for r in range(replicates):
                    ok = rng.random() < cand_skill
                    success = pos if ok else not pos
                    reps.append(
                        ReplicateVerdict(
                            replicate=r,
                            success=success,
                            reasoning="synthetic reasoning " * 4,
                            confidence="medium",
                        )
                    )
                votes = sum(x.success for x in reps)
                majority = votes * 2 > replicates
                items.append(
                    ItemVerdict(
                        trajectory_id=t, success=majority, unstable=0 < votes < replicates, replicates=reps
                    )
                )
                tp += pos and majority
                fn += pos and not majority
                tn += (not pos) and not majority
                fp += (not pos) and majority
            ledger.record_verdicts(exp.id, items)
            n_pos, n_neg = tp + fn, tn + fp
            tpr, tnr = tp / n_pos, tn / n_neg
            po = (tp + tn) / n_items
            pe = ((tp + fp) * n_pos + (tn + fn) * n_neg) / n_items**2
            kappa = (po - pe) / (1 - pe)
            metrics = {
                "kappa": kappa,
                "fpr": 1 - tnr,
                "balanced_accuracy": (tpr + tnr) / 2,
                "tpr": tpr,
                "tnr": tnr,
                "tp": tp,
                "fn": fn,
                "tn": tn,
                "fp": fp,
                "n": n_items,
            }
            status = "baseline" if seq == 0 else ("kept" if cand_skill > skill + 0.012 else "rolled_back")
            # As in real runs: most losing candidates stop early (no metrics), a few are guard-rejected.
            early = status == "rolled_back" and rng.random() < 0.6
            if status == "rolled_back" and not early and rng.random() < 0.1:
                status = "guard_rejected"
            flips = {
                k: rng.sample(ids, rng.randint(0, 6))
                for k in ("tp_to_fn", "fn_to_tp", "tn_to_fp", "fp_to_tn")
            }
            ledger.record_decision(
                exp.id,
                ExperimentOutcome(
                    status=status,
                    reason=f"synthetic decision {status}",
                    metrics=None if early or status == "guard_rejected" else metrics,
                    early_stopped=early,
                    intervals={
                        "kappa": (kappa - 0.11, kappa + 0.11),
                        "fpr": (metrics["fpr"] - 0.07, metrics["fpr"] + 0.07),
                    },
                    flips=None if seq == 0 else flips,
                    p_value=None if seq == 0 else rng.random(),
                    items_evaluated=n_items,
                    usage=Usage(calls=n_items * replicates, cost_usd=rng.uniform(0.5, 2.0)),
                ),
            )
            if status in ("baseline", "kept"):
                incumbent, skill = exp.id, max(skill, cand_skill)
        ledger.set_run_status(run.id, "finished", stop_reason="benchmark")
        return run.id


async def time_open(ws_root: Path, n_experiments: int) -> float:
    """Seconds from constructing the app to the history table holding every row, painted."""
    from tui.app import JudgeloopApp
    from tui.views import HistoryView

    start = time.perf_counter()
    app = JudgeloopApp(ws_root, image_mode="halfcell", watch=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while True:
            screen = app.screen
            if (
                isinstance(screen, HistoryView)
                and screen.query_one("#history-table").row_count == n_experiments
            ):
                break
            await pilot.pause(0.005)
        await pilot.pause()  # the paint after the rows arrived
        return time.perf_counter() - start


async def time_scroll(ws_root: Path) -> tuple[list[float], list[float], list[float]]:
    """Per-keypress wall seconds (key + repaint) for cursor moves and page-downs through the history,
    and the process CPU seconds of every key. Pilot's idle detection sleeps in small steps, so the wall
    figure has a floor of its own; the CPU figure is the work the app did for the key."""
    from tui.app import JudgeloopApp, settle

    app = JudgeloopApp(ws_root, image_mode="halfcell", watch=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        table = app.screen.query_one("#history-table")
        table.focus()
        table.move_cursor(row=0)
        moves, pages, cpu = [], [], []
        for key, n, out in (("down", 300, moves), ("pagedown", 30, pages)):
            for _ in range(n):
                t, c = time.perf_counter(), time.process_time()
                await pilot.press(key)
                await pilot.pause()
                out.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
        return moves, pages, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=500)
    parser.add_argument("--items", type=int, default=162)
    parser.add_argument("--replicates", type=int, default=3)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--wave", type=int, default=1, help="candidates' rows in waves of this size")
    parser.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="keep the synthetic workspace here and reuse it on the next call (for profiling)",
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()} {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workspace or Path(tmp) / "ws"
        t = time.perf_counter()
        ledger_path = root / "experiments" / "ledger.sqlite"
        if not ledger_path.is_file():
            init_workspace(root)
            build_ledger(ledger_path, args.experiments, args.items, args.replicates, wave=args.wave)
        size_mb = ledger_path.stat().st_size / 1e6
        print(
            f"ledger: {args.experiments} experiments × {args.items} items × {args.replicates} replicates "
            f"({args.experiments * args.items * args.replicates:,} verdict rows, {size_mb:.1f} MB) "
            f"ready in {time.perf_counter() - t:.1f}s"
        )
        opens = [asyncio.run(time_open(root, args.experiments)) for _ in range(args.starts)]
        print(
            f"open → history painted with {args.experiments} rows: median {statistics.median(opens):.2f}s, "
            f"max {max(opens):.2f}s over {len(opens)} starts"
        )
        moves, pages, cpu = asyncio.run(time_scroll(root))
        for name, xs in (("cursor down", moves), ("page down", pages), ("CPU per key (all keys)", cpu)):
            xs = sorted(xs)
            print(
                f"scroll {name}: median {statistics.median(xs) * 1000:.1f} ms, "
                f"p95 {xs[int(len(xs) * 0.95) - 1] * 1000:.1f} ms per key ({len(xs)} keys)"
            )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
