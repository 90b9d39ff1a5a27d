"""Throughput of waves under a batch API: candidates decided per hour with ``run --wave 1`` vs 4 vs 8.

Each batch pass of a batch API waits minutes to hours; a candidate under the adaptive policy needs up
to three passes in sequence (its first pass, then the incumbent's and its own re-judging), so one at a
time a batch night buys few candidates. A wave of K sends each pass of its K candidates as one batch.

The real loop (`optimizer.loop.session.start_run` with ``--batch``, adaptive, the decision-power
benchmark's 162-item workspace, judge and optimiser: benchmarks/decision_power.py) runs against the
test suite's fake OpenAI server, whose batches end a fixed ``--latency-s`` after submission (time
scaled: 10 minutes of batch latency become 0.5 s by default). Simulated time = the run's wall time after its
baseline, with every second some batch was pending scaled back up to the simulated latency (the
loop's own work counts as it is). Figures per wave size: candidates decided, batches sent, judge calls
per candidate / 162, simulated hours, candidates decided per simulated hour.

Measured (default run: 8 candidates, one 8-item fix among seven no-ops, seed 0; x86_64 Linux, 2 cores,
load average ~0.7; 36 s wall):

    wave decided kept batches calls/cand/162 sim. hours candidates/hour vs wave 1
       1       8    2      24           1.46       4.00            2.00      1.0x
       4       8    1       6           1.43       1.00            7.99      4.0x
       8       8    1       3           1.44       0.50           15.96      8.0x

One at a time every candidate waits for three batches in a row (first pass, the incumbent's and its
own re-judging); a wave's candidates wait for the same three together. A re-judging call two
candidates of a wave share is sent once and counted on one row (it read 1.52 / 1.70 for waves of 4 / 8
while every row that needed it counted it).

``--direct``: direct calls instead, every judge call ``--call-s`` long, futility screening off vs on,
candidates one at a time: judge calls and wall time per decided candidate (their ledger rows'
``duration_s``). Measured (``--direct --candidates 8 --call-s 0.5``): off 1.51 calls/162 and 8.6 s a
candidate, on 0.92 and 7.0 s (the looks' waits for a pass to drain cost less than the calls saved).

Run:  python benchmarks/throughput.py [--waves 1 4 8] [--candidates 8] [--batch-minutes 10] [--latency-s 0.5]
      python benchmarks/throughput.py --direct [--candidates 8] [--call-s 0.5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _power_loop as power_loop
from benchmarks._figures import with_docs_figure
from benchmarks._judge_model import JudgeModel, item_q
from optimizer.ledger import Ledger
from optimizer.loop import session
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support import fakeserver
from tests.support.fakeserver import FakeLLMServer


@dataclass(frozen=True)
class WaveThroughput:
    wave: int
    decided: int  # candidates kept or rolled back
    kept: int
    batches: int  # batches the candidates' passes sent (the baseline's not counted)
    calls_per_candidate: float  # judge calls per decided candidate / items
    simulated_h: float  # after the baseline

    @property
    def per_hour(self) -> float:
        return self.decided / self.simulated_h if self.simulated_h > 0 else float("nan")


@contextmanager
def batch_latency(latency_s: float) -> Iterator[None]:
    """The fake server's batches end ``latency_s`` after they were created (not after some polls)."""
    ended = property(lambda batch: time.time() - batch.created >= latency_s)
    with mock.patch.object(fakeserver._FakeBatch, "ended", ended):  # the fake's clock, for this benchmark
        yield


