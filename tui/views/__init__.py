"""The views: history, every run side by side, experiment, disagreements, item, reviews, compare, what helped, label suspects, help — one module each.

Each view loads its data in a thread worker (``exclusive=True`` in a named group, so a newer load
cancels an older one) that posts a message back; the handler fills the widgets. Nothing slow runs
on the UI thread. Worker failures go to one handler (``View.on_worker_state_changed``) that shows
an error modal instead of crashing.
"""

from tui.views.allruns import AllRunsView
from tui.views.base import View, fmt_p, metric_rows, metric_table, status_text
from tui.views.compare import CompareView
from tui.views.disagreements import DisagreementsView
from tui.views.experiment import FLIP_CELLS, FLIP_TITLES, ExperimentView
from tui.views.help import HelpView
from tui.views.helped import HelpedView, helped_cells
from tui.views.history import HISTORY_COLUMNS, SORT_KEYS, HistoryView, decisions_summary, history_cells
from tui.views.item import ItemView, viewed_steps
from tui.views.reviews import ReviewsView
from tui.views.suspects import SuspectsView

__all__ = [
    "FLIP_CELLS",
    "FLIP_TITLES",
    "HISTORY_COLUMNS",
    "SORT_KEYS",
    "AllRunsView",
    "CompareView",
    "DisagreementsView",
    "ExperimentView",
    "HelpView",
    "HelpedView",
    "HistoryView",
    "ItemView",
    "ReviewsView",
    "SuspectsView",
    "View",
    "decisions_summary",
    "fmt_p",
    "helped_cells",
    "history_cells",
    "metric_rows",
    "metric_table",
    "status_text",
    "viewed_steps",
]
