"""Ctrl-C and SIGTERM on the long commands, through a real subprocess against the fake server.

The first signal stops new judge calls at once and says so on stderr; the calls in flight finish into
the cache; the command ends cleanly (`run`: the run stopped, the cut experiment left for `--resume`;
`eval`: exit 130, nothing written). A second signal aborts (exit 130). "In flight" is a state the test
builds, never a guess about timing: the fake judge holds every call slot at its gate before the signal,
so no call can be half-sent, and every request the server sees after the signal would be a new call.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from optimizer.ledger import Ledger
from tests.support.attribution import MARKER_A, MarkerJudge, add_line, run_chain
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, commit_all, present, run_loop, stop_after_baseline, wait_for
from tests.support.paths import REPO_ROOT
from tests.support.scripted import add_heldout_split, assert_clean, latest
from tests.support.signals import CliRun, cache_rows, gated_judge, release, running_candidate_with_progress
from tests.support.waits import EVENT_WAIT_S

CONCURRENCY = 8  # CliRun's --concurrency


def _held(judge: FakeJudge, server: FakeLLMServer) -> int:
    """Calls the server holds at the judge's gate (received, not answered)."""
    return len(server.inference_requests()) - judge.admitted


def _every_slot_held(judge: FakeJudge, server: FakeLLMServer) -> None:
    wait_for(lambda: _held(judge, server) == CONCURRENCY, "every call slot to be held at the gate", 60)


# -- run ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_stops_new_calls_at_once_records_the_stop_and_resume_finishes_the_candidate(ws: Path) -> None:
    judge = gated_judge(ws, candidate_calls=4)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "2") as cli:
            wait_for(lambda: running_candidate_with_progress(ws), "a running candidate with progress events")
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGINT)
            # Said at once, while the calls in flight are still held: the run does not wait for its step.
            wait_for(
                lambda: cli.said("judgeloop: Ctrl-C: the run stops after the judge calls in flight"),
                "the stop to be announced",
            )
            assert cli.proc.poll() is None
            requests_at_stop = len(server.inference_requests())
            release(judge, abandon=False)  # the calls in flight are answered
            assert cli.wait() == 130, "".join(cli.lines)  # stopped by a signal: not a clean end for a script
        assert len(server.inference_requests()) == requests_at_stop, "a judge call started after the Ctrl-C"
        # Nothing lost: every answered call is in the cache, to be served again by --resume.
        assert cache_rows(ws)[0] == len(judge.answered)
        run, exps = latest(ws)
        assert run.status == "stopped"
        assert (run.stop_reason or "").startswith(
            f"interrupted (Ctrl-C) while evaluating experiment {exps[1].id}, after "
        )
        assert [e.status for e in exps] == ["baseline", "running"]  # left for --resume, not decided on part
        assert cli.said(f"run {run.id} stopped: interrupted (Ctrl-C)")
        assert_clean(ws)
        cut = exps[1]
        assert cut.cost_usd == 0.0  # fake-judge has no price; the spend is tested with prices elsewhere
        answered_before = len(judge.answered)

        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and "max-experiments 2" in (run.stop_reason or "")
    resumed = next(e for e in exps if e.id == cut.id)
    assert resumed.status in ("kept", "rolled_back")
    baseline_calls = len(judge.neg_rank) + len(judge.pos_rank)
    # The calls the candidate got answered before the stop came back from the cache.
    assert resumed.cache_hits >= answered_before - baseline_calls
    assert len(judge.answered) == cache_rows(ws)[0]  # no call was paid twice
    assert_clean(ws)


@pytest.mark.slow
def test_ctrl_c_then_sigterm_aborts_with_130_named_as_sigterm(ws: Path) -> None:
    judge = gated_judge(ws, candidate_calls=4)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "1") as cli:
            wait_for(lambda: running_candidate_with_progress(ws), "a running candidate with progress events")
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGINT)
            wait_for(lambda: cli.said("judgeloop: Ctrl-C: the run stops"), "the stop to be announced")
            wait_for(
                lambda: cache_rows(ws)[0] >= present(judge.gate_after), "the answered calls to be cached"
            )
            cli.proc.send_signal(signal.SIGTERM)  # the calls in flight are still held: abort now
            rc = cli.wait()
            release(judge, abandon=True)
            assert rc == 130, "".join(cli.lines)
        assert cli.said("judgeloop: second SIGTERM: aborting now")
        run, exps = latest(ws)
        assert run.status == "stopped" and run.stop_reason == "aborted by a second SIGTERM"
        assert [e.status for e in exps] == ["baseline", "running"]

        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and exps[1].status in ("kept", "rolled_back")
    assert_clean(ws)


