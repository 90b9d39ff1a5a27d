"""Structure moves through the real loop and CLI: a judge.toml move is a candidate like any edit; a
move outside [optimizer] structure_moves, its bounds or max_members is refused whoever made it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from optimizer.judge.prompts import JUDGE_TOML
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.loop.strategies.tools import ToolState, run_tool
from optimizer.structure import set_key, structure_changes
from optimizer.workspace import gitops
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, commit_all, run_loop
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, ledger_of


def moves_on(root: Path, moves: str, max_members: int = 3) -> None:
    path = root / "judgeloop.toml"
    path.write_text(
        re.sub(
            r"(?m)^\[optimizer\]\n",
            f"[optimizer]\nstructure_moves = {moves}\nmax_members = {max_members}\n",
            path.read_text(encoding="utf-8"),
            count=1,
        ),
        encoding="utf-8",
    )
    commit_all(root, "structure moves on")


def move(key: str, value: object) -> Callable[[ProposalContext], Proposal]:
    def step(ctx: ProposalContext) -> Proposal:
        # As the agent's tool makes it: set_structure on the tool state, then the changed files.
        state = ToolState(ctx)
        out = run_tool(state, "set_structure", {"key": key, "value": value})
        files = (
            state.changed_files()
            if not out.is_error
            else {
                JUDGE_TOML: set_key((ctx.workspace_root / JUDGE_TOML).read_text(encoding="utf-8"), key, value)
            }
        )  # hostile
        return Proposal(files=files, rationale=f"move {key} to {value}")

    return step


@pytest.mark.slow
def test_moves_are_judged_like_edits_and_hostile_ones_are_refused(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moves_on(ws, '["max_images", "panel.members"]', max_members=2)
    before = (ws / JUDGE_TOML).read_text(encoding="utf-8")

    def free_text(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={JUDGE_TOML: ctx.current_files[JUDGE_TOML] + "\ntemperature = 0.0\n"},
            rationale="a key outside the table",
        )

    steps = [
        move("max_images", 40),
        move("max_images", 1000),
        move("panel.members", 3),
        move("tiling", True),
        free_text,
    ]
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy(steps, server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "5", "--patience", "9") == 0
    _, exps = latest(ws)
    # The in-bounds move was committed and evaluated (with screenshots = "none" it renders the same requests:
    # judged from the cache, an equal judge, rolled back).
    assert (
        exps[1].status == "rolled_back"
        and exps[1].files_changed == [JUDGE_TOML]
        and exps[1].items_evaluated > 0
    )
    diff = ledger_of(ws).get_experiment(exps[1].id).diff_text
    assert diff is not None and "+max_images = 40" in diff
    shown = gitops.read_file_at(ws, f"refs/judgeloop/rejected/{exps[1].id}", JUDGE_TOML)
    assert structure_changes(before, shown) == {"max_images": (100, 40)}
    assert [(e.status, e.calls) for e in exps[2:]] == [("guard_rejected", 0)] * 4
    assert [e.reason for e in exps[2:]] == [
        f"{JUDGE_TOML}: max_images = 1000 must be an integer 2..100",
        f"{JUDGE_TOML}: panel.members = 3 names 3 members, over [optimizer] max_members = 2",
        f"{JUDGE_TOML}: tiling is not in [optimizer] structure_moves (movable here: max_images, panel.members)",
        f"{JUDGE_TOML}: temperature is not a movable key (movable here: max_images, panel.members)",
    ]
    assert (ws / JUDGE_TOML).read_text(encoding="utf-8") == before
    assert_clean(ws)


@pytest.mark.slow
def test_with_moves_off_a_judge_toml_edit_is_refused(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy([move("max_images", 40)], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    _, exps = latest(ws)
    assert exps[1].status == "guard_rejected" and exps[1].reason is not None
    assert "structure_moves is empty (structure moves are off)" in exps[1].reason


@pytest.mark.slow
def test_a_hand_edit_of_judge_toml_is_refused_up_front_unless_it_is_a_permitted_move(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = ws / JUDGE_TOML
    original = toml.read_text(encoding="utf-8")
    toml.write_text(set_key(original, "tiling", True), encoding="utf-8")
    assert run_loop(ws, "http://127.0.0.1:9/v1", "--strategy", "manual") == 2
    err = capsys.readouterr().err
    assert "prompts/judge.toml is edited but [optimizer] structure_moves is empty" in err
    assert toml.read_text(encoding="utf-8") == set_key(original, "tiling", True)  # the edit is left in place
    toml.write_text(original, encoding="utf-8")
    moves_on(ws, '["tiling"]')
    toml.write_text(set_key(original, "max_images", 3), encoding="utf-8")
    assert run_loop(ws, "http://127.0.0.1:9/v1", "--strategy", "manual") == 2
    assert (
        "prompts/judge.toml: max_images is not in [optimizer] structure_moves (movable here: tiling); a run never "
        "judges such an edit"
    ) in capsys.readouterr().err
    toml.write_text(set_key(original, "tiling", True), encoding="utf-8")
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual", "-m", "tile the screenshots") == 0
    _, exps = latest(ws)
    assert exps[1].files_changed == [JUDGE_TOML] and exps[1].status in ("kept", "rolled_back")
