"""The overfit lint through the real loop: hostile spellings of dev data are guard rejections."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.devset.split import open_split
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, run_loop
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, toggle


@pytest.mark.slow
def test_an_obfuscated_dev_id_and_a_typed_dev_value_are_guard_rejected(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.loop.guards import instruction_values, trajectory_values

    workspace = Workspace.open(ws)
    split = open_split(workspace, workspace.config.workspace.dev_split)
    trajectories = [split.trajectory(t) for t in split.ids]
    dev_id = split.ids[0]
    # A value only the trajectories hold (what an agent typed), so the rejection proves the runner passes them.
    typed = sorted(
        trajectory_values(trajectories) - instruction_values(t.task.instruction for t in trajectories)
    )
    assert typed, "the small dev split should type something no instruction names"
    hidden_id = "\u200b".join(dev_id)

    def obfuscated_id(ctx: ProposalContext) -> Proposal:
        rubric = ctx.current_files[RUBRIC_MD] + f"\n- Item {hidden_id} is a known negative.\n"
        return Proposal(files={RUBRIC_MD: rubric}, rationale="hide a dev id behind zero-width spaces")

    def typed_value(ctx: ProposalContext) -> Proposal:
        rubric = ctx.current_files[RUBRIC_MD] + f"\n- An agent that types {typed[0]} succeeded.\n"
        return Proposal(files={RUBRIC_MD: rubric}, rationale="name what a dev agent typed")

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy([obfuscated_id, typed_value, toggle(GOOD_ENTRY)], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3") == 0
    _, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "guard_rejected", "guard_rejected", "kept"]
    assert exps[1].reason == f"{RUBRIC_MD} contains the dev id {dev_id!r}; write rules, not item references"
    assert (
        exps[2].reason is not None and repr(typed[0]) in exps[2].reason and "dev trajectory" in exps[2].reason
    )
    assert all(e.calls == 0 and e.commit_sha is None for e in exps[1:3])
    rubric = gitops.read_file_at(ws, latest(ws)[0].branch, RUBRIC_MD)
    assert rubric is not None and hidden_id not in rubric
    assert_clean(ws)


@pytest.mark.slow
def test_a_rationale_over_the_cap_is_guard_rejected_and_kept_clipped_out_of_git_and_history(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 400,000-character rationale (the red team's was 40 MB) is refused by the guards in one line; the
    ledger keeps only its first MAX_RATIONALE_CHARS characters, nothing is committed, and the next
    proposal's history carries the clipped text, not the whole."""
    from optimizer.loop.guards import MAX_RATIONALE_CHARS

    huge = "Check typed text exactly. " + "x" * 400_000

    def long_winded(ctx: ProposalContext) -> Proposal:
        proposal = toggle(GOOD_ENTRY)(ctx)
        proposal.rationale = huge
        return proposal

    strategy = ScriptedStrategy([long_winded, toggle(GOOD_ENTRY)])
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, strategy)
        tip = gitops.rev_parse(ws, "HEAD")
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    _, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "guard_rejected", "kept"]
    reason = exps[1].reason or ""
    assert reason == (
        f"the rationale is {len(huge):,} characters, over the cap of {MAX_RATIONALE_CHARS:,}; "
        "say why in one paragraph"
    ), reason
    assert exps[1].calls == 0 and exps[1].commit_sha is None
    stored = exps[1].rationale or ""
    assert stored.startswith("Check typed text exactly. ") and len(stored) < MAX_RATIONALE_CHARS + 100
    # Nothing of it reached git: the rejected candidate was never committed.
    assert all(len(message) < MAX_RATIONALE_CHARS for _sha, message in gitops.branch_log(ws, "HEAD", tip))
    shown = "\n".join(p.rationale for p in strategy.contexts[1].history)
    assert "Check typed text exactly." in shown and len(shown) < 2 * MAX_RATIONALE_CHARS
    assert_clean(ws)
