"""The overfit lint through the real loop: hostile spellings of dev data are guard rejections."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer import gitops
from optimizer.devset.split import open_split
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, run_loop
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, toggle


def test_an_obfuscated_dev_id_and_a_typed_dev_value_are_guard_rejected(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.loop.guards import instruction_values, trajectory_values

    workspace = Workspace.open(ws)
    split = open_split(workspace, workspace.config.workspace.dev_split)
    trajectories = [split.trajectory(t) for t in split.ids]
    dev_id = split.ids[0]
    # A value only the trajectories hold (what an agent typed), so the rejection proves the runner passes them.
    typed = sorted(trajectory_values(trajectories) - instruction_values(t.task.instruction for t in trajectories))
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
    assert exps[2].reason is not None and repr(typed[0]) in exps[2].reason and "dev trajectory" in exps[2].reason
    assert all(e.calls == 0 and e.commit_sha is None for e in exps[1:3])
    rubric = gitops.read_file_at(ws, latest(ws)[0].branch, RUBRIC_MD)
    assert rubric is not None and hidden_id not in rubric
    assert_clean(ws)
