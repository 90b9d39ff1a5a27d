"""The views: history, experiment, disagreements, item, reviews, compare, help.

Each view loads its data in a thread worker (``exclusive=True`` in a named group, so a newer load
cancels an older one) that posts a message back; the handler fills the widgets. Nothing slow runs
on the UI thread. Worker failures go to one handler (``View.on_worker_state_changed``) that shows
an error modal instead of crashing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Markdown, Static
from textual.worker import Worker, WorkerState

from optimizer.judge.types import VIEW_SCREENSHOTS
from optimizer.metrics import FLIP_ARROWS, FLIP_ROWS
from optimizer.models import MISTAKE_TYPES
from optimizer.report import accounting, fp_by_type_line, rejudged_items, test_line, token_split
from tui.data import (
    REVIEW_LABELS,
    STATUS_STYLES,
    STATUS_TEXT,
    Comparison,
    Disagreement,
    DisagreementFilter,
    ExperimentDetail,
    Helped,
    HelpedRow,
    History,
    HistoryRow,
    ItemDetail,
    bar,
    curve_points,
    fmt,
    load_comparison,
    load_disagreements,
    load_experiment,
    load_helped,
    load_history,
    load_item,
    matches_filter,
    one_line,
)
from tui.widgets import FixedColumnsTable, MetricChart, StatusStrip, StepImage, load_screenshot

if TYPE_CHECKING:
    from collections.abc import Iterable

    from optimizer.ledger import ReplicateVerdict
    from tui.app import JudgeloopApp

FLIP_TITLES = {
    "tp_to_fn": "newly wrong: TP → FN (positive, now judged failed)",
    "fn_to_tp": "newly right: FN → TP (positive, now judged success)",
    "tn_to_fp": "newly wrong: TN → FP (negative, now judged success)",
    "fp_to_tn": "newly right: FP → TN (negative, now judged failed)",
}
# The flip table's cell (row, column) → flip key: rows as FLIP_ROWS (newly wrong, newly right), column 0
# holds the row's label, then positives, negatives.
FLIP_CELLS = {(row, col + 1): key for row, (_, keys) in enumerate(FLIP_ROWS) for col, key in enumerate(keys)}


class Loaded(Message):
    """A worker finished loading a view's data (``data`` is None when there is nothing to show)."""

    def __init__(self, data: Any) -> None:
        super().__init__()
        self.data = data


def status_text(status: str) -> Text:
    return Text(STATUS_TEXT.get(status, status), style=STATUS_STYLES.get(status, ""))


