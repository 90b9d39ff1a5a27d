"""The loop's engine API, called directly as the TUI or another program would: typed options in,
typed outcomes and events out, nothing printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.events import Event, Message, Progress, StopKind, said_lines
from optimizer.ledger import Ledger
from optimizer.loop.decide import decide
from optimizer.loop.session import RunOptions, resume_run, start_run
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge


def options(server: FakeLLMServer, **update: object) -> RunOptions:
    judge = JudgeOverrides(
        provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
    )
    return RunOptions(strategy="library", judge=judge, **update)  # type: ignore[arg-type]


@pytest.mark.slow
def test_start_run_reports_through_events_and_returns_a_typed_stop(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events: list[Event] = []
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        outcome = start_run(Workspace.open(ws), options(server, max_experiments=2), events.append)
    assert capsys.readouterr() == ("", "")  # the engine never prints
    assert outcome.status == "finished" and not outcome.aborted
    assert (
        outcome.stop.kind is StopKind.MAX_EXPERIMENTS
        and outcome.stop.message == "reached --max-experiments 2"
    )
    said = said_lines(events)
    assert said[0].startswith(f"run {outcome.run_id}: branch judgeloop/{outcome.run_id}")
    assert f"run {outcome.run_id} finished: reached --max-experiments 2" in said
    progress = [e.snapshot for e in events if isinstance(e, Progress)]
    assert any(s.done == s.total == 32 for s in progress)  # the baseline's last snapshot is always sent
    with Ledger.open_readonly(ws / "experiments" / "ledger.sqlite") as ledger:
        run = ledger.get_run(outcome.run_id)
    assert run.status == "finished" and run.stop_reason == outcome.stop.message


@pytest.mark.slow
def test_propose_only_waits_then_decide_and_resume(ws: Path) -> None:
    workspace = Workspace.open(ws)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        first = start_run(workspace, options(server, propose_only=True))
        assert first.status == "waiting" and first.stop.kind is StopKind.WAITING
        with Ledger.open_readonly(ws / "experiments" / "ledger.sqlite") as ledger:
            (waiting,) = ledger.experiments_with_status("waiting")
        said: list[Event] = []
        assert decide(workspace, waiting.id, keep=False, events=said.append) == waiting.id
        assert (
            Message(f"experiment {waiting.id} discarded; kept under refs/judgeloop/rejected/{waiting.id}")
            in said
        )
        again = resume_run(workspace, options(server, propose_only=True))
    assert again.run_id == first.run_id and again.stop.kind in (StopKind.WAITING, StopKind.PROPOSED)


@pytest.mark.slow
def test_every_call_the_judge_answered_is_on_the_ledger_even_when_candidates_stop_early(ws: Path) -> None:
    # Slow answers and 8 call slots: when a candidate's outcome becomes certain, calls are in flight.
    # The provider bills them, so they must reach the cache and the experiment's calls and cost.
    judge = FakeJudge(ws, delay_s=0.05)
    with FakeLLMServer(default=judge) as server:
        outcome = start_run(Workspace.open(ws), options(server, max_experiments=3))
        answered = len(judge.answered)
        requests = len(server.inference_requests())
    with Ledger.open_readonly(ws / "experiments" / "ledger.sqlite") as ledger:
        exps = ledger.experiments(outcome.run_id)
    assert any(e.early_stopped for e in exps), "no candidate stopped early: the test proves nothing"
    assert answered == requests == sum(e.calls for e in exps)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_experiments": 0},
        {"patience": 0},
        {"budget_usd": -5.0},
        {"budget_usd": float("nan")},
        {"hours": 0.0},
        {"replicates": 16},
    ],
)
def test_run_options_refuse_values_the_cli_refuses(bad: dict[str, object]) -> None:
    from optimizer.errors import UserError

    with pytest.raises(UserError, match=next(iter(bad))):
        RunOptions(strategy="library", **bad)  # type: ignore[arg-type]
