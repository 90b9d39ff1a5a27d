"""Smoke tests of benchmarks/decision_power.py: its judge, its test statistic, the simulation and one
tiny loop run through the fake server. Structure and outcomes that a broken benchmark would change;
no timing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import _power_common as common
from benchmarks import _power_loop as power_loop
from benchmarks import _power_sim as power_sim
from benchmarks import decision_power as dp
from benchmarks._judge_model import JudgeModel, item_q
from tests.support.fakeserver import RecordedRequest

N_ITEMS = 162


def _deterministic_odds(wrong: int) -> tuple[np.ndarray, np.ndarray]:
    """A judge that never varies: the first ``wrong`` negatives always wrong, everything else right."""
    _, positive = common.labels_only()
    negatives = [i for i, p in enumerate(positive) if not p][:wrong]
    q = np.ones(len(positive))
    q[negatives] = 0.0
    return q, q < 0.5


def _request(system: str, item: int) -> RecordedRequest:
    user = f"## Goal\n\nSave it (benchmark item {item})\n\n## Steps\n\nTotal steps: **3**\n\n"
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    return RecordedRequest("POST", "/v1/chat/completions", "openai", {}, True, body)


def test_judge_model_follows_item_odds_and_fix_markers() -> None:
    positive = [True, False, False]
    model = JudgeModel(
        positive,
        [None, "Critical Mistake", "Bad Side Effect"],
        np.array([1.0, 0.0, 0.5]),
        np.array([False, True, True]),
        seed=1,
    )
    verdict = json.loads(model(_request("rubric", 0)).text or "")
    assert verdict["success"] is True  # q = 1 on a positive
    verdict = json.loads(model(_request("rubric", 1)).text or "")
    assert verdict["success"] is True and verdict["mistake_type"] is None  # q = 0 on a negative: wrong
    marker = model.register_fix("abc", [1])
    verdict = json.loads(model(_request(f"rubric\n{marker}: check", 1)).text or "")
    assert verdict["success"] is False and verdict["mistake_type"] == "Critical Mistake"
    # Every call is a fresh draw: an unstable item comes out both ways under the same prompt.
    answers = {json.loads(model(_request("rubric", 2)).text or "")["success"] for _ in range(60)}
    assert answers == {True, False}
    assert model.calls == 63


def test_keyed_draws_do_not_depend_on_arrival_order_and_still_vary_by_repeat() -> None:
    """`--keyed-draws`: the verdicts of a set of calls are the same whatever order they arrive in, and
    whether an unrelated call (one answered after an early stop) came in between; repeats still differ."""
    n = 40
    positive = [False] * n
    odds = np.full(n, 0.5)

    def verdicts(order: list[int], extra: int | None) -> dict[tuple[int, int], bool]:
        model = JudgeModel(positive, [None] * n, odds, odds < 0.5, seed=7, keyed=True)
        seen: dict[int, int] = {}
        out: dict[tuple[int, int], bool] = {}
        for i, item in enumerate(order):
            if i == 5 and extra is not None:
                model(_request("other prompt", extra))
            out[(item, seen.get(item, 0))] = json.loads(model(_request("rubric", item)).text or "")["success"]
            seen[item] = seen.get(item, 0) + 1
        return out

    order = [i % n for i in range(3 * n)]
    first = verdicts(order, None)
    assert verdicts(order[::-1], 3) == first
    assert set(first.values()) == {True, False}  # not one answer for all
    assert any(first[(i, 0)] != first[(i, 1)] for i in range(n))  # a repeat is a fresh draw


def test_item_odds_have_the_issue_composition() -> None:
    q, fixable = item_q(N_ITEMS, 0)
    unstable = (q > 0.2) & (q < 0.8)
    assert unstable.sum() == 49 and np.isclose(q, 0.01).sum() == 23
    assert ((q >= 0.3) & (q <= 0.7))[unstable].all()
    assert fixable.sum() == 23 + (q[unstable] < 0.5).sum()


def test_simulated_adaptive_decisions_are_the_engines() -> None:
    q, fixable = item_q(N_ITEMS, 0)
    positive = np.array(common.labels_only()[1])
    res = power_sim.simulate(
        "adaptive",
        common.SimJudge(q, fixable, positive),
        common.RunPlan(runs=10, candidates=6, fixes_per_run=1, seed=4),
        check_engine=40,
    )
    assert res.engine_checked == 40  # each replayed by optimizer.stats.decision.decide_adaptive, which agreed
    assert any(t.calls > N_ITEMS for t in res.trials)  # noise disagreements are re-judged


def test_run_bootstrap_interval_widens_when_a_runs_candidates_move_together() -> None:
    together = [common.Trial("noop", r % 2 == 0, 1, run=str(r)) for r in range(20) for _ in range(5)]
    apart = [common.Trial("noop", (r * 5 + j) % 2 == 0, 1, run=str(r)) for r in range(20) for j in range(5)]
    lo_t, hi_t = common.run_bootstrap(together, "noop")
    lo_a, hi_a = common.run_bootstrap(apart, "noop")
    assert lo_t < 0.5 < hi_t and hi_t - lo_t > 2 * (hi_a - lo_a)


def test_simulation_keeps_clean_fixes_and_never_a_noop_of_a_steady_judge() -> None:
    q, fixable = _deterministic_odds(12)
    positive = np.array(common.labels_only()[1])
    for policy in ("literal", "paired", "adaptive"):
        res = power_sim.simulate(
            policy,
            common.SimJudge(q, fixable, positive),
            common.RunPlan(runs=3, candidates=2, fixes_per_run=0, seed=0, schedule=["noop", "fix12"]),
        )
        assert [(t.kind, t.kept) for t in res.trials] == [("noop", False), ("fix12", True)] * 3, policy
        # A steady judge disagrees only on the fixed items; adaptive re-judges them twice under each prompt.
        extra = 4 * 12 if policy == "adaptive" else 0
        assert [t.calls for t in res.trials] == [N_ITEMS, N_ITEMS + extra] * 3, policy


def test_simulated_noise_keeps_noops_under_literal_far_more_often_than_under_paired() -> None:
    q, fixable = item_q(N_ITEMS, 0)
    positive = np.array(common.labels_only()[1])
    rates = {
        p: common.keep_rate(
            power_sim.simulate(
                p, common.SimJudge(q, fixable, positive), common.RunPlan(60, 6, 1, seed=2)
            ).trials,
            "noop",
        )
        for p in ("literal", "paired")
    }
    (lit_k, lit_n), (par_k, par_n) = rates["literal"], rates["paired"]
    assert lit_n == par_n == 180
    assert lit_k / lit_n > 0.25 and par_k / par_n < 0.15


@pytest.mark.parametrize("policy", common.policies_available())
@pytest.mark.slow
def test_loop_keeps_a_fix_of_every_wrong_item_and_rolls_back_a_noop(policy: str) -> None:
    # A steady judge: the no-op ties the incumbent (rolled back), the fix of all 12 wrong items is a
    # clean gain every policy keeps; both go through start_run, the SDK and the fake server.
    res = power_loop.loop_trials(
        policy,
        common.RunPlan(runs=1, candidates=2, fixes_per_run=0, seed=0, schedule=["noop", "fix12"]),
        concurrency=8,
        odds=_deterministic_odds(12),
    )
    assert [(t.kind, t.kept) for t in res.trials] == [("noop", False), ("fix12", True)]
    assert res.undecided == 0 and res.baseline_calls == N_ITEMS
    assert res.server_calls == res.ledger_calls == N_ITEMS + sum(t.calls for t in res.trials)
    assert (
        res.trials[0].calls <= N_ITEMS
    )  # nothing disagrees, nothing is re-judged (an early stop may cut it)
    lines = dp.table({policy: res}, {}, N_ITEMS)
    assert lines[2].startswith(f"{policy:<9} loop") and "100.0%" in lines[2]


@pytest.mark.slow
def test_loop_judges_structure_moves_with_a_planted_effect() -> None:
    # Candidates that are judge.toml moves ([optimizer] structure_moves on): a no-op move ties the
    # incumbent, a move carrying a planted fix of all 12 wrong items is kept, a later no-op move keeps
    # the fix it carries (so it ties again); every call is counted once, at the server and in the ledger.
    res = power_loop.loop_trials(
        "adaptive",
        common.RunPlan(
            runs=1, candidates=3, fixes_per_run=0, seed=0, schedule=["s-noop", "s-fix12", "s-noop"]
        ),
        concurrency=8,
        odds=_deterministic_odds(12),
    )
    assert [(t.kind, t.kept) for t in res.trials] == [("s-noop", False), ("s-fix12", True), ("s-noop", False)]
    assert res.undecided == 0 and res.server_calls == res.ledger_calls


def test_cheaper_simulation_refuses_a_steadily_worse_candidate_and_keeps_an_equal_one() -> None:
    positive = np.array(common.labels_only()[1])
    steady = np.ones(len(positive))  # a judge that is always right: only the planted items differ
    worse = power_sim.simulate_cheaper(steady, positive, 2, 5, seed=0, margin=1)
    equal = power_sim.simulate_cheaper(steady, positive, 0, 5, seed=0, margin=1)
    assert worse[:2] == (0, 5) and equal[:2] == (5, 5)
    # Worse by 2 is within a margin of 10: kept; within 3 too, but two flips are no evidence of it (p ≈ 1/4).
    assert power_sim.simulate_cheaper(steady, positive, 2, 3, seed=0, margin=10)[:2] == (3, 3)
    assert power_sim.simulate_cheaper(steady, positive, 2, 3, seed=0, margin=3)[:2] == (0, 3)
    # The 2 disagreeing items are re-judged twice under each prompt: (162 + 2·2·2) / 162 calls per item.
    assert worse[2] == pytest.approx((N_ITEMS + 8) / N_ITEMS)


def test_cheaper_rows_cover_both_judges_and_margins() -> None:
    q, _ = item_q(N_ITEMS, 0)
    positive = np.array(common.labels_only()[1])
    lines = power_sim.cheaper_rows(q, positive, 4, seed=1, margins=(1,))
    assert (
        len(lines) == 4 and lines[2].split()[:2] == ["noisy", "1"] and lines[3].split()[:2] == ["steady", "1"]
    )
    assert all("n=4" in line for line in lines[2:])


@pytest.mark.slow
def test_futility_rows_only_ever_take_keeps_away_and_save_calls() -> None:
    """The coupled futility rows: the same candidates with and without the screen; with it, a keep is
    a keep without it, and a candidate costs at most what it cost without."""
    positive = np.array(common.labels_only()[1])
    q, fixable = item_q(len(positive), 0)
    base, screened = power_sim.simulate_futility(
        common.SimJudge(q, fixable, positive), common.RunPlan(4, 6, 1, seed=5), thresholds=(0.05, 0.5)
    )
    for res in screened.values():
        assert [t.kind for t in res.trials] == [t.kind for t in base.trials]
        for with_it, without in zip(res.trials, base.trials, strict=True):
            assert (not with_it.kept or without.kept) and with_it.calls <= without.calls
    stopped = [
        w for w, b in zip(screened["on, T = 0.5"].trials, base.trials, strict=True) if w.calls < b.calls
    ]
    assert stopped, "the screen never stopped a candidate: the test proves nothing"
    lines = power_sim.futility_table(base, screened, len(positive))
    assert lines[2].startswith("off") and lines[3].startswith("first pass only, T = 0.02")
    assert lines[4].startswith("on, T = 0.05") and lines[-1].startswith("oracle (true odds), T = 0.05")


def test_the_oracle_floor_is_the_adaptive_rule_on_a_fully_judged_split_and_zero_for_a_steady_no_op() -> None:
    from optimizer.workspace.config import LoopSection

    positive = np.array(common.labels_only()[1])
    n = len(positive)
    loop = LoopSection.model_validate({"policy": "adaptive", "alpha": 0.1, "rejudge": 2})
    rng = np.random.default_rng(0)
    q, _ = _deterministic_odds(20)  # 20 negatives always wrong
    inc_first = q > 0.5
    # A fix of those 20, every item judged: no draw to make, P(clear) is the adaptive rule's own answer.
    cand_first = np.ones(n, bool)
    judgements = np.where(cand_first != inc_first, 3, 1)
    cand_total = np.where(judgements == 3, 3, cand_first.astype(int))
    inc_total = inc_first.astype(int)  # its re-judging wrong again (q = 0)
    kept = power_sim.adaptive_keep(inc_total, cand_total, judgements, positive, loop)
    p = power_sim.oracle_p_clear(
        np.ones(n, bool),
        common.Tallies(inc_total, cand_total, judgements),
        inc_first,
        common.Odds(q_i=q, q_c=np.ones(n)),
        positive,
        loop,
        rng,
        draws=20,
    )
    assert kept and p == 1.0
    # A steady no-op (the same odds, all 0 or 1) with half the split judged: no draw can clear.
    inside = np.arange(n) < n // 2
    same = inc_first.astype(int)
    assert (
        power_sim.oracle_p_clear(
            inside,
            common.Tallies(same, same, np.ones(n, int)),
            inc_first,
            common.Odds(q, q),
            positive,
            loop,
            rng,
            draws=20,
        )
        == 0.0
    )


@pytest.mark.slow
def test_wave_rows_keep_the_planted_fix_and_never_a_noop_of_a_steady_judge() -> None:
    # A steady judge: the no-ops tie the incumbent, the 8-item fix is a clean gain Holm keeps at alpha/3
    # (8 items fixed every time: p = 1/256); through start_run with --wave 3.
    row = power_loop.wave_trials(3, runs=1, seed=0, concurrency=8, odds=_deterministic_odds(12))
    assert (row.wave, row.null_waves, row.null_false_keeps) == (3, 1, 0)
    assert (row.planted_waves, row.planted_fix_kept, row.planted_noop_kept) == (1, 1, 0)
    assert 0 < row.calls_per_candidate <= 2
    lines = power_loop.wave_table([row])
    assert lines[2].split()[:2] == ["3", "0.0%"] and "100.0%" in lines[2] and " yes " in lines[2]


@pytest.mark.slow
def test_simulated_noop_waves_keep_nothing_of_a_steady_judge_and_holm_bounds_a_noisy_one() -> None:
    positive = np.array(common.labels_only()[1])
    q, _ = _deterministic_odds(12)
    assert power_loop.simulate_wave_null(q, positive, 4, 20, seed=0) == (
        0,
        20,
    )  # no disagreement, nothing kept
    q, _ = item_q(N_ITEMS, 0)
    kept, waves = power_loop.simulate_wave_null(q, positive, 4, 150, seed=3)
    assert waves == 150 and kept / waves < 0.2  # Holm's per-wave bound is 0.1; generous for 150 waves


@pytest.mark.slow
def test_loop_keeps_a_unanimous_panel_with_a_planted_fpr_effect_and_not_a_noop_panel() -> None:
    # A steady judge wrong on 12 negatives: the no-op panel (members err identically) ties the
    # incumbent and is rolled back; the panel whose members err independently on those 12 negatives
    # gets them right by its unanimous vote and is kept. Every member's call is one call, counted
    # alike at the server and in the ledger.
    res = power_loop.loop_trials(
        "adaptive",
        common.RunPlan(runs=1, candidates=2, fixes_per_run=0, seed=0, schedule=common.PANEL_KINDS),
        concurrency=8,
        odds=_deterministic_odds(12),
    )
    assert [(t.kind, t.kept) for t in res.trials] == [("p-noop", False), ("p-fix12", True)]
    assert res.undecided == 0 and res.server_calls == res.ledger_calls
    assert res.baseline_calls == N_ITEMS
    noop, fix = res.trials
    assert noop.calls <= 3 * N_ITEMS  # three member calls per verdict (an early stop may cut the pass)
    # A keep judges the whole pass, three members per item, then re-judges the 12 disagreeing items
    # twice under each prompt (the single incumbent 2 calls, the panel 3 × 2).
    assert fix.calls == 3 * N_ITEMS + 12 * 2 * (1 + 3)


def test_the_panel_judge_errs_identically_across_a_noop_panel_and_independently_on_planted_negatives() -> (
    None
):
    positive = [False] * 6
    model = JudgeModel(
        positive,
        ["Critical Mistake"] * 6,
        np.full(6, 0.5),
        np.ones(6, dtype=bool),
        seed=3,
        steady=True,
        independent_members=common.EFFECT_MEMBERS,
        panel_planted=(0, 1, 2),
    )

    def says(item: int, member: str | None) -> bool:
        system = "rubric" if member is None else f"You are panel member {member}.\n\nrubric"
        return bool(json.loads(model(_request(system, item)).text or "")["success"])

    for item in range(6):
        # A prompt answers an item the same way every time; the no-op members all alike.
        assert says(item, None) == says(item, None)
        assert len({says(item, m) for m in common.NOOP_MEMBERS}) == 1
    for item in (0, 1, 2):  # planted: exactly one effect member errs, so the unanimous vote is right
        assert [says(item, m) for m in common.EFFECT_MEMBERS] == [k == item for k in range(3)]
    for item in (3, 4, 5):  # not planted: the effect members err as the no-op ones do
        assert {says(item, m) for m in common.EFFECT_MEMBERS} == {says(item, "x")}
    # Over many items, the single judge and a member draw apart (a no-op panel is a fresh draw, not a copy).
    wide = JudgeModel(
        [False] * 200, [None] * 200, np.full(200, 0.5), np.zeros(200, dtype=bool), seed=1, steady=True
    )
    single = [json.loads(wide(_request("rubric", i)).text or "")["success"] for i in range(200)]
    member = [
        json.loads(wide(_request("You are panel member x.\n\nrubric", i)).text or "")["success"]
        for i in range(200)
    ]
    assert single != member and 60 < sum(single) < 140
