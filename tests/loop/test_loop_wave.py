"""`judgeloop run --wave K` through the real CLI against the fake judge: K candidates per round parked
on one incumbent, judged together, decided by Holm (at most one keep), the others rolled back with
their p-value and Holm level; refusals; a duplicate or a short wave; a stopped wave resumed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optimizer import gitops
from optimizer.cli import main
from optimizer.loop.strategies import IN_WAVE, Proposal, ProposalContext, ProposalError
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, commit_all, git, report_json, run_loop
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, toggle

NEUTRAL = "lib-harmless-exploration"  # changes nothing the fake judge answers: a no-op candidate
HOLM = re.compile(r"wave of (\d+) \(Holm\): rank (\d+), level ([0-9.e-]+), (p=\S+|stopped early)")


def test_wave_of_three_keeps_the_fix_and_rolls_back_the_rest(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    strategy = ScriptedStrategy([toggle(NEUTRAL), toggle(GOOD_ENTRY), toggle(BAD_ENTRY)])
    install(monkeypatch, strategy)
    # A fix of 7 negatives: clear at alpha/3 (p = 1/128), as a 4-item one (p = 1/16) would not be.
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server:
        assert run_loop(ws, server.openai_base_url, "--wave", "3", "--max-experiments", "3") == 0
    run, exps = latest(ws)
    cands = [e for e in exps if e.seq > 0]
    assert [e.seq for e in exps] == [0, 1, 2, 3] and run.status == "finished"
    # All three were proposed against the baseline, each told about the earlier ones of its wave.
    assert {e.parent_id for e in cands} == {exps[0].id}
    assert [[h.id for h in ctx.history if h.decision == IN_WAVE] for ctx in strategy.contexts] == [
        [], [cands[0].id], [cands[0].id, cands[1].id]]
    assert [e.status for e in cands] == ["rolled_back", "kept", "rolled_back"]
    # Holm over the wave of 3: the three levels are alpha/3, alpha/2, alpha by rank, each in the reason.
    alpha = 0.1
    found = {e.id: HOLM.search(e.reason or "") for e in cands}
    assert all(m is not None and m.group(1) == "3" for m in found.values())
    ranks = {e.id: int(m.group(2)) for e, m in zip(cands, found.values(), strict=True) if m}
    assert sorted(ranks.values()) == [1, 2, 3]
    for e in cands:
        assert e.alpha == pytest.approx(alpha / (3 - ranks[e.id] + 1))
    kept = cands[1]
    assert kept.p_value is not None and kept.p_value < present_alpha(kept)
    # Git: three commits on the baseline; the branch ends at the kept one, the others under rejected refs.
    assert gitops.rev_parse(ws, run.branch) == kept.commit_sha
    assert git(ws, "rev-parse", f"{kept.commit_sha}^").strip() == run.start_rev
    rejected = gitops.rejected_refs(ws)
    assert set(rejected) == {cands[0].id, cands[2].id}
    for e in (cands[0], cands[2]):
        assert git(ws, "rev-parse", f"{rejected[e.id]}^").strip() == run.start_rev
        assert gitops.parse_trailers(gitops.commit_message(ws, rejected[e.id]))["Judgeloop-Decision"] == "rolled_back"
    assert gitops.parked_candidates(ws) == {}
    assert_clean(ws)
    # The run's accounting: a wave of 3 tested at alpha counts alpha/3 per test, alpha in all.
    acc = report_json(ws, capsys)["accounting"]
    assert acc["tested"] == 3 and acc["expected_false_keeps"] == pytest.approx(alpha)


def present_alpha(e: object) -> float:
    alpha = getattr(e, "alpha", None)
    assert isinstance(alpha, float)
    return alpha
