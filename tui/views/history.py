"""The start screen: the experiments table, the kappa and FPR curves."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Static

from optimizer.fmt import num
from optimizer.ledger import Experiment
from optimizer.report.data import accounting
from tui.data import History, HistoryRow, curve_points, load_history, matches_filter, one_line
from tui.messages import CompareMarked, ExperimentSelected, HistoryLoaded
from tui.views.base import View, decision_text
from tui.widgets import FixedColumnsTable, MetricChart

# (header, key, width): fixed widths so the table reads the same at 80 columns and at 200.
HISTORY_COLUMNS = (
    ("id", "id", 5),
    ("time", "time", 11),
    ("strategy", "strategy", 8),
    ("decision", "decision", 16),
    ("κ", "kappa", 6),
    ("FPR", "fpr", 5),
    ("bal.acc", "bacc", 7),
    ("Δκ", "dkappa", 6),
    ("ΔFPR", "dfpr", 6),
    ("p", "p", 6),
    ("+rej", "rejudge", 5),
    ("$", "cost", 7),
    ("rationale", "rationale", 60),
)
# Hidden in this order when the terminal is narrow (160 columns show all; 120 hide +rej and time; 80
# also strategy, bal.acc and ΔFPR): id, decision, κ, FPR, Δκ, p, $ and the rationale always show.
HISTORY_DROP_ORDER = ("rejudge", "time", "strategy", "bacc", "dfpr")
# A run with waves (`run --wave K`) adds its wave column after the decision (``w3 2/4``), hidden last.
WAVE_COLUMN = ("wave", "wave", 9)
WAVE_COLUMNS = (*HISTORY_COLUMNS[:4], WAVE_COLUMN, *HISTORY_COLUMNS[4:])
WAVE_DROP_ORDER = (*HISTORY_DROP_ORDER, "wave")
SORT_KEYS = ("id", "kappa", "fpr", "bacc", "dkappa", "p", "cost", "decision")


def _sort_value(row: HistoryRow, key: str) -> tuple[int, Any]:
    exp = row.experiment
    value: Any = {
        "id": row.wave_order,  # a wave's rows together, at its first member
        "kappa": exp.kappa,
        "fpr": exp.fpr,
        "bacc": exp.balanced_accuracy,
        "dkappa": row.d_kappa,
        "dfpr": row.d_fpr,
        "p": exp.p_value,
        "rejudge": exp.rejudge_calls,
        "cost": exp.cost_usd,
        "decision": exp.status,
        "time": exp.created,
        "strategy": exp.strategy or "",
        "rationale": exp.rationale or "",
    }.get(key, exp.id)
    return (value is None, value if value is not None else 0)


def decisions_summary(run: Any, experiments: list[Any]) -> str:
    """``"expected false keeps ≤ 0.40"`` (or "literal: no test") for the history title."""
    acc = accounting(run, experiments)
    if acc.expected_false_keeps is None:
        return "literal policy: false keeps not bounded"
    return f"expected false keeps ≤ {acc.expected_false_keeps:.2f}" + (
        f" (FDR {acc.fdr:g})" if acc.fdr else ""
    )


def wave_cell(row: HistoryRow) -> Text:
    """The wave column: ``w3 2/4``, the wave's kept member in bold green; blank for a single candidate."""
    style = "bold green" if row.experiment.status == "kept" else "dim" if row.wave is not None else ""
    return Text(row.wave_tag, style=style, no_wrap=True, overflow="ellipsis")


def decision_cell(exp: Experiment) -> Text:
    """The decision cell: a cheaper keep says so; a merged keep names the candidates it carries ([loop] stack);
    a pooled roll back says it pointed the right way."""
    text = decision_text(exp)
    if exp.keep_kind == "cheaper":
        return Text.assemble(text, Text(" cheaper", style="cyan"))
    if exp.carries:
        return Text.assemble(text, Text(f" carries {','.join(str(i) for i in exp.carries)}", style="cyan"))
    if exp.status == "rolled_back" and exp.pooled_on is not None:
        return Text.assemble(text, Text(" pooled", style="cyan"))
    return text


