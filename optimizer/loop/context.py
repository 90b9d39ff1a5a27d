"""What every room of a candidate's life cycle shares (`RunContext`): the workspace, the ledger, the
run and its split and labels, its `RunSettings`, the listener, the stop request, and the run's spend
(US dollars) against its judge budget. The rooms (`optimizer.loop.propose`, `evaluate`, `settle`,
`waves`, `costs`) take this small object, not the runner; the runner only loops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from optimizer.devset.split import Split
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.stopping import StopRequest
from optimizer.events import Listener, Message, StageChanged, ignore
from optimizer.ledger import Ledger, Run
from optimizer.loop.guards import DevMaterial
from optimizer.loop.progress import WaveProgress
from optimizer.models import Label
from optimizer.runsettings import Limits, RunSettings
from optimizer.stats.decision import lord_level
from optimizer.vocab import TESTED_STATUSES, StageKind
from optimizer.workspace.config import experiment_seed
from optimizer.workspace.workspace import Workspace


@dataclass
class RunContext:
    """One run as its rooms see it. ``spent_usd``: the run's spend so far (judge and optimiser, US
    dollars); ``budget_exhausted``: why the judge budget cannot pay for another call, once it cannot."""

    ws: Workspace
    ledger: Ledger
    run: Run
    split: Split
    labels: dict[str, Label]
    settings: RunSettings
    events: Listener = ignore
    # Set by a Ctrl-C or SIGTERM (`optimizer.cli.signals`), or by any caller: no new judge call starts.
    stop: StopRequest = field(default_factory=StopRequest)
    spent_usd: float = 0.0
    started: float = field(default_factory=time.monotonic)
    budget_exhausted: str | None = None
    wave_line: WaveProgress | None = None  # while a wave is judged: its one progress line
    reads_seen: bool = False  # some pass of this run was billed cache reads
    silent_passes: int = 0  # passes below plan before any read was billed (`evaluate.cache_telemetry`)
    guard_cache: DevMaterial | None = None  # `propose.guard_inputs`, built once per run
    _budget: Budget | None = None

    @property
    def root(self) -> Path:
        return self.ws.root

    @property
    def limits(self) -> Limits:
        """The run's own limits (a call may pass others to the engine: `LoopRunner.candidate`)."""
        return self.settings.limits

    @property
    def interrupted(self) -> bool:
        return self.stop.is_set()

    def budget(self) -> Budget | None:
        """The run's judge budget (``--budget-usd``), shared by every pass; None without one."""
        if self.settings.limits.budget_usd is None:
            return None
        if self._budget is None:
            self._budget = Budget(self.settings.limits.budget_usd, spent_usd=self.spent_usd)
        return self._budget

    def raise_budget(self, usd: float, *, by: str, via: str) -> None:
        """Raise the run's judge budget by ``usd`` (US dollars), as ``by`` decided (asked ``via``): the one
        place a budget changes mid-run. The ledger's ``runs.budgets`` (the new total and the top-up), the
        run's limits, the shared `Budget` and the budget stop all follow. The caller checked the amount."""
        if self.settings.limits.budget_usd is None:
            raise RuntimeError("a run without a judge budget has none to raise")
        self.run = self.ledger.record_budget_top_up(self.run.id, usd, by=by, via=via)
        total = self.settings.limits.budget_usd + usd
        self.settings = replace(self.settings, limits=replace(self.settings.limits, budget_usd=total))
        if self._budget is not None:
            self._budget.max_usd = total
        self.budget_exhausted = (
            None  # the stop was this budget's; the next call is measured against the new one
        )

    def charge(self, cost_usd: float) -> None:
        """Count optimiser spending (US dollars) against the run's spend and the judge budget."""
        self.spent_usd += cost_usd
        if self._budget is not None:
            self._budget.spent_usd += cost_usd

    def count_judged(self, cost_usd: float) -> None:
        """Count judge spending (US dollars) in the run's spend; the budget reserved it already."""
        self.spent_usd += cost_usd

    def say(self, message: str) -> None:
        """A line for the person following the run (the CLI prints it on stdout)."""
        self.events(Message(message))

    def stage(self, name: StageKind, experiment_id: int | None = None, **details: Any) -> None:
        """A `StageChanged` event in the ledger (the TUI's live strip; a resume reads the last one);
        ``details``: its fields for this stage (an unknown name is a TypeError)."""
        self.ledger.add_event(self.run.id, StageChanged(name, **details), experiment_id=experiment_id)

    def decision_seed(self, experiment_id: int) -> int:
        """The seed of a candidate's Monte Carlo p-value (used only when the exact one is out of
        reach), stored with the decision so it replays."""
        return experiment_seed(self.settings.seed, experiment_id)

    def test_level(self) -> float:
        """The level the next candidate is tested at: ``[loop] alpha``, or with ``[loop] fdr`` the
        LORD++ level given this run's earlier tested candidates (`optimizer.stats.decision.lord_level`)."""
        loop = self.settings.loop
        if loop.fdr is None:
            return loop.alpha
        past = [
            e.status == "kept"
            for e in self.ledger.experiments(self.run.id)
            if e.seq > 0 and e.alpha is not None and e.status in TESTED_STATUSES
        ]
        return lord_level(loop.fdr, past)
