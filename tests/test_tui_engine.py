"""The TUI calls the engine in process where no long run is involved (keep/discard a waiting
candidate); only long runs are detached processes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from optimizer.ledger import Ledger
from tests.support.tui_runs import RealRun, make_real_run
from tui import runs


@pytest.fixture
def waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int]:
    ws = tmp_path / "ws"
    monkeypatch.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
    assert (
        make_real_run(
            ws, RealRun(max_experiments=1, replicates=1, items=8, screenshots="none", propose_only=True)
        )
        == 0
    )
    with Ledger.open_readonly(ws / "experiments" / "ledger.sqlite") as ledger:
        (candidate,) = ledger.experiments_with_status("waiting")
    return ws, candidate.id


def no_subprocess(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"the TUI started a process to decide: {args[0] if args else kwargs}")


@pytest.mark.slow
def test_decide_runs_the_engine_in_process(
    waiting: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, exp_id = waiting
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    result = runs.decide(ws, exp_id, "discard")
    assert result.returncode == 0, result.output
    assert f"experiment {exp_id} discarded; kept under refs/judgeloop/rejected/{exp_id}" in result.output
    with Ledger.open_readonly(ws / "experiments" / "ledger.sqlite") as ledger:
        assert ledger.get_experiment(exp_id).status == "rolled_back"


@pytest.mark.slow
def test_decide_refusal_is_the_commands_one_line_error(waiting: tuple[Path, int]) -> None:
    ws, exp_id = waiting
    assert runs.decide(ws, exp_id, "keep").returncode == 0
    again = runs.decide(ws, exp_id, "keep")  # no longer waiting
    assert again.returncode == 2
    assert again.output == f"judgeloop: error: experiment {exp_id} is kept, not waiting for a decision"
