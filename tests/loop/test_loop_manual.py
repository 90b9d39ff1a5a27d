"""``judgeloop run --strategy manual``: a person's own edit judged like an optimiser's candidate.

Same fixtures as test_loop_run.py (a 32-item dev split, the deterministic fake judge, the real
openai SDK). The fake judge answers by which library entries' texts appear in its system prompt, so
pasting an entry's text into the rubric by hand is a hand edit with a known effect.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.events import Event, Message, StopKind, said_lines
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.loop.session import RunOptions, start_run
from optimizer.workspace import gitops
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, git, present, run_loop
from tests.support.scripted import assert_clean, hand_edit, latest


@pytest.mark.slow
def test_a_good_hand_edit_is_judged_and_kept_with_its_message(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = hand_edit(ws, GOOD_ENTRY)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert (
            run_loop(ws, server.openai_base_url, "--strategy", "manual", "-m", "check typed text exactly")
            == 0
        )
    out = capsys.readouterr().out
    run, exps = latest(ws)
    assert run.strategy == "manual" and run.status == "finished"
    assert [(e.seq, e.status) for e in exps] == [(0, "baseline"), (1, "kept")]
    assert exps[1].strategy == "manual" and exps[1].rationale == "check typed text exactly"
    assert present(exps[1].fpr) < present(exps[0].fpr)
    assert "your edit was kept" in out
    assert gitops.rev_parse(ws, "HEAD") == gitops.rev_parse(ws, run.branch) == exps[1].commit_sha
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new  # the edit is the committed incumbent now
    saved = ws / str(run.budgets["manual_edit"])
    assert (saved / RUBRIC_MD).read_text(encoding="utf-8") == new
    assert_clean(ws)


@pytest.mark.slow
def test_a_hand_edit_that_raises_fpr_is_rolled_back_and_kept_under_the_rejected_ref(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (ws / RUBRIC_MD).read_text(encoding="utf-8")
    new = hand_edit(ws, BAD_ENTRY)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual") == 0
    out = capsys.readouterr().out
    _run, exps = latest(ws)
    assert [(e.seq, e.status) for e in exps] == [(0, "baseline"), (1, "rolled_back")]
    assert exps[1].rationale == f"a hand edit of {RUBRIC_MD}"
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == before  # the tree is back on the incumbent
    assert git(ws, "show", f"refs/judgeloop/rejected/{exps[1].id}:{RUBRIC_MD}") == new
    assert f"git checkout refs/judgeloop/rejected/{exps[1].id} -- prompts/" in out
    assert_clean(ws)


def test_manual_needs_an_edit_of_the_allowed_files_and_nothing_else(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "-w", str(ws), "--strategy", "manual"]) == 2
    assert "no edit to judge: change prompts/judge.md or prompts/rubric.md" in capsys.readouterr().err

    new = hand_edit(ws, GOOD_ENTRY)
    (ws / "judgeloop.toml").write_text((ws / "judgeloop.toml").read_text() + "\n# a stray edit\n")
    assert main(["run", "-w", str(ws), "--strategy", "manual"]) == 2
    err = capsys.readouterr().err
    assert "changes outside the loop's files (judgeloop.toml)" in err and "Traceback" not in err
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new  # refused before touching the edit
    assert not (ws / "experiments" / "manual").exists()


def _stop_after_baseline(root: Path) -> Callable[[Event], None]:
    """An events listener that creates experiments/STOP once the baseline is reported (during the run)."""

    def listen(event: Event) -> None:
        if isinstance(event, Message) and "baseline kappa=" in event.text:
            (root / "experiments" / "STOP").write_text("", encoding="utf-8")

    return listen


@pytest.mark.slow
def test_a_manual_run_stopped_before_the_candidate_puts_the_edit_back_and_resume_judges_it(ws: Path) -> None:
    new = hand_edit(ws, GOOD_ENTRY)
    said: list[Event] = []
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        judge = JudgeOverrides(
            provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
        )
        listen = _stop_after_baseline(ws)

        def on_event(e: Event) -> None:
            said.append(e)
            listen(e)

        outcome = start_run(Workspace.open(ws), RunOptions(strategy="manual", judge=judge), on_event)
        assert outcome.stop.kind is StopKind.STOP_FILE
        run, exps = latest(ws)
        assert run.status == "stopped" and [e.status for e in exps] == ["baseline"]
        # Not judged, so not gone: the edit is back in the working tree, and the run says so.
        assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new
        lines = said_lines(said)
        assert any(
            "the run ended before judging it; your edit is back in prompts/rubric.md" in t for t in lines
        )
        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new


@pytest.mark.slow
def test_a_leftover_stop_file_is_removed_with_a_message_and_the_edit_is_judged(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The red team's case: `s` in the TUI with no run going left experiments/STOP behind.
    new = hand_edit(ws, GOOD_ENTRY)
    (ws / "experiments").mkdir(exist_ok=True)
    (ws / "experiments" / "STOP").write_text("stop requested from the TUI\n", encoding="utf-8")
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual") == 0
    out = capsys.readouterr().out
    assert "removed a leftover experiments/STOP (it predates this run)" in out
    _run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "kept"]
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new
    assert not (ws / "experiments" / "STOP").exists()


@pytest.mark.slow
def test_a_manual_edit_the_guards_reject_goes_back_into_the_working_tree(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rubric = ws / RUBRIC_MD
    new = rubric.read_text(encoding="utf-8") + "\n- Compare the typed text with {{expected_text}} exactly.\n"
    rubric.write_text(new, encoding="utf-8")
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual") == 0
    out = capsys.readouterr().out
    _run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "guard_rejected"]
    assert "unknown placeholder {{expected_text}}" in (exps[1].reason or "")
    assert rubric.read_text(encoding="utf-8") == new
    assert "your edit is back in prompts/rubric.md" in out


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda t: t.replace('exactly one of "low", "medium", "high"', 'any of "low", "medium", "high"'),
            "prompts/judge.md edits protected region 1 (starting at line ",
        ),
        (
            lambda t: t.replace("<!-- judgeloop:protected:end -->\n", ""),
            "prompts/judge.md removes a protection marker <!-- judgeloop:protected:end -->",
        ),
        (
            lambda t: t.replace("{{rubric}}", "{{rubric}}\n<!-- judgeloop:protected:begin -->"),
            "prompts/judge.md adds a protection marker <!-- judgeloop:protected:begin -->",
        ),
    ],
    ids=["edit-inside", "drop-marker", "add-marker"],
)
@pytest.mark.slow
def test_a_hand_edit_of_a_protected_region_is_refused_before_the_run_starts_and_kept(
    ws: Path, capsys: pytest.CaptureFixture[str], edit: Callable[[str], str], expected: str
) -> None:
    judge_md = ws / "prompts" / "judge.md"
    before_head = gitops.rev_parse(ws, "HEAD")
    new_judge = edit(judge_md.read_text(encoding="utf-8"))
    assert new_judge != judge_md.read_text(encoding="utf-8")
    judge_md.write_text(new_judge, encoding="utf-8")
    new_rubric = hand_edit(
        ws, GOOD_ENTRY
    )  # an allowed edit alongside does not carry the protected one through
    capsys.readouterr()
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual", "-m", "tweak the contract") == 2
        assert server.requests == []  # no baseline, no judge call: refused up front
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err.count("\n") == 1
    assert expected in err
    assert "git diff prompts/judge.md" in err and "run again" in err
    assert "run " not in out  # no run was announced
    # The edit is still in the working tree, untouched; nothing was saved, committed or branched.
    assert judge_md.read_text(encoding="utf-8") == new_judge
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new_rubric
    assert gitops.rev_parse(ws, "HEAD") == before_head
    assert git(ws, "branch", "--list", "judgeloop/*").strip() == ""
    assert not (ws / "experiments" / "manual").exists()


def test_a_hand_edit_of_judge_md_around_its_protected_region_is_not_refused(ws: Path) -> None:
    # The up-front check is the protected guard, not a ban on judge.md: text before and after the
    # region may change (and the region may move down) — the edit is saved for the run as usual.
    from optimizer.loop.strategies.manual import capture_edits

    judge_md = ws / "prompts" / "judge.md"
    text = judge_md.read_text(encoding="utf-8")
    new = text.replace("{{rubric}}", "Read every step before you answer.\n\n{{rubric}}") + "\nBe brief.\n"
    judge_md.write_text(new, encoding="utf-8")
    folder = capture_edits(ws, ws / "experiments", ["prompts/judge.md", "prompts/rubric.md"], None)
    assert (folder / "prompts" / "judge.md").read_text(encoding="utf-8") == new
    assert judge_md.read_text(encoding="utf-8") == text  # reset to HEAD for the run, as before