@pytest.mark.slow
def test_sigterm_is_named_sigterm_and_stops_the_run_like_ctrl_c(ws: Path) -> None:
    judge = gated_judge(ws, candidate_calls=4)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "2") as cli:
            wait_for(lambda: running_candidate_with_progress(ws), "a running candidate with progress events")
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGTERM)
            wait_for(
                lambda: cli.said("judgeloop: SIGTERM: the run stops after the judge calls in flight"),
                "the stop to be announced",
            )
            requests_at_stop = len(server.inference_requests())
            release(judge, abandon=False)
            assert cli.wait() == 130, "".join(cli.lines)  # stopped by a signal: not a clean end for a script
        assert len(server.inference_requests()) == requests_at_stop
    assert not any("Ctrl-C" in line for line in cli.lines if "SIGTERM" not in line and "abort" not in line)
    run, exps = latest(ws)
    assert run.status == "stopped" and (run.stop_reason or "").startswith("interrupted (SIGTERM)")
    assert [e.status for e in exps] == ["baseline", "running"]


@pytest.mark.slow
def test_ctrl_c_during_the_baseline_leaves_it_for_resume(ws: Path) -> None:
    judge = FakeJudge(ws)
    judge.gate_after = 5  # five baseline calls answered, then every slot held
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "1") as cli:
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGINT)
            wait_for(lambda: cli.said("judgeloop: Ctrl-C: the run stops"), "the stop to be announced")
            requests_at_stop = len(server.inference_requests())
            release(judge, abandon=False)
            assert cli.wait() == 130, "".join(cli.lines)  # stopped by a signal: not a clean end for a script
        assert len(server.inference_requests()) == requests_at_stop
        run, exps = latest(ws)
        assert run.status == "stopped" and [e.status for e in exps] == ["running"]
        assert f"after {5 + CONCURRENCY}/" in (run.stop_reason or "")
        answered = len(judge.answered)
        assert answered == 5 + CONCURRENCY and cache_rows(ws)[0] == answered

        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and exps[0].status == "baseline"
    assert exps[0].cache_hits >= answered  # the baseline's answered calls were not paid again
    assert len(judge.answered) == cache_rows(ws)[0]


# -- eval ----------------------------------------------------------------------------------------------