def history_cells(row: HistoryRow, weak: bool = False, waves: bool = False) -> tuple[Text, ...]:
    """One history row's cells as ready Text (no markup parsing on the UI thread; built in the worker).
    ``weak``: a kept edit whose contribution at the end is not significant (marked ``?``); ``waves``:
    with the wave column (`WAVE_COLUMNS`)."""
    exp = row.experiment
    plain = (
        exp.created.strftime("%m-%d %H:%M"),
        exp.strategy or "—",
    )
    metrics = row.metric_texts()  # an early-stopped candidate's partial ones, marked *
    return (
        Text(
            f"{exp.id}{'◆' if row.in_chain else ''}{'?' if weak else ''}",
            style="bold yellow" if weak else ("bold" if row.in_chain else ""),
        ),
        *(Text(v) for v in plain),
        decision_cell(exp),
        *((wave_cell(row),) if waves else ()),
        *(Text(v) for v in metrics),
        Text(row.delta_text("kappa"), style="green" if (row.d_kappa or 0) > 0 else ""),
        Text(row.delta_text("fpr"), style="red" if (row.d_fpr or 0) > 0 else ""),
        # The re-judging pass's extra judge calls (adaptive policy), blank when there was none.
        # An early stop's p is a bound (what the report prints as "≥0.188").
        Text(("≥" if exp.early_stopped and exp.p_value is not None else "") + num(exp.p_value)),
        Text(str(exp.rejudge_calls) if exp.rejudge_calls else ""),
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
    HistoryView #history-empty, HistoryView #history-nomatch { display: none; }
    HistoryView.-nomatch #history-nomatch { display: block; height: auto; padding: 0 1; text-style: bold; }
    HistoryView.-empty #history-empty { display: block; }
    HistoryView.-empty #history-table, HistoryView.-empty #charts { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "enter", "open_experiment", "Open", id="history.open", tooltip="Open the selected experiment"
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="history.filter",
            tooltip="Filter rows by words (status:kept matches a status)",
        ),
        Binding(
            "o", "cycle_sort", "Sort", id="history.sort", tooltip="Sort by the next column (again: reverse)"
        ),
        Binding(
            "m", "mark", "Mark", id="history.mark", tooltip="Mark this experiment as the left side of compare"
        ),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="history.clear-filter"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.history: History | None = None
        self.cells: dict[int, tuple[Text, ...]] = {}
        self.filter_text = ""
        self.sort_key = "id"
        self.sort_reverse = False
        self.wave_column = False  # the table shows WAVE_COLUMNS

    def body(self) -> ComposeResult:
        yield Input(
            placeholder="filter: words, or status:kept / status:rolled_back — enter applies, esc clears",
            id="history-filter",
            disabled=True,
            select_on_focus=False,
        )
        table = FixedColumnsTable(
            id="history-table",
            cursor_type="row",
            zebra_stripes=True,
            fill_column="rationale",
            drop_order=HISTORY_DROP_ORDER,
        )
        table.set_columns(HISTORY_COLUMNS)
        yield table
        yield Static("", id="history-nomatch")
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
        history = load_history(self.japp.ledger(), self.japp.run_id)
        waves = history.has_waves
        cells = {row.id: history_cells(row, row.id in history.weak_ids, waves) for row in history.rows}
        self.post_message(HistoryLoaded(history, cells, curve_points(history)))

    def not_ready(self) -> None:
        self.history, self.cells = None, {}
        self.add_class("-empty")
        self.set_title("history — no runs yet")

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        self.history, self.cells, points = message.history, message.cells, message.points
        self.remove_class("-empty")
        run = self.history.run
        waiting = self.history.waiting()
        title = Text.assemble(
            f"history — run {run.id} ({run.status}) · {run.strategy} · {run.policy} · split {run.split} · "
            f"{len(self.history.rows)} experiments · {decisions_summary(run, self.history.experiments)}",
        )
        if waiting is not None:
            title.append(
                f" · experiment {waiting.id} waiting: e then k keep / x discard", style="bold yellow"
            )
        title.append(self.history.partial_legend)
        if self.history.weak_ids:
            title.append(
                f" · ? = kept, but not significant at the end ({len(self.history.weak_ids)}; g shows)",
                style="yellow",
            )
        self.set_title(title)
        table = self.query_one("#history-table", FixedColumnsTable)
        if self.history.has_waves != self.wave_column:  # the wave column comes and goes with the run shown
            self.wave_column = self.history.has_waves
            table.drop_order = WAVE_DROP_ORDER if self.wave_column else HISTORY_DROP_ORDER
            table.set_rows([])
            table.set_columns(WAVE_COLUMNS if self.wave_column else HISTORY_COLUMNS)
        self.fill_table()
        self.query_one("#kappa-chart", MetricChart).show_points(points)
        self.query_one("#fpr-chart", MetricChart).show_points(points)

    def visible_rows(self) -> list[HistoryRow]:
        if self.history is None:
            return []
        rows = [r for r in self.history.rows if matches_filter(r, self.filter_text)]
        return sorted(rows, key=lambda r: _sort_value(r, self.sort_key), reverse=self.sort_reverse)

    def fill_table(self) -> None:
        table = self.query_one("#history-table", FixedColumnsTable)
        selected = self.selected_id()
        visible = self.visible_rows()
        table.set_rows([(str(row.id), self.cells[row.id]) for row in visible])
        # A filter that matches nothing says so (a blank table reads as "no experiments").
        nomatch = self.history is not None and bool(self.history.rows) and not visible
        self.set_class(nomatch, "-nomatch")
        if nomatch and self.history is not None:
            self.query_one("#history-nomatch", Static).update(
                f"no experiment matches the filter {self.filter_text.strip()!r} (of {len(self.history.rows)}) — "
                "esc clears it"
            )
        if selected is not None and str(selected) in table.rows:
            table.move_cursor(row=table.get_row_index(str(selected)))
        else:
            wanted = self.japp.experiment_id or (
                self.history.run.incumbent_experiment if self.history else None
            )
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
            self.post_message(ExperimentSelected(int(event.row_key.value)))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_experiment()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        self.sort_reverse = not self.sort_reverse if key == self.sort_key else False
        self.sort_key = key
        self.fill_table()

    def action_open_experiment(self) -> None:
        exp_id = self.selected_id()
        if exp_id is not None:
            self.post_message(ExperimentSelected(exp_id, switch_to="experiment"))

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
            self.sort_key = (
                SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
                if self.sort_key in SORT_KEYS
                else "id"
            )
            self.sort_reverse = False
        else:
            self.sort_reverse = True
        self.notify(f"sorted by {self.sort_key}{' (descending)' if self.sort_reverse else ''}", timeout=2)
        self.fill_table()

    def action_mark(self) -> None:
        exp_id = self.selected_id()
        if exp_id is not None:
            self.post_message(CompareMarked(exp_id))
