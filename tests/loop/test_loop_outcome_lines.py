"""What `judgeloop run` says a candidate came to, through the real CLI: a --propose-only candidate has
one outcome (it waits for `judgeloop decide`), never "rolled back" or "nothing kept"; an early-stopped
candidate's reason puts what was observed first and the report marks its p-value as a bound."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optimizer.cli import main
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, FakeJudge, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest, toggle

# "rolled back" as an outcome of this candidate; the policy's note on another policy ("the paired policy
# would have rolled back it") is advice about advice, not an outcome.
ROLLED_BACK = re.compile(r"(?<!would have )rolled back")


@pytest.mark.slow
def test_propose_only_says_once_that_the_candidate_waits_and_never_that_it_was_rolled_back(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(BAD_ENTRY)]))  # FPR rises: the policy would roll it back
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--propose-only") == 0
    out = capsys.readouterr().out.splitlines()
    run, exps = latest(ws)
    waiting = exps[1]
    assert run.status == "waiting" and waiting.status == "waiting"
    decide_lines = [line for line in out if "judgeloop decide" in line]
    assert decide_lines == [
        f"run {run.id} waiting: experiment {waiting.id} waits for your decision: "
        f"`judgeloop decide {waiting.id} keep|discard`; spent $0.0000"
    ], out
    assert not [line for line in out if ROLLED_BACK.search(line) or "nothing kept" in line], out
    # The policy's view is given as advice, before the evidence.
    advice = [
        line for line in out if line.startswith(f"  experiment {waiting.id}: evaluated; the adaptive policy ")
    ]
    assert len(advice) == 1 and "policy would roll it back (" in advice[0], out


@pytest.mark.slow
def test_an_early_stopped_candidate_reads_observed_first_and_its_p_value_as_a_bound(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(BAD_ENTRY)]))  # false positives: the FPR bound fires
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--policy", "paired", "--max-experiments", "1") == 0
    run, exps = latest(ws)
    cand = exps[1]
    assert cand.status == "rolled_back" and cand.early_stopped, cand.reason
    m = re.match(r"stopped early after (\d+)/32 items: ", cand.reason or "")
    assert m and int(m.group(1)) == cand.items_evaluated < 32, cand.reason
    capsys.readouterr()
    assert main(["report", "-w", str(ws), "--run", run.id]) == 0
    report = capsys.readouterr().out
    assert f"McNemar p ≥ {cand.p_value:.3f} (a bound: stopped early)" in report
    assert main(["history", "-w", str(ws), "--run", run.id]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == [str(cand.id)])
    assert f"≥{cand.p_value:.3f}" in row
    tsv = (ws / "experiments" / "runs" / run.id / "experiments.tsv").read_text(encoding="utf-8").splitlines()
    header = tsv[0].split("\t")
    cells = dict(
        zip(header, next(r for r in tsv[1:] if r.split("\t")[0] == str(cand.id)).split("\t"), strict=True)
    )
    assert cells["early_stopped"] == "1" and cells["reason"] == cand.reason
