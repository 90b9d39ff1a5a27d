"""`judgeloop selftest`: the A/A check against the decision-power benchmark, the planted degradation, the
minimum detectable gain, and what it must never touch — through the real CLI and the fake server."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from benchmarks import _power_common as common
from benchmarks import _power_loop as power_loop
from benchmarks import _power_sim as power_sim
from benchmarks._judge_model import JudgeModel, item_q
from optimizer.cli import main
from optimizer.stats.binomial import clopper_pearson_interval
from optimizer.stats.decision import min_fixes_to_keep
from optimizer.trust.power import BENCHMARK, simulated_keep_rate
from optimizer.trust.selftest import PLANTED_RULE
from optimizer.trust.selftest_files import latest_selftest
from optimizer.workspace.config import LoopSection
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import commit_all, set_toml_key
from tests.support.trust import GullibleJudge, judge_args, run_json, untouched_state


@pytest.mark.slow
def test_planted_degradation_is_rolled_back_and_a_steady_judge_never_keeps_itself(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = GullibleJudge(ws)
    before = untouched_state(ws)
    with FakeLLMServer(default=judge) as server:
        result = run_json(capsys, "selftest", "-w", str(ws), "--repeats", "2", *judge_args(server))
    planted = result["planted"]
    assert planted["decided"] and planted["rolled_back"] is True
    # The judge obeyed the rule: every negative it judged under it became a false positive.
    assert (
        planted["fpr_planted"] == 1.0 and planted["fpr_incumbent"] < 1.0 and planted["judge_obeyed"] is True
    )
    assert PLANTED_RULE in planted["rule"]
    # A deterministic judge gives identical verdicts to identical prompts: nothing kept, nothing unstable.
    aa = result["aa"]
    assert (aa["repeats"], aa["kept"], aa["keep_rate"]) == (2, 0, 0.0)
    assert aa["instability"]["unstable_items"] == 0 and aa["instability"]["flip_rate"] == 0.0
    assert aa["instability"]["items_judged_twice"] == 32
    # Minimum detectable gain: the decision module's own figure for this split and level (adaptive, 0.1).
    assert result["detectable"]["min_clean_fixes"] == min_fixes_to_keep(0, 0.1)
    # At this (zero) noise the simulation agrees: a fix is kept exactly when it is that large.
    power = result["detectable"]["at_noise"]
    assert power["smallest_fix"] == min_fixes_to_keep(0, 0.1)
    assert all(
        rate == (1.0 if int(d) >= power["smallest_fix"] else 0.0)
        for d, rate in power["keep_rate_by_fix"].items()
    )
    assert (
        result["policy"]["policy"] == "adaptive"
        and result["benchmark"]["reference"] == BENCHMARK["policies"]["adaptive"]
    )
    assert result["complete"] is True
    # Recorded where certify finds it; nothing the user owns changed (prompts, devset, HEAD, branch, refs).
    saved = Path(ws / result["files"]["json"])
    assert saved.parent == ws / "experiments" / "selftest" and saved.with_suffix(".md").is_file()
    assert json.loads(saved.read_text())["aa"] == aa
    found = latest_selftest(Workspace.open(ws))
    assert found is not None and found.files is not None and found.files.json_path == result["files"]["json"]
    assert untouched_state(ws) == before


@pytest.mark.slow
def test_the_aa_slots_are_fresh_calls_and_a_second_selftest_is_served_by_the_cache(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = GullibleJudge(ws)
    with FakeLLMServer(default=judge) as server:
        first = run_json(capsys, "selftest", "-w", str(ws), "--repeats", "2", *judge_args(server))
        n_first = len(judge.answered)
        again = run_json(capsys, "selftest", "-w", str(ws), "--repeats", "2", *judge_args(server))
    # 2 repeats x 2 sides x 32 items, all distinct replicate indices of identical prompts (nothing
    # disagrees, nothing re-judged), plus the planted pass (its incumbent side is repeat 1's, cached) and
    # its disagreements re-judged twice under each prompt. The planted pass judges negatives first and
    # stops once its outcome is certain; how many of its 32 calls were already in flight then depends on
    # timing (the engine renders ahead), so that part is a range.
    rejudged = first["planted"]["rejudged"]
    assert rejudged > 0
    assert first["calls"] == n_first
    assert 2 * 2 * 32 + 2 * 2 * rejudged < n_first <= 2 * 2 * 32 + 32 + 2 * 2 * rejudged
    assert again["calls"] == 0 and len(judge.answered) == n_first and again["cache_hits"] > 0


@pytest.mark.slow
def test_budget_stops_the_selftest_cleanly_and_says_so(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text() + '\n[prices."fake-judge"]\ninput = 3.0\noutput = 15.0\n', encoding="utf-8"
    )
    commit_all(ws, "prices")
    with FakeLLMServer(default=GullibleJudge(ws)) as server:
        result = run_json(
            capsys, "selftest", "-w", str(ws), "--repeats", "5", "--budget-usd", "0.5", *judge_args(server)
        )
    assert result["complete"] is False and result["stopped"] and "budget" in result["stopped"]
    assert result["aa"]["repeats"] < 5 and result["cost_usd"] <= 0.5


def test_selftest_refuses_a_held_out_dev_split_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_toml_key(ws, "workspace", "heldout_splits", '["small"]')
    commit_all(ws, "held out")
    with FakeLLMServer(default=GullibleJudge(ws)) as server:
        capsys.readouterr()
        assert main(["selftest", "-w", str(ws), *judge_args(server)]) == 2
        assert server.requests == []
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "held" in err and "'small'" in err
    assert not (ws / "experiments" / "selftest").exists()


@pytest.mark.slow
def test_aa_keep_rate_agrees_with_the_decision_power_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The benchmark's judge (AH-D's composition, every call a fresh draw) under the default policy.

    An A/A repeat is a no-op candidate against a *fresh* incumbent, the benchmark's ``sim1`` setting, so
    its keep count over n independent repeats is Binomial(n, p) with p the benchmark's fresh-incumbent
    no-op keep rate (8.3% for adaptive, n = 3,000). "Agrees within its sampling error": p lies in the
    exact 95% interval of the observed rate (what the self-test reports as ``agrees``), and the same
    quantity recomputed now by the benchmark's own simulation of this judge (600 no-ops) lies in the
    exact 99% interval. One call at a time, so the seeded judge's draws are the same on every run.
    """
    repeats = 20
    with mock.patch.dict(os.environ, {"OPENAI_API_KEY": "sk-test"}):
        root, positive, types = power_loop.build_workspace(tmp_path)
        q, fixable = item_q(len(positive), 0)
        model = JudgeModel(positive, types, q, fixable, seed=7)
        with FakeLLMServer(default=model, keep_alive=True) as server:
            result = run_json(
                capsys,
                "selftest",
                "-w",
                str(root),
                "--repeats",
                str(repeats),
                *judge_args(server, concurrency=1),
            )
    aa, bench = result["aa"], result["benchmark"]
    assert result["policy"]["name"] == "adaptive" and aa["repeats"] == repeats
    reference = BENCHMARK["policies"]["adaptive"]["noop_fresh"]
    assert bench["reference"]["noop_fresh"] == reference and bench["agrees"] is True
    lo, hi = aa["keep_rate_interval"]
    assert lo <= reference <= hi
    sim = power_sim.simulate(
        "adaptive",
        common.SimJudge(q, fixable, np.array(positive)),
        common.RunPlan(600, 1, 0, seed=3, schedule=["noop"]),
    )
    k, n = common.keep_rate(sim.trials, "noop")
    lo99, hi99 = clopper_pearson_interval(aa["kept"], repeats, level=0.99)
    assert lo99 <= k / n <= hi99
    # The judge's noise is what the benchmark built in: 30% of items unstable flip about half the time.
    assert 0.08 <= aa["instability"]["flip_rate"] <= 0.25
    # This judge ignores the rule: a no-op for it, decided like the rest, and said so.
    assert result["planted"]["decided"] and result["planted"]["judge_obeyed"] is False
    # The smallest reliably kept fix at the measured odds is near the benchmark's (adaptive keeps 78%
    # of 8-item fixes): the measured odds stand in for the judge's true ones.
    assert result["detectable"]["at_noise"]["smallest_fix"] in (6, 8, 12)


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "fix"), [("adaptive", 8), ("paired", 8), ("literal", 0)])
def test_simulated_keep_rate_is_the_decision_power_benchmarks(policy: str, fix: int) -> None:
    # The self-test's power simulation and the benchmark's own simulation (benchmarks/decision_power.py,
    # an independent implementation of the same model) on the benchmark judge's odds, 1,000 trials each:
    # equal within 4 standard errors of the difference.
    positive = np.array(common.labels_only()[1])
    q, fixable = item_q(len(positive), 0)
    ours = simulated_keep_rate(
        positive, q, fix, LoopSection.model_validate({"policy": policy}), 0.1, trials=1000, seed=4
    )
    kind = "noop" if fix == 0 else f"fix{fix}"
    res = power_sim.simulate(
        policy, common.SimJudge(q, fixable, positive), common.RunPlan(1000, 1, 0, seed=5, schedule=[kind])
    )
    k, n = common.keep_rate(res.trials, kind)
    p = (ours + k / n) / 2
    assert abs(ours - k / n) <= 4 * math.sqrt(2 * p * (1 - p) / 1000)
    # And the stored reference figures the self-test prints are this model's (same tolerance, n = 3,000).
    ref = BENCHMARK["policies"][policy]["noop_fresh" if fix == 0 else f"fix{fix}"]
    assert abs(ours - ref) <= 4 * math.sqrt(p * (1 - p) * (1 / 1000 + 1 / 3000))
