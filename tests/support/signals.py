"""Driving `judgeloop run` in a subprocess for the signal and crash tests: the CLI with its output
collected, a fake judge held at a gate (so "mid-candidate" is a state a test waits for), and what the
ledger and the judge cache hold meanwhile."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

from optimizer.ledger import Ledger
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, run_args
from tests.support.paths import REPO_ROOT
from tests.support.waits import EVENT_WAIT_S


def running_candidate_with_progress(root: Path) -> bool:
    path = root / "experiments" / "ledger.sqlite"
    if not path.exists():
        return False
    with Ledger(path) as led:
        run = led.latest_run()
        if run is None:
            return False
        running = [e for e in led.experiments(run.id) if e.seq > 0 and e.status == "running"]
        if not running:
            return False
        return any(
            e.kind == "progress" and e.experiment_id == running[0].id
            for e in led.events_since(0, run_id=run.id)
        )


def cache_rows(root: Path) -> tuple[int, float]:
    """(calls, summed cost in US dollars) in the workspace's judge cache: every call ever paid here."""
    path = root / "experiments" / "cache.sqlite"
    if not path.exists():
        return 0, 0.0
    conn = sqlite3.connect(path, timeout=5)
    try:
        n, cost = conn.execute("SELECT COUNT(*), COALESCE(SUM(cost_usd), 0) FROM calls").fetchone()
        return int(n), float(cost)
    except sqlite3.OperationalError:  # not created yet
        return 0, 0.0
    finally:
        conn.close()


class CliRun:
    """``python -m optimizer.cli run ...`` in a subprocess; its stdout lines are collected by a thread."""

    def __init__(self, root: Path, server: FakeLLMServer, *extra: str) -> None:
        cmd = [sys.executable, "-m", "optimizer.cli", *run_args(root, server.openai_base_url, *extra)]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait(self) -> int:
        rc = self.proc.wait(timeout=EVENT_WAIT_S)
        self._reader.join(timeout=10)
        return rc

    def __enter__(self) -> CliRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def gated_judge(root: Path, candidate_calls: int) -> FakeJudge:
    """A judge that answers the baseline and ``candidate_calls`` candidate calls, then holds every
    call at its gate (the candidate is mid-evaluation for as long as the test wants)."""
    judge = FakeJudge(root)
    judge.gate_after = len(judge.neg_rank) + len(judge.pos_rank) + candidate_calls
    judge.delay_s = 0.005
    return judge


def release(judge: FakeJudge, *, abandon: bool) -> None:
    judge.abandon_gated = abandon
    judge.gate_after = None
    judge.gate.set()


def kill_hand_edit_then_resume(ws: Path, judge: FakeJudge, server: FakeLLMServer, stage: str) -> int:
    """`judgeloop run --strategy manual` on the workspace's hand edit, in a subprocess, killed with
    SIGKILL once ``judge``'s gate holds its calls, the ``stage`` (e.g. "rejudging") has begun and every
    answered call is in the judge cache; then the gate let go (held calls abandoned) and `run --resume`
    in this process. Returns how many calls had been answered before the resume; asserts that the
    resume finished and asked no answered call again (each answered call is its own cache entry)."""
    from tests.support.loop import present, run_loop, wait_for
    from tests.support.processes import killed_cli

    args = run_args(ws, server.openai_base_url, "--strategy", "manual", "-m", "a hand edit", concurrency="4")

    def stage_begun() -> bool:
        path = ws / "experiments" / "ledger.sqlite"
        if not path.exists():
            return False
        with Ledger(path) as led:
            run = led.latest_run()
            return run is not None and any(
                e.kind == "stage" and e.payload.get("stage") == stage
                for e in led.events_since(0, run_id=run.id)
            )

    def moment() -> None:
        wait_for(lambda: len(judge.answered) >= present(judge.gate_after), "the gated calls", 60)
        wait_for(stage_begun, f"the {stage} stage")
        wait_for(lambda: cache_rows(ws)[0] == len(judge.answered), "the answered calls to be cached")

    killed_cli(args, moment)
    release(judge, abandon=True)
    answered_before = len(judge.answered)
    assert run_loop(ws, server.openai_base_url, "--resume") == 0
    assert len(judge.answered) == cache_rows(ws)[0] > answered_before
    return answered_before