def pending_union(intervals: Sequence[tuple[float, float]]) -> float:
    """Seconds during which at least one of ``intervals`` (start, end) was open."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def measure(
    k: int,
    kinds: Sequence[str],
    *,
    seed: int = 0,
    latency_s: float = 0.5,
    batch_minutes: float = 10.0,
    concurrency: int = 16,
    odds: tuple[np.ndarray, np.ndarray] | None = None,
) -> WaveThroughput:
    """One run of ``len(kinds)`` candidates (``kinds``: "noop" / "fixD", the benchmark strategy's) in
    waves of ``k``, each pass one batch of the fake server (ending ``latency_s`` after submission)."""
    scale = batch_minutes * 60 / latency_s
    rng = random.Random(f"throughput/{seed}")
    key = {"OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "throughput-bench")}
    with (
        mock.patch.dict(os.environ, key),
        tempfile.TemporaryDirectory(prefix="throughput-") as tmp,
        batch_latency(latency_s),
    ):
        root, positive, types = power_loop.build_workspace(Path(tmp))
        q, fixable = odds if odds is not None else item_q(len(positive), 0)
        model = JudgeModel(positive, types, q, fixable, seed=rng.getrandbits(32))
        power_loop.set_loop_key(root, "policy", '"adaptive"')
        power_loop.set_loop_key(root, "patience", "1000000")
        cfg = root / "judgeloop.toml"
        poll = max(0.005, latency_s / 20)
        cfg.write_text(
            cfg.read_text(encoding="utf-8").replace(
                "\n[judge]\n", f"\n[judge]\nbatch_poll_s = {poll}\nbatch_poll_max_s = {poll * 2}\n", 1
            ),
            encoding="utf-8",
        )
        power_loop._git(root, "commit", "-qam", "throughput: batch polling")
        strategy = power_loop.BenchStrategy(model, rng, schedule=list(kinds))
        with (
            FakeLLMServer(default=model, keep_alive=True) as server,
            power_loop._strategy_installed(strategy),
        ):
            judge = JudgeOverrides(
                provider="openai",
                model="fake-judge",
                base_url=server.openai_base_url,
                concurrency=concurrency,
            )
            ws = Workspace.open(root)
            options = session.RunOptions(max_experiments=len(kinds), judge=judge, batch=True, wave=k)
            outcome = session.start_run(ws, options)
            ended_at = time.time()
            created = sorted(b.created for b in server._batches.values())  # the fake's record of its batches
        with Ledger(ws.ledger_path) as ledger:
            exps = ledger.experiments(outcome.run_id)
    # From the baseline's batch ending on: real work as it is, batch waits scaled back to the latency.
    t0 = created[0] + latency_s
    waits = pending_union([(c, c + latency_s) for c in created[1:]])
    simulated_s = max(0.0, ended_at - t0 - waits) + waits * scale
    decided = [e for e in exps if e.seq > 0 and e.status in ("kept", "rolled_back")]
    n_items = len(positive)
    calls = sum(e.calls for e in decided) / len(decided) / n_items if decided else float("nan")
    return WaveThroughput(
        k, len(decided), sum(e.status == "kept" for e in decided), len(created) - 1, calls, simulated_s / 3600
    )


@dataclass(frozen=True)
class DirectWall:
    """Direct passes (no batch): futility off or on, per decided candidate."""

    futility: bool
    decided: int
    kept: int
    calls_per_candidate: float  # judge calls / items
    wall_s: float  # mean duration of a decided candidate (its ledger row's duration_s)


class _Delayed:
    """The benchmark judge with every reply sent ``delay_s`` after its request arrived."""

    def __init__(self, model: JudgeModel, delay_s: float) -> None:
        self.model, self.delay_s = model, delay_s

    def __call__(self, request: fakeserver.RecordedRequest) -> fakeserver.Behaviour:
        return dataclasses.replace(self.model(request), delay_s=self.delay_s)


def measure_direct(
    futility: bool, kinds: Sequence[str], *, seed: int = 0, call_s: float = 0.25, concurrency: int = 16
) -> DirectWall:
    """One run of ``kinds`` candidates, one at a time, direct calls that each take ``call_s``: what
    futility's looks (each a pass that drains before its re-judging) cost in wall time per candidate."""
    rng = random.Random(f"throughput-direct/{seed}")
    key = {"OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "throughput-bench")}
    with mock.patch.dict(os.environ, key), tempfile.TemporaryDirectory(prefix="throughput-direct-") as tmp:
        root, positive, types = power_loop.build_workspace(Path(tmp))
        q, fixable = item_q(len(positive), 0)
        model = JudgeModel(positive, types, q, fixable, seed=rng.getrandbits(32))
        power_loop.set_loop_key(root, "policy", '"adaptive"')
        power_loop.set_loop_key(root, "patience", "1000000")
        power_loop.set_loop_key(root, "futility", "true" if futility else "false")
        power_loop._git(root, "commit", "-qam", "throughput: futility")
        strategy = power_loop.BenchStrategy(model, rng, schedule=list(kinds))
        with (
            FakeLLMServer(default=_Delayed(model, call_s), keep_alive=True) as server,
            power_loop._strategy_installed(strategy),
        ):
            judge = JudgeOverrides(
                provider="openai",
                model="fake-judge",
                base_url=server.openai_base_url,
                concurrency=concurrency,
            )
            ws = Workspace.open(root)
            outcome = session.start_run(ws, session.RunOptions(max_experiments=len(kinds), judge=judge))
        with Ledger(ws.ledger_path) as ledger:
            exps = ledger.experiments(outcome.run_id)
    decided = [e for e in exps if e.seq > 0 and e.status in ("kept", "rolled_back")]
    n = len(positive)
    return DirectWall(
        futility,
        len(decided),
        sum(e.status == "kept" for e in decided),
        sum(e.calls for e in decided) / max(1, len(decided)) / n,
        sum(e.duration_s or 0.0 for e in decided) / max(1, len(decided)),
    )


def direct_table(rows: Sequence[DirectWall], call_s: float) -> list[str]:
    head = f"{'futility':>8} {'decided':>7} {'kept':>4} {'calls/cand/162':>14} {'wall s/cand':>11} {'calls of a call_s':>17}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{'on' if r.futility else 'off':>8} {r.decided:>7} {r.kept:>4} {r.calls_per_candidate:>14.2f} "
            f"{r.wall_s:>11.1f} {r.wall_s / call_s:>17.1f}"
        )
    return lines


def table(rows: Sequence[WaveThroughput]) -> list[str]:
    head = (
        f"{'wave':>4} {'decided':>7} {'kept':>4} {'batches':>7} {'calls/cand/162':>14} {'sim. hours':>10} "
        f"{'candidates/hour':>15} {'vs wave 1':>9}"
    )
    lines = [head, "-" * len(head)]
    base = next((r.per_hour for r in rows if r.wave == 1), None)
    for r in rows:
        ratio = f"{r.per_hour / base:.1f}x" if base else "—"
        lines.append(
            f"{r.wave:>4} {r.decided:>7} {r.kept:>4} {r.batches:>7} {r.calls_per_candidate:>14.2f} "
            f"{r.simulated_h:>10.2f} {r.per_hour:>15.2f} {ratio:>9}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument(
        "--candidates", type=int, default=8, help="candidates per run (one 8-item fix, the rest no-ops)"
    )
    parser.add_argument("--batch-minutes", type=float, default=10.0, help="simulated latency of one batch")
    parser.add_argument("--latency-s", type=float, default=0.5, help="the real seconds it is scaled to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--direct",
        action="store_true",
        help="direct calls instead: futility off vs on, wall time per candidate (one at a time)",
    )
    parser.add_argument("--call-s", type=float, default=0.25, help="--direct: seconds every judge call takes")
    args = parser.parse_args(argv)
    started = time.monotonic()
    kinds = ["noop"] * (args.candidates - 1) + ["fix8"]
    random.Random(args.seed).shuffle(kinds)
    if args.direct:
        print(
            f"direct passes: every judge call takes {args.call_s:g} s, concurrency 16, adaptive, "
            f"{args.candidates} candidates one at a time ({' '.join(kinds)})"
        )
        print(
            f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        )
        direct = [measure_direct(f, kinds, seed=args.seed, call_s=args.call_s) for f in (False, True)]
        print()
        for line in direct_table(direct, args.call_s):
            print(line)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\nwall time {time.monotonic() - started:.0f} s; load average {load} (1 / 5 / 15 min)")
        return 0
    print(
        f"throughput: candidates decided per hour under a batch API ({args.batch_minutes:g} min per batch, "
        f"scaled to {args.latency_s:g} s), adaptive policy, {args.candidates} candidates ({' '.join(kinds)})"
    )
    print(
        f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    rows = [
        measure(k, kinds, seed=args.seed, latency_s=args.latency_s, batch_minutes=args.batch_minutes)
        for k in args.waves
    ]
    print()
    for line in table(rows):
        print(line)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nwall time {time.monotonic() - started:.0f} s; load average {load} (1 / 5 / 15 min)")
    return 0


if __name__ == "__main__":
    sys.exit(with_docs_figure(main))
