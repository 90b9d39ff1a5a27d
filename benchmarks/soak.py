"""Chaos soak of `judgeloop run`: an overnight run compressed into minutes, with faults and kills.

The loop (``library`` strategy) runs as its own process on the full 88-item sample dev split against
the loop tests' deterministic fake judge (tests/support/loop.py, OpenAI wire, real SDK), with a
fault mix injected into judge calls — 429 with ``retry-after``, 500, malformed JSON, hangs past the
per-call timeout — and is killed with SIGKILL at random moments and resumed with ``--resume``,
until ``--experiments`` candidates are decided. Then it checks what an overnight user relies on and
prints the figures:

- the run finished, no experiment is left running, every candidate has a decision;
- ``git log`` of the run branch is exactly the kept chain, every commit with its trailers; every
  rolled-back candidate is under ``refs/judgeloop/rejected/``; the tree is clean, on the incumbent;
- no kept candidate raised FPR;
- paid calls paid twice: request bodies the server answered more than once. Only a reply that was
  in flight when the process was killed can be lost and asked again, so this is bounded by
  kills x concurrency (and is usually 0).

Run:  .venv/bin/python benchmarks/soak.py [--experiments 20] [--kills 6] [--fault-rate 0.15] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.ledger import Ledger
from optimizer.workspace import gitops
from tests.support.fakeserver import (
    FakeLLMServer,
    RecordedRequest,
    hang,
    malformed,
    rate_limited,
    server_error,
)
from tests.support.loop import FakeJudge, body_digest, make_workspace, set_toml_key

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2.0
CONCURRENCY = 8


class ChaosJudge:
    """The fake judge behind a fault injector; counts what it did."""

    def __init__(self, judge: FakeJudge, fault_rate: float, seed: int) -> None:
        self.judge = judge
        self.fault_rate = fault_rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.faults: collections.Counter[str] = collections.Counter()
        self.answered: collections.Counter[str] = collections.Counter()

    def __call__(self, request: RecordedRequest):
        with self.lock:
            roll = self.rng.random()
            kind = self.rng.choice(["429", "500", "malformed", "hang"]) if roll < self.fault_rate else None
            if kind:
                self.faults[kind] += 1
        if kind == "429":
            return rate_limited(retry_after=0.05)
        if kind == "500":
            return server_error(500)
        if kind == "malformed":
            return malformed()
        if kind == "hang":
            return hang(TIMEOUT_S + 1.0)
        behaviour = self.judge(request)
        if isinstance(request.body, dict) and behaviour.kind == "reply":
            with self.lock:
                self.answered[body_digest(request.body)] += 1
        return behaviour


def loop_process(root: Path, url: str, experiments: int, *, resume: bool) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "optimizer.cli",
        "run",
        "-w",
        str(root),
        "--provider",
        "openai",
        "--base-url",
        url,
        "--model",
        "fake-judge",
        "--concurrency",
        str(CONCURRENCY),
    ]
    cmd += (
        ["--resume"]
        if resume
        else ["--strategy", "library", "--max-experiments", str(experiments), "--patience", "1000"]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": "soak-key"}
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def check(root: Path) -> dict[str, object]:
    """The invariants (an AssertionError names the first one broken) and the run's outcome counts."""
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None
        exps = led.experiments(run.id)
    assert run.status == "finished", f"run status {run.status}: {run.stop_reason}"
    assert not [e for e in exps if e.status == "running"], "an experiment was left running"
    by_id = {e.id: e for e in exps}
    kept = [e for e in exps if e.status == "kept"]
    for e in kept:
        parent = by_id[e.parent_id] if e.parent_id else None
        assert parent is not None and e.fpr is not None and parent.fpr is not None
        assert e.fpr <= parent.fpr + 1e-12, f"kept experiment {e.id} raised FPR {parent.fpr} -> {e.fpr}"
    incumbent = ([e for e in exps if e.status == "baseline"] + kept)[-1]
    assert gitops.rev_parse(root, run.branch) == incumbent.commit_sha, "the branch is not on the incumbent"
    assert gitops.rev_parse(root, "HEAD") == incumbent.commit_sha, "HEAD is not on the incumbent"
    assert not gitops.is_dirty(root), "the working tree is dirty"
    log = subprocess.run(
        ["git", "-C", str(root), "log", "--format=%H%x00%B%x01", f"{run.start_rev}..{run.branch}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commits = [c.strip() for c in log.split("\x01") if c.strip()]
    assert len(commits) == len(kept), f"{len(commits)} commits on the branch for {len(kept)} kept candidates"
    for commit in commits:
        trailers = gitops.parse_trailers(commit.split("\x00", 1)[1])
        assert trailers.get("Judgeloop-Decision") == "kept" and "Judgeloop-Kappa" in trailers, commit[:12]
    refs = subprocess.run(
        ["git", "-C", str(root), "for-each-ref", "--format=%(refname)", "refs/judgeloop/rejected/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    rolled_back = {e.id for e in exps if e.status == "rolled_back"}
    assert {int(r.rsplit("/", 1)[1]) for r in refs} >= rolled_back, (
        "a rolled-back candidate has no rejected ref"
    )
    return {
        "experiments": len(exps) - 1,
        "outcomes": dict(collections.Counter(e.status for e in exps)),
        "errors_recorded": [e.reason for e in exps if e.status == "error"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=20, help="candidates to decide")
    parser.add_argument(
        "--kills", type=int, default=6, help="SIGKILLs at random moments, each followed by --resume"
    )
    parser.add_argument(
        "--fault-rate", type=float, default=0.15, help="share of judge calls answered by a fault"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = make_workspace(Path(tmp))
        set_toml_key(root, "judge", "timeout_s", str(TIMEOUT_S))
        set_toml_key(root, "judge", "max_retries", "2")
        subprocess.run(["git", "-C", str(root), "commit", "-qam", "soak settings"], check=True)
        chaos = ChaosJudge(FakeJudge(root), args.fault_rate, args.seed)
        kills = resumes = 0
        with FakeLLMServer(default=chaos, keep_alive=True, max_hang_s=TIMEOUT_S + 2) as server:
            proc = loop_process(root, server.openai_base_url, args.experiments, resume=False)
            while True:
                if kills < args.kills:
                    try:
                        proc.wait(timeout=rng.uniform(1.0, 8.0))
                    except subprocess.TimeoutExpired:
                        proc.send_signal(signal.SIGKILL)
                        proc.wait()
                        kills += 1
                else:
                    proc.wait(timeout=1800)
                code = proc.returncode
                if code == 0:
                    with Ledger(root / "experiments" / "ledger.sqlite") as led:
                        run = led.latest_run()
                        finished = run is not None and run.status == "finished"
                    if finished:
                        break
                elif code != -signal.SIGKILL:
                    raise SystemExit(f"the loop exited {code}: {proc.stderr.read() if proc.stderr else ''}")
                with Ledger(root / "experiments" / "ledger.sqlite") as led:
                    recorded = led.latest_run() is not None
                # Killed before it even recorded its run (process start-up): start it again instead.
                proc = loop_process(root, server.openai_base_url, args.experiments, resume=recorded)
                resumes += recorded
            outcome = check(root)
            repeated = sum(n - 1 for n in chaos.answered.values() if n > 1)
    figures = {
        **outcome,
        "kills": kills,
        "resumes": resumes,
        "faults_injected": dict(chaos.faults),
        "judge_calls_answered": sum(chaos.answered.values()),
        "paid_calls_paid_twice": repeated,
        "bound_kills_x_concurrency": kills * CONCURRENCY,
        "wall_s": round(time.monotonic() - started, 1),
    }
    assert repeated <= kills * CONCURRENCY, "more repeated calls than replies that could have been in flight"
    print(
        f"soak: {outcome['experiments']} candidates decided ({outcome['outcomes']}), {kills} kill -9 + "
        f"{resumes} resumes, faults injected {dict(chaos.faults)}; invariants hold (finished, nothing running, "
        f"branch = kept chain with trailers, rejected refs, clean tree, no kept candidate raised FPR); "
        f"paid calls paid twice: {repeated} of {figures['judge_calls_answered']} (bound {kills * CONCURRENCY}); "
        f"{figures['wall_s']} s"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
