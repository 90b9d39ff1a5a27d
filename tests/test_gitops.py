from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.errors import UserError
from optimizer.scaffold import init_workspace
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace, repo_at


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace(tmp_path / "ws")


def _edit(ws: Workspace, rel: str, extra: str) -> None:
    path = ws.root / rel
    path.write_text(path.read_text(encoding="utf-8") + extra, encoding="utf-8")


def test_create_run_branch_checks_out_judgeloop_branch(ws: Workspace) -> None:
    start = gitops.rev_parse(ws, "HEAD")
    name = gitops.create_run_branch(ws, "20261130-031502-ab12", start)
    assert name == "judgeloop/20261130-031502-ab12"
    assert gitops.current_branch(ws) == name and gitops.rev_parse(ws, "HEAD") == start
    with pytest.raises(UserError, match="already exists"):
        gitops.create_run_branch(ws, "20261130-031502-ab12", start)


def test_dirty_tree_is_refused_in_one_line_listing_paths(ws: Workspace) -> None:
    _edit(ws, "prompts/judge.md", "\nextra\n")
    for i in range(6):
        (ws.root / f"new{i}.txt").write_text("x")
    (ws.experiments_dir / "ledger.sqlite").write_bytes(b"ignored")
    paths = gitops.dirty_paths(ws)
    assert "prompts/judge.md" in paths and not any(p.startswith("experiments/") for p in paths)
    with pytest.raises(UserError) as err:
        gitops.create_run_branch(ws, "r1")
    message = str(err.value)
    assert "\n" not in message and "prompts/judge.md" in message and "and 2 more" in message
    assert gitops.current_branch(ws) == "main"


def test_only_experiments_output_is_not_dirty(ws: Workspace) -> None:
    (ws.experiments_dir / "runs").mkdir()
    (ws.experiments_dir / "runs" / "x.json").write_text("{}")
    assert not gitops.is_dirty(ws)
    gitops.ensure_clean(ws)


def test_unknown_revision_is_a_user_error(ws: Workspace) -> None:
    with pytest.raises(UserError, match="unknown git revision 'nope'"):
        gitops.rev_parse(ws, "nope")


def test_kept_commit_has_final_trailers_and_same_diff(ws: Workspace) -> None:
    base = gitops.rev_parse(ws)
    gitops.create_run_branch(ws, "r1", base)
    _edit(ws, "prompts/rubric.md", "\n- A new rule.\n")
    changes = gitops.worktree_changes(ws)
    new_text = changes["prompts/rubric.md"][1]
    assert (
        list(changes) == ["prompts/rubric.md"]
        and new_text is not None
        and new_text.endswith("- A new rule.\n")
    )
    sha = gitops.commit_candidate(ws, ["prompts/rubric.md"], "library: add a rule\n\nwhy it helps", 3)
    pending = gitops.parse_trailers(gitops.commit_message(ws, sha))
    assert pending == {"Judgeloop-Experiment": "3", "Judgeloop-Decision": "pending"}
    before = gitops.diff_against(ws, base, sha)

    kept = gitops.finalize_kept(
        ws, sha, {"Judgeloop-Kappa": 0.6123, "Judgeloop-FPR": 0.14, "Judgeloop-Decision": "kept"}
    )
    assert kept != sha and gitops.rev_parse(ws, "judgeloop/r1") == kept
    message = gitops.commit_message(ws, kept)
    assert message.startswith("library: add a rule\n\nwhy it helps\n\n")
    assert gitops.parse_trailers(message) == {
        "Judgeloop-Experiment": "3",
        "Judgeloop-Decision": "kept",
        "Judgeloop-Kappa": "0.612",
        "Judgeloop-FPR": "0.140",
    }
    after = gitops.diff_against(ws, base, kept)
    assert after == before and after.files_changed == ["prompts/rubric.md"] and after.insertions == 2
    assert not gitops.is_dirty(ws)
    with repo_at(ws.root) as repo:
        commit = repo.commit(kept)
        assert commit.author.name == "judgeloop" and commit.committer.name == "judgeloop"


@pytest.mark.slow
def test_rolled_back_commit_is_kept_under_side_ref_and_branch_reset(ws: Workspace) -> None:
    base = gitops.rev_parse(ws)
    gitops.create_run_branch(ws, "r2", base)
    original = (ws.root / "prompts/judge.md").read_text()
    _edit(ws, "prompts/judge.md", "\nBe lenient.\n")
    sha = gitops.commit_candidate(ws, ["prompts/judge.md"], "reflect: be lenient", 7)

    rejected = gitops.roll_back(ws, sha, 7, base, {"Judgeloop-Decision": "rolled_back", "Judgeloop-FPR": 0.2})
    assert gitops.rev_parse(ws, "judgeloop/r2") == base
    assert (ws.root / "prompts/judge.md").read_text() == original and not gitops.is_dirty(ws)
    assert gitops.rejected_refs(ws) == {7: rejected}
    assert gitops.rev_parse(ws, "refs/judgeloop/rejected/7") == rejected
    diff = gitops.diff_against(ws, base, "refs/judgeloop/rejected/7")
    assert "+Be lenient." in diff.text and diff.files_changed == ["prompts/judge.md"]
    assert gitops.parse_trailers(gitops.commit_message(ws, rejected))["Judgeloop-Decision"] == "rolled_back"
    rejected_text = gitops.read_file_at(ws, rejected, "prompts/judge.md")
    assert rejected_text is not None and rejected_text.endswith("Be lenient.\n")
    # git log of the branch holds only kept commits: the candidate is not on it
    assert all(s not in (sha, rejected) for s, _ in gitops.branch_log(ws, "judgeloop/r2"))


