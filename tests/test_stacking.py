"""Stacking's pure rule and its git merge (`[loop] stack`): which rolled-back candidate points the right way
(`optimizer.stats.pooling`), how pooled candidates merge onto their incumbent and which are left out
(`optimizer.workspace.merging`), and who may claim to carry them (`Experiment.carries`, the trailer)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from optimizer.ledger import Experiment
from optimizer.loop.stack import CARRIES_TRAILER, STACK, carries_trailers
from optimizer.scaffold import init_workspace
from optimizer.stats.evidence import AdaptiveTest
from optimizer.stats.pooling import points_right_way
from optimizer.stats.rules import Decision
from optimizer.workspace import gitops
from optimizer.workspace.merging import merge_pooled
from optimizer.workspace.workspace import Workspace

RUBRIC = "prompts/rubric.md"


def decision(**kw: object) -> Decision:
    base: dict[str, object] = {
        "keep": False,
        "reason": "r",
        "literal_keep": True,
        "paired_keep": False,
        "p_value": 0.3,
        "policy": "adaptive",
    }
    return Decision.model_validate(base | kw)


def gain(statistic: float) -> AdaptiveTest:
    return AdaptiveTest(
        first_pass=1,
        rejudge=2,
        alpha=0.1,
        statistic=statistic,
        p_value=0.3,
        seed=0,
        draws=0,
        mcnemar_p=0.5,
        items=[],
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"majority_literal_keep": True, "test": gain(2.0)}, True),  # decided in full: up, not significant
        ({"majority_literal_keep": False, "test": gain(2.0)}, False),  # FPR rose or kappa fell on majorities
        ({"majority_literal_keep": True, "test": gain(-1.0)}, False),  # a negative gain in items
        ({"majority_literal_keep": True, "test": gain(0.0)}, False),  # no gain at all
        ({"literal_keep": True}, True),  # paired / literal: the first pass's literal rule
        ({"literal_keep": False}, False),
        (
            {"keep": True, "majority_literal_keep": True, "test": gain(5.0)},
            False,
        ),  # a keep is kept, not pooled
        ({"early_stopped": True, "short_of_significance": True}, True),  # only significance out of reach
        (
            {"early_stopped": True, "short_of_significance": False},
            False,
        ),  # kappa/FPR out of reach, or no gain
        ({"early_stopped": True}, False),  # the FPR or kappa bound, or futility's screen
        ({"keep_kind": "cheaper", "majority_literal_keep": True}, False),
    ],
)
def test_points_right_way_is_the_stated_rule(fields: dict[str, object], expected: bool) -> None:
    assert points_right_way(decision(**fields)) is expected


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace(tmp_path / "ws")


def candidate(ws: Workspace, incumbent: str, exp_id: int, old: str, new: str) -> str:
    """A rolled-back candidate on ``incumbent`` that replaces ``old`` with ``new`` in the rubric."""
    gitops.restore_tree(ws.root, incumbent)
    path = ws.root / RUBRIC
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    sha = gitops.commit_candidate(ws, [RUBRIC], f"candidate {exp_id}", exp_id)
    return gitops.roll_back(ws, sha, exp_id, incumbent, {"Judgeloop-Decision": "rolled_back"})


def test_pooled_candidates_merge_onto_the_incumbent_and_a_conflicting_or_foreign_one_is_left_out(
    ws: Workspace,
) -> None:
    base = gitops.rev_parse(ws)
    gitops.create_run_branch(ws, "r1", base)
    candidate(ws, base, 2, "## What counts as success", "## What counts as success\n\nRule A.")
    candidate(ws, base, 3, "### Bad Side Effect", "### Bad Side Effect\n\nRule B.")
    candidate(ws, base, 4, "## What counts as success", "## What counts as success\n\nRule X, not A.")
    # A candidate proposed on another incumbent (the first one's commit) is no part of this pool.
    on_other = gitops.rev_parse(ws, f"{gitops.REJECTED_PREFIX}2")
    candidate(ws, on_other, 5, "### Critical Mistake", "### Critical Mistake\n\nRule C.")
    gitops.restore_tree(ws.root, base)

    merged = merge_pooled(ws.root, base, [2, 3, 4, 5, 6])
    assert merged.carried == [2, 3]
    assert set(merged.left_out) == {4, 5, 6}
    assert merged.left_out[4] == f"its edit conflicts with experiment(s) 2, 3 in {RUBRIC}"
    assert "not proposed on this incumbent" in merged.left_out[5] and "is gone" in merged.left_out[6]
    text = merged.files[RUBRIC]
    assert text is not None and "Rule A." in text and "Rule B." in text and "Rule X" not in text
    # Nothing moved: the branch, the tree and the incumbent's rubric are as they were.
    assert gitops.rev_parse(ws) == base and "Rule A." not in (ws.root / RUBRIC).read_text(encoding="utf-8")


def row(strategy: str, meta: Mapping[str, object]) -> Experiment:
    return Experiment(
        id=9,
        run_id="r",
        seq=4,
        strategy=strategy,
        created=datetime.now(UTC),
        status="kept",
        proposal_meta=dict(meta),
    )


def test_only_a_merge_row_carries_parts_and_only_its_commit_gets_the_trailer() -> None:
    meta: dict[str, object] = {
        "stack": {"pooled": [2, 3, 4], "carries": [2, 3], "left_out": {"4": "conflict"}}
    }
    assert row(STACK, meta).carries == [2, 3] and row(STACK, meta).stack_pooled == [2, 3, 4]
    assert carries_trailers(STACK, meta) == {CARRIES_TRAILER: "2, 3"}
    # A strategy that writes the same record into its own proposal's meta claims nothing.
    assert row("reflect", meta).carries == [] and carries_trailers("reflect", meta) == {}
    # A malformed record carries nothing (never a crash in the report or the TUI).
    for bad in ({"stack": "2,3"}, {"stack": {"carries": "2"}}, {"stack": {"carries": [True, "3", 4.0]}}):
        assert row(STACK, bad).carries == [] and carries_trailers(STACK, bad) == {}
