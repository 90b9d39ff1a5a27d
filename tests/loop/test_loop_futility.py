"""Futility screening through `judgeloop run` (real openai SDK, fake server, deterministic judge): a no-op
is rolled back after the screen with its reason in the ledger; a real fix is judged in full and kept."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from optimizer.ledger import Ledger
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    commit_all,
    present,
    run_loop,
    set_toml_key,
)
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, toggle
from tests.support.signals import kill_hand_edit_then_resume

NO_OP = "lib-final-state"  # the fake judge ignores it: every answer stays the incumbent's
FUTILE = re.compile(r"^futile: P\(clear\) = (\d\.\d{3}) < 0\.5 after (\d+) of 32 items ")


@pytest.mark.slow
def test_a_no_op_stops_after_the_screen_and_a_real_fix_is_kept_on_the_full_split(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_toml_key(ws, "loop", "futility", "true")
    set_toml_key(ws, "loop", "futility_threshold", "0.5")  # aggressive: still never a keep on partial data
    commit_all(ws, "futility on")
    judge = FakeJudge(ws)
    install(monkeypatch, ScriptedStrategy([toggle(NO_OP), toggle(GOOD_ENTRY), toggle(GOOD_ENTRY, NO_OP)]))
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3") == 0
    _run, exps = latest(ws)
    _base, noop, good, noop2 = exps
    for futile in (noop, noop2):
        m = FUTILE.match(futile.reason or "")
        assert futile.status == "rolled_back" and futile.early_stopped and m, futile.reason
        assert int(m.group(2)) == futile.items_evaluated < 32 and futile.rejudge_calls == 0
    # The fix: every item judged, decided by the full adaptive test, kept.
    assert good.status == "kept" and good.items_evaluated == 32 and not good.early_stopped, good.reason
    assert good.test is not None and good.test["p_value"] < 0.1 and "futile" not in (good.reason or "")
    assert noop2.parent_id == good.id
    kept = [e for e in exps[1:] if e.status == "kept"]
    assert all(e.items_evaluated == 32 and not e.early_stopped for e in kept)


@pytest.mark.slow
def test_futility_is_on_by_default_says_why_and_futility_false_judges_a_no_op_past_the_screen(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(NO_OP)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    _run, (_base, noop) = latest(ws)
    # A no-op's answers are the incumbent's: every draw fails on kappa, and the reason says so.
    assert noop.status == "rolled_back" and noop.early_stopped and noop.items_evaluated < 32, noop.reason
    assert (noop.reason or "").startswith("futile: P(clear) = 0.000 < 0.01 after "), noop.reason
    assert "kappa did not rise in 200 of 200 draws" in (noop.reason or ""), noop.reason

    set_toml_key(ws, "loop", "futility", "false")
    commit_all(ws, "futility off")
    install(monkeypatch, ScriptedStrategy([toggle(NO_OP)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    _run, (_base, noop) = latest(ws)
    assert noop.status == "rolled_back" and "futile" not in (noop.reason or "")


@pytest.mark.slow
def test_the_looks_re_judge_the_screens_disagreements_once_and_the_ledger_counts_every_call(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fix's disagreements are all incumbent errors, so the first look holds them: they are re-judged
    there (before the futility check), never again at the end, and the ledger's calls are the server's."""
    set_toml_key(ws, "loop", "futility", "true")
    commit_all(ws, "futility on")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        paid = len(server.inference_requests())
    _run, (base, good) = latest(ws)
    assert good.status == "kept" and good.items_evaluated == 32 and not good.early_stopped, good.reason
    assert good.test is not None
    rejudged = [item for item in good.test["items"] if item["rejudged"]]
    assert rejudged and all(item["incumbent_total"] == item["candidate_total"] == 3 for item in rejudged)
    assert good.rejudge_calls == 4 * len(rejudged)  # 2 more under each prompt, once per item
    assert base.calls + good.calls == paid  # every call paid once and counted once
    # After the look's re-judging the first pass goes on from the same start (a crash's spend is counted from it).
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        stages = [
            e.payload
            for e in led.events_since(0, run_id=good.run_id)
            if e.kind == "stage" and e.experiment_id == good.id
        ]
    kinds = [p["stage"] for p in stages]
    assert (
        kinds.index("rejudging") < len(kinds) - 1 and kinds[kinds.index("rejudging") + 1] == "evaluating"
    ), kinds
    starts = {p["started_at"] for p in stages if p["stage"] == "evaluating"}
    assert len(starts) == 1, stages


@pytest.mark.slow
def test_an_edit_that_raises_the_fpr_is_stopped_by_the_screen_and_its_reason_says_fpr_rose(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BAD_ENTRY gets every positive right and breaks negatives: kappa rises, FPR rises. The screen
    stops it (on by default) and the reason names the FPR, not only a probability."""
    install(monkeypatch, ScriptedStrategy([toggle(BAD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        paid = len(server.inference_requests())
    _run, (base, bad) = latest(ws)
    reason = present(bad.reason)
    assert bad.status == "rolled_back" and bad.early_stopped and bad.items_evaluated < 32, reason
    m = re.search(
        r"^futile: P\(clear\) = 0\.000 < 0\.01 after \d+ of 32 items — FPR rose in (\d+) of 200 draws", reason
    )
    assert m and int(m.group(1)) > 100, reason  # most draws fail on the FPR
    assert base.calls + bad.calls == paid  # every call counted once


def _first_look_size(judge: FakeJudge) -> int:
    """The first look of a candidate against the baseline: every item the baseline gets wrong and 10%
    (rounded up) of each class's right items (`optimizer.stats.futility.LOOKS`)."""
    from optimizer.stats.futility import LOOKS

    split = {*judge.neg_rank, *judge.pos_rank}  # the run's 32-item split (the labels hold the whole sample)
    wrong = [t for t in split if not judge.correct(t, set())]
    right = {
        pos: sum(1 for t in split if judge.labels[t].is_positive is pos and judge.correct(t, set()))
        for pos in (False, True)
    }
    return len(wrong) + sum(math.ceil(LOOKS[0] * n) for n in right.values())


@pytest.mark.slow
def test_kill_9_while_re_judging_a_look_then_resume_repeats_no_answered_call(ws: Path) -> None:
    from tests.support.scripted import hand_edit

    judge = FakeJudge(ws)
    n_items = len(judge.neg_rank) + len(judge.pos_rank)
    # The baseline, the candidate's first look and 3 of the look's re-judging calls are answered; then stall.
    judge.gate_after = n_items + _first_look_size(judge) + 3
    hand_edit(ws, BAD_ENTRY)
    with FakeLLMServer(default=judge) as server:
        kill_hand_edit_then_resume(ws, judge, server, "rejudging")  # no answered call asked again
    run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "rolled_back"] and run.status == "finished"
    assert "FPR rose" in present(exps[1].reason), exps[1].reason
    assert_clean(ws)
