"""Scripted loop runs: a test optimiser that plays a list of steps (`ScriptedStrategy`, `toggle`,
`priced`, `install`), hand edits, a held-out split, and what a test reads back (`latest`, `assert_clean`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from optimizer.devset.split import open_split
from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, parse_library, with_entries
from optimizer.ledger import Experiment, Ledger, Run
from optimizer.loop.strategies import Proposal, ProposalContext
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import git


def ledger_of(root: Path) -> Ledger:
    return Ledger(root / "experiments" / "ledger.sqlite")


def latest(root: Path) -> tuple[Run, list[Experiment]]:
    """(run, experiments) of the latest run."""
    with ledger_of(root) as led:
        run = led.latest_run()
        assert run is not None
        return run, led.experiments(run.id)


def assert_no_kept_candidate_raised_fpr(root: Path) -> None:
    """Every kept experiment, in every run, has FPR ≤ its parent's and kappa > its parent's."""
    with ledger_of(root) as led:
        for run in led.runs():
            for exp in led.experiments(run.id):
                if exp.status != "kept":
                    continue
                assert exp.parent_id is not None
                parent = led.get_experiment(exp.parent_id)
                assert exp.fpr is not None and parent.fpr is not None
                assert exp.fpr <= parent.fpr, f"kept experiment {exp.id} raised FPR"
                assert exp.kappa is not None and parent.kappa is not None and exp.kappa > parent.kappa


def assert_clean(root: Path) -> None:
    assert (
        git(root, "status", "--porcelain", "--untracked-files=all", "--", ".", ":!experiments").strip() == ""
    )


# -- scripted strategies ---------------------------------------------------------------------------

Step = Callable[[ProposalContext], Proposal]


class ScriptedStrategy:
    """A test optimiser: each call to ``propose`` runs the next step; it records every context."""

    name = "scripted"

    def __init__(self, steps: list[Step], server: FakeLLMServer | None = None) -> None:
        self.steps = list(steps)
        self.contexts: list[ProposalContext] = []
        self.request_counts: list[int] = []
        self.server = server

    async def propose(self, ctx: ProposalContext) -> Proposal:
        self.contexts.append(ctx)
        if self.server is not None:
            self.request_counts.append(len(self.server.inference_requests()))
        step = self.steps[min(len(self.contexts), len(self.steps)) - 1]
        return step(ctx)


def toggle(*enable: str) -> Step:
    """A proposal whose rubric enables exactly ``enable`` (library order)."""

    def step(ctx: ProposalContext) -> Proposal:
        library = parse_library((ctx.workspace_root / LIBRARY_MD).read_text(encoding="utf-8"))
        rubric = with_entries(ctx.current_files[RUBRIC_MD], library, list(enable))
        return Proposal(
            files={RUBRIC_MD: rubric}, rationale=f"enable exactly {', '.join(enable) or 'nothing'}"
        )

    return step


def priced(step: Step, cost_usd: float) -> Step:
    """``step`` with an optimiser cost attached (as if an LLM had been paid for it)."""

    def wrapped(ctx: ProposalContext) -> Proposal:
        proposal = step(ctx)
        proposal.cost_usd = cost_usd
        proposal.calls = 1
        return proposal

    return wrapped


def install(monkeypatch: pytest.MonkeyPatch, strategy: ScriptedStrategy) -> None:
    monkeypatch.setattr("optimizer.loop.session.make_strategy", lambda *a, **k: strategy)


def add_heldout_split(root: Path, n_held: int = 12) -> tuple[list[str], list[str]]:
    """Import ``n_held`` sample items outside the dev split as split ``held`` and list it under
    [workspace] heldout_splits; returns (dev ids, held-out ids)."""
    from optimizer.workspace.workspace import Workspace
    from tests.support.heldout import import_held

    dev = open_split(Workspace.open(root), "small").ids
    held = [t for t in open_split(Workspace.open(root), "sample").ids if t not in dev][:n_held]
    import_held(root, held)
    return dev, held


def hand_edit(root: Path, entry: str) -> str:
    """Append a library entry's text to the rubric, as a person would; return the new rubric text."""
    text = {e.id: e.text for e in parse_library((root / LIBRARY_MD).read_text(encoding="utf-8"))}[entry]
    rubric = root / RUBRIC_MD
    new = rubric.read_text(encoding="utf-8") + f"\n- {text}\n"
    rubric.write_text(new, encoding="utf-8")
    return new
