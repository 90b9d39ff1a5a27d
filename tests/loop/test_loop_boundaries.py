"""The loop's boundaries against a hostile or careless optimiser (issue 16): a candidate that cannot be
judged is a guard rejection, never a dead run; one path rule for what may be edited; no link in
prompts/ is read or written through; no edit grows without bound.

Same fixtures as test_loop_run.py: a 32-item dev split, the deterministic fake judge, the real openai
SDK against the fake server on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.judge.prompts import JUDGE_TOML, LIBRARY_END, RUBRIC_MD
from optimizer.ledger import Ledger
from optimizer.loop.runner import LoopRunner
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.workspace import gitops
from optimizer.workspace.paths import MAX_PROMPT_FILE_CHARS
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, git, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, Step, assert_clean, install, latest, toggle


def add_to_rubric(line: str) -> Step:
    def step(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={RUBRIC_MD: ctx.current_files[RUBRIC_MD] + f"\n{line}\n"}, rationale=f"add {line!r}"
        )

    return step


@pytest.mark.slow
def test_an_unknown_placeholder_is_a_guard_rejection_and_the_run_goes_on(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The red team's first case: a rule written with {{value}} passed every guard, was committed, then
    # failed every evaluation, resume and new run.
    strategy = ScriptedStrategy(
        [add_to_rubric("- The typed text must equal {{expected_text}}."), toggle(GOOD_ENTRY)]
    )
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    run, exps = latest(ws)
    assert run.status == "finished"
    assert [e.status for e in exps] == ["baseline", "guard_rejected", "kept"]
    assert "unknown placeholder {{expected_text}}" in (exps[1].reason or "")
    assert exps[1].commit_sha is None and set(gitops.rejected_refs(ws)) == set()
    # The strategy is told why: the reason is in the next proposal's history.
    assert "unknown placeholder {{expected_text}}" in strategy.contexts[1].history[0].reason
    assert "{{expected_text}}" not in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert_clean(ws)


@pytest.mark.slow
def test_a_broken_library_marker_and_an_invalid_judge_toml_are_guard_rejections(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_toml_key(
        ws,
        "optimizer",
        "allowed_files",
        '["prompts/judge.md", "prompts/rubric.md", "prompts/judge.toml"]\nstructure_moves = ["tiling"]',
    )  # judge.toml edits reach the structure guard
    commit_all(ws, "allow judge.toml")

    def drop_library_end(ctx: ProposalContext) -> Proposal:
        text = ctx.current_files[RUBRIC_MD]
        return Proposal(files={RUBRIC_MD: text.replace(LIBRARY_END + "\n", "", 1)}, rationale="drop a marker")

    def bad_toml(ctx: ProposalContext) -> Proposal:
        text = re.sub(r"(?m)^replicates = .*$", "replicates = -3", ctx.current_files[JUDGE_TOML])
        return Proposal(files={JUDGE_TOML: text}, rationale="toml")

    def not_toml(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={JUDGE_TOML: ctx.current_files[JUDGE_TOML] + "\n[[[ nonsense\n"}, rationale="toml"
        )

    install(monkeypatch, ScriptedStrategy([drop_library_end, bad_toml, not_toml, toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "4") == 0
    _, exps = latest(ws)
    assert [e.status for e in exps] == [
        "baseline",
        "guard_rejected",
        "guard_rejected",
        "guard_rejected",
        "kept",
    ]
    assert "library region is never closed" in (exps[1].reason or "")
    assert "judge.toml" in (exps[2].reason or "") and "replicates" in (exps[2].reason or "")
    assert "not valid TOML" in (exps[3].reason or "")
    assert_clean(ws)


@pytest.mark.slow
def test_resume_rolls_back_a_committed_candidate_that_cannot_be_evaluated(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The state an older judgeloop left: the bad candidate committed, the run dead before evaluating it.
    strategy = ScriptedStrategy([add_to_rubric("- Compare with {{value}}."), toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        with monkeypatch.context() as m:
            m.setattr("optimizer.loop.propose.validate", lambda *a, **k: None)

            async def killed(*args: object, **kwargs: object) -> None:
                raise RuntimeError("killed before the evaluation")

            m.setattr(LoopRunner, "evaluate_candidate", killed)
            with pytest.raises(RuntimeError):
                run_loop(ws, server.openai_base_url, "--max-experiments", "2")
        run, exps = latest(ws)
        assert run.status == "crashed" and exps[1].status == "running"
        assert gitops.rev_parse(ws, "HEAD") == exps[1].commit_sha  # the unusable commit is the branch tip
        capsys.readouterr()
        # No orphans: a plain run closes the crashed run first (its unusable candidate rolled back under
        # refs/judgeloop/rejected/<id>, the branch back at the last kept commit) and starts from that commit.
        crashed, bad, baseline_sha = run, exps[1], exps[0].commit_sha
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    out = capsys.readouterr().out
    assert f"closed run {crashed.id}" in out and "refs/judgeloop/rejected/" in out
    assert gitops.rev_parse(ws, f"refs/judgeloop/rejected/{bad.id}") == bad.commit_sha
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        old = next(e for e in led.experiments(crashed.id) if e.id == bad.id)
    assert old.status == "error" and "rolled back when the next command started" in (old.reason or "")
    run, exps = latest(ws)
    assert run.id != crashed.id and run.status == "finished"
    assert (
        exps[0].commit_sha == baseline_sha
    )  # the new run's baseline is the last kept commit, not the bad tip
    assert [e.status for e in exps] == ["baseline", "kept"]
    # Rolled back, not lost: the commit is preserved under the side ref, the branch moved on.
    assert bad.id in gitops.rejected_refs(ws)
    assert "{{value}}" not in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert_clean(ws)


@pytest.mark.slow
def test_paths_that_mean_something_else_are_refused_and_nothing_is_written_outside(
    ws: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.md"
    rubric = (ws / RUBRIC_MD).read_text(encoding="utf-8")

    def absolute(ctx: ProposalContext) -> Proposal:  # a code-level strategy wrote to /prompts/… before
        return Proposal(files={"/" + RUBRIC_MD: rubric + "\n- a rule\n"}, rationale="absolute")

    def dotdot(ctx: ProposalContext) -> Proposal:
        return Proposal(files={"prompts/../judgeloop.toml": "[loop]\nalpha = 1.0\n"}, rationale="escape")

    def far(ctx: ProposalContext) -> Proposal:
        return Proposal(files={str(outside): "x"}, rationale="far away")

    install(monkeypatch, ScriptedStrategy([absolute, dotdot, far, toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "4") == 0
    _, exps = latest(ws)
    assert [e.status for e in exps] == [
        "baseline",
        "guard_rejected",
        "guard_rejected",
        "guard_rejected",
        "kept",
    ]
    assert all("outside the allowed files" in (e.reason or "") for e in exps[1:4])
    assert not Path("/prompts").exists() and not outside.exists()
    assert "alpha = 1.0" not in (ws / "judgeloop.toml").read_text(encoding="utf-8")
    assert_clean(ws)


def test_allowed_files_outside_prompts_are_refused_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in (
        '["judgeloop.toml"]',
        '["prompts/../devset/small/labels.jsonl"]',
        '[".git/config"]',
        '["/etc/passwd"]',
    ):
        set_toml_key(ws, "optimizer", "allowed_files", bad)
        assert main(["run", "-w", str(ws), "--max-experiments", "1"]) == 2
        err = capsys.readouterr().err
        assert "allowed_files" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_symlink_or_hard_link_in_prompts_is_refused_and_the_target_is_untouched(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = ws / "devset" / "small" / "labels.jsonl"
    if labels.is_symlink():  # the small split is imported with --link
        labels = labels.resolve()
    before = labels.read_bytes()
    rubric = ws / RUBRIC_MD
    rubric.unlink()
    os.symlink(labels, rubric)
    commit_all(ws, "a person committed a link")
    for argv in (["run", "-w", str(ws), "--max-experiments", "1"], ["eval", "-w", str(ws)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "prompts/rubric.md is a symbolic link" in err and "Traceback" not in err
    assert labels.read_bytes() == before

    git(ws, "rm", "-q", RUBRIC_MD)
    rubric.write_text("# rubric\n", encoding="utf-8")
    os.link(rubric, ws / "shared-copy.md")
    assert main(["run", "-w", str(ws), "--max-experiments", "1"]) == 2
    assert "hard link" in capsys.readouterr().err


@pytest.mark.slow
def test_an_oversized_candidate_is_refused(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def huge(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={RUBRIC_MD: ctx.current_files[RUBRIC_MD] + "\n" + "- check it.\n" * 6000},
            rationale="a very long rubric",
        )

    monkeypatch.setattr("optimizer.loop.propose.check_candidate", lambda *a, **k: _ok())
    install(monkeypatch, ScriptedStrategy([huge]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    _, exps = latest(ws)
    assert exps[1].status == "guard_rejected"
    assert f"over the cap of {MAX_PROMPT_FILE_CHARS:,}" in (exps[1].reason or "")


def _ok() -> object:
    from optimizer.loop.guards import GuardResult

    return GuardResult(ok=True)
