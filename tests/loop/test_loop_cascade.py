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
from tests.support.loop import (
    add_small_dev_split,
    commit_all,
    labels_of,
    make_workspace,
    report_json,
    run_loop,
)
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_strategy_proposes_a_cascade_through_the_guard_and_the_policy_decides_it(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single cheap judge with a [cascade] table on the shelf (structure = "single"): the strategy's move to
    structure = "cascade" passes the guard, is judged by both stages (the strict judge asked about exactly
    the cheap judge's successes) and decided by the policy; its move to another second judge is refused by
    the guard before any call."""
    cfg = ws / "judgeloop.toml"
    text = re.sub(
        r"(?m)^\[optimizer\]\n",
        '[optimizer]\nstructure_moves = ["structure", "cascade.escalate"]\n',
        cfg.read_text(encoding="utf-8"),
        count=1,
    )
    cfg.write_text(text, encoding="utf-8")
    judges = TwoJudges.of_workspace(ws, correlated=True)

    def to_cascade(ctx: ProposalContext) -> Proposal:
        text = set_key(ctx.current_files[JUDGE_TOML], "structure", "cascade")
        return Proposal(files={JUDGE_TOML: text}, rationale="a cascade: the strict judge on the successes")

    def other_second(ctx: ProposalContext) -> Proposal:
        text = ctx.current_files[JUDGE_TOML].replace(f'model = "{STRICT}"', 'model = "another-judge"')
        return Proposal(files={JUDGE_TOML: text}, rationale="another second judge")

    with FakeLLMServer(default=judges) as server:
        write_cascade(ws, server.openai_base_url, ("success",), cheap="fake-judge")
        toml = ws / JUDGE_TOML
        toml.write_text(set_key(toml.read_text(encoding="utf-8"), "structure", "single"), encoding="utf-8")
        commit_all(ws, "a single judge with a cascade on the shelf")
        install(monkeypatch, ScriptedStrategy([to_cascade, other_second], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2", "--patience", "9") == 0
    _run, exps = latest(ws)
    base, cascade, refused = exps
    assert base.calls > 0 and cascade.files_changed == [JUDGE_TOML] and cascade.calls > 0
    # The policy decided it (kept or rolled back, with its reason), like any candidate.
    assert cascade.status in ("kept", "rolled_back") and cascade.reason
    successes = {t for t in labels_of(ws) if judges.says_success(CHEAP, t)}
    rows = ledger_of(ws).item_verdicts(cascade.id)
    records = {row.trajectory_id: rep.cascade for row in rows for rep in row.replicates}
    assert records and all(r is not None and r.rule == "success" for r in records.values())
    # Escalated exactly where the cheap judge said success; the strict judge asked about nothing else (the
    # policy may stop a candidate early: the items it judged are the ledger's).
    assert {t for t, r in records.items() if r is not None and r.escalated} == successes & set(records)
    assert set(records) & successes <= set(judges.asked[STRICT]) <= successes
    assert (refused.status, refused.calls) == ("guard_rejected", 0)
    assert refused.reason is not None and "cascade.second.model is not a movable key" in refused.reason