class _Cli:
    """``python -m optimizer.cli ARGS`` with stdout and stderr read apart by threads."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "optimizer.cli", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream: IO[str] | None, lines: list[str]) -> None:
        assert stream is not None
        for line in stream:
            lines.append(line)

    def wait(self) -> int:
        rc = self.proc.wait(timeout=EVENT_WAIT_S)
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def __enter__(self) -> _Cli:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.mark.slow
def test_eval_stops_on_sigterm_within_the_calls_in_flight_writes_nothing_and_loses_nothing(ws: Path) -> None:
    judge = FakeJudge(ws)
    judge.gate_after = 6
    out = ws / "experiments" / "evals" / "cut"
    with FakeLLMServer(default=judge) as server:
        args = (
            "eval",
            "-w",
            str(ws),
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
            "--concurrency",
            str(CONCURRENCY),
            "--out",
            str(out),
        )
        with _Cli(*args) as cli:
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGTERM)
            wait_for(
                lambda: any(
                    "judgeloop: SIGTERM: the evaluation stops after the judge calls in flight" in line
                    for line in list(cli.err)
                ),
                "the stop to be announced",
            )
            assert cli.proc.poll() is None  # still waiting for the calls in flight, not killed
            requests_at_stop = len(server.inference_requests())
            release(judge, abandon=False)
            assert cli.wait() == 130, "".join(cli.err)
        assert len(server.inference_requests()) == requests_at_stop, "a judge call started after SIGTERM"
        judged = 6 + CONCURRENCY
        assert cli.err[-1].startswith(f"judgeloop eval: stopped by SIGTERM: {judged} of ")
        assert "nothing written" in cli.err[-1] and "Traceback" not in "".join(cli.err)
        assert not out.exists() and not "".join(cli.out).strip()
        assert cache_rows(ws)[0] == len(judge.answered) == judged

        # The same evaluation again pays only for the other items.
        with _Cli(*args) as again:
            assert again.wait() == 0, "".join(again.err)
    assert len(judge.answered) == len(set(judge.answered)) == cache_rows(ws)[0]
    assert any(f"{judged} cached" in line for line in again.out)
    assert (out / "_summary.json").is_file()


def test_ctrl_c_before_any_call_on_a_cached_eval_still_ends_cleanly(ws: Path) -> None:
    """A stop requested when nothing is in flight ends at once; the in-process engine sees the same
    request (the `StopRequest` the CLI hands it) and starts no call."""
    from optimizer.evaluation.scored import EvalOptions, evaluate
    from optimizer.evaluation.stopping import Interrupted, StopRequest
    from optimizer.workspace.config import JudgeOverrides
    from optimizer.workspace.workspace import Workspace

    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        stop = StopRequest()
        assert stop.request("Ctrl-C") and not stop.request("SIGTERM")  # the first reason is kept
        options = EvalOptions(
            judge=JudgeOverrides(provider="openai", base_url=server.openai_base_url, model="fake-judge"),
            out=ws / "never",
        )
        try:
            evaluate(Workspace.open(ws), options, stop=stop)
        except Interrupted as exc:
            assert str(exc).startswith("0 of ")
        else:
            raise AssertionError("an evaluation stopped before its first call returned a result")
        assert server.inference_requests() == []
    assert not (ws / "never").exists()


# -- confirm and attribute ---------------------------------------------------------------------------


def _judge_args(server: FakeLLMServer) -> tuple[str, ...]:
    return (
        "--provider",
        "openai",
        "--base-url",
        server.openai_base_url,
        "--model",
        "fake-judge",
        "--concurrency",
        str(CONCURRENCY),
    )


@pytest.mark.slow
def test_confirm_stopped_by_ctrl_c_records_nothing_counts_no_use_and_loses_no_call(ws: Path) -> None:
    with FakeLLMServer(default=FakeJudge(ws)) as server, stop_after_baseline():
        assert run_loop(ws, server.openai_base_url) == 0  # a run with an incumbent to confirm
    _, held = add_heldout_split(ws, n_held=12)
    cached_before = cache_rows(ws)[0]  # the run's calls
    judge = FakeJudge(ws)  # knows the held-out items now
    judge.gate_after = 2
    with FakeLLMServer(default=judge) as server:
        args = ("confirm", "-w", str(ws), "--split", "held", *_judge_args(server))
        with _Cli(*args) as cli:
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGINT)
            wait_for(
                lambda: any(
                    "judgeloop: Ctrl-C: the confirmation stops after the judge calls in flight" in line
                    for line in list(cli.err)
                ),
                "the stop to be announced",
            )
            requests_at_stop = len(server.inference_requests())
            release(judge, abandon=False)
            assert cli.wait() == 130, "".join(cli.err)
        assert len(server.inference_requests()) == requests_at_stop
        assert cli.err[-1].startswith(
            f"judgeloop confirm: stopped by Ctrl-C: {2 + CONCURRENCY} of {len(held)} "
            "items judged; nothing recorded and the use is not counted"
        )
        with Ledger(ws / "experiments" / "ledger.sqlite") as led:
            assert led.count_confirmations("held") == 0
        assert cache_rows(ws)[0] - cached_before == len(judge.answered)

        with _Cli(*args) as again:
            assert again.wait() == 0, "".join(again.err)
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        assert led.count_confirmations("held") == 1
    assert len(judge.answered) == len(set(judge.answered)) == cache_rows(ws)[0] - cached_before == len(held)


@pytest.mark.slow
def test_attribute_stopped_by_ctrl_c_keeps_what_it_measured_and_says_what_is_left(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        exps = run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0)])
        assert [e.status for e in exps] == ["baseline", "kept"]
        judge.gate_after = len(judge.answered) + 10
        args = ("attribute", "-w", str(ws), *_judge_args(server))
        with _Cli(*args) as cli:
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGINT)
            wait_for(
                lambda: any(
                    "judgeloop: Ctrl-C: the attribution stops after the judge calls in flight" in line
                    for line in list(cli.err)
                ),
                "the stop to be announced",
            )
            requests_at_stop = len(server.inference_requests())
            release(judge, abandon=False)
            assert cli.wait() == 0, "".join(cli.err)
        assert len(server.inference_requests()) == requests_at_stop
        out = "".join(cli.out)
        assert re.search(r"#\d+: not measured: .*interrupted \(Ctrl-C\)", out) and ": partial" in out, out
        assert cache_rows(ws)[0] == len(judge.answered)

        with _Cli(*args) as again:
            assert again.wait() == 0, "".join(again.err)
    assert ": complete" in "".join(again.out)
    # Re-judging repeats a request body on purpose (another replicate): the measure is the cache, one
    # entry per answered call, none answered twice.
    assert len(judge.answered) == cache_rows(ws)[0]


@pytest.mark.slow
def test_the_spend_of_a_cut_evaluation_is_on_the_ledger_once_before_and_after_resume(ws: Path) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "prices")
    judge = gated_judge(ws, candidate_calls=4)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "1") as cli:
            wait_for(lambda: running_candidate_with_progress(ws), "a running candidate with progress events")
            _every_slot_held(judge, server)
            cli.proc.send_signal(signal.SIGINT)
            wait_for(lambda: cli.said("judgeloop: Ctrl-C: the run stops"), "the stop to be announced")
            release(judge, abandon=False)
            assert cli.wait() == 130, "".join(cli.lines)  # stopped by a signal: not a clean end for a script
        _, exps = latest(ws)
        calls, paid = cache_rows(ws)
        assert calls == len(judge.answered) and paid > 0
        # Every dollar paid is on a row (the cut candidate's included), and the summary said so.
        assert sum(e.cost_usd for e in exps) == pytest.approx(paid)
        assert exps[1].status == "running" and exps[1].cost_usd > 0
        assert cli.said(f"; spent ${paid:.4f}")

        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    _, exps = latest(ws)
    assert exps[1].status in ("kept", "rolled_back")
    assert sum(e.cost_usd for e in exps) == pytest.approx(cache_rows(ws)[1])  # counted once, not twice
