"""``judgeloop run --strategy manual``: a person's own edit judged like an optimiser's candidate.

Same fixtures as test_loop_run.py (a 32-item dev split, the deterministic fake judge, the real
openai SDK). The fake judge answers by which library entries' texts appear in its system prompt, so
pasting an entry's text into the rubric by hand is a hand edit with a known effect.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer import gitops
from optimizer.cli import main
from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, parse_library
from tests.fakeserver import FakeLLMServer
from tests.loop.helpers import BAD_ENTRY, GOOD_ENTRY, FakeJudge, git, run_loop
from tests.loop.test_loop_run import assert_clean, latest


def hand_edit(root: Path, entry: str) -> str:
    """Append a library entry's text to the rubric, as a person would; return the new rubric text."""
    text = {e.id: e.text for e in parse_library((root / LIBRARY_MD).read_text(encoding="utf-8"))}[entry]
    rubric = root / RUBRIC_MD
    new = rubric.read_text(encoding="utf-8") + f"\n- {text}\n"
    rubric.write_text(new, encoding="utf-8")
    return new


def test_a_good_hand_edit_is_judged_and_kept_with_its_message(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = hand_edit(ws, GOOD_ENTRY)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual", "-m", "check typed text exactly") == 0
    out = capsys.readouterr().out
    run, exps = latest(ws)
    assert run.strategy == "manual" and run.status == "finished"
    assert [(e.seq, e.status) for e in exps] == [(0, "baseline"), (1, "kept")]
    assert exps[1].strategy == "manual" and exps[1].rationale == "check typed text exactly"
    assert exps[1].fpr < exps[0].fpr
    assert "your edit was kept" in out
    assert gitops.rev_parse(ws, "HEAD") == gitops.rev_parse(ws, run.branch) == exps[1].commit_sha
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new  # the edit is the committed incumbent now
    saved = ws / str(run.budgets["manual_edit"])
    assert (saved / RUBRIC_MD).read_text(encoding="utf-8") == new
    assert_clean(ws)


def test_a_hand_edit_that_raises_fpr_is_rolled_back_and_kept_under_the_rejected_ref(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (ws / RUBRIC_MD).read_text(encoding="utf-8")
    new = hand_edit(ws, BAD_ENTRY)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual") == 0
    out = capsys.readouterr().out
    run, exps = latest(ws)
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


def test_a_stopped_manual_run_resumes_with_the_saved_edit(ws: Path) -> None:
    new = hand_edit(ws, GOOD_ENTRY)
    (ws / "experiments").mkdir(exist_ok=True)
    (ws / "experiments" / "STOP").write_text("", encoding="utf-8")  # stop right after the baseline
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual") == 0
        run, exps = latest(ws)
        assert run.status == "stopped" and [e.status for e in exps] == ["baseline"]
        assert (ws / RUBRIC_MD).read_text(encoding="utf-8") != new  # reset; the edit lives in the saved copy
        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == new
