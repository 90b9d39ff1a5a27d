"""Stacking sub-threshold candidates (`[loop] stack`) through `judgeloop run` (real openai SDK, fake server,
a deterministic judge): small fixes each rolled back alone are pooled, merged with git's three-way merge and
kept together; a harmful edit in the pool sinks its merge and is never carried into a keep; `--resume`
keeps the pool; the strategies' history shows a pooled candidate as "pointed the right way, pooled"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Experiment
from optimizer.loop.stack import STACK
from optimizer.loop.strategies import POOLED, Proposal, ProposalContext
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, commit_all, git, present, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, Step, assert_clean, install, latest, ledger_of

# Each fix is a line under its own heading of rubric.md (apart, so git merges them cleanly) and makes two
# more of the judge's wrongly judged negatives right: alone a gain of 2 items (sign-flip p = 0.25, rolled
# back); three together 6 items (p = 1/64, kept at alpha 0.1).
FIXES = {
    "A": "## What counts as success",
    "B": "### Critical Mistake",
    "C": "### Bad Side Effect",
    "H": "### Misunderstanding of the Instruction",
}


def marker(name: str) -> str:
    return f"STACK-FIX-{name}"


@dataclass
class StackJudge(FakeJudge):
    """`FakeJudge` (base: 9 of 16 negatives right) plus the planted fixes: A, B and C each make two more
    negatives right; H alone makes the last wrong negative right (it points the right way), but with any
    other fix in the prompt it turns six right negatives into false positives (a harmful edit whose harm
    only shows in the merge)."""

    def enabled_in(self, system: str) -> set[str]:
        return super().enabled_in(system) | {name for name in FIXES if marker(name) in system}

    def correct(self, tid: str, enabled: set[str]) -> bool:
        if tid not in self.neg_rank:
            return super().correct(tid, enabled)
        rank, base = self.neg_rank[tid], self.limits["base_neg"]
        if "H" in enabled and enabled & {"A", "B", "C"} and rank < 6:
            return False
        for k, name in enumerate(("A", "B", "C")):
            if name in enabled and base + 2 * k <= rank < base + 2 * k + 2:
                return True
        if "H" in enabled and rank == base + 6:
            return True
        return rank < base


def fix(name: str, *, stop_after: bool = False) -> Step:
    """A proposal adding fix ``name``'s line under its heading; ``stop_after``: also leave experiments/STOP,
    as a person would, so the run stops once this candidate is settled."""

    def step(ctx: ProposalContext) -> Proposal:
        heading = FIXES[name]
        text = ctx.current_files[RUBRIC_MD]
        assert heading in text
        new = text.replace(heading, f"{heading}\n\nRead {marker(name)} closely before you decide.", 1)
        if stop_after:
            (ctx.workspace_root / "experiments" / "STOP").write_text("", encoding="utf-8")
        return Proposal(files={RUBRIC_MD: new}, rationale=f"fix {name}: a small, specific reading rule")

    return step


@pytest.fixture
def stack_ws(ws: Path) -> Path:
    set_toml_key(ws, "loop", "futility", "false")  # futility's early rollbacks are never pooled
    set_toml_key(ws, "loop", "stack", "3")
    commit_all(ws, "stack 3, futility off")
    return ws


def by_strategy(exps: list[Experiment], name: str) -> list[Experiment]:
    return [e for e in exps if e.strategy == name]


@pytest.mark.slow
def test_three_small_fixes_rolled_back_alone_are_pooled_merged_and_kept_together(
    stack_ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    strategy = ScriptedStrategy([fix("A"), fix("B"), fix("C"), fix("A")])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=StackJudge(stack_ws)) as server:
        assert run_loop(stack_ws, server.openai_base_url, "--max-experiments", "4") == 0
    run, exps = latest(stack_ws)
    base, a, b, c, merged = exps
    for part in (a, b, c):  # each alone: a real gain of 2 items, which the exact bound shows cannot clear
        assert part.status == "rolled_back" and "could not be significant" in (part.reason or ""), part.reason
        assert part.pooled_on == base.id and "pooled for stacking" in (part.reason or "")
        assert git(stack_ws, "rev-parse", f"refs/judgeloop/rejected/{part.id}").strip()
    # The fourth candidate is the merge, not the strategy's: asked three times only.
    assert len(strategy.contexts) == 3
    assert merged.strategy == STACK and merged.parent_id == base.id, merged.reason
    assert merged.status == "kept", merged.reason
    assert merged.carries == [a.id, b.id, c.id] and merged.proposal_meta["stack"]["left_out"] == {}
    assert merged.pooled_on is None
    rubric = git(stack_ws, "show", f"{run.branch}:{RUBRIC_MD}")
    assert all(marker(n) in rubric for n in "ABC") and marker("H") not in rubric
    message = git(stack_ws, "log", "-1", "--format=%B", run.branch)
    assert f"Judgeloop-Carries: {a.id}, {b.id}, {c.id}" in message and "Judgeloop-Decision: kept" in message
    # The strategy saw the pooled candidates as a direction to build on.
    seen = {p.id: p.decision for p in strategy.contexts[2].history}
    assert seen == {a.id: POOLED, b.id: POOLED}
    # The history and the report say which candidates were pooled and what the merged keep carries.
    capsys.readouterr()
    assert main(["history", "-w", str(stack_ws)]) == 0
    history = capsys.readouterr().out
    assert history.count(" pooled ") == 3 and "kept (stacked)" in history, history
    assert main(["report", "-w", str(stack_ws)]) == 0
    report = capsys.readouterr().out
    assert f"KEPT (STACKED)  commit {present(merged.commit_sha)[:10]}" in report, report
    assert f"carries #{a.id}, #{b.id}, #{c.id}" in report and "(scripted) POOLED" in report, report
    # `attribute` measures the merged keep's parts as separate edits, each by reverting its own commit.
    with FakeLLMServer(default=StackJudge(stack_ws)) as server:
        args = ["--provider", "openai", "--base-url", server.openai_base_url, "--model", "fake-judge"]
        assert main(["attribute", "-w", str(stack_ws), "--run", run.id, *args]) == 0
    with ledger_of(stack_ws) as led:
        attribution = present(led.latest_attribution(run.id))
    parts = {e.experiment: e for e in attribution.edits}
    assert set(parts) == {a.id, b.id, c.id}, attribution
    assert all(present(e.items) > 0 and len(e.fixed) == 2 and not e.broken for e in parts.values()), (
        attribution
    )
    assert_clean(stack_ws)


@pytest.mark.slow
def test_a_harmful_edit_in_the_pool_sinks_its_merge_and_is_never_carried_into_a_keep(
    stack_ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(monkeypatch, ScriptedStrategy([fix("A"), fix("H"), fix("B"), fix("C")]))
    with FakeLLMServer(default=StackJudge(stack_ws)) as server:
        assert run_loop(stack_ws, server.openai_base_url, "--max-experiments", "5") == 0
    run, exps = latest(stack_ws)
    base, a, h, b, merged, c = exps
    assert [e.pooled_on for e in (a, h, b)] == [base.id] * 3, [e.reason for e in (a, h, b)]
    assert merged.strategy == STACK and merged.carries == [a.id, h.id, b.id]
    assert merged.status == "rolled_back" and "FPR rose" in (merged.reason or ""), merged.reason
    assert merged.pooled_on is None  # a merge is never pooled again
    # The merge used the pool up: C starts a new pool (one member, nothing merged).
    assert c.strategy != STACK and c.pooled_on == base.id
    kept = [e for e in exps if e.status == "kept"]
    assert all(h.id not in e.carries for e in kept)
    assert marker("H") not in git(stack_ws, "show", f"{run.branch}:{RUBRIC_MD}")
    assert_clean(stack_ws)


@pytest.mark.slow
def test_resume_keeps_the_pool(stack_ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, ScriptedStrategy([fix("A"), fix("B", stop_after=True)]))
    with FakeLLMServer(default=StackJudge(stack_ws)) as server:
        assert run_loop(stack_ws, server.openai_base_url, "--max-experiments", "4") == 0
        run, exps = latest(stack_ws)
        assert run.status == "stopped" and len(exps) == 3, run.stop_reason
        install(monkeypatch, ScriptedStrategy([fix("C")]))
        assert run_loop(stack_ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(stack_ws)
    base, a, b, c, merged = exps
    assert [e.pooled_on for e in (a, b, c)] == [base.id] * 3
    assert merged.strategy == STACK and merged.status == "kept", merged.reason
    assert merged.carries == [a.id, b.id, c.id]
    assert_clean(stack_ws)
