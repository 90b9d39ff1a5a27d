"""A wave's accounting through `judgeloop run --wave 2` (real openai SDK, fake server): two candidates with
the same answers share the incumbent's re-judging of the items they both disagree on; that call is sent
once and counted once (calls and cost on exactly one row), in batch mode (one entry of the merged batch)
and with direct calls (the second waits for the first, then reads the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest, toggle
from tests.support.signals import cache_rows

PRICES = '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n'  # US dollars per million tokens
NO_OP = "lib-final-state"  # the fake judge ignores it: the two candidates answer alike


@pytest.mark.slow
@pytest.mark.parametrize("batch", [True, False], ids=["batch", "direct"])
def test_a_re_judging_call_two_wave_candidates_share_is_counted_on_one_row(
    ws: Path, monkeypatch: pytest.MonkeyPatch, batch: bool
) -> None:
    path = ws / "judgeloop.toml"
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            "\n[judge]\n", "\n[judge]\nbatch_poll_s = 0.01\nbatch_poll_max_s = 0.04\n", 1
        )
        + PRICES,
        encoding="utf-8",
    )
    commit_all(ws, "poll batches fast")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(GOOD_ENTRY, NO_OP)]))
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45), batch_polls=2) as server:
        extra = ["--batch"] if batch else []
        assert run_loop(ws, server.openai_base_url, "--wave", "2", "--max-experiments", "2", *extra) == 0
        received = server.inference_requests()
        direct_bills = [usage for request, usage in server.replies if request.batch_id is None]
    _run, exps = latest(ws)
    _base, first, second = exps
    # Both re-judged the same items: the incumbent's side of it is one set of calls for the two.
    assert first.rejudge_calls > 0 and second.rejudge_calls > 0
    stored, cached_cost = cache_rows(ws)
    # Every call the server answered is counted once, on one row, and so is what it was billed
    # (batch: each call is one cache row, priced as billed; direct: the server's own usage, at the price).
    assert sum(e.calls for e in exps) == len(received)
    billed = (
        cached_cost if batch else sum((u.input_tokens + u.output_tokens) * 10.0 / 1e6 for u in direct_bills)
    )
    assert sum(e.cost_usd for e in exps) == pytest.approx(billed, rel=1e-9, abs=1e-12)
    assert billed > 0
    assert stored == len(received)  # nothing was paid twice (direct: one call per key at a time)
    # The two re-judged the same items, 2 more times under each prompt: each candidate's side is its own,
    # the incumbent's side (shared) is counted once over the two rows (each call on the first that made it).
    items = {
        e.id: {i["trajectory_id"] for i in (e.test or {})["items"] if i["rejudged"]} for e in (first, second)
    }
    assert items[first.id] == items[second.id] and items[first.id]
    side = 2 * len(items[first.id])
    assert first.rejudge_calls + second.rejudge_calls == 3 * side
    if batch:  # the merged batch's shared entries all went to the candidate that collected first
        assert sorted((first.rejudge_calls, second.rejudge_calls)) == [side, 2 * side]