def metric_table(detail_rows: list[tuple[str, str, str, str, str]]) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name in ("metric", "value", "95% interval", "incumbent", "Δ"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for row in detail_rows:
        table.add_row(*row)
    return table


def metric_rows(exp: Any, parent: Any) -> list[tuple[str, str, str, str, str]]:
    """(name, value, interval, incumbent value, delta) for the headline metrics."""
    rows = []
    for name in ("kappa", "fpr", "balanced_accuracy", "tpr", "tnr"):
        value = exp.metric(name)
        interval = (exp.intervals or {}).get(name)
        before = parent.metric(name) if parent is not None else None
        rows.append((
            name, fmt(value), f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "—", fmt(before),
            fmt(None if value is None or before is None else value - before, signed=True),
        ))
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
        yield Footer()

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

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures go: an error modal, never a crash."""
        if event.state == WorkerState.ERROR:
            self.japp.show_error(f"{event.worker.name or 'background work'} failed", event.worker.error)

    def set_title(self, text: str | Text) -> None:
        self.query_one("#view-title", Static).update(text)


# ---------------------------------------------------------------------------------------------
# History


# (header, key, width): fixed widths so the table reads the same at 80 columns and at 200.
HISTORY_COLUMNS = (
    ("id", "id", 5), ("time", "time", 11), ("strategy", "strategy", 8), ("decision", "decision", 14),
    ("κ", "kappa", 6), ("FPR", "fpr", 5), ("bal.acc", "bacc", 7), ("Δκ", "dkappa", 6), ("ΔFPR", "dfpr", 6),
    ("p", "p", 5), ("+rej", "rejudge", 5), ("$", "cost", 7), ("rationale", "rationale", 60),
)
SORT_KEYS = ("id", "kappa", "fpr", "bacc", "dkappa", "p", "cost", "decision")


def _sort_value(row: HistoryRow, key: str) -> tuple[int, Any]:
    exp = row.experiment
    value: Any = {
        "id": exp.id, "kappa": exp.kappa, "fpr": exp.fpr, "bacc": exp.balanced_accuracy, "dkappa": row.d_kappa,
        "dfpr": row.d_fpr, "p": exp.p_value, "rejudge": exp.rejudge_calls, "cost": exp.cost_usd,
        "decision": exp.status, "time": exp.created,
        "strategy": exp.strategy or "", "rationale": exp.rationale or "",
    }.get(key, exp.id)
    return (value is None, value if value is not None else 0)


def fmt_p(p: float) -> str:
    """A p-value with four decimals, or in scientific notation below 0.001."""
    return f"{p:.4f}" if p >= 0.001 else f"{p:.1e}"


def decisions_summary(run: Any, experiments: list[Any]) -> str:
    """``"expected false keeps ≤ 0.40"`` (or "literal: no test") for the history title."""
    acc = accounting(run, experiments)
    if acc["expected_false_keeps"] is None:
        return "literal policy: false keeps not bounded"
    return f"expected false keeps ≤ {acc['expected_false_keeps']:.2f}" + (f" (FDR {acc['fdr']:g})" if acc["fdr"] else "")


def history_cells(row: HistoryRow, weak: bool = False) -> tuple[Text, ...]:
    """One history row's cells as ready Text (no markup parsing on the UI thread; built in the worker).
    ``weak``: a kept edit whose contribution at the end is not significant (marked ``?``)."""
    exp = row.experiment
    plain = (
        exp.created.strftime("%m-%d %H:%M"), exp.strategy or "—",
    )
    metrics = (fmt(exp.kappa), fmt(exp.fpr), fmt(exp.balanced_accuracy))
    return (
        Text(f"{exp.id}{'◆' if row.in_chain else ''}{'?' if weak else ''}",
             style="bold yellow" if weak else ("bold" if row.in_chain else "")),
        *(Text(v) for v in plain),
        status_text(exp.status),
        *(Text(v) for v in metrics),
        Text(fmt(row.d_kappa, signed=True), style="green" if (row.d_kappa or 0) > 0 else ""),
        Text(fmt(row.d_fpr, signed=True), style="red" if (row.d_fpr or 0) > 0 else ""),
        # The re-judging pass's extra judge calls (adaptive policy), blank when there was none.
        Text(fmt(exp.p_value)), Text(str(exp.rejudge_calls) if exp.rejudge_calls else ""),
        Text(f"{exp.cost_usd:.4f}"),
        Text(one_line(exp.rationale, 120), no_wrap=True, overflow="ellipsis"),
    )


class HistoryView(View):
    """The start screen: the experiments table, the kappa and FPR curves, the live strip."""

    view_name = "history"
    DEFAULT_CSS = """
    HistoryView #history-table { height: auto; max-height: 50%; min-height: 4; overflow-x: hidden; }
    HistoryView #charts { height: 1fr; min-height: 8; }
    HistoryView #history-filter { display: none; height: 3; }
    HistoryView #history-filter.-shown { display: block; }
    HistoryView #history-empty { display: none; }
    HistoryView.-empty #history-empty { display: block; }
    HistoryView.-empty #history-table, HistoryView.-empty #charts { display: none; }
    """
    BINDINGS = [
        Binding("enter", "open_experiment", "Open", id="history.open", tooltip="Open the selected experiment"),
        Binding("slash", "filter", "Filter", id="history.filter",
                tooltip="Filter rows by words (status:kept matches a status)"),
        Binding("o", "cycle_sort", "Sort", id="history.sort", tooltip="Sort by the next column (again: reverse)"),
        Binding("m", "mark", "Mark", id="history.mark", tooltip="Mark this experiment as the left side of compare"),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="history.clear-filter"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.history: History | None = None
        self.cells: dict[int, tuple[Text, ...]] = {}
        self.filter_text = ""
        self.sort_key = "id"
        self.sort_reverse = False

    def body(self) -> ComposeResult:
        yield Input(placeholder="filter: words, or status:kept / status:rolled_back — enter applies, esc clears",
                    id="history-filter", disabled=True)
        table = FixedColumnsTable(id="history-table", cursor_type="row", zebra_stripes=True, fill_column="rationale")
        for label, key, width in HISTORY_COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table
        yield Static("no runs yet — press r to start one", id="history-empty", classes="empty")
        with Horizontal(id="charts"):
            yield MetricChart("kappa", id="kappa-chart")
            yield MetricChart("fpr", id="fpr-chart")

    def reload(self) -> None:
        self.query_one("#history-table", DataTable).focus()
        self.load_history()

    @work(thread=True, exclusive=True, group="history", exit_on_error=False, name="loading the history")
    def load_history(self) -> None:
        """Read the run and build everything the UI thread will show: table cells and chart points."""
        ledger = self.japp.reader()
        history = load_history(ledger, self.japp.run_id) if ledger is not None else None
        if history is None:
            self.post_message(Loaded(None))
            return
        cells = {row.id: history_cells(row, row.id in history.weak_ids) for row in history.rows}
        self.post_message(Loaded((history, cells, curve_points(history))))

    def on_loaded(self, message: Loaded) -> None:
        self.history, self.cells, points = message.data if message.data is not None else (None, {}, None)
        self.set_class(self.history is None, "-empty")
        if self.history is None:
            self.set_title("history — no runs yet")
            return
        run = self.history.run
        waiting = self.history.waiting()
        title = Text.assemble(
            f"history — run {run.id} ({run.status}) · {run.strategy} · {run.policy} · split {run.split} · "
            f"{len(self.history.rows)} experiments · {decisions_summary(run, self.history.experiments)}",
        )
        if waiting is not None:
            title.append(f" · experiment {waiting.id} waiting: e then k keep / x discard", style="bold yellow")
        if self.history.weak_ids:
            title.append(f" · ? = kept, but not significant at the end ({len(self.history.weak_ids)}; g shows)",
                         style="yellow")
        self.set_title(title)
        self.fill_table()
        self.query_one("#kappa-chart", MetricChart).show_points(points)
        self.query_one("#fpr-chart", MetricChart).show_points(points)

    def visible_rows(self) -> list[HistoryRow]:
        if self.history is None:
            return []
        rows = [r for r in self.history.rows if matches_filter(r, self.filter_text)]
        return sorted(rows, key=lambda r: _sort_value(r, self.sort_key), reverse=self.sort_reverse)

    def fill_table(self) -> None:
        table = self.query_one("#history-table", DataTable)
        selected = self.selected_id()
        table.clear()
        for row in self.visible_rows():
            table.add_row(*self.cells[row.id], key=str(row.id))
        if selected is not None and str(selected) in table.rows:
            table.move_cursor(row=table.get_row_index(str(selected)))
        else:
            wanted = self.japp.experiment_id or (self.history.run.incumbent_experiment if self.history else None)
            if wanted is not None and str(wanted) in table.rows:
                table.move_cursor(row=table.get_row_index(str(wanted)))

    def selected_id(self) -> int | None:
        table = self.query_one("#history-table", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return int(key) if key is not None else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.japp.experiment_id = int(event.row_key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_experiment()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        self.sort_reverse = not self.sort_reverse if key == self.sort_key else False
        self.sort_key = key
        self.fill_table()

    def action_open_experiment(self) -> None:
        exp_id = self.selected_id()
        if exp_id is not None:
            self.japp.experiment_id = exp_id
            self.japp.switch_view("experiment")

    def action_filter(self) -> None:
        box = self.query_one("#history-filter", Input)
        box.disabled = False
        box.add_class("-shown")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter_text = event.value
        self.fill_table()
        self.query_one("#history-table", DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.fill_table()

    def action_clear_filter(self) -> None:
        box = self.query_one("#history-filter", Input)
        box.value = ""
        box.remove_class("-shown")
        box.disabled = True
        self.filter_text = ""
        self.fill_table()
        self.query_one("#history-table", DataTable).focus()

    def action_cycle_sort(self) -> None:
        if self.sort_reverse:
            self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)] \
                if self.sort_key in SORT_KEYS else "id"
            self.sort_reverse = False
        else:
            self.sort_reverse = True
        self.notify(f"sorted by {self.sort_key}{' (descending)' if self.sort_reverse else ''}", timeout=2)
        self.fill_table()

    def action_mark(self) -> None:
        exp_id = self.selected_id()
        if exp_id is not None:
            self.japp.compare_left = exp_id
            self.notify(f"experiment {exp_id} marked: select another and press c to compare", timeout=3)


# ---------------------------------------------------------------------------------------------
# Experiment


class ExperimentView(View):
    """One experiment: decision and reason, metrics with intervals, the flip table, rationale, diff."""

    view_name = "experiment"
    DEFAULT_CSS = """
    ExperimentView #flip-table { height: auto; max-height: 6; margin: 1 0; }
    ExperimentView #experiment-body { height: 1fr; }
    """
    BINDINGS = [
        Binding("k", "decide('keep')", "Keep", id="experiment.keep",
                tooltip="Keep the waiting candidate (propose-only mode)"),
        Binding("x", "decide('discard')", "Discard", id="experiment.discard",
                tooltip="Discard the waiting candidate (propose-only mode)"),
        Binding("f", "focus_flips", "Flips", id="experiment.flips", tooltip="Focus the flip table (enter lists items)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.detail: ExperimentDetail | None = None

    def body(self) -> ComposeResult:
        with VerticalScroll(id="experiment-body"):
            yield Static("", id="experiment-decision")
            yield Static("", id="experiment-metrics")
            yield Static("flip table against the incumbent — enter on a cell lists its items", classes="hint")
            table: DataTable[Any] = DataTable(id="flip-table", cursor_type="cell", show_cursor=True)
            table.add_column("incumbent → candidate", key="what", width=24)
            table.add_column("positives", key="pos", width=10)
            table.add_column("negatives", key="neg", width=10)
            yield table
            yield Static("", id="experiment-rationale")
            yield Static("", id="experiment-diff")

    def reload(self) -> None:
        if self.japp.experiment_id is None:
            self.set_title("experiment — none selected (pick one in the history, h)")
            return
        self.load_experiment(self.japp.experiment_id)

    @work(thread=True, exclusive=True, group="experiment", exit_on_error=False, name="loading the experiment")
    def load_experiment(self, experiment_id: int) -> None:
        ledger = self.japp.reader()
        self.post_message(Loaded(load_experiment(ledger, experiment_id) if ledger is not None else None))

    def on_loaded(self, message: Loaded) -> None:
        detail: ExperimentDetail | None = message.data
        self.detail = detail
        if detail is None:
            return
        exp, parent = detail.experiment, detail.parent
        self.set_title(Text.assemble(
            f"experiment {exp.id} (run {exp.run_id}) · {exp.strategy or 'baseline'} · ",
            status_text(exp.status),
            f" · parent {parent.id}" if parent else " · no parent",
        ))
        decision = Text.assemble(("decision: ", "bold"), status_text(exp.decision or exp.status))
        if exp.test:
            decision.append(f"   sign-flip p = {fmt_p(exp.test['p_value'])} at alpha {exp.test['alpha']:.3g}"
                            f" · first-pass McNemar p = {fmt_p(exp.test['mcnemar_p'])}")
        elif exp.p_value is not None:
            decision.append(f"   McNemar p = {exp.p_value:.4f}")
        if exp.early_stopped:
            decision.append("   (stopped early)", style="italic")
        decision.append(f"\n{exp.reason or 'no reason recorded'}")
        if exp.status == "waiting":
            decision.append("\nthis candidate is waiting: k keeps it, x discards it", style="bold yellow")
        decision.append(
            f"\nitems {exp.items_evaluated} · calls {exp.calls} + {exp.cache_hits} cached · "
            f"{token_split(exp.input_tokens, exp.cache_read_tokens, exp.cache_write_tokens, exp.output_tokens)} · "
            f"${exp.cost_usd:.4f}"
            + (f" · {exp.duration_s:.0f}s" if exp.duration_s else "")
        )
        if exp.optimizer_calls or exp.optimizer_cost_usd:  # the total above splits into judge + optimiser
            decision.append(
                f"\njudge ${exp.judge_cost_usd:.4f} · optimiser ${exp.optimizer_cost_usd:.4f} "
                f"({exp.optimizer_calls} calls · "
                f"{exp.optimizer_input_tokens + exp.optimizer_output_tokens:,} tokens)"
            )
        if detail.fp_by_type is not None:
            decision.append("\n" + fp_by_type_line(*detail.fp_by_type))
        line = test_line(exp, limit=0)
        if line:
            decision.append("\n" + line)
        rejudged = rejudged_items(exp)
        if rejudged:
            decision.append("\nre-judged (incumbent → candidate, judgements right): ", style="bold")
            decision.append(" · ".join(f"{i.trajectory_id[:8]} {i.draws()}" for i in rejudged))
        self.query_one("#experiment-decision", Static).update(decision)
        self.query_one("#experiment-metrics", Static).update(metric_table(metric_rows(exp, parent)))
        counts = exp.flip_counts()
        table = self.query_one("#flip-table", DataTable)
        table.clear()
        for label, keys in FLIP_ROWS:
            table.add_row(label, *(f"{FLIP_ARROWS[k]} {counts[k]}" for k in keys), key=label)
        rationale = Text.assemble(("rationale\n", "bold"), exp.rationale or "—")
        self.query_one("#experiment-rationale", Static).update(rationale)
        diff = exp.diff_text or ""
        files = ", ".join(exp.files_changed) or "no files"
        header = Text(f"\ndiff against parent — {files} (+{exp.insertions or 0} −{exp.deletions or 0})", style="bold")
        body = Syntax(diff, "diff", theme="ansi_dark", word_wrap=True) if diff.strip() else Text("(no diff: baseline)")
        self.query_one("#experiment-diff", Static).update(Group(header, body))

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        if self.detail is None:
            return
        row, column = event.coordinate.row, event.coordinate.column
        key = FLIP_CELLS.get((row, column))
        if key is None:
            return
        ids = (self.detail.experiment.flips or {}).get(key, [])
        self.japp.open_item_list(FLIP_TITLES[key], ids, self.detail.experiment.id)

    def action_focus_flips(self) -> None:
        self.query_one("#flip-table", DataTable).focus()

    def action_decide(self, decision: str) -> None:
        if self.detail is None or self.detail.experiment.status != "waiting":
            self.notify("only a waiting candidate (propose-only mode) can be kept or discarded here",
                        severity="warning")
            return
        self.japp.decide_waiting(self.detail.experiment.id, decision)


# ---------------------------------------------------------------------------------------------
# Disagreements


class DisagreementsView(View):
    """The items where the judge and the label disagree, for one experiment, with filters."""

    view_name = "disagreements"
    DEFAULT_CSS = "DisagreementsView #disagreement-table { height: 1fr; }"
    BINDINGS = [
        Binding("enter", "open_item", "Open", id="disagreements.open", tooltip="Open the selected item"),
        Binding("f", "cycle_kind", "FP/FN", id="disagreements.kind", tooltip="Show all / false positives / false negatives"),
        Binding("t", "cycle_type", "Type", id="disagreements.type", tooltip="Filter by the label's mistake type"),
        Binding("u", "cycle_unstable", "Unstable", id="disagreements.unstable",
                tooltip="Any / unstable across replicates / stable"),
        Binding("n", "cycle_reviewed", "Reviewed", id="disagreements.reviewed", tooltip="Any / not reviewed / reviewed"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Disagreement] = []
        self.filters = DisagreementFilter()

    def body(self) -> ComposeResult:
        yield Static("", id="disagreement-filters", classes="hint")
        # The reasoning column takes the width the others leave; the rest is sized so the table fits
        # 80 columns (reasoning 8 wide there) without a horizontal scrollbar.
        table = FixedColumnsTable(id="disagreement-table", cursor_type="row", zebra_stripes=True,
                                  fill_column="reasoning", fill_min=8)
        for label, key, width in (("item", "id", 9), ("kind", "kind", 4), ("label type", "type", 18),
                                  ("judge", "judge", 7), ("conf.", "conf", 8), ("unst.", "unstable", 5),
                                  ("rev.", "reviewed", 4), ("reasoning", "reasoning", 8)):
            table.add_column(label, key=key, width=width)
        yield table

    def reload(self) -> None:
        if self.japp.experiment_id is None:
            self.set_title("disagreements — no experiment selected (pick one in the history, h)")
            return
        self.load_items(self.japp.experiment_id)

    @work(thread=True, exclusive=True, group="disagreements", exit_on_error=False, name="loading disagreements")
    def load_items(self, experiment_id: int) -> None:
        ledger = self.japp.reader()
        self.post_message(Loaded(load_disagreements(ledger, experiment_id) if ledger is not None else None))

    def on_loaded(self, message: Loaded) -> None:
        if message.data is None:
            return
        exp, items = message.data
        self.items = items
        n_fp = sum(d.kind == "FP" for d in items)
        self.set_title(f"disagreements — experiment {exp.id} ({STATUS_TEXT.get(exp.status, exp.status)}): "
                       f"{len(items)} items, {n_fp} FP, {len(items) - n_fp} FN")
        self.fill()

    def fill(self) -> None:
        self.query_one("#disagreement-filters", Static).update(
            f"filters: {self.filters.describe()}   (f kind · t type · u unstable · n reviewed)"
        )
        table = self.query_one("#disagreement-table", DataTable)
        table.clear()
        for d in self.items:
            if not self.filters.accepts(d):
                continue
            judge = {True: "success", False: "failure", None: d.verdict.status}[d.verdict.success]
            table.add_row(
                d.trajectory_id[:8], Text(d.kind, style="red" if d.kind == "FP" else "yellow"),
                d.label.mistake_type or ("—" if d.label.positive else "untyped"), judge, d.confidence,
                "yes" if d.verdict.unstable else "", "yes" if d.reviewed else "", one_line(d.reasoning, 240),
                key=d.trajectory_id,
            )
        shown = table.row_count
        if shown == 0:
            self.notify("no disagreement matches these filters", timeout=2)

    def action_open_item(self) -> None:
        table = self.query_one("#disagreement-table", DataTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key is not None:
            self.japp.item_id = key
            self.japp.switch_view("item")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_item()

    def action_cycle_kind(self) -> None:
        order: list[str | None] = [None, "FP", "FN"]
        self.filters.kind = order[(order.index(self.filters.kind) + 1) % len(order)]
        self.fill()

    def action_cycle_type(self) -> None:
        order: list[str | None] = [None, *MISTAKE_TYPES, "untyped"]
        current = self.filters.mistake_type
        self.filters.mistake_type = order[(order.index(current) + 1) % len(order)] if current in order else None
        self.fill()

    def action_cycle_unstable(self) -> None:
        order: list[bool | None] = [None, True, False]
        self.filters.unstable = order[(order.index(self.filters.unstable) + 1) % 3]
        self.fill()

    def action_cycle_reviewed(self) -> None:
        order: list[bool | None] = [None, False, True]
        self.filters.reviewed = order[(order.index(self.filters.reviewed) + 1) % 3]
        self.fill()


# ---------------------------------------------------------------------------------------------
# Item


class ItemView(View):
    """One item under one experiment: instruction, label, every replicate, steps and screenshot."""

    view_name = "item"
    DEFAULT_CSS = """
    ItemView #item-main { height: 1fr; }
    ItemView #item-left { width: 1fr; }
    ItemView #item-right { width: 1fr; }
    ItemView #step-table { height: 1fr; min-height: 4; }
    ItemView #step-image { height: 2fr; }
    """
    BINDINGS = [
        Binding("right,period", "step(1)", "Next step", id="item.next-step", tooltip="Select the next step",
                key_display="→"),
        Binding("left,comma", "step(-1)", "Prev step", id="item.prev-step", tooltip="Select the previous step",
                key_display="←"),
        Binding("o", "open_png", "Open PNG", id="item.open-png", tooltip="Open the full screenshot outside (xdg-open/$OPENER)"),
        Binding("right_square_bracket", "other_experiment(1)", "Next exp", id="item.next-experiment",
                tooltip="The same item under the next experiment"),
        Binding("left_square_bracket", "other_experiment(-1)", "Prev exp", id="item.prev-experiment",
                tooltip="The same item under the previous experiment"),
        Binding("w", "review('judge_wrong')", "Judge wrong", id="item.review-judge-wrong",
                tooltip="Review: the judge is wrong on this item"),
        Binding("l", "review('label_suspect')", "Label suspect", id="item.review-label-suspect",
                tooltip="Review: the label looks wrong"),
        Binding("a", "review('rubric_ambiguous')", "Rubric ambiguous", id="item.review-rubric-ambiguous",
                tooltip="Review: the rubric does not settle this item"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.detail: ItemDetail | None = None
        self.step_index = 0

    def body(self) -> ComposeResult:
        with Horizontal(id="item-main"):
            with VerticalScroll(id="item-left"):
                yield Static("", id="item-info")
                yield Static("", id="item-replicates")
                yield Static("", id="item-reviews")
            with Vertical(id="item-right"):
                table: DataTable[Any] = DataTable(id="step-table", cursor_type="row")
                table.add_column("step", key="step", width=5)
                table.add_column("action", key="action", width=70)
                yield table
                yield StepImage(self.japp.image_mode, id="step-image")

    def reload(self) -> None:
        if self.japp.experiment_id is None or self.japp.item_id is None:
            self.set_title("item — none selected (open one from the disagreements, d)")
            return
        self.load_item(self.japp.experiment_id, self.japp.item_id)

    @work(thread=True, exclusive=True, group="item", exit_on_error=False, name="loading the item")
    def load_item(self, experiment_id: int, trajectory_id: str) -> None:
        ledger = self.japp.reader()
        if ledger is None:
            return
        self.post_message(Loaded(load_item(ledger, self.japp.ws_root, experiment_id, trajectory_id)))

    def on_loaded(self, message: Loaded) -> None:
        detail: ItemDetail = message.data
        self.detail = detail
        exp = detail.experiment
        self.set_title(f"item {detail.trajectory_id} under experiment {exp.id} "
                       f"({STATUS_TEXT.get(exp.status, exp.status)})")
        info = Text()
        info.append("instruction\n", style="bold")
        info.append((detail.instruction or detail.trajectory_error or "—") + "\n\n")
        if detail.label is not None:
            info.append("label: ", style="bold")
            info.append(detail.label.label, style="green" if detail.label.positive else "red")
            if detail.label.mistake_type:
                info.append(f" · {detail.label.mistake_type}")
        else:
            info.append("label: not stored for this run", style="italic")
        self.query_one("#item-info", Static).update(info)
        reps = Text()
        verdict = detail.verdict
        if verdict is None:
            reps.append("\nthis experiment has no verdict for this item (stopped early?)", style="italic")
        else:
            majority = {True: "success", False: "failure", None: verdict.status}[verdict.success]
            agree = detail.label is not None and verdict.success == detail.label.positive
            reps.append("\njudge (majority): ", style="bold")
            reps.append(majority, style="green" if agree else "bold red")
            if verdict.unstable:
                reps.append("  unstable across replicates", style="yellow")
            for rep in verdict.replicates:
                answer = {True: "success", False: "failure", None: rep.status}[rep.success]
                reps.append(f"\n\nreplicate {rep.replicate}: ", style="bold")
                reps.append(f"{answer} · confidence {rep.confidence or '?'}")
                if rep.mistake_type:
                    reps.append(f" · {rep.mistake_type}")
                if rep.cached:
                    reps.append(" · cached", style="dim")
                if rep.tools:
                    reps.append(f"\ntools: {' · '.join(str(c) for c in rep.tools)}", style="dim")
                reps.append(f"\n{rep.reasoning or rep.raw or '(no reasoning)'}")
        self.query_one("#item-replicates", Static).update(reps)
        self.show_reviews()
        table = self.query_one("#step-table", DataTable)
        table.clear()
        viewed = viewed_steps(detail.verdict.replicates if detail.verdict else [])
        for step in detail.steps:
            # ● marks a step whose screenshot an agentic judge looked at (in any replicate).
            index = Text(f"{step.index}●", style="bold cyan") if step.index in viewed else str(step.index)
            table.add_row(index, step.action, key=str(step.index))
        self.step_index = min(self.step_index, max(0, len(detail.steps) - 1))
        if detail.steps:
            table.move_cursor(row=self.step_index)
            self.show_step()
        else:
            self.query_one(StepImage).show(None, None, detail.trajectory_error or "no steps")

    def show_reviews(self) -> None:
        if self.detail is None:
            return
        text = Text("\nreviews of this item", style="bold")
        if not self.detail.reviews:
            text.append("\nnone yet — w judge wrong · l label suspect · a rubric ambiguous", style="dim")
        for r in self.detail.reviews:
            text.append(f"\n{r.created:%Y-%m-%d %H:%M} {REVIEW_LABELS[r.kind]}"
                        f"{f' (exp {r.experiment_id})' if r.experiment_id else ''}: {r.note or '—'}")
        self.query_one("#item-reviews", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "step-table" and event.row_key.value is not None:
            if int(event.row_key.value) != self.step_index:
                self.step_index = int(event.row_key.value)
                self.show_step()

    def show_step(self) -> None:
        if self.detail is None or not self.detail.steps:
            return
        step = self.detail.steps[self.step_index]
        if step.problem is not None:  # a screenshot outside the split: refused, never decoded or opened
            self.query_one(StepImage).show(None, None, f"step {step.index}: {step.problem}")
            return
        self.query_one(StepImage).show(None, step.screenshot, f"step {step.index}: loading screenshot…")
        self.decode_step(step.index, step.screenshot)

    @work(thread=True, exclusive=True, group="item-image", exit_on_error=False, name="decoding the screenshot")
    def decode_step(self, index: int, path: Any) -> None:
        if path is None or not path.is_file():
            self.post_message(StepDecoded(index, None, path))
            return
        self.post_message(StepDecoded(index, load_screenshot(path), path))

    def on_step_decoded(self, message: StepDecoded) -> None:
        if message.index != self.step_index:
            return  # the user already moved on
        note = f"step {message.index}: {message.path.name}" if message.path else f"step {message.index}: no screenshot"
        if message.path is not None and message.image is None:
            note = f"step {message.index}: screenshot missing ({message.path})"
        self.query_one(StepImage).show(message.image, message.path, note)

    def action_step(self, delta: int) -> None:
        if self.detail is None or not self.detail.steps:
            return
        self.step_index = max(0, min(len(self.detail.steps) - 1, self.step_index + delta))
        self.query_one("#step-table", DataTable).move_cursor(row=self.step_index)
        self.show_step()

    def action_open_png(self) -> None:
        path = self.query_one(StepImage).path
        self.japp.open_outside(path)

    def action_other_experiment(self, delta: int) -> None:
        if self.detail is None or not self.detail.other_experiments:
            return
        others = self.detail.other_experiments
        current = self.detail.experiment.id
        idx = others.index(current) if current in others else -1
        target = others[(idx + delta) % len(others)]
        if target == current:
            self.notify("no other experiment judged this item", timeout=2)
            return
        self.japp.experiment_id = target
        self.reload()

    def action_review(self, kind: str) -> None:
        if self.detail is None:
            return
        self.japp.review_item(self.detail.trajectory_id, kind, self.detail.experiment.id, on_saved=self.reload)


class StepDecoded(Message):
    def __init__(self, index: int, image: Any, path: Any) -> None:
        super().__init__()
        self.index = index
        self.image = image
        self.path = path


# ---------------------------------------------------------------------------------------------
# Reviews, compare, help


class ReviewsView(View):
    """Every human review in the ledger; enter opens the item, E exports them as JSONL."""

    view_name = "reviews"
    DEFAULT_CSS = "ReviewsView #review-table { height: 1fr; }"
    BINDINGS = [
        Binding("enter", "open_item", "Open", id="reviews.open", tooltip="Open the reviewed item"),
        Binding("E", "export", "Export", id="reviews.export",
                tooltip="Write every review to experiments/reviews.jsonl (like `judgeloop reviews --export`)"),
    ]

    def body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="review-table", cursor_type="row", zebra_stripes=True)
        for label, key, width in (("#", "id", 4), ("when", "when", 16), ("item", "item", 13), ("exp", "exp", 5),
                                  ("kind", "kind", 16), ("note", "note", 50), ("by", "author", 10)):
            table.add_column(label, key=key, width=width)
        yield table
        yield Static("reviews guide the agent strategy; `judgeloop reviews --export FILE` writes them as JSONL",
                     classes="hint")

    def reload(self) -> None:
        self.load_reviews()

    @work(thread=True, exclusive=True, group="reviews", exit_on_error=False, name="loading reviews")
    def load_reviews(self) -> None:
        ledger = self.japp.reader()
        self.post_message(Loaded(ledger.reviews() if ledger is not None else []))

    def on_loaded(self, message: Loaded) -> None:
        reviews = message.data
        self.reviews = reviews
        self.set_title(f"reviews — {len(reviews)} in the ledger")
        table = self.query_one("#review-table", DataTable)
        table.clear()
        for r in reviews:
            table.add_row(str(r.id), f"{r.created:%Y-%m-%d %H:%M}", r.trajectory_id[:13],
                          str(r.experiment_id or "—"), REVIEW_LABELS[r.kind], one_line(r.note, 50), r.author,
                          key=str(r.id))

    def action_open_item(self) -> None:
        table = self.query_one("#review-table", DataTable)
        if table.row_count == 0:
            return
        review = self.reviews[table.cursor_row]
        if review.experiment_id is not None:
            self.japp.experiment_id = review.experiment_id
        self.japp.item_id = review.trajectory_id
        self.japp.switch_view("item")

    def action_export(self) -> None:
        self.japp.export_reviews()


class CompareView(View):
    """Two experiments side by side: metrics, decision, diff, and the flips from left to right."""

    view_name = "compare"
    DEFAULT_CSS = """
    CompareView #compare-flips { height: auto; padding: 0 1; }
    CompareView #compare-main { height: 1fr; }
    CompareView .side { width: 1fr; border-right: solid $panel; padding: 0 1; }
    """

    def body(self) -> ComposeResult:
        yield Static("", id="compare-flips")
        with Horizontal(id="compare-main"):
            with VerticalScroll(classes="side"):
                yield Static("", id="compare-left")
            with VerticalScroll(classes="side"):
                yield Static("", id="compare-right")

    def reload(self) -> None:
        pair = self.japp.compare_pair()
        if pair is None:
            self.set_title("compare — select an experiment (and mark another with m in the history)")
            return
        self.load_pair(*pair)

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False, name="loading the comparison")
    def load_pair(self, left: int | None, right: int) -> None:
        ledger = self.japp.reader()
        if ledger is None:
            return
        if left is None:  # nothing marked: compare with the incumbent it faced
            left = ledger.get_experiment(right).parent_id
        if left is None:
            self.post_message(Loaded(None))
            return
        self.post_message(Loaded(load_comparison(ledger, left, right)))

    def on_loaded(self, message: Loaded) -> None:
        comparison: Comparison | None = message.data
        if comparison is None:
            self.set_title("compare — the baseline has no parent: mark another experiment with m in the history")
            return
        left, right = comparison.left, comparison.right
        self.set_title(f"compare — experiment {left.id} (left) vs {right.id} (right)")
        f = comparison.flips
        self.query_one("#compare-flips", Static).update("left → right: " + ", ".join(
            f"{sum(len(f[k]) for k in keys)} {words} (" + ", ".join(f"{FLIP_ARROWS[k]} {len(f[k])}" for k in keys) + ")"
            for words, keys in FLIP_ROWS
        ))
        for side, exp, other in (("#compare-left", left, right), ("#compare-right", right, left)):
            parts: list[Any] = [
                Text.assemble((f"experiment {exp.id} ", "bold"), status_text(exp.status),
                              f" · {exp.strategy or 'baseline'}"),
                metric_table(metric_rows(exp, other)),
                Text(f"\n{one_line(exp.reason, 200)}\n", style="italic"),
                Text(one_line(exp.rationale, 200) + "\n"),
            ]
            if exp.diff_text:
                parts.append(Syntax(exp.diff_text, "diff", theme="ansi_dark", word_wrap=True))
            self.query_one(side, Static).update(Group(*parts))


# ---------------------------------------------------------------------------------------------
# What helped


def _signed_text(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:+.{digits}f}"


def helped_cells(row: HelpedRow, scale: float) -> tuple[Text, ...]:
    """A kept edit's cells: its gain when kept and its contribution at the end, each as a bar."""
    exp, c = row.experiment, row.contribution

    def bar_cell(value: float | None, style: str) -> Text:
        if value is None:
            return Text("—", style="dim")
        return Text.assemble((f"{value:+6.2f} ", ""), (bar(value, scale), "red" if value < 0 else style))

    at_end = c.items if c is not None else None
    note = "not measured yet: judgeloop attribute" if c is None else (c.note or "")
    if row.significant is False:
        note = "not significant at the end" + (f"; {note}" if note else "")
    return (
        Text(f"#{exp.id}", style="bold"), Text((exp.commit_sha or "")[:8]),
        bar_cell(row.gain, "cyan"), bar_cell(at_end, "green" if row.significant else "yellow"),
        Text(fmt(c.p_value if c else None)), Text(_signed_text(c.kappa_delta if c else None, 3)),
        Text(_signed_text(c.fpr_delta if c else None, 3)),
        Text(f"+{len(c.fixed)}/-{len(c.broken)}" if c is not None and c.items is not None else "—"),
        Text(note or one_line(exp.rationale, 120), no_wrap=True, overflow="ellipsis",
             style="yellow" if row.significant is False else ""),
    )


class HelpedView(View):
    """What helped: the kept edits (newest first), each one's gain when kept beside its contribution at
    the end (`judgeloop attribute`), as bars; the selected edit's diff and the items that depend on it."""

    view_name = "helped"
    DEFAULT_CSS = """
    HelpedView #helped-table { height: auto; max-height: 45%; min-height: 4; overflow-x: hidden; }
    HelpedView #helped-detail { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("enter", "open_items", "Items", id="helped.items",
                tooltip="List the items that depend on the selected edit (enter opens one)"),
        Binding("e", "open_experiment", "Experiment", id="helped.experiment",
                tooltip="Open the selected edit's experiment (its decision when it was kept)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.helped: Helped | None = None
        self.diffs: dict[int, str] = {}

    def body(self) -> ComposeResult:
        yield Static("", id="helped-summary", classes="hint")
        table = FixedColumnsTable(id="helped-table", cursor_type="row", zebra_stripes=True, fill_column="note")
        for label, key, width in (("edit", "edit", 6), ("commit", "commit", 8), ("gain when kept", "gain", 19),
                                  ("at the end", "end", 19), ("p", "p", 5), ("Δκ", "dkappa", 6), ("ΔFPR", "dfpr", 6),
                                  ("fix/brk", "flips", 7), ("note", "note", 30)):
            table.add_column(label, key=key, width=width)
        yield table
        with VerticalScroll(id="helped-detail"):
            yield Static("", id="helped-items")
            yield Static("", id="helped-diff")

    def reload(self) -> None:
        self.query_one("#helped-table", DataTable).focus()
        self.load_helped()

    @work(thread=True, exclusive=True, group="helped", exit_on_error=False, name="loading what helped")
    def load_helped(self) -> None:
        ledger = self.japp.reader()
        helped = load_helped(ledger, self.japp.run_id) if ledger is not None else None
        if ledger is None or helped is None:
            self.post_message(Loaded(None))
            return
        values = [abs(v) for r in helped.rows for v in (r.gain, r.contribution.items if r.contribution else None)
                  if v is not None]
        scale = max(values, default=1.0) or 1.0
        diffs = {r.experiment.id: ledger.get_experiment(r.experiment.id).diff_text or "" for r in helped.rows}
        self.post_message(Loaded((helped, {r.experiment.id: helped_cells(r, scale) for r in helped.rows}, diffs)))

    def on_loaded(self, message: Loaded) -> None:
        if message.data is None:
            self.set_title("what helped — no runs yet")
            return
        self.helped, cells, self.diffs = message.data
        helped = self.helped
        a = helped.attribution
        self.set_title(f"what helped — run {helped.run.id}: {len(helped.rows)} kept edit(s), newest first")
        if a is None:
            summary = Text("contribution at the end not measured yet: run `judgeloop attribute` "
                           "(each kept edit reverted from the final prompts, re-judged on the dev split)", style="yellow")
        else:
            fvb = a.final_vs_baseline
            summary = Text(f"attribution {a.id} ({a.status}) · final {a.final_commit[:8]} vs it without each edit · "
                           f"{a.judge} · items = Σ change in the share of correct judgements · ${a.cost_usd:.4f}")
            if fvb is not None and fvb.items is not None:
                summary.append(f"\nfinal vs baseline {a.baseline_commit[:8]}: {fvb.items:+.2f} items, "
                               f"Δκ {_signed_text(fvb.kappa_delta, 3)}, ΔFPR {_signed_text(fvb.fpr_delta, 3)}, "
                               f"p {fmt(fvb.p_value)}", style="bold")
            if a.note:
                summary.append(f"\n{a.note}", style="yellow")
        self.query_one("#helped-summary", Static).update(summary)
        table = self.query_one("#helped-table", DataTable)
        table.clear()
        for row in helped.rows:
            table.add_row(*cells[row.experiment.id], key=str(row.experiment.id))
        if helped.rows:
            self.show_detail(helped.rows[0])

    def selected(self) -> HelpedRow | None:
        table = self.query_one("#helped-table", DataTable)
        if self.helped is None or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.helped.rows if str(r.experiment.id) == key), None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        row = self.selected()
        if row is not None:
            self.japp.experiment_id = row.experiment.id
            self.show_detail(row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_items()

    def show_detail(self, row: HelpedRow) -> None:
        exp, c = row.experiment, row.contribution
        items = Text.assemble((f"#{exp.id} ", "bold"), f"{one_line(exp.rationale, 160)}\n")
        if c is None or c.items is None:
            items.append(c.note if c is not None and c.note else "its contribution at the end is not measured yet",
                         style="italic")
        else:
            if c.entangled_with:
                items.append(f"entangled with {', '.join(f'#{e}' for e in c.entangled_with)}: measured by reverting "
                             "them together\n", style="yellow")
            items.append("items that depend on it (share of correct judgements without it → at the end):\n",
                         style="bold")
            shares = sorted(c.shares, key=lambda s: -abs(s.difference))
            for share in shares[:40]:
                style = "green" if share.difference > 0 else ("red" if share.difference < 0 else "dim")
                items.append(f"  {share.trajectory_id[:13]:<13} {share.draws():<12} {share.difference:+.2f}\n",
                             style=style)
            if not shares:
                items.append("  none: no item changed\n", style="dim")
        self.query_one("#helped-items", Static).update(items)
        diff = self.diffs.get(exp.id, "")
        body = Syntax(diff, "diff", theme="ansi_dark", word_wrap=True) if diff.strip() else Text("(no diff recorded)")
        self.query_one("#helped-diff", Static).update(Group(Text("\nits diff", style="bold"), body))

    def action_open_items(self) -> None:
        row = self.selected()
        if row is None or row.contribution is None:
            return
        c = row.contribution
        self.japp.open_item_list(f"items that depend on #{row.experiment.id}: fixed {len(c.fixed)}, broken "
                                 f"{len(c.broken)}", [*c.fixed, *c.broken], row.experiment.id)

    def action_open_experiment(self) -> None:
        row = self.selected()
        if row is not None:
            self.japp.experiment_id = row.experiment.id
            self.japp.switch_view("experiment")


class HelpView(View):
    """Every key, generated from the bindings (so a remapped key shows as remapped)."""

    view_name = "help"

    def body(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown("", id="help-text")

    def reload(self) -> None:
        self.set_title("help — judgeloop tui")
        self.query_one("#help-text", Markdown).update(self.japp.help_markdown())


def viewed_steps(replicates: Iterable[ReplicateVerdict]) -> set[int]:
    """Steps whose screenshot an agentic judge asked to view (calls it was not refused), in any replicate."""
    steps: set[int] = set()
    for rep in replicates:
        for call in rep.tools:
            if call.name == VIEW_SCREENSHOTS and call.outcome == "ok" and call.arguments:
                requested = call.arguments.get("steps")
                if isinstance(requested, list):
                    steps.update(s for s in requested if isinstance(s, int) and not isinstance(s, bool))
    return steps
