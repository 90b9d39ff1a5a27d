"""`judgeloop runs prune` (issue 36 point 8): a dry run by default; with --yes it removes old finished runs'
branches and folders, never the branch checked out nor a run whose kept chain HEAD stands on, and loses
nothing (the ledger keeps the rows, git the tips under refs/judgeloop/pruned/<run>)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.workspace import gitops
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, git, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest
from tests.support.scripted import toggle as enable


def _branches(ws: Path) -> set[str]:
    return set(git(ws, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split())


@pytest.mark.slow
def test_runs_prune_spares_the_checked_out_run_and_the_chain_under_head_and_keeps_every_commit(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(
        monkeypatch, ScriptedStrategy([enable(GOOD_ENTRY), enable(GOOD_ENTRY, BAD_ENTRY), enable(GOOD_ENTRY)])
    )
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        a, _ = latest(ws)
        # B starts on A's tip: A's kept chain is under B.
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        b, _ = latest(ws)
        git(ws, "checkout", "-q", "main")
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        c, _ = latest(ws)
    c_tip = gitops.rev_parse(ws, c.branch)
    assert c_tip != gitops.rev_parse(ws, "main")  # C kept its candidate: its branch holds a commit of its own
    git(ws, "checkout", "-q", b.branch)
    branches = _branches(ws)
    assert {a.branch, b.branch, c.branch} <= branches
    c_folder = ws / "experiments" / "runs" / c.id
    assert c_folder.is_dir()
    capsys.readouterr()

    # The default is a dry run: it says what would go and changes nothing.
    assert main(["-w", str(ws), "runs", "prune", "--keep", "0"]) == 0
    out = capsys.readouterr().out
    assert f"remove run {c.id}: branch {c.branch}" in out and "dry run: nothing removed" in out
    assert f"keep   run {b.id}: its branch is checked out" in out
    assert f"keep   run {a.id}: HEAD stands on its kept chain" in out
    assert _branches(ws) == branches and c_folder.is_dir()

    assert main(["-w", str(ws), "runs", "prune", "--keep", "0", "--yes"]) == 0
    assert f"run {c.id}: removed branch {c.branch}" in capsys.readouterr().out
    assert _branches(ws) == branches - {c.branch}
    assert not c_folder.exists()
    assert gitops.current_branch(ws) == b.branch
    # Nothing lost: C's commits are under refs/judgeloop/pruned/<run>, its rows in the ledger.
    assert git(ws, "rev-parse", f"refs/judgeloop/pruned/{c.id}").strip() == c_tip
    assert main(["-w", str(ws), "history", "--run", c.id]) == 0
    assert c.branch in capsys.readouterr().out


@pytest.mark.slow
def test_runs_prune_keeps_the_newest_runs_by_default(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([enable(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    run, _ = latest(ws)
    git(ws, "checkout", "-q", "main")
    capsys.readouterr()
    assert main(["-w", str(ws), "runs", "prune", "--yes"]) == 0
    assert f"keep   run {run.id}: one of the 5 newest runs" in capsys.readouterr().out
    assert run.branch in _branches(ws)
