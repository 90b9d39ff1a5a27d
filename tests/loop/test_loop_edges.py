"""The loop's edges: Ctrl-C twice, ``--hours``, ``--resume`` refusals and what it keeps
(the judge, the replicates, the spend across a ``kill -9``).

Same fixtures as tests/loop/test_loop_run.py: fresh copies of an ``init --sample`` workspace whose dev
split is a 32-item subset, a deterministic fake judge, the real openai SDK. The signal tests run
``python -m optimizer.cli run`` in a subprocess and hold the fake judge at a gate, so "mid-candidate"
is a state the test waits for (ledger progress events), never a guess about timing.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger, RunSpec
from optimizer.workspace import gitops
from tests.support.fakeserver import FakeLLMServer, RecordedRequest
from tests.support.loop import (
    GOOD_ENTRY,
    FakeJudge,
    body_digest,
    commit_all,
    present,
    request_texts,
    run_loop,
    stop_after_baseline,
    wait_for,
)
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, toggle
from tests.support.signals import (
    CliRun,
)
from tests.support.signals import (
    cache_rows as _cache_rows,
)
from tests.support.signals import (
    gated_judge as _gated_judge,
)
from tests.support.signals import (
    release as _release,
)
from tests.support.signals import (
    running_candidate_with_progress as _running_candidate_with_progress,
)

PRICES = '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n'  # US dollars per million tokens


# -- helpers -----------------------------------------------------------------------------------------


def _stopped_run(root: Path, server: FakeLLMServer, *extra: str) -> None:
    """A run that evaluated its baseline and stopped (a STOP file): unfinished, so resumable."""
    with stop_after_baseline():
        assert run_loop(root, server.openai_base_url, *extra) == 0
    run, exps = latest(root)
    assert run.status == "stopped" and [e.status for e in exps] == ["baseline"]


def _trajectories_requested(judge: FakeJudge, requests: list[RecordedRequest]) -> collections.Counter[str]:
    return collections.Counter(
        judge.trajectory_of(request_texts(r.body)[1]) for r in requests if isinstance(r.body, dict)
    )


# -- Ctrl-C --------------------------------------------------------------------------------------------


# The first Ctrl-C (a clean stop within the calls in flight) and SIGTERM: tests/loop/test_loop_signals.py.


@pytest.mark.slow
def test_ctrl_c_twice_aborts_with_130_and_resume_completes_the_run(ws: Path) -> None:
    judge = _gated_judge(ws, candidate_calls=4)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "1") as cli:
            # Every call the gate lets through answered first: on a loaded machine the candidate's calls
            # go out one by one, and a Ctrl-C before the fourth would leave fewer cached than the gate's.
            wait_for(lambda: len(judge.answered) >= present(judge.gate_after), "the gated calls", 60)
            wait_for(lambda: _running_candidate_with_progress(ws), "a running candidate with progress events")
            cli.proc.send_signal(signal.SIGINT)
            wait_for(lambda: cli.said("judgeloop: Ctrl-C: the run stops"), "the loop to see the Ctrl-C")
            # Every answered call is in the cache before the abort: a reply the server sent but the
            # client had not yet stored when it was killed is genuinely lost, and would be paid again.
            wait_for(
                lambda: _cache_rows(ws)[0] >= present(judge.gate_after), "the answered calls to be cached"
            )
            cli.proc.send_signal(signal.SIGINT)
            rc = cli.wait()
            _release(judge, abandon=True)  # held handlers now answer a dead socket, unrecorded
            assert rc == 130, "".join(cli.lines)
        assert cli.said("second Ctrl-C: aborting now")
        run, exps = latest(ws)
        assert run.status == "stopped" and run.stop_reason == "aborted by a second Ctrl-C"
        assert [e.status for e in exps] == ["baseline", "running"]  # the ledger says where it stopped

        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and "max-experiments 1" in (run.stop_reason or "")
    assert [e.seq for e in exps] == [0, 1] and exps[1].status in ("kept", "rolled_back")
    assert exps[1].cache_hits >= 4  # the calls answered before the abort were not paid again
    inc = next(e for e in reversed(exps) if e.status in ("baseline", "kept"))
    assert gitops.rev_parse(ws, run.branch) == inc.commit_sha
    assert_clean(ws)


# -- --hours -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_hours_stops_after_the_baseline(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    judge = FakeJudge(ws, delay_s=0.02)  # 32 items at concurrency 8: the baseline outlasts 0.036 s
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--hours", "0.00001", "--max-experiments", "5") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and "--hours" in (run.stop_reason or "")
    assert [e.status for e in exps] == ["baseline"]
    assert strategy.contexts == []  # the optimiser was never asked
    assert_clean(ws)


# -- --resume refusals -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_refuses_edits_outside_the_loops_files_and_resets_a_dirty_prompt(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        _stopped_run(ws, server)
        _, exps = latest(ws)
        outside = (
            ws / "prompts" / "judge.toml"
        )  # next to the prompts, but not the loop's to edit: a hard reset would lose it
        original = outside.read_text(encoding="utf-8")
        edited = original + "\n# a human's edit, not the loop's\n"
        outside.write_text(edited, encoding="utf-8")
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--resume") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and outside.relative_to(ws).as_posix() in err
        assert outside.read_text(encoding="utf-8") == edited  # refused, and nothing was reset
        run, _ = latest(ws)
        assert run.status == "stopped"

        outside.write_text(original, encoding="utf-8")
        # A crash between writing an allowed prompt file and committing it leaves only that file dirty.
        (ws / RUBRIC_MD).write_text("half-written candidate\n", encoding="utf-8")
        assert run_loop(ws, server.openai_base_url, "--resume", "--max-experiments", "1") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == gitops.read_file_at(
        ws, present(exps[1].commit_sha), RUBRIC_MD
    )
    assert "half-written candidate" not in present(
        gitops.read_file_at(ws, present(exps[1].commit_sha), RUBRIC_MD)
    )
    assert_clean(ws)


@pytest.mark.slow
def test_resume_keeps_the_runs_judge_and_refuses_another(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        _stopped_run(ws, server)
        for flags, named in (
            (["--provider", "anthropic"], "--provider 'anthropic'"),
            (["--model", "other-judge"], "--model 'other-judge'"),
        ):
            capsys.readouterr()
            assert main(["run", "-w", str(ws), "--resume", *flags]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and named in err and "start a new run" in err
        n_before = len(server.inference_requests())
        # No judge flags: the workspace's own judge ([judge] provider = "local") must not be used.
        assert main(["run", "-w", str(ws), "--resume", "--max-experiments", "1"]) == 0
        resumed = server.inference_requests()[n_before:]
    assert resumed and {r.model for r in resumed} == {"fake-judge"}
    run, exps = latest(ws)
    assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]


# -- replicates ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_replicates_are_pinned_per_run_across_resume(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        _stopped_run(ws, server, "--replicates", "3")
        baseline_calls = _trajectories_requested(judge, server.inference_requests())
        n_before = len(server.inference_requests())
        # judge.toml still says 1 replicate; the run's budgets JSON says 3.
        assert run_loop(ws, server.openai_base_url, "--resume", "--max-experiments", "1") == 0
        candidate_calls = _trajectories_requested(judge, server.inference_requests()[n_before:])
    assert len(baseline_calls) == 32 and set(baseline_calls.values()) == {3}
    run, exps = latest(ws)
    assert run.budgets["replicates"] == 3
    assert [e.status for e in exps] == ["baseline", "kept"]  # kept: evaluated in full, no early stop
    # 3 per item; the items the prompts disagree on are judged 2 more times under each (adaptive):
    # replicate indices 3 and 4, so 3 + 2 + 2 requests for those.
    rejudged = {item["trajectory_id"] for item in (exps[1].test or {})["items"] if item["rejudged"]}
    assert rejudged and len(candidate_calls) == 32
    assert {t: n for t, n in candidate_calls.items() if n != 3} == dict.fromkeys(rejudged, 7)
    assert all(
        item["candidate_total"] == item["incumbent_total"] == 5
        for item in (exps[1].test or {})["items"]
        if item["rejudged"]
    )
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        assert {len(v.replicates) for v in led.item_verdicts(exps[1].id)} == {3}


# -- spend across a crash --------------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_after_kill_9_counts_the_spend_before_it_against_the_budget(ws: Path) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(cfg.read_text(encoding="utf-8") + PRICES, encoding="utf-8")
    commit_all(ws, "prices")
    judge = _gated_judge(ws, candidate_calls=10)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--max-experiments", "2") as cli:
            wait_for(lambda: len(judge.answered) >= present(judge.gate_after), "the gated calls", 60)
            wait_for(lambda: _running_candidate_with_progress(ws), "a running candidate with progress events")
            wait_for(lambda: _cache_rows(ws)[0] == len(judge.answered), "the answered calls to be cached")
            cli.proc.send_signal(signal.SIGKILL)
            assert cli.wait() == -signal.SIGKILL
        answered = judge.gate_after
        _release(judge, abandon=True)
        calls_before, spent_before = _cache_rows(ws)
        assert calls_before == answered and spent_before > 0
        per_call = spent_before / calls_before
        answered_before = set(judge.answered)

        # Room for less than half a call beyond what was spent before the kill.
        budget = spent_before + per_call * 0.4
        n_before = len(server.inference_requests())
        assert run_loop(ws, server.openai_base_url, "--resume", "--budget-usd", f"{budget:.9f}") == 0
        resumed = [
            body_digest(r.body) for r in server.inference_requests()[n_before:] if isinstance(r.body, dict)
        ]
    calls_after, spent_after = _cache_rows(ws)
    assert spent_after <= budget + 1e-9, f"paid ${spent_after - spent_before:.6f} beyond the pre-kill spend"
    assert calls_after == calls_before and not resumed  # no paid call at all: none fits the budget
    assert not set(resumed) & answered_before
    run, exps = latest(ws)
    assert run.status == "finished" and "budget" in (run.stop_reason or "")
    assert not [e for e in exps if e.status == "running"]
    assert exps[1].status == "error" and "budget" in (exps[1].reason or "")
    # The ledger's spend is the money paid: the calls answered before the kill are on the candidate's row.
    assert sum(e.cost_usd for e in exps) == pytest.approx(spent_after)
    assert_clean(ws)


# -- one loop command per workspace; a stale git lock -----------------------------------------------


def test_a_second_loop_command_in_the_same_workspace_is_refused_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.workspace.workspace import Workspace, command_lock

    with command_lock(Workspace.open(ws), "run"):  # as if an overnight run were going on
        for argv in (
            ["run", "--strategy", "library"],
            ["run", "--resume"],
            ["decide", "1", "keep"],
            ["confirm", "--split", "sample"],
        ):
            assert main([argv[0], "-w", str(ws), *argv[1:]]) == 2
            err = capsys.readouterr().err
            assert (
                f"another judgeloop command is working in this workspace (judgeloop run, pid {os.getpid()})"
                in err
            )
            assert "Traceback" not in err
    assert not (ws / "experiments" / "ledger.sqlite").exists()  # nothing was started
    # Released with the holder: the next command takes it (and a killed holder releases it too: flock).
    with command_lock(Workspace.open(ws), "decide"):
        pass


@pytest.mark.slow
def test_a_stale_git_index_lock_left_by_a_kill_is_removed_and_a_fresh_one_respected(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = ws / ".git" / "index.lock"
    lock.write_text("")
    assert main(["run", "-w", str(ws), "--strategy", "library"]) == 2  # fresh: maybe a git command at work
    assert "index.lock exists: a git command is working" in capsys.readouterr().err
    old = time.time() - 60
    os.utime(lock, (old, old))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "1") == 0
    assert "removed a stale .git/index.lock" in capsys.readouterr().out
    assert not lock.exists()
    run, exps = latest(ws)
    assert run.status == "finished" and len(exps) == 2


@pytest.mark.slow
def test_a_run_killed_before_its_branch_existed_resumes_from_its_start(ws: Path) -> None:
    from optimizer.devset.split import open_split
    from optimizer.workspace.workspace import Workspace

    workspace = Workspace.open(ws)
    split = open_split(workspace, workspace.config.workspace.dev_split)
    with Ledger(workspace.ledger_path) as led:  # what `run` had recorded when it was killed
        run = led.create_run(
            RunSpec(
                strategy="library",
                policy="paired",
                split=split.name,
                split_fingerprint=split.fingerprint,
                start_rev=gitops.rev_parse(ws, "HEAD"),
                budgets={"max_experiments": 1, "replicates": 1},
            )
        )
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    resumed, exps = latest(ws)
    assert resumed.id == run.id and resumed.status == "finished" and len(exps) == 2
    assert gitops.rev_parse(ws, "HEAD") == gitops.rev_parse(ws, run.branch)
    with Ledger(workspace.ledger_path) as led:
        assert len(led.labels(run.id)) == len(split.ids)
    assert_clean(ws)