def test_commit_candidate_refuses_stray_staged_paths_and_empty_change(ws: Workspace) -> None:
    gitops.create_run_branch(ws, "r3")
    with pytest.raises(ValueError, match="nothing to commit"):
        gitops.commit_candidate(ws, ["prompts/judge.md"], "no-op", 1)
    _edit(ws, "prompts/judge.md", "x\n")
    _edit(ws, "judgeloop.toml", "# sneaky\n")
    with repo_at(ws.root) as repo:
        repo.git.add("judgeloop.toml")
    with pytest.raises(RuntimeError, match=r"judgeloop\.toml"):
        gitops.commit_candidate(ws, ["prompts/judge.md"], "edit", 1)


def test_restore_tree_resets_and_cleans_only_prompts(ws: Workspace) -> None:
    base = gitops.rev_parse(ws)
    gitops.create_run_branch(ws, "r4", base)
    _edit(ws, "prompts/judge.md", "pending edit\n")
    gitops.commit_candidate(ws, ["prompts/judge.md"], "pending", 2)
    _edit(ws, "prompts/rubric.md", "uncommitted\n")
    (ws.root / "prompts" / "stray.md").write_text("untracked")
    (ws.root / "notes.txt").write_text("the user's file")
    gitops.restore_tree(ws, base)
    assert gitops.rev_parse(ws) == base
    assert not (ws.root / "prompts" / "stray.md").exists()
    assert (ws.root / "notes.txt").read_text() == "the user's file"
    assert gitops.changed_files(ws) == ["notes.txt"]


def test_read_file_at_missing_path_is_none(ws: Workspace) -> None:
    assert gitops.read_file_at(ws, "HEAD", "prompts/nope.md") is None
    config_text = gitops.read_file_at(ws, "HEAD", "judgeloop.toml")
    assert config_text is not None and config_text.startswith("#")


def test_replace_trailers_merges_and_keeps_body() -> None:
    msg = gitops.format_message(
        "subj", "body line", {"Judgeloop-Experiment": 4, "Judgeloop-Decision": "pending"}
    )
    out = gitops.replace_trailers(msg, {"Judgeloop-Decision": "kept", "Judgeloop-Kappa": 0.5})
    assert (
        out
        == "subj\n\nbody line\n\nJudgeloop-Experiment: 4\nJudgeloop-Decision: kept\nJudgeloop-Kappa: 0.500\n"
    )


def test_untracked_imported_split_is_not_dirty_but_edited_tracked_data_is(ws: Workspace) -> None:
    split = ws.root / "devset" / "big"
    split.mkdir(parents=True)
    (split / "manifest.txt").write_text("a\n")
    assert gitops.dirty_paths(ws.root) == []
    with repo_at(ws.root) as repo:
        repo.git.add("devset/big")
        repo.index.commit("add split")
    (split / "manifest.txt").write_text("b\n")
    assert gitops.dirty_paths(ws.root) == ["devset/big/manifest.txt"]


def test_a_revision_is_resolved_as_git_resolves_it_or_refused_naming_why(ws: Workspace) -> None:
    """git's own spellings resolve (``HEAD@{0}``, ``main~0``); the reflog's 1000th entry and main as it was
    yesterday (the log goes back to today only: git would answer with its oldest entry) are UserErrors that
    name the revision and git's reason, not GitPython's IndexError or NotImplementedError."""
    head = gitops.rev_parse(ws)
    assert gitops.rev_parse(ws, "HEAD@{0}") == gitops.rev_parse(ws, "main~0") == head
    for rev, why in (
        ("HEAD@{1000}", "log for 'HEAD' only has"),
        ("main@{yesterday}", "only goes back to"),
        ("--output=/tmp/x", "git cannot resolve it"),
        ("a\0b", "git cannot resolve it"),
    ):
        with pytest.raises(UserError) as err:
            gitops.rev_parse(ws, rev)
        message = str(err.value)
        assert (
            message.startswith(f"unknown git revision {rev!r} (") and why in message and "\n" not in message
        )
    assert gitops.prompts_tree(ws, "HEAD@{1000}") is None
