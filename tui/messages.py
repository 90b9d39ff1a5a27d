"""Every message the TUI passes between its threads, views and the app: one type per payload.

Loaded payloads go from a view's worker thread to the view itself (``bubble=False``: nothing else
wants them). Selection changes go from a view up to the app, which alone holds the selection
(``JudgeloopApp.experiment_id``, ``item_id``, ``compare_left``) and tells the current view when it
moved. Live snapshots and a watcher that had to stop go from the watcher thread to the app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from pathlib import Path

    from PIL.Image import Image
    from rich.text import Text

    from optimizer.errors import UserError
    from optimizer.ledger import Experiment, Review
    from tui.data import AllRuns, Comparison, CurvePoints, ExperimentDetail, Helped, History, RunSummary
    from tui.items import Disagreement, ItemDetail, SuspectQueue
    from tui.watch import LiveState

# ---------------------------------------------------------------------------------------------
# Loaded payloads: a view's worker → the view


@dataclass
class HistoryLoaded(Message, bubble=False):
    """The history's rows with their cells (built in the worker, no markup parsing on the UI thread)
    and the curves' points."""

    history: History
    cells: dict[int, tuple[Text, ...]]
    points: CurvePoints


@dataclass
class ExperimentLoaded(Message, bubble=False):
    detail: ExperimentDetail


@dataclass
class DisagreementsLoaded(Message, bubble=False):
    experiment: Experiment
    items: list[Disagreement]


@dataclass
class ItemLoaded(Message, bubble=False):
    detail: ItemDetail


@dataclass
class StepDecoded(Message, bubble=False):
    """A step's screenshot, decoded off the UI thread (``image`` None: no file, or it could not be read)."""

    index: int
    image: Image | None
    path: Path | None


@dataclass
class ReviewsLoaded(Message, bubble=False):
    reviews: list[Review]


@dataclass
class SuspectsLoaded(Message, bubble=False):
    queue: SuspectQueue


@dataclass
class ComparisonLoaded(Message, bubble=False):
    """Two experiments side by side; ``comparison`` None: the right one is the baseline and nothing
    is marked to compare it with."""

    comparison: Comparison | None


@dataclass
class HelpedLoaded(Message, bubble=False):
    """The kept edits with their cells (bars scaled together) and each one's diff."""

    helped: Helped
    cells: dict[int, tuple[Text, ...]]
    diffs: dict[int, str] = field(default_factory=dict)


@dataclass
class RunsListed(Message, bubble=False):
    """Every run for the run picker, newest first."""

    summaries: list[RunSummary]


@dataclass
class AllRunsLoaded(Message, bubble=False):
    """Every run's experiments for the runs-side-by-side view, with their cells (built in the worker)."""

    all_runs: AllRuns
    cells: dict[int, tuple[Text, ...]]


# ---------------------------------------------------------------------------------------------
# Selection: a view → the app


@dataclass
class ExperimentSelected(Message):
    """The user moved to an experiment (a row highlighted or opened). The app's selection follows;
    with ``switch_to``, the app then shows that view."""

    experiment_id: int
    switch_to: str | None = None


@dataclass
class ItemSelected(Message):
    """The user opened an item, under ``experiment_id`` (None: under the selected experiment)."""

    trajectory_id: str
    experiment_id: int | None = None
    switch_to: str | None = "item"


@dataclass
class RunPicked(Message):
    """The user picked the run the history shows (None: the latest); with ``switch_to``, the app then
    shows that view."""

    run_id: str | None
    switch_to: str | None = "history"


@dataclass
class CompareMarked(Message):
    """The user marked an experiment as the left side of the compare view."""

    experiment_id: int


# ---------------------------------------------------------------------------------------------
# Following the run: the watcher thread → the app


class LiveUpdate(Message):
    """A new cumulative snapshot of the live run. A newer one replaces an older one still queued,
    so a burst of ledger events is one repaint (the toolong pattern)."""

    def __init__(self, state: LiveState) -> None:
        super().__init__()
        self.state = state

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LiveUpdate)


@dataclass
class WatchFailed(Message):
    """The watcher found a ledger it cannot read (not "not ready yet": a real problem) and stopped."""

    error: UserError
