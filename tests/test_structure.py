"""Structure moves: the movable-keys table, the judge.toml guard, the set_structure tool, reflect's moves."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from optimizer.errors import UserError
from optimizer.loop.guards import DevMaterial, check_candidate
from optimizer.loop.strategies.tools import ToolState, run_tool, tool_specs
from optimizer.scaffold import bundled_dir
from optimizer.structure import MOVABLE_KEYS, check_structure, set_key, structure_changes
from optimizer.workspace.config import load_config
from optimizer.workspace.workspace import Workspace
from tests.support.strategies import make_context, make_dev

JUDGE_TOML = "prompts/judge.toml"
BUNDLED = (bundled_dir() / "prompts" / "judge.toml").read_text(encoding="utf-8")


def guard(new: str, moves: list[str], max_members: int = 3, old: str = BUNDLED) -> tuple[str, str]:
    result = check_candidate(
        {JUDGE_TOML: (old, new)},
        ["prompts/judge.md", "prompts/rubric.md"],
        200,
        DevMaterial([], [], [], []),
        structure_moves=moves,
        max_members=max_members,
    )
    return result.guard, result.reason


def test_set_key_rewrites_one_line_keeps_comments_and_reads_back() -> None:
    text = set_key(BUNDLED, "tiling", True)
    assert tomllib.loads(text)["tiling"] is True
    assert structure_changes(BUNDLED, text) == {"tiling": (False, True)}
    # Every comment line of the bundled file survives the move.
    assert [ln for ln in BUNDLED.splitlines() if ln.startswith("#")] == [
        ln for ln in text.splitlines() if ln.startswith("#")
    ]
    panel = set_key(text, "panel.members", ["strict", "evidence"])
    assert tomllib.loads(panel)["panel"] == {"members": ["strict", "evidence"]}
    again = set_key(panel, "panel.vote", "unanimous")
    assert tomllib.loads(again)["panel"] == {"members": ["strict", "evidence"], "vote": "unanimous"}
    assert "tiling" not in tomllib.loads(set_key(BUNDLED, "tiling", None))  # None: back to the default


def test_a_move_within_bounds_passes_every_guard() -> None:
    assert guard(set_key(BUNDLED, "max_images", 40), ["max_images", "tiling"]) == ("ok", "")


@pytest.mark.parametrize(
    ("new", "moves", "max_members", "expected"),
    [
        # structure moves off: any judge.toml edit is refused
        (set_key(BUNDLED, "tiling", True), [], 3, "structure_moves is empty (structure moves are off)"),
        # a movable key outside its bounds
        (
            set_key(BUNDLED, "max_images", 500),
            ["max_images"],
            3,
            "max_images = 500 must be an integer 2..100",
        ),
        (set_key(BUNDLED, "screenshots", "some"), ["screenshots"], 3, 'screenshots = "some" must be "all" |'),
        # a movable key the run does not allow
        (set_key(BUNDLED, "tiling", True), ["max_images"], 3, "tiling is not in [optimizer] structure_moves"),
        # a key that is never movable (added, or changed)
        (BUNDLED + "\ntemperature = 0.0\n", ["tiling"], 3, "temperature is not a movable key"),
        (
            BUNDLED.replace("replicates = 1", "replicates = 5"),
            ["tiling"],
            3,
            "replicates is not a movable key",
        ),
        # a panel beyond max_members, by count or by names
        (
            set_key(BUNDLED, "panel.members", 5),
            ["panel.members"],
            3,
            "names 5 members, over [optimizer] max_members = 3",
        ),
        (set_key(BUNDLED, "panel.members", ["a", "b", "c"]), ["panel.members"], 2, "names 3 members"),
        # a comment-only edit is no move
        (
            BUNDLED + "\n# free text the optimiser wants the judge to read\n",
            ["tiling"],
            3,
            "changes none of its keys",
        ),
        ("tiling = [", ["tiling"], 3, "is not valid TOML"),
    ],
)
def test_hostile_judge_toml_edits_are_refused_with_the_reason(
    new: str, moves: list[str], max_members: int, expected: str
) -> None:
    name, reason = guard(new, moves, max_members)
    assert name == "structure"
    assert expected in reason


def test_judge_toml_cannot_be_deleted_or_reached_by_another_spelling() -> None:
    allowed = ["prompts/judge.md", "prompts/rubric.md"]
    deleted = check_candidate(
        {JUDGE_TOML: (BUNDLED, None)},
        allowed,
        200,
        DevMaterial([], [], [], []),
        structure_moves=["tiling"],
        max_members=3,
    )
    assert (deleted.guard, deleted.reason) == (
        "structure",
        f"the candidate deletes {JUDGE_TOML}; structure moves edit keys, never the file",
    )
    spelled = check_candidate(
        {"prompts/./judge.toml": (BUNDLED, set_key(BUNDLED, "tiling", True))},
        allowed,
        200,
        DevMaterial([], [], [], []),
        structure_moves=["tiling"],
        max_members=3,
    )
    assert spelled.guard == "allowed_files"


def test_the_overfit_guards_still_read_judge_toml() -> None:
    new = set_key(BUNDLED, "panel.members", ["3f2b9c1e"])
    result = check_candidate(
        {JUDGE_TOML: (BUNDLED, new)},
        ["prompts/rubric.md"],
        200,
        DevMaterial(["3f2b9c1e-aaaa-bbbb"], [], [], []),
        structure_moves=["panel.members"],
        max_members=3,
    )
    assert result.guard == "overfit_id"


def test_structure_moves_must_name_movable_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "judgeloop.toml"
    cfg.write_text('[optimizer]\nstructure_moves = ["tiling", "replicates"]\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"'replicates' is not a movable judge\.toml key"):
        load_config(cfg)
    cfg.write_text('[optimizer]\nstructure_moves = ["tiling"]\nmax_members = 0\n', encoding="utf-8")
    with pytest.raises(UserError, match="max_members"):
        load_config(cfg)
    cfg.write_text('[optimizer]\nstructure_moves = ["tiling"]\n', encoding="utf-8")
    opt = load_config(cfg).optimizer
    assert opt.editable_files == ["prompts/judge.md", "prompts/rubric.md", JUDGE_TOML]
    assert opt.model_copy(update={"structure_moves": []}).editable_files == [
        "prompts/judge.md",
        "prompts/rubric.md",
    ]


def test_every_movable_key_refuses_a_value_of_the_wrong_type_and_may_go_back_to_its_default() -> None:
    for spec in MOVABLE_KEYS.values():
        assert spec.check({"a": 1}, 3) is not None, spec.name
    # Removing a movable key is a move too: the key takes its default.
    assert (
        check_structure(JUDGE_TOML, BUNDLED, set_key(BUNDLED, "max_images", None), ["max_images"], 3) is None
    )


def _state(tmp_path: Path, moves: list[str], max_members: int = 3) -> ToolState:
    dev = make_dev(tmp_path)
    ctx = make_context(dev, [])
    ctx.current_files[JUDGE_TOML] = BUNDLED
    ctx.structure_moves = moves
    ctx.max_members = max_members
    return ToolState(ctx)


def test_set_structure_moves_within_bounds_and_refuses_the_rest(tmp_path: Path) -> None:
    state = _state(tmp_path, ["tiling", "panel.members"], max_members=2)
    assert not run_tool(state, "set_structure", {"key": "tiling", "value": True}).is_error
    assert structure_changes(BUNDLED, state.changed_files()[JUDGE_TOML]) == {"tiling": (False, True)}
    refused = [
        run_tool(state, "set_structure", args)
        for args in (
            {"key": "panel.members", "value": 3},
            {"key": "replicates", "value": 3},
            {"key": "max_images", "value": 10},
            {"key": "tiling", "value": "yes"},
        )
    ]
    assert [o.text for o in refused] == [
        "error: panel.members names 3 members, over [optimizer] max_members = 2",
        "error: 'replicates' is not a key you may move; movable: tiling, panel.members",
        "error: 'max_images' is not a key you may move; movable: tiling, panel.members",
        "error: tiling must be true or false",
    ]
    listed = json.loads(run_tool(state, "read_structure", {}).text)
    assert listed["tiling"]["value"] is True and listed["panel.members"]["value"] is None
    # read_file/write_file never reach judge.toml: it is not an allowed file.
    assert run_tool(state, "write_file", {"path": JUDGE_TOML, "text": "mode = 'agentic'"}).is_error


def test_structure_tools_are_offered_and_work_only_when_moves_are_on(tmp_path: Path) -> None:
    assert {"set_structure", "read_structure"}.isdisjoint(t.name for t in tool_specs())
    assert {"set_structure", "read_structure"} <= {t.name for t in tool_specs(structure=True)}
    state = _state(tmp_path, [])
    assert run_tool(state, "set_structure", {"key": "tiling", "value": True}).is_error
    assert JUDGE_TOML not in state.files


def test_the_library_strategy_toggles_a_structural_entry_only_when_its_keys_may_move(tmp_path: Path) -> None:
    from optimizer.loop.strategies import ProposalError
    from optimizer.loop.strategies.library import LibraryStrategy

    dev = make_dev(tmp_path)
    ctx = make_context(dev, [])
    ctx.current_files[JUDGE_TOML] = BUNDLED
    ctx.current_files["prompts/library.md"] = (
        "# doc\n\n## lib-tiling\n\njudge.toml: tiling = true\n\n"
        '## lib-few\n\njudge.toml: screenshots = "spaced", max_images = 8\n'
    )
    with pytest.raises(ProposalError, match="no entries to toggle"):
        LibraryStrategy().propose_sync(ctx)  # structure moves off: neither entry takes part
    ctx.structure_moves = ["tiling", "screenshots"]  # lib-few also needs max_images: still out
    on = LibraryStrategy().propose_sync(ctx)
    assert set(on.files) == {JUDGE_TOML} and on.meta == {"library_enabled": ["lib-tiling"]}
    assert structure_changes(BUNDLED, on.files[JUDGE_TOML]) == {"tiling": (False, True)}
    # From a judge.toml that has it, the toggle is to disable it: the key goes back to its default.
    ctx.current_files[JUDGE_TOML] = on.files[JUDGE_TOML]
    off = LibraryStrategy().propose_sync(ctx)
    assert off.meta == {"library_enabled": []} and "tiling" not in tomllib.loads(off.files[JUDGE_TOML])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("judge.toml: tiling = yes", "is not TOML assignments"),
        ("judge.toml: temperature = 0.0", "temperature is not a movable judge.toml key"),
        ("judge.toml: max_images = 1", "max_images must be an integer 2..100"),
    ],
)
def test_a_malformed_structural_entry_is_one_line_naming_it(body: str, expected: str) -> None:
    from optimizer.judge.prompts import parse_library

    with pytest.raises(UserError, match=expected):
        parse_library(f"## lib-bad\n\n{body}\n")


def test_reflect_moves_structure_within_bounds_and_an_out_of_bounds_move_is_a_proposal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from optimizer.loop.strategies import ProposalError
    from optimizer.loop.strategies.reflect import ReflectStrategy, build_user_message
    from optimizer.workspace.config import OptimizerSection
    from tests.support.fakeserver import FakeLLMServer, reply

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    dev = make_dev(tmp_path)
    ctx = make_context(dev, [])
    ctx.current_files[JUDGE_TOML] = BUNDLED
    ctx.structure_moves = ["tiling", "max_images"]
    assert "- tiling = false (allowed: true | false" in build_user_message(ctx)
    alone = json.dumps({"structure": {"tiling": True}, "rationale": "tile the screenshots"})
    hostile = json.dumps({"structure": {"replicates": 5}, "rationale": "more votes"})
    with FakeLLMServer() as server:
        server.script(reply(alone), reply(hostile))
        cfg = OptimizerSection(
            provider="openai",
            model="gpt-4o-mini",
            base_url=server.openai_base_url,
            max_retries=0,
            timeout_s=10.0,
        )
        proposal = asyncio.run(ReflectStrategy(cfg, {}).propose(ctx))
        with pytest.raises(ProposalError, match="moved 'replicates', which is not in"):
            asyncio.run(ReflectStrategy(cfg, {}).propose(ctx))
    assert set(proposal.files) == {JUDGE_TOML} and proposal.rationale == "tile the screenshots"
    assert structure_changes(BUNDLED, proposal.files[JUDGE_TOML]) == {"tiling": (False, True)}


def test_attribution_reverts_a_structure_move_like_any_hunk(empty_workspace: Workspace) -> None:
    from optimizer.loop.attribute import build_variants
    from optimizer.workspace import gitops
    from tests.support.loop import commit_all

    root = empty_workspace.root
    toml = root / JUDGE_TOML
    shas = []
    for key, value in (("tiling", True), ("max_images", 40), ("image_width", 256), ("image_height", 200)):
        toml.write_text(set_key(toml.read_text(encoding="utf-8"), key, value), encoding="utf-8")
        commit_all(root, f"move {key}")
        shas.append(gitops.rev_parse(root, "HEAD"))
    edits = [gitops.KeptCommit(sha, n) for n, sha in reversed(list(enumerate(shas, start=1)))]  # newest first
    by_experiment = {v.edit.experiment: v for v in build_variants(empty_workspace, shas[-1], edits)}
    tiling_off = by_experiment[1].prompts
    assert tiling_off is not None and not tiling_off.settings.tiling and tiling_off.settings.max_images == 40
    assert by_experiment[1].entangled_with == []  # a move on its own lines reverts cleanly
    # Adjacent lines (image_width, image_height) conflict: measured together, as entangled text edits are.
    width = by_experiment[3]
    assert [c.experiment for c in width.entangled_with] == [4]
    assert width.prompts is not None
    assert (width.prompts.settings.image_width, width.prompts.settings.image_height) == (512, 332)
