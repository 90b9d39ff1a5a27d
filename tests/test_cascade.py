"""A cascade judge (issue 34): a lenient cheap judge first, a strict expensive one on the escalated items.

Two fake judges of known odds on one fake server (`tests.support.cascade`): the cascade's figures match the
odds within sampling error, the second judge is asked about exactly the escalated items (counted at the
server), both verdicts are kept, and the calibration scores a rule on a fold it was not chosen on."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from optimizer.answers.cascade import (
    FIRST_ALONE,
    SECOND_ALONE,
    StageResults,
    calibrate_results,
    candidate_rules,
    fold_figures,
)
from optimizer.cli import main
from optimizer.devset.labels import load_labels
from optimizer.errors import UserError
from optimizer.evaluation.cascade import escalated_items, panel_split
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.files import write_results
from optimizer.evaluation.results import EvalRun, ItemResult, ReplicateResult
from optimizer.judge.cascade import EscalationRule
from optimizer.judge.prompts import PromptSet
from optimizer.loop.records import item_verdicts
from optimizer.models import Label, Verdict
from optimizer.stats.metrics import Answer, bootstrap_intervals, score
from optimizer.structure import check_structure
from optimizer.workspace.workspace import Workspace
from tests.support.cascade import (
    CALL_USD,
    CHEAP,
    STRICT,
    TwoJudges,
    cascade_toml,
    expected_odds,
    write_cascade,
)
from tests.support.evaluation import SECRET, Data, judge, make_data
from tests.support.fakeserver import FakeLLMServer


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Data:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    data = make_data(tmp_path, n_pairs=30)  # 120 items: 60 positives, 60 negatives
    toml = data.ws.root / "prompts" / "judge.toml"
    toml.write_text(
        re.sub(r"(?m)^screenshots = .*$", 'screenshots = "none"', toml.read_text()), encoding="utf-8"
    )
    return data


def labels_of(data: Data) -> dict[str, Label]:
    return load_labels(data.split)


def run_cascade(data: Data, server: FakeLLMServer, **options: Any) -> EvalRun:
    ws = Workspace.open(data.ws.root)
    prompts = PromptSet.from_dir(ws.prompts_dir)
    first = judge(model=CHEAP, base_url=server.openai_base_url, max_retries=0, timeout_s=10)
    return asyncio.run(
        evaluate_items(
            ws,
            data.split,
            prompts,
            first,
            item_ids=data.split.ids,
            replicates=1,
            options=PassOptions(**options),
        )
    )


def within(observed: float, expected: float, n: int, what: str) -> None:
    """``observed`` (a rate over ``n`` items) is within 3.5 standard errors of ``expected``."""
    se = math.sqrt(max(expected * (1 - expected), 1e-9) / n)
    assert abs(observed - expected) <= 3.5 * se + 1e-9, (
        f"{what}: {observed:.3f} vs {expected:.3f} (se {se:.3f})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("correlated", [False, True], ids=["independent", "correlated"])
def test_a_cascade_matches_the_fakes_odds_and_asks_the_second_judge_exactly_the_escalated_items(
    data: Data, correlated: bool
) -> None:
    judges = TwoJudges.of_data(data, correlated=correlated)
    with FakeLLMServer(judges) as server:
        write_cascade(data.ws.root, server.openai_base_url)
        run = run_cascade(data, server)
    labels = labels_of(data)
    ids = data.split.ids
    up = {t for t in ids if judges.says_success(CHEAP, t)}
    # Counted at the server: the cheap judge on every item once, the strict one on exactly the escalated ones.
    assert sorted(judges.asked[CHEAP]) == sorted(ids)
    assert sorted(judges.asked[STRICT]) == sorted(up)
    # The final answer is the strict judge's where it was asked, else the cheap one's.
    for item in run.items:
        tid = item.trajectory_id
        assert item.answer.success == judges.says_success(STRICT if tid in up else CHEAP, tid)
    metrics = score(labels, run.answers())
    n_pos = sum(1 for lab in labels.values() if lab.is_positive)
    expected = expected_odds(judges, n_pos / len(ids))
    assert metrics.tpr is not None and metrics.fpr is not None and metrics.kappa is not None
    within(metrics.tpr, expected["tpr"], n_pos, "TPR")
    within(metrics.fpr, expected["fpr"], len(ids) - n_pos, "FPR")
    share = len(up) / len(ids)
    within(share, expected["share"], len(ids), "escalation share")
    # Cost per verdict: every item's cheap call plus a strict call per escalated item, exactly as billed.
    cost = run.usage.cost_usd / len(ids)
    assert cost == pytest.approx(CALL_USD[CHEAP] + share * CALL_USD[STRICT])
    se_cost = CALL_USD[STRICT] * math.sqrt(expected["share"] * (1 - expected["share"]) / len(ids))
    assert abs(cost - expected["cost"]) <= 3.5 * se_cost
    # Kappa: the odds' value lies inside the observed kappa's 99% interval.
    tpr, fpr, p = expected["tpr"], expected["fpr"], n_pos / len(ids)
    p_yes = p * tpr + (1 - p) * fpr
    p_agree = p * tpr + (1 - p) * (1 - fpr)
    p_chance = p * p_yes + (1 - p) * (1 - p_yes)
    kappa_odds = (p_agree - p_chance) / (1 - p_chance)
    low, high = bootstrap_intervals(labels, run.answers(), level=0.99)["kappa"]
    assert low <= kappa_odds <= high
    # The record: per-stage calls and cost, the escalation share.
    record = run.meta.cascade
    assert (
        record is not None
        and record["escalated"] == len(up)
        and record["stages"]["second"]["calls"] == len(up)
    )
    assert record["stages"]["first"]["cost_usd"] == pytest.approx(len(ids) * CALL_USD[CHEAP])


@pytest.mark.slow
def test_both_verdicts_are_kept_in_the_verdict_files_and_the_ledger_rows(data: Data, tmp_path: Path) -> None:
    judges = TwoJudges.of_data(data)
    with FakeLLMServer(judges) as server:
        write_cascade(data.ws.root, server.openai_base_url)
        run = run_cascade(data, server)
    out = write_results(tmp_path / "out", run)
    up = next(t for t in data.split.ids if judges.says_success(CHEAP, t))
    stay = next(t for t in data.split.ids if not judges.says_success(CHEAP, t))
    body = json.loads((out / f"{up}.json").read_text())
    assert body["cascade"]["escalated"] is True and body["cascade"]["final"] == "second"
    assert body["cascade"]["first"]["success"] is True and body["success"] == judges.says_success(STRICT, up)
    assert json.loads((out / f"{stay}.json").read_text())["cascade"]["escalated"] is False
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["cascade"]["rule"] == "success" and summary["cascade"]["second"]["model"] == STRICT
    rows = {row.trajectory_id: row for row in item_verdicts(run)}
    record = rows[up].replicates[0].cascade
    assert record is not None and record.first is not None and record.first["reasoning"] == CHEAP
    assert rows[up].replicates[0].reasoning == STRICT
    # A stage's cost is in the item's: the cheap call plus the strict one.
    assert rows[up].replicates[0].cost_usd == pytest.approx(CALL_USD[CHEAP] + CALL_USD[STRICT])


@pytest.mark.slow
def test_a_second_evaluation_is_served_from_the_cache_for_both_stages(data: Data) -> None:
    judges = TwoJudges.of_data(data)
    with FakeLLMServer(judges) as server:
        write_cascade(data.ws.root, server.openai_base_url)
        run_cascade(data, server)
        asked = {k: len(v) for k, v in judges.asked.items()}
        again = run_cascade(data, server)
    assert {k: len(v) for k, v in judges.asked.items()} == asked
    assert again.usage.calls == 0 and again.cache_hits == len(data.split.ids) + asked[STRICT]


@pytest.mark.slow
def test_calibration_reports_every_rule_on_a_fold_it_was_not_chosen_on(data: Data) -> None:
    """The rule is chosen on the tuning fold; the held-out fold's figures are computed on its own items, so
    where the judges behave differently on the two folds, the figures differ."""
    judges = TwoJudges.of_data(data)
    with FakeLLMServer(judges) as server:
        write_cascade(data.ws.root, server.openai_base_url)
        ws = Workspace.open(data.ws.root)
        prompts = PromptSet.from_dir(ws.prompts_dir)
        first = judge(model=CHEAP, base_url=server.openai_base_url, max_retries=0, timeout_s=10)
        every = ("success", "failure", "invalid")
        whole = judge(model=STRICT, base_url=server.openai_base_url, max_retries=0, timeout_s=10)
        run1 = asyncio.run(
            evaluate_items(ws, data.split, prompts, first, item_ids=data.split.ids, replicates=1)
        )
        toml = ws.prompts_dir / "judge.toml"
        toml.write_text(
            toml.read_text().replace('escalate = ["success"]', f"escalate = {json.dumps(list(every))}")
        )
        run2 = asyncio.run(
            evaluate_items(
                ws,
                data.split,
                PromptSet.from_dir(ws.prompts_dir),
                whole,
                item_ids=data.split.ids,
                replicates=1,
            )
        )
    results = StageResults(
        {i.trajectory_id: i for i in run1.items},
        {i.trajectory_id: i for i in run2.items},  # every item escalated: the strict judge's answers
    )
    ids = sorted(data.split.ids)
    folds = {0: ids[: len(ids) // 2], 1: ids[len(ids) // 2 :]}
    labels = labels_of(data)
    rows, chosen = calibrate_results(results, labels, folds, tune_fold=0)
    assert len(rows) == len(candidate_rules()) and [r.rule for r in rows if r.chosen] == [chosen]
    by_rule = {r.rule: r for r in rows}
    rule = EscalationRule(frozenset({"success"}))
    assert by_rule["success"].heldout == fold_figures(results, rule, labels, folds[1])
    assert by_rule["success"].tuning == fold_figures(results, rule, labels, folds[0])
    assert by_rule["success"].heldout != by_rule["success"].tuning
    # The held-out row of the first judge alone is the first judge's score on fold 1 only.
    alone = score({t: labels[t] for t in folds[1]}, {t: results.first[t].answer for t in folds[1]})
    assert by_rule["first alone"].heldout.kappa == alone.kappa and by_rule["first alone"].heldout.share == 0
    assert by_rule["second alone"].heldout.share == 1
    assert SECOND_ALONE.on == frozenset(every) and FIRST_ALONE.on == frozenset()


@pytest.mark.slow
def test_cascade_calibrate_runs_from_the_command_line(data: Data, capsys: pytest.CaptureFixture[str]) -> None:
    judges = TwoJudges.of_data(data)
    with FakeLLMServer(judges) as server:
        write_cascade(data.ws.root, server.openai_base_url)
        cfg = data.ws.root / "judgeloop.toml"
        cfg.write_text(
            re.sub(r'(?m)^#? ?dev_split = "[^"]*".*$', 'dev_split = "tiny"', cfg.read_text(), count=1)
        )
        code = main(
            ["cascade", "calibrate", "-w", str(data.ws.root), "--json", "--provider", "openai", "--model", CHEAP,
             "--base-url", server.openai_base_url]
        )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "tiny" and out["tune_fold"] == 0 and out["heldout_fold"] == 1
    assert sum(1 for r in out["rules"] if r["chosen"]) == 1
    row = next(r for r in out["rules"] if r["rule"] == "success")
    assert 0 < row["heldout"]["share"] < 1 and len(row["heldout"]["kappa_ci"]) == 2
    # Both judges judged every item once; the cheap judge's calls are the cascade's own cache entries.
    assert sorted(judges.asked[CHEAP]) == sorted(data.split.ids) == sorted(judges.asked[STRICT])


# --------------------------------------------------------------------------- refusals and hostile input


def test_the_second_judges_prompt_folder_cannot_leave_prompts(data: Data) -> None:
    toml = data.ws.root / "prompts" / "judge.toml"
    base = toml.read_text()
    for folder in ("../devset", "/etc", "second/../../x", ".."):
        toml.write_text(
            base + cascade_toml("http://127.0.0.1:9/v1").replace("max_retries = 0", f'prompts = "{folder}"')
        )
        with pytest.raises(UserError, match="not a folder name under prompts/"):
            PromptSet.from_dir(data.ws.root / "prompts")


def test_a_linked_second_prompt_folder_is_refused(data: Data, tmp_path: Path) -> None:
    write_cascade(data.ws.root, "http://127.0.0.1:9/v1")
    second = data.ws.root / "prompts" / "second"
    elsewhere = tmp_path / "elsewhere"
    second.rename(elsewhere)
    second.symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        PromptSet.from_dir(data.ws.root / "prompts")


def test_a_cascade_without_its_table_or_files_is_refused_in_one_line(data: Data) -> None:
    toml = data.ws.root / "prompts" / "judge.toml"
    base = toml.read_text()
    toml.write_text(base + '\nstructure = "cascade"\n')
    with pytest.raises(UserError, match=r"needs a \[cascade\] table"):
        PromptSet.from_dir(data.ws.root / "prompts")
    toml.write_text(base + cascade_toml("http://127.0.0.1:9/v1"))
    with pytest.raises(UserError, match=r"second/judge\.md is missing"):
        PromptSet.from_dir(data.ws.root / "prompts")


def test_batch_refuses_a_second_judge_without_a_batch_api(data: Data) -> None:
    from optimizer.evaluation.batch import BatchOptions

    with FakeLLMServer(TwoJudges.of_data(data)) as server:
        write_cascade(data.ws.root, server.openai_base_url)
        toml = data.ws.root / "prompts" / "judge.toml"
        text = toml.read_text().replace("[cascade.second]\n", '[cascade.second]\nmode = "agentic"\n')
        toml.write_text(text)
        with pytest.raises(UserError, match="--batch: the cascade's second judge"):
            run_cascade(data, server, batch=BatchOptions())
        assert server.inference_requests() == []  # refused before any call is paid for


def test_structure_moves_may_switch_to_a_cascade_and_change_its_rule_but_not_its_second_judge() -> None:
    base = cascade_toml("http://127.0.0.1:9/v1", structure="single")
    moves = ["structure", "cascade.escalate", "cascade.confidence_below"]
    to_cascade = base.replace('structure = "single"', 'structure = "cascade"')
    assert check_structure("prompts/judge.toml", base, to_cascade, moves, 3) is None
    rule = base.replace('escalate = ["success"]', 'escalate = ["success", "low_confidence"]')
    assert check_structure("prompts/judge.toml", base, rule, moves, 3) is None
    bad = base.replace('escalate = ["success"]', 'escalate = ["success", "success"]')
    assert "must be a list of distinct" in str(check_structure("prompts/judge.toml", base, bad, moves, 3))
    other = base.replace(f'model = "{STRICT}"', 'model = "other"')
    assert "cascade.second.model is not a movable key" in str(
        check_structure("prompts/judge.toml", base, other, moves, 3)
    )


def _rep(index: int, success: bool | None, members: tuple[bool | None, ...] = ()) -> ReplicateResult:
    def verdict(ok: bool | None) -> Verdict | None:
        return None if ok is None else Verdict(success=ok, confidence="high")

    return ReplicateResult(
        index=index,
        cache_key=f"k{index}",
        cached=False,
        reply_text=None,
        verdict=verdict(success),
        parse_error=None,
        model=CHEAP,
        members=tuple(_rep(index, m) for m in members),
    )


def _item(tid: str, reps: list[ReplicateResult]) -> ItemResult:
    return ItemResult(
        trajectory_id=tid,
        replicates=reps,
        answer=Answer(success=False),
        unstable=False,
        infra_error=False,
        verdict=Verdict(success=False, confidence="high"),
    )


def test_low_confidence_escalates_a_panels_split_whatever_the_votes_confidence() -> None:
    """A first judge that is a panel: an item whose members did not all agree in some replicate goes on
    under "low_confidence" even when the item's verdict is a confident failure; a unanimous panel and a
    single judge do not; a member whose reply did not parse is a different answer."""
    run = EvalRun(
        items=[
            _item("split", [_rep(0, False, (False, False, False)), _rep(1, False, (True, False, False))]),
            _item("unanimous", [_rep(0, False, (False, False, False))]),
            _item("unparsed", [_rep(0, False, (False, None, False))]),
            _item("single", [_rep(0, False)]),
        ]
    )
    low = EscalationRule(frozenset({"low_confidence"}))
    assert [panel_split(item) for item in run.items] == [True, False, True, False]
    assert escalated_items(run, low) == ["split", "unparsed"]
    # Without "low_confidence" a split is no reason; "failure" sends every failure on anyway.
    assert escalated_items(run, EscalationRule(frozenset({"success"}))) == []
    assert len(escalated_items(run, EscalationRule(frozenset({"failure"})))) == 4
    assert low.escalates(True, "high", split=True) and not low.escalates(True, "high")
