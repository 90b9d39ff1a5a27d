"""Cheaper, not worse, and max_cost_ratio through the real loop (fake judge over HTTP, billed by size)."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.judge.prompts import JUDGE_MD, RUBRIC_MD
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.loop.strategies.tools import ToolState, run_tool
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import (
    BAD_ENTRY,
    FakeJudge,
    add_small_dev_split,
    commit_all,
    labels_of,
    make_workspace,
    run_loop,
)
from tests.support.panel import member_text, write_members
from tests.support.scripted import ScriptedStrategy, install, latest, toggle

# Generic text that makes every request several times dearer; dropping it changes no verdict of the fake judge.
FILLER = (
    "\n## Reading\n\n" + "Read the whole trajectory with care before you decide on a verdict. " * 500 + "\n"
)


def add_keys(root: Path, section: str, text: str) -> None:
    """Put ``text`` (TOML lines) at the top of ``[section]`` of judgeloop.toml."""
    path = root / "judgeloop.toml"
    path.write_text(
        re.sub(rf"(?m)^\[{section}\]\n", f"[{section}]\n{text}\n", path.read_text(encoding="utf-8"), count=1),
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_workspace(
        tmp_path_factory.mktemp("template"), toml_extra='[prices."fake-judge"]\ninput = 1.0\noutput = 1.0\n'
    )
    add_small_dev_split(root)
    rubric = root / RUBRIC_MD
    rubric.write_text(rubric.read_text(encoding="utf-8") + FILLER, encoding="utf-8")
    commit_all(root, "a costly rubric")
    return root


def drop_filler(*enable: str) -> Callable[[ProposalContext], Proposal]:
    def step(ctx: ProposalContext) -> Proposal:
        proposal = toggle(*enable)(ctx)
        return Proposal(
            files={RUBRIC_MD: proposal.files[RUBRIC_MD].replace(FILLER, "\n")},
            rationale=f"drop the reading filler{', enable ' + ', '.join(enable) if enable else ''}",
        )

    return step


@pytest.mark.slow
def test_a_cheaper_equal_candidate_is_kept_as_cheaper_and_fpr_still_vetoes(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_keys(ws, "loop", "cheaper_margin_items = 1\ncheaper_min_saving = 0.2")
    commit_all(ws, "cheaper on")
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy([drop_filler(BAD_ENTRY), drop_filler()], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    run, exps = latest(ws)
    base, fpr_up, cheaper = exps
    assert (fpr_up.status, fpr_up.keep_kind) == ("rolled_back", None)
    assert fpr_up.reason is not None and "FPR rose" in fpr_up.reason
    assert (cheaper.status, cheaper.keep_kind) == ("kept", "cheaper")
    assert cheaper.reason is not None and "kept as cheaper, not worse" in cheaper.reason
    assert cheaper.kappa == base.kappa and cheaper.fpr == base.fpr
    assert base.verdict_cost_usd is not None and cheaper.verdict_cost_usd is not None
    assert cheaper.verdict_cost_usd < 0.8 * base.verdict_cost_usd
    # The cheaper candidate was judged in full (no kappa early stop) and shows as cheaper everywhere.
    assert cheaper.items_evaluated == 32 and not cheaper.early_stopped
    capsys.readouterr()
    assert main(["report", "-w", str(ws)]) == 0
    text = capsys.readouterr().out
    assert f"#{cheaper.id} (scripted) KEPT (CHEAPER)" in text
    assert "also for cheaper-not-worse" in text
    tsv = Path(ws / "experiments" / "runs" / run.id / "experiments.tsv")
    rows = {r["id"]: r for r in csv.DictReader(tsv.open(encoding="utf-8"), delimiter="\t")}
    assert rows[str(cheaper.id)]["keep_kind"] == "cheaper" and rows[str(base.id)]["keep_kind"] == ""


@pytest.mark.slow
def test_max_cost_ratio_refuses_a_dearer_candidate_before_any_judge_call(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_keys(ws, "optimizer", "max_cost_ratio = 1.2")
    commit_all(ws, "cost cap")

    def double(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={
                RUBRIC_MD: ctx.current_files[RUBRIC_MD] + "\n" + "Check each step against the goal. " * 600
            },
            rationale="read twice as much",
        )

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy([double], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    _, exps = latest(ws)
    assert exps[1].status == "guard_rejected" and exps[1].calls == 0
    assert exps[1].reason is not None and re.search(
        r"estimated at \d\.\d\dx the incumbent's cost per verdict, over \[optimizer\] max_cost_ratio 1\.2",
        exps[1].reason,
    )


def set_move(*moves: tuple[str, object]) -> Callable[[ProposalContext], Proposal]:
    """Structure moves as the agent's tool makes them (set_structure on the tool state)."""

    def step(ctx: ProposalContext) -> Proposal:
        state = ToolState(ctx)
        for key, value in moves:
            out = run_tool(state, "set_structure", {"key": key, "value": value})
            assert not out.is_error, out
        return Proposal(files=state.changed_files(), rationale=f"moves {moves}")

    return step


