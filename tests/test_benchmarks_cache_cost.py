"""Smoke test of benchmarks/cache_cost.py and its parts (benchmarks/_cache_*.py) on a tiny configuration:
every wire x layout x mode billed, batch at half the direct bill, one batch per pass, and the real loop
deciding identically direct and in batch mode. Structure and outcomes that a broken benchmark (or batch
path) would change; no timing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks import _cache_common as common
from benchmarks import _cache_loop as cache_loop
from benchmarks import _cache_structures as cache_structures
from benchmarks import _cache_warmup as warmup
from benchmarks import cache_cost as cc

CANDIDATES = 2


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


@pytest.mark.slow
def test_batch_mode_bills_half_of_direct_on_every_layout_and_wire(tmp_path: Path, keys: None) -> None:
    results = cc.measure_costs(tmp_path, n=6, steps=12, candidates=CANDIDATES, say=lambda _m: None)
    assert set(results) == {
        (w, layout, m) for w in common.MODELS for layout in common.LAYOUTS for m in common.MODES
    }
    for (wire, layout, mode), figures in results.items():
        assert len(figures.per_candidate) == CANDIDATES
        assert figures.batches == (CANDIDATES + 1 if mode == "batch" else 0)  # one batch per pass
        assert figures.calls_after == 0  # the batch's answers are the direct calls' cache entries
        if mode == "batch" and layout == "trajectory-first":
            direct = results[(wire, layout, "direct")]
            # No two entries of a batch share a cold prefix (each item's own trajectory; the first
            # pass writes them, later passes read them): the same caching, every token at
            # Price.batch (0.5), cache prices included.
            assert figures.mean == pytest.approx(0.5 * direct.mean, rel=0.05)
            assert figures.baseline == pytest.approx(0.5 * direct.baseline, rel=0.05)
        elif mode == "batch":
            direct = results[(wire, layout, "direct")]
            # rubric-first: every entry of a batch shares the system prompt, and the entries run
            # together, so none reads what another writes (the fake's visibility rule): dearer than
            # half the direct bill, still cheaper than direct.
            assert 0.5 * direct.mean < figures.mean < direct.mean
    for wire in common.MODELS:
        for mode in common.MODES:
            # After the baseline each trajectory is read from the prompt cache under the new layout.
            assert results[(wire, "trajectory-first", mode)].mean < results[(wire, "rubric-first", mode)].mean
    table = cc.cost_table(results, 6, CANDIDATES)
    rows = [line.split() for line in table.splitlines() if line.startswith("  ") and "layout" not in line]
    assert len(rows) == len(common.MODELS) * len(common.LAYOUTS) * len(common.MODES)
    assert [r[4] for r in rows if r[:2] == ["rubric-first", "direct"]] == ["1.000"] * len(common.MODELS)
    assert "made 0 calls" in table


@pytest.mark.slow
def test_loop_decides_identically_direct_and_in_batches(tmp_path: Path, keys: None) -> None:
    loops = cache_loop.compare_loops(tmp_path, candidates=3, wires=("openai",), say=lambda _m: None)
    direct, batch = loops["openai"]
    assert [d.seq for d in direct.decisions] == [0, 1, 2, 3]
    assert {d.status for d in direct.decisions} >= {"baseline", "kept", "rolled_back"}
    assert cache_loop.same_decisions(direct, batch)
    both, same = cache_loop.verdicts_compared(direct, batch)
    assert both >= 4 * 29 and same == both
    assert direct.batches == 0 and batch.batches >= len(batch.decisions)  # re-judging passes are batches too
    assert all(b.items == 32 for b in batch.decisions)  # no early stopping inside a batch
    # Half price per call. The direct run may answer a call or two fewer: a candidate stopped early
    # leaves unsent whatever was not yet in flight (how many were depends on timing), a batch sends all.
    assert direct.calls_answered <= batch.calls_answered <= direct.calls_answered + 3 * 3
    per_call_batch = sum(b.cost_usd for b in batch.decisions) / batch.calls_answered
    per_call_direct = sum(d.cost_usd for d in direct.decisions) / direct.calls_answered
    assert per_call_batch == pytest.approx(0.5 * per_call_direct, rel=0.05)
    assert "decisions identical (4 of 4 experiments)" in cache_loop.decision_table(loops, 3)
    # The comparison is not vacuous: one flipped decision is reported.
    flipped = dataclasses.replace(batch.decisions[1], status="rolled_back")
    other = dataclasses.replace(batch, decisions=[batch.decisions[0], flipped, *batch.decisions[2:]])
    assert not cache_loop.same_decisions(direct, other)
    assert "DIFFERENT" in cache_loop.decision_table({"openai": (direct, other)}, 3)


def test_the_warmup_rows_show_one_write_per_item_after_and_several_before(tmp_path: Path, keys: None) -> None:
    results = warmup.measure_writes(
        tmp_path, n=4, steps=12, replicates=3, wires=("anthropic",), say=lambda _m: None
    )
    for mode in common.MODES:
        old, new = results[("anthropic", mode, "old")], results[("anthropic", mode, "new")]
        assert new.writes == [1] * 4 and sum(old.writes) > 4
        assert new.write_tokens < old.write_tokens and new.equivalents < old.equivalents
        assert not new.warned
    assert results[("anthropic", "batch", "old")].warned  # --batch-cold: planned reads, none billed
    table = warmup.writes_table(results, 4, 3)
    assert "anthropic direct" in table and "anthropic batch" in table


@pytest.mark.slow
def test_the_structure_rows_price_a_panel_of_k_at_one_write_per_item_and_k_calls(
    tmp_path: Path, keys: None
) -> None:
    n = 4
    # 1 simulated minute a pass: 15 s a request on 4 items, so no entry nears its TTL whatever the order of calls.
    results = cache_structures.measure_structures(
        tmp_path,
        n=n,
        steps=12,
        candidates=1,
        wires=("anthropic",),
        say=lambda _m: None,
        minutes_per_candidate=1.0,
    )
    assert [name for _, name in results] == [
        "single",
        "panel of 2",
        "panel of 3",
        "criteria",
        "review",
        "criteria+review",
    ]
    single = results[("anthropic", "single")]
    for k, name in ((1, "single"), (2, "panel of 2"), (3, "panel of 3")):
        f = results[("anthropic", name)]
        assert f.calls_per_verdict == k
        assert f.writes_per_item == [1] * n  # the members share the item's cached trajectory
        # Trajectories cached, each member's call is the single judge's call again (count members:
        # the same instructions), so k members cost k single verdicts.
        assert f.candidate_mean == pytest.approx(k * single.candidate_mean, rel=1e-6)
        # Cold, the first member writes the trajectory and the others read it: each of them costs a
        # warm call (a candidate's call, whose rubric is one rule longer), not another write.
        assert f.first_usd == pytest.approx(single.first_usd + (k - 1) * single.candidate_mean, rel=0.02)
    table = cache_structures.structures_table(results, n, 12, 1)
    assert "panel of 3" in table and "calls/verdict" in table and "criteria+review" in table


@pytest.mark.slow
def test_the_structure_rows_price_criteria_and_review_by_their_calls(tmp_path: Path, keys: None) -> None:
    n = 6
    # The Anthropic wire: cache breakpoints only where judgeloop puts them (OpenAI's automatic caching
    # would also write the derivations' shared instructions).
    results = cache_structures.measure_structures(
        tmp_path,
        n=n,
        steps=12,
        candidates=2,
        wires=("anthropic",),
        say=lambda _m: None,
        minutes_per_candidate=1.0,
    )  # (as above: no entry nears its TTL)
    single, criteria, review, both = (
        results[("anthropic", name)] for name in ("single", "criteria", "review", "criteria+review")
    )
    for f in (criteria, review, both):
        assert f.writes_per_item == [1] * n  # every call of a verdict reads the item's one cached trajectory
    # criteria: a derivation and a check per item on the first pass; a rubric edit re-checks but is
    # served the derivation by judgeloop's cache (it reads the instruction only).
    assert criteria.calls_per_verdict == 2 and criteria.candidate_calls == [1.0, 1.0]
    assert single.candidate_mean < criteria.candidate_mean < 2 * single.candidate_mean
    # review: one more call on each success verdict, on every pass (each candidate's verdicts are new).
    share = review.calls_per_verdict - 1
    assert 0 < share < 1 and review.candidate_calls == [1 + share] * 2
    assert (
        both.calls_per_verdict == pytest.approx(2 + share)
        and both.candidate_calls == [pytest.approx(1 + share)] * 2
    )
    assert single.candidate_mean < review.candidate_mean < (1 + share) * single.candidate_mean
