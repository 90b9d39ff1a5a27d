"""`judgeloop attribute` after a ``kill -9`` inside its scratch git worktree: the next attribute removes
what the dead process left (the worktree's record in git and its folder), and never a scratch
worktree that a live process is using."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.workspace import gitops
from tests.support.attribution import (
    MARKER_A,
    MARKER_B,
    MarkerJudge,
    add_line,
    attribute,
    run_chain,
)
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import git, wait_for
from tests.support.processes import killed_cli

# `judgeloop attribute` as a user runs it, stopped inside the scratch worktree (at its first revert)
# until it is killed; it writes the worktree's path to argv[1] when it gets there.
STUCK_ATTRIBUTE = """
import pathlib, sys, time
from optimizer.workspace import gitops
from optimizer.cli import main

def stuck(tree, shas, start):
    pathlib.Path(sys.argv[1]).write_text(str(tree))
    time.sleep(600)

gitops.revert_in = stuck
sys.exit(main(sys.argv[2:]))
"""


def worktrees(root: Path) -> list[str]:
    return [
        line.split()[1]
        for line in git(root, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


@pytest.mark.slow
def test_a_kill_9_inside_the_scratch_worktree_is_cleaned_up_by_the_next_attribute(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0), add_line(MARKER_B, at=1)])
        where = tmp_path / "tree.txt"
        args = [
            str(where),
            "attribute",
            "-w",
            str(ws),
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
        ]
        killed_cli(
            args,
            lambda: wait_for(
                lambda: where.is_file() and where.read_text() != "",
                "attribute to reach its scratch worktree",
                60,
            ),
            launcher=("-c", STUCK_ATTRIBUTE),
        )
        tree = Path(where.read_text())
        # What the kill left: the worktree recorded in git, its folder on disk.
        assert tree.is_dir() and str(tree) in worktrees(ws)
        result = attribute(ws, server, capsys)
    assert result["attribution_meta"]["status"] == "complete"
    assert worktrees(ws) == [str(ws)] and not tree.exists() and not tree.parent.exists()


@pytest.mark.slow
def test_pruning_leaves_a_scratch_worktree_in_use_and_removes_leftover_folders(ws: Path) -> None:
    head = git(ws, "rev-parse", "HEAD").strip()
    with gitops.scratch_worktree(ws, head) as live:
        leftover = live.parent.parent / "tree-left-by-a-kill"  # a folder whose worktree was never added
        (leftover / "tree").mkdir(parents=True)
        removed = gitops.prune_scratch_worktrees(ws)
        assert live.is_dir() and str(live) in worktrees(ws)  # its owner holds it: untouched
        assert removed == [leftover] and not leftover.exists()
    assert worktrees(ws) == [str(ws)] and not live.parent.exists()
