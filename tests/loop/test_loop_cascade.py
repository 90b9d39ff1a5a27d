"""A cascade through the real loop (issue 34): a rule that escalates fewer items is kept by the
cheaper-not-worse track against the strict judge on every item, and a rule that raises FPR is rolled back.

The incumbent escalates every item (the strict, expensive judge decides all of them, after the cheap one);
the fakes' errors are correlated (the strict judge errs only where the cheap one does, `tests.support.cascade`),
so escalating only the cheap judge's successes changes no answer and saves about a third of the bill."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from optimizer.judge.prompts import JUDGE_TOML
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.structure import set_key
from tests.support.cascade import CALL_USD, CHEAP, STRICT, TwoJudges, write_cascade
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import add_small_dev_split, commit_all, make_workspace, report_json, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_workspace(tmp_path_factory.mktemp("template"))
    add_small_dev_split(root)
    return root


def escalate(*on: str) -> Callable[[ProposalContext], Proposal]:
    def step(ctx: ProposalContext) -> Proposal:
        text = set_key(ctx.current_files[JUDGE_TOML], "cascade.escalate", list(on))
        return Proposal(files={JUDGE_TOML: text}, rationale=f"escalate {', '.join(on)}")

    return step


def test_a_cheaper_rule_is_kept_as_cheaper_and_an_fpr_raising_rule_is_rolled_back(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = ws / "judgeloop.toml"
    text = cfg.read_text(encoding="utf-8")
    text = re.sub(
        r"(?m)^\[loop\]\n", "[loop]\ncheaper_margin_items = 1\ncheaper_min_saving = 0.2\n", text, count=1
    )
    text = re.sub(
        r"(?m)^\[optimizer\]\n", '[optimizer]\nstructure_moves = ["cascade.escalate"]\n', text, count=1
    )
    cfg.write_text(text, encoding="utf-8")
    judges = TwoJudges.of_workspace(ws, correlated=True)
    with FakeLLMServer(default=judges) as server:
        write_cascade(ws, server.openai_base_url, ("success", "failure", "invalid"), cheap="fake-judge")
        commit_all(ws, "a cascade whose strict judge decides every item")
        install(monkeypatch, ScriptedStrategy([escalate("failure"), escalate("success")], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    _run, exps = latest(ws)
    base, fpr_up, cheaper = exps
    assert fpr_up.status == "rolled_back" and fpr_up.reason is not None and "FPR" in fpr_up.reason
    assert (cheaper.status, cheaper.keep_kind) == ("kept", "cheaper"), cheaper.reason
    assert cheaper.reason is not None and "kept as cheaper, not worse" in cheaper.reason
    assert cheaper.verdict_cost_usd is not None and base.verdict_cost_usd is not None
    assert cheaper.verdict_cost_usd < 0.8 * base.verdict_cost_usd
    # The kept rule's verdicts: the strict judge's on the escalated items, each with the first verdict kept.
    rows = ledger_of(ws).item_verdicts(cheaper.id)
    records = [rep.cascade for row in rows for rep in row.replicates]
    assert records and all(r is not None and r.rule == "success" for r in records)
    up = [r for r in records if r is not None and r.escalated]
    assert up and all(r.first is not None and r.first["success"] is True for r in up)
    assert judges.asked.get(STRICT)
    # The report: the escalation share and each stage's cost per verdict, as made.
    entries = {e["id"]: e for e in report_json(ws, capsys)["experiments"]}
    cascade = entries[cheaper.id]["cascade"]
    assert cascade["escalated"] == len(up) and cascade["escalation_share"] == len(up) / len(records)
    assert cascade["second_per_verdict_usd"] == pytest.approx(len(up) * CALL_USD[STRICT] / len(records))
    assert cascade["first_per_verdict_usd"] == pytest.approx(CALL_USD[CHEAP])
    assert entries[base.id]["cascade"]["escalation_share"] == 1