def estimated_ratio(reason: str | None) -> float:
    assert reason is not None
    m = re.search(
        r"estimated at (\d+\.\d\d)x the incumbent's cost per verdict, over \[optimizer\] max_cost_ratio",
        reason,
    )
    assert m is not None, reason
    return float(m.group(1))


@pytest.mark.slow
def test_max_cost_ratio_counts_every_call_of_a_structure_before_any_judge_call(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any estimated rise is over the cap: each structure's estimate shows in its refusal.
    add_keys(
        ws,
        "optimizer",
        'max_cost_ratio = 1.0\nstructure_moves = ["panel.members", "panel.vote", "structure", '
        '"review"]\nmax_members = 3',
    )
    commit_all(ws, "cost cap, structure moves on")
    steps = [
        set_move(("panel.members", 3), ("panel.vote", "unanimous")),
        set_move(("structure", "criteria")),
        set_move(("review", "success")),
    ]
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy(steps, server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3", "--patience", "9") == 0
        judge_requests = len(server.requests)
    _, exps = latest(ws)
    assert [(e.status, e.calls) for e in exps[1:]] == [("guard_rejected", 0)] * 3
    assert judge_requests == exps[0].calls  # only the baseline reached the judge
    panel, criteria, review = (estimated_ratio(e.reason) for e in exps[1:])
    # Three members with the incumbent's instructions, each reading the cached trajectory: 3 calls' worth.
    assert panel == pytest.approx(3.0, abs=0.01)
    # The check call (the incumbent's call plus the criteria block) and a derivation from the instruction alone.
    assert criteria > 1.0
    # A review call (the trajectory with the review's own, shorter instructions) on half the verdicts (the
    # split's positive share): more than the incumbent, less than a second full call on each positive.
    labels = list(labels_of(ws).values())
    share = sum(1 for lab in labels if lab.is_positive) / len(labels)
    assert 1.0 < review < 1 + share


@pytest.mark.slow
def test_the_estimate_reads_each_named_members_own_instructions(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hostile: a member file padded far beyond judge.md cannot hide behind the others' size.
    write_members(ws, ("a", "b"))
    (ws / "prompts" / "members" / "big.md").write_text(
        member_text((ws / JUDGE_MD).read_text(encoding="utf-8"), "big") + FILLER, encoding="utf-8"
    )
    add_keys(
        ws,
        "optimizer",
        'max_cost_ratio = 1.0\nstructure_moves = ["panel.members", "panel.vote"]\nmax_members = 3',
    )
    commit_all(ws, "members, moves on")
    steps = [
        set_move(("panel.members", ["a", "b"]), ("panel.vote", "unanimous")),
        set_move(("panel.members", ["a", "big"]), ("panel.vote", "unanimous")),
    ]
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        install(monkeypatch, ScriptedStrategy(steps, server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2", "--patience", "9") == 0
    _, exps = latest(ws)
    assert [(e.status, e.calls) for e in exps[1:]] == [("guard_rejected", 0)] * 2
    plain, padded = (estimated_ratio(e.reason) for e in exps[1:])
    # Two members of judge.md's length (one line longer): two single calls' worth.
    assert plain == pytest.approx(2.0, abs=0.05)
    # The padded member carries the rubric's filler and its own copy of it: the pair is well over 2x.
    assert padded > plain + 0.5
