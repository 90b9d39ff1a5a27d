"""What every view shares: the screen with its title, status strip and footer, and the cells
several views draw (a status, the metric table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from optimizer.fmt import num, p_value
from tui.data import STATUS_STYLES, STATUS_TEXT, LedgerNotReady
from tui.widgets import KeyFooter, StatusStrip

if TYPE_CHECKING:
    from optimizer.ledger import Experiment
    from tui.app import JudgeloopApp


def status_text(status: str) -> Text:
    return Text(STATUS_TEXT.get(status, status), style=STATUS_STYLES.get(status, ""))


OVERRULED = "kept (overruled)"


def decision_text(exp: Experiment) -> Text:
    """An experiment's outcome for a table or title: its status, or ``kept (overruled)`` when a person kept
    what its policy rolled back (``Experiment.overrule``: the ledger's policy_keep and decided_by)."""
    if exp.overrule is not None:
        return Text(OVERRULED, style="bold yellow")
    return status_text(exp.status)


def metric_table(detail_rows: list[tuple[str, str, str, str, str]]) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name in ("metric", "value", "95% interval", "incumbent", "Δ"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for row in detail_rows:
        table.add_row(*row)
    return table


def metric_rows(exp: Experiment, parent: Experiment | None) -> list[tuple[str, str, str, str, str]]:
    """(name, value, interval, incumbent value, delta) for the headline metrics."""
    rows = []
    for name in ("kappa", "fpr", "balanced_accuracy", "tpr", "tnr"):
        value = exp.metric(name)
        interval = (exp.intervals or {}).get(name)
        before = parent.metric(name) if parent is not None else None
        rows.append(
            (
                name,
                num(value),
                f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "—",
                num(before),
                num(None if value is None or before is None else value - before, signed=True),
            )
        )
    return rows


class View(Screen[None]):
    """A full-screen view with the live status strip and the footer of keys."""

    view_name = "view"
    DEFAULT_CSS = """
    View { layout: vertical; }
    View .title { height: auto; background: $boost; padding: 0 1; text-style: bold; }
    View .hint { height: auto; color: $text-muted; padding: 0 1; }
    View .empty { height: 1fr; content-align: center middle; text-style: bold; color: $text-muted; }
    """

    @property
    def japp(self) -> JudgeloopApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(self.view_name, classes="title", id="view-title")
        yield from self.body()
        yield StatusStrip(id="status-strip")
        yield KeyFooter()

    def body(self) -> ComposeResult:  # pragma: no cover - overridden
        yield from ()

    def on_mount(self) -> None:
        strip = self.query_one(StatusStrip)
        if self.japp.live_pending:
            strip.update("reading the run's status…")
        else:
            strip.show_state(self.japp.live)
        self.reload()

    def reload(self) -> None:
        """Load the view's data again (in a worker)."""

    def not_ready(self) -> None:
        """What the view shows while there is nothing to show yet (no ledger, or no run): by default
        whatever it shows already."""

    def selection_changed(self) -> None:
        """The app's selection moved while this view is shown (views that show it reload)."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures go: LedgerNotReady is the view's empty state (``not_ready``);
        any other failure an error modal, never a crash."""
        if event.state != WorkerState.ERROR:
            return
        if isinstance(event.worker.error, LedgerNotReady):
            self.not_ready()
            return
        self.japp.show_error(f"{event.worker.name or 'background work'} failed", event.worker.error)

    def set_title(self, text: str | Text) -> None:
        self.query_one("#view-title", Static).update(text)


def fmt_p(p: float) -> str:
    """A p-value with four decimals, or in scientific notation below 0.001."""
    return p_value(p, 4)
