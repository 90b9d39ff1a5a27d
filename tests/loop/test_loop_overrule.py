"""A person's overrule is never silent (issue 36 point 7): `judgeloop decide N keep` against the policy's
roll back asks on a terminal or needs --force, and `history` and `report` mark the row "kept (overruled)".

Same fixtures as tests/loop/test_loop_resume.py: an ``init --sample`` workspace, a deterministic fake judge.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.workspace import gitops
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, FakeJudge, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest, toggle


def _waiting_against_the_policy(ws: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A propose-only candidate that raises FPR: the policy rolls it back; it waits for a person."""
    install(monkeypatch, ScriptedStrategy([toggle(BAD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--propose-only") == 0
    _, exps = latest(ws)
    waiting = exps[-1]
    assert waiting.status == "waiting" and waiting.policy_keep is False
    return waiting.id


@pytest.mark.slow
def test_decide_keep_against_the_policy_needs_force_off_a_terminal_and_history_marks_it_overruled(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exp_id = _waiting_against_the_policy(ws, monkeypatch)
    run, _ = latest(ws)
    tip = gitops.rev_parse(ws, run.branch)
    capsys.readouterr()
    # No terminal (pytest's stdin), no --force: one line, exit 2, nothing decided.
    assert main(["decide", "-w", str(ws), str(exp_id), "keep"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert "--force" in err and "policy rolls experiment" in err
    _, exps = latest(ws)
    assert exps[-1].status == "waiting" and gitops.rev_parse(ws, run.branch) == tip

    assert main(["decide", "-w", str(ws), str(exp_id), "keep", "--force"]) == 0
    _, exps = latest(ws)
    assert exps[-1].status == "kept" and exps[-1].overrule is not None
    capsys.readouterr()
    assert main(["history", "-w", str(ws)]) == 0
    row = next(
        line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith(f"{exp_id} ")
    )
    assert "kept (overruled)" in row
    assert main(["report", "-w", str(ws)]) == 0
    assert f"#{exp_id} (scripted) KEPT (OVERRULED)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(("answer", "kept"), [("n", False), ("y", True)])
def test_decide_keep_against_the_policy_asks_on_a_terminal(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answer: str, kept: bool
) -> None:
    exp_id = _waiting_against_the_policy(ws, monkeypatch)
    asked: list[str] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return answer

    monkeypatch.setattr("builtins.input", ask)
    assert main(["decide", "-w", str(ws), str(exp_id), "keep"]) == (0 if kept else 2)
    assert len(asked) == 1 and "overrules the policy" in asked[0]
    _, exps = latest(ws)
    assert exps[-1].status == ("kept" if kept else "waiting")
