"""`judgeloop plan`: what a budget buys, from the estimator before any run and from the ledger after
one; and `run`'s one-line warning when a budget cannot cover one candidate. Through the real CLI."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.judge.cascade import EscalationRule
from optimizer.judge.criteria import (
    ESTIMATE_CRITERIA,
    check_instructions,
    derive_request,
    review_instructions,
)
from optimizer.judge.estimate import request_input_tokens, request_token_split
from optimizer.judge.prompts import JUDGE_TOML, PromptSet
from optimizer.judge.providers.pricing import price_for
from optimizer.judge.render import RenderOptions, build_request
from optimizer.ledger import Ledger
from optimizer.structure import set_key
from optimizer.workspace.workspace import Workspace
from tests.support.cascade import STRICT, write_cascade
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, add_small_dev_split, labels_of, make_workspace, run_loop

PRICES = """
[prices."fake-judge"]
input = 2.0
output = 8.0

[prices."other-judge"]
input = 1.0
output = 1.0
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_workspace(tmp_path_factory.mktemp("plan"), toml_extra=PRICES)
    add_small_dev_split(root)
    return root


def _plan(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["plan", "-w", str(root), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_before_any_run_the_plan_is_the_estimators(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(ws, capsys, "--budget-usd", "20", "--provider", "openai", "--model", "gpt-5", "--hours", "2")
    # Independently: gpt-5 at $1.25 in, $0.125 cached, $10 out per M; no write surcharge on OpenAI.
    workspace = Workspace.open(ws)
    split = open_split(workspace, "small")
    prompts = PromptSet.from_dir(workspace.prompts_dir)
    out = prompts.settings.max_tokens * 10.0
    cold = warm = 0.0
    for tid in split.ids:
        request = build_request(split.trajectory(tid), split, prompts)
        prefix, rest = request_token_split(request)
        assert prefix + rest == request_input_tokens(request)
        cold += (request_input_tokens(request) * 1.25 + out) / 1e6
        warm += (prefix * 0.125 + rest * 1.25 + out) / 1e6
    assert plan["source"] == "estimate" and plan["items"] == len(split.ids) == 32
    assert plan["first_pass_cold_usd"] == pytest.approx(cold) and plan[
        "first_pass_warm_usd"
    ] == pytest.approx(warm)
    assert warm < cold
    assert plan["policy"] == "adaptive" and plan["rejudge_share"] == pytest.approx(0.48)
    assert plan["cost_per_candidate_usd"] == pytest.approx(warm * 1.48)
    assert plan["candidates"] == math.floor((20 - cold) / (warm * 1.48))
    # No run yet: no measured latency, so the hours buy no stated number.
    assert plan["candidates_in_hours"] is None
    paired = _plan(
        ws,
        capsys,
        "--budget-usd",
        "20",
        "--provider",
        "openai",
        "--model",
        "gpt-5",
        "--policy",
        "paired",
        "--replicates",
        "3",
    )
    assert paired["rejudge_share"] == 0 and paired["first_pass_cold_usd"] == pytest.approx(3 * cold)


def test_the_cpu_judges_plan_says_what_a_pass_and_a_candidate_take(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The local CPU judge costs nothing, so before any run `plan` states its time instead: the text-only,
    instructions-first requests' tokens at the measured throughput (the shared instructions read once a
    pass, each call its own text and a typical verdict). Computed here from the rendered requests."""
    plan = _plan(ws, capsys, "--budget-usd", "1", "--provider", "local", "--hours", "1", "--policy", "paired")
    workspace = Workspace.open(ws)
    split = open_split(workspace, "small")
    prompts = PromptSet.from_dir(workspace.prompts_dir)
    options = RenderOptions(text_only=True, layout="rubric-first")
    requests = [build_request(split.trajectory(t), split, prompts, options) for t in split.ids]
    texts = [r.system + "".join(getattr(p, "text", "") for p in r.parts) for r in requests]
    shared = math.ceil(len(os.path.commonprefix(texts)) / 4)  # noqa: RUF071 - characters, not paths
    assert 0 < shared < min(request_input_tokens(r) for r in requests)  # the instructions, shared
    own = sum(request_input_tokens(r) - shared for r in requests)
    idle = shared / 170 + own / 170 + len(requests) * 80 / 63
    assert plan["candidates"] is None and plan["seconds_source"] == "estimated, both cores idle"
    assert plan["seconds_per_candidate"] == pytest.approx(idle)  # paired: one pass, no re-judging
    assert plan["candidates_in_hours"] == math.floor(3600 / idle)
    cpu = next(n for n in plan["notes"] if n.startswith("CPU judge:"))
    assert f"{idle / 60:.1f} min a candidate" in cpu and "with one busy" in cpu
    assert "(estimated, both cores idle)" in "\n".join(
        _lines(ws, capsys, "--provider", "local", "--hours", "1")
    )


def _lines(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["plan", "-w", str(root), "--budget-usd", "1", *args]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_after_a_run_the_plan_uses_the_ledgers_figures_for_the_same_judge(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "2") == 0
        with Ledger.open_readonly(Workspace.open(ws).ledger_path) as ledger:
            run = ledger.runs()[-1]
            decided = [e for e in ledger.experiments(run.id) if e.seq >= 1 and e.decision is not None]
        # A candidate answered wholly from the judge-call cache (a repeated prompt) paid nothing: not a figure.
        decided = [e for e in decided if e.calls > 0]
        assert decided
        plan = _plan(
            ws,
            capsys,
            "--budget-usd",
            "5",
            "--hours",
            "1",
            "--provider",
            "openai",
            "--model",
            "fake-judge",
            "--base-url",
            server.openai_base_url,
        )
        other = _plan(
            ws,
            capsys,
            "--budget-usd",
            "5",
            "--provider",
            "openai",
            "--model",
            "other-judge",
            "--base-url",
            server.openai_base_url,
        )
    mean_cost = sum(e.judge_cost_usd for e in decided) / len(decided)
    mean_seconds = sum(e.duration_s or 0.0 for e in decided) / len(decided)
    assert plan["source"] == "ledger" and plan["measured_candidates"] == len(decided)
    assert plan["cost_per_candidate_usd"] == pytest.approx(mean_cost)
    assert plan["calls_per_candidate"] == pytest.approx(sum(e.calls for e in decided) / len(decided))
    assert plan["candidates"] == max(0, math.floor((5 - plan["baseline_usd"]) / mean_cost))
    assert plan["seconds_per_candidate"] == pytest.approx(mean_seconds)
    assert plan["candidates_in_hours"] == math.floor(3600 / mean_seconds)
    # Another model's plan does not borrow this judge's figures.
    assert other["source"] == "estimate" and other["measured_candidates"] == 0


def test_run_warns_in_one_line_before_starting_when_the_budget_cannot_buy_a_candidate(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")  # the run then stops at its key check, after the warning
    capsys.readouterr()
    main(["run", "-w", str(ws), "--provider", "openai", "--model", "gpt-5", "--budget-usd", "0.01"])
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if "cannot cover one candidate" in line]
    assert len(warnings) == 1 and "$0.01" in warnings[0] and "judgeloop plan" in warnings[0]
    main(["run", "-w", str(ws), "--provider", "openai", "--model", "gpt-5", "--budget-usd", "500"])
    assert "cannot cover" not in capsys.readouterr().err


def test_plan_refusals_are_one_line(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert (
        main(["plan", "-w", str(ws), "--budget-usd", "5", "--provider", "openai", "--model", "unpriced-x"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no price is known for model 'unpriced-x'" in err
    assert main(["plan", "-w", str(ws), "--budget-usd", "0"]) == 2
    assert main(["plan", "-w", str(ws)]) == 2  # --budget-usd is required
    assert main(["plan", "-w", str(ws), "--budget-usd", "5", "--split", "nope"]) == 2
    # A free judge (the local demo): the budget does not bound the run, and the text says so.
    capsys.readouterr()
    assert main(["plan", "-w", str(ws), "--budget-usd", "5"]) == 0
    assert "no limit (this judge costs nothing)" in capsys.readouterr().out


def _structured(root: Path, **keys: object) -> None:
    toml = root / JUDGE_TOML
    text = toml.read_text(encoding="utf-8")
    for key, value in keys.items():
        text = set_key(text, key, value)
    toml.write_text(text, encoding="utf-8")


def test_plan_counts_the_calls_of_criteria_and_review(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        "--budget-usd",
        "20",
        "--provider",
        "openai",
        "--model",
        "gpt-5",
        "--policy",
        "paired",
        "--replicates",
        "2",
    )
    workspace = Workspace.open(ws)
    split = open_split(workspace, "small")
    n = len(split.ids)
    single = _plan(ws, capsys, *args)
    assert single["calls_per_candidate"] == 2 * n
    _structured(ws, structure="criteria")
    criteria = _plan(ws, capsys, *args)
    # One derivation per item (from the instruction alone) and one check per replicate.
    assert criteria["calls_per_candidate"] == n * (2 + 1)
    prompts = PromptSet.from_dir(workspace.prompts_dir)
    out = prompts.settings.max_tokens * 10.0

    def warm(request: Any) -> float:
        prefix, rest = request_token_split(request)
        return (prefix * 0.125 + rest * 1.25 + out) / 1e6

    expected = 0.0
    for tid in split.ids:
        traj = split.trajectory(tid)
        expected += warm(derive_request(prompts, traj.task.instruction))
        expected += 2 * warm(
            build_request(
                traj,
                split,
                prompts,
                options=RenderOptions(extra_instructions=check_instructions(ESTIMATE_CRITERIA)),
            )
        )
    assert criteria["first_pass_warm_usd"] == pytest.approx(expected)
    assert any('structure = "criteria": 1 derivation per item' in note for note in criteria["notes"])

    # review = "success" with no ledger: the split's positive share, said as an assumption.
    _structured(ws, structure="single", review="success")
    reviewed = _plan(ws, capsys, *args)
    labels = labels_of(ws)
    share = sum(1 for t in split.ids if labels[t].is_positive) / n
    assert reviewed["calls_per_candidate"] == pytest.approx(2 * n * (1 + share))
    assert any(
        f"a review call on {share:.0%} of verdicts (assumed: the split's positive share" in note
        for note in reviewed["notes"]
    )
    assert reviewed["first_pass_warm_usd"] > single["first_pass_warm_usd"]


@pytest.mark.slow
def test_after_a_run_the_review_share_is_the_ledgers(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "1") == 0
    with Ledger.open_readonly(Workspace.open(ws).ledger_path) as ledger:
        reps = [
            rep
            for e in ledger.experiments(ledger.runs()[-1].id)
            for item in ledger.item_verdicts(e.id)
            for rep in item.replicates
            if rep.status == "ok"
        ]
    share = sum(1 for rep in reps if rep.success) / len(reps)
    args = ("--budget-usd", "20", "--provider", "openai", "--model", "fake-judge", "--replicates", "1")
    single = _plan(ws, capsys, *args)
    _structured(ws, review="success")
    plan = _plan(ws, capsys, *args)
    assert any(
        f"a review call on {share:.0%} of verdicts (the share of first judgements that were successes in "
        f"the ledger, {len(reps)} verdicts)" in note
        for note in plan["notes"]
    )
    # The ledger's share prices the first pass: each item's review call on that share of its verdicts.
    workspace = Workspace.open(ws)
    price = price_for("fake-judge", workspace.config.prices)
    assert price is not None
    split = open_split(workspace, "small")
    prompts = PromptSet.from_dir(workspace.prompts_dir)
    review_text = review_instructions(prompts, {"success": True, "reasoning": ""})
    extra = 0.0
    for tid in split.ids:
        prefix, rest = request_token_split(
            build_request(
                split.trajectory(tid),
                split,
                prompts,
                options=RenderOptions(replace_instructions=review_text),
            )
        )
        extra += (
            prefix * price.cache_read_price + rest * price.input + prompts.settings.max_tokens * price.output
        ) / 1e6
    assert plan["first_pass_warm_usd"] == pytest.approx(single["first_pass_warm_usd"] + share * extra)


def test_a_wave_buys_whole_waves_of_the_same_candidates(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--budget-usd", "20", "--provider", "openai", "--model", "gpt-5")
    one = _plan(ws, capsys, *args)
    assert (one["wave"], one["waves"]) == (1, one["candidates"]) and one["candidates"] >= 5
    four = _plan(ws, capsys, *args, "--wave", "4")
    # The same candidate, priced alike; the budget buys whole waves of four of them.
    assert four["cost_per_candidate_usd"] == pytest.approx(one["cost_per_candidate_usd"])
    assert four["waves"] == one["candidates"] // 4 and four["candidates"] == 4 * four["waves"]
    n = len(open_split(Workspace.open(ws), "small").ids)
    assert four["calls"] == math.floor(four["candidates"] * four["calls_per_candidate"] + n * 1)
    # judgeloop.toml's [loop] wave is the default; --wave 0 is refused by the parser.
    toml = ws / "judgeloop.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("\nwave = 1", "\nwave = 4"), encoding="utf-8")
    assert _plan(ws, capsys, *args)["waves"] == four["waves"]
    capsys.readouterr()
    assert main(["plan", "-w", str(ws), "--wave", "0", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "--wave: 0 is out of range" in err and len(err.splitlines()) == 1


def test_a_cascades_plan_shows_each_stages_calls_and_cost_and_the_estimated_escalation_share(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--budget-usd", "20", "--provider", "openai", "--model", "gpt-5", "--policy", "paired")
    single = _plan(ws, capsys, *args)
    write_cascade(ws, "http://127.0.0.1:9/v1")
    plan = _plan(ws, capsys, *args)
    cascade = plan["cascade"]
    split = open_split(Workspace.open(ws), "small")
    positives = sum(1 for t in split.ids if labels_of(ws)[t].is_positive) / len(split.ids)
    # Rule "success": the loop's pre-call estimate, the split's positive share.
    assert cascade["rule"] == "success" and cascade["escalation_share"] == pytest.approx(positives)
    assert cascade["escalation_share"] == EscalationRule(frozenset({"success"})).estimated_share(positives)
    first, second = cascade["stages"]["first"], cascade["stages"]["second"]
    # The first judge judges every item as the single judge did; the second only the escalated share.
    assert first["pass_usd"] == pytest.approx(single["first_pass_warm_usd"])
    assert first["calls_per_item"] == pytest.approx(1.0)
    assert second["calls_per_item"] == pytest.approx(positives)
    assert plan["first_pass_warm_usd"] == pytest.approx(first["pass_usd"] + second["pass_usd"])
    # The strict judge's price ($10 / $40 per M) makes its escalated share dearer than gpt-5 on every item.
    assert second["pass_usd"] > first["pass_usd"] > 0
    capsys.readouterr()
    assert main(["plan", "-w", str(ws), *args]) == 0
    out = capsys.readouterr().out
    assert f"about {positives:.0%} of items escalated" in out and "second judge" in out


def test_a_cascade_whose_second_judge_has_no_price_is_refused_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_cascade(ws, "http://127.0.0.1:9/v1")
    toml = ws / JUDGE_TOML
    text = toml.read_text(encoding="utf-8").split("[cascade.second.prices.")[0]  # the table is last
    toml.write_text(text.replace(STRICT, "unpriced-strict"), encoding="utf-8")
    capsys.readouterr()
    assert main(["plan", "-w", str(ws), "--budget-usd", "5", "--provider", "openai", "--model", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "second judge model 'unpriced-strict'" in err
