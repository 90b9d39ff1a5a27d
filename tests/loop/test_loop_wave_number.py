"""`judgeloop run --wave 2` through the real CLI: each wave's rows carry its number in the run (an
optimiser failure's row too), and what the TUI groups and ranks from them is what the loop decided."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optimizer.ledger.waves import holm_rank, next_wave_number, waves
from optimizer.loop.strategies import Proposal, ProposalContext, ProposalError
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of, toggle
from tui.data import load_history

NEUTRAL = "lib-harmless-exploration"  # changes nothing the fake judge answers: a no-op candidate
HOLM = re.compile(r"wave of (\d+) \(Holm\): rank (\d+), level ")


def fails(ctx: ProposalContext) -> Proposal:
    raise ProposalError("no idea left")


@pytest.mark.slow
def test_two_waves_are_numbered_in_their_rows_and_the_tui_groups_them_as_decided(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(NEUTRAL), toggle(GOOD_ENTRY), toggle(BAD_ENTRY), fails]))
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server:
        assert run_loop(ws, server.openai_base_url, "--wave", "2", "--max-experiments", "4") == 0
    run, exps = latest(ws)
    base, *cands = exps
    assert [e.status for e in cands] == ["rolled_back", "kept", "rolled_back", "error"]
    kept = cands[1]
    # The optimiser's failure is the second wave's member: its row carries the wave's record too.
    assert [e.proposal_meta["wave"] for e in cands] == [
        {"size": 2, "alpha": 0.1, "incumbent": base.id, "number": 1}
    ] * 2 + [{"size": 2, "alpha": 0.1, "incumbent": kept.id, "number": 2}] * 2
    assert [(g.number, g.members) for g in waves(exps)] == [
        (1, (cands[0].id, kept.id)),
        (2, (cands[2].id, cands[3].id)),
    ]
    assert next_wave_number(exps) == 3
    # The rank the TUI recomputes is the one decide_wave wrote in each reason.
    for e in cands[:3]:
        m = HOLM.search(e.reason or "")
        rank = holm_rank(
            e, [c for c in cands if c.proposal_meta["wave"]["number"] == e.proposal_meta["wave"]["number"]]
        )
        assert m is not None and m.group(1) == "2"
        assert rank is None or rank == int(m.group(2))
    assert holm_rank(kept, cands[:2]) == 1
    with ledger_of(ws) as led:
        tags = [r.wave_tag for r in load_history(led, run.id).rows]
    assert tags == ["", "w1 1/2", "w1 2/2", "w2 1/2", "w2 2/2"]
