"""Every run side by side: each run's experiments in one table with a run column, oldest run first —
the one-run-per-edit manual workflow's edits one after another (the history shows one run)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from tui.data import PARTIAL_MARK, AllRuns, AllRunsRow, load_all_runs, one_line
from tui.messages import AllRunsLoaded, ExperimentSelected, RunPicked
from tui.views.base import View, decision_text
from tui.widgets import FixedColumnsTable

# (header, key, width): the run first (its number in time, as the run picker R numbers it), then the
# figures that tell one edit from the next, then the rest (a narrow terminal hides time, strategy and the
# rationale; the line under the table gives them in full).
ALL_RUNS_COLUMNS = (
    ("run", "run", 3),
    ("id", "id", 5),
    ("decision", "decision", 16),
    ("κ", "kappa", 6),
    ("FPR", "fpr", 6),
    ("Δκ", "dkappa", 6),
    ("ΔFPR", "dfpr", 6),
    ("time", "time", 11),
    ("strategy", "strategy", 8),
    ("$", "cost", 7),
    ("rationale", "rationale", 40),
)


def all_runs_cells(entry: AllRunsRow) -> tuple[Text, ...]:
    """One experiment's cells: the run it belongs to, then its history figures (partial ones marked ``*``)."""
    row, exp = entry.row, entry.row.experiment
    kappa, fpr, _ = row.metric_texts()
    dim = "dim" if exp.status == "baseline" else ""
    return (
        Text(f"#{entry.number}", style="bold"),
        Text(f"{exp.id}{'◆' if row.in_chain else ''}", style="bold" if row.in_chain else dim),
        decision_text(exp),
        Text(kappa),
        Text(fpr),
        Text(row.delta_text("kappa"), style="green" if (row.d_kappa or 0) > 0 else ""),
        Text(row.delta_text("fpr"), style="red" if (row.d_fpr or 0) > 0 else ""),
        Text(exp.created.strftime("%m-%d %H:%M"), style=dim),
        Text(exp.strategy or "—", style=dim),
        Text(f"{exp.cost_usd:.4f}"),
        Text(one_line(exp.rationale, 120), no_wrap=True, overflow="ellipsis"),
    )


def detail_line(entry: AllRunsRow) -> Text:
    """The highlighted experiment under the table: its run, id, time, strategy and whole rationale."""
    exp = entry.row.experiment
    line = Text(
        f"run #{entry.number} {entry.run.id} · experiment {exp.id} · {exp.created:%m-%d %H:%M} · "
        f"{exp.strategy or 'baseline'} · ",
        style="bold",
    )
    line.append(one_line(exp.rationale, 400) or "no rationale")
    return line


class AllRunsView(View):
    """Every run's experiments in one table (a run column, oldest run first); enter opens one."""

    view_name = "runs"
    DEFAULT_CSS = """
    AllRunsView #all-runs-table { height: 1fr; overflow-x: hidden; }
    AllRunsView #all-runs-detail { height: auto; max-height: 3; padding: 0 1; background: $boost; }
    AllRunsView #all-runs-empty { display: none; }
    AllRunsView.-empty #all-runs-empty { display: block; }
    AllRunsView.-empty #all-runs-table, AllRunsView.-empty #all-runs-detail { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "enter",
            "open_experiment",
            "Open",
            id="runs.open",
            tooltip="Open the selected experiment (the history then shows its run)",
        ),
        Binding(
            "b",
            "toggle_baselines",
            "Baselines",
            id="runs.baselines",
            tooltip="Hide or show each run's baseline (candidates only: successive edits one under another)",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.all_runs: AllRuns | None = None
        self.cells: dict[int, tuple[Text, ...]] = {}
        self.show_baselines = True

    def body(self) -> ComposeResult:
        # Narrow, the time, strategy and rationale columns go (in that order), never cut mid-column: the
        # line under the table gives the highlighted row's run, time, strategy and rationale.
        table = FixedColumnsTable(
            id="all-runs-table",
            cursor_type="row",
            zebra_stripes=True,
            fill_column="rationale",
            drop_order=("time", "strategy", "rationale"),
        )
        table.set_columns(ALL_RUNS_COLUMNS)
        yield table
        yield Static("", id="all-runs-detail")
        yield Static("no runs yet — press r to start one", id="all-runs-empty", classes="empty")

    def reload(self) -> None:
        self.query_one("#all-runs-table", DataTable).focus()
        self.load_all_runs()

    @work(thread=True, exclusive=True, group="all-runs", exit_on_error=False, name="loading every run")
    def load_all_runs(self) -> None:
        all_runs = load_all_runs(self.japp.ledger())
        self.post_message(
            AllRunsLoaded(all_runs, {entry.id: all_runs_cells(entry) for entry in all_runs.rows})
        )

    def not_ready(self) -> None:
        self.all_runs, self.cells = None, {}
        self.add_class("-empty")
        self.set_title("all runs — no runs yet")

    def on_all_runs_loaded(self, message: AllRunsLoaded) -> None:
        self.all_runs, self.cells = message.all_runs, message.cells
        self.remove_class("-empty")
        self.show_title()
        self.fill_table()

    def show_title(self) -> None:
        if self.all_runs is None:
            return
        n_runs, rows = len(self.all_runs.runs), self.all_runs.rows
        partial = any(entry.row.partial is not None for entry in rows)
        self.set_title(
            f"all runs — {n_runs} run{'s' if n_runs != 1 else ''}, {len(rows)} experiments, oldest first"
            + ("" if self.show_baselines else " · baselines hidden (b)")
            + (f" · {PARTIAL_MARK} = judged items only (early stop), Δ on the same items" if partial else "")
            + " · R: one run"
        )

    def visible_rows(self) -> list[AllRunsRow]:
        if self.all_runs is None:
            return []
        return [e for e in self.all_runs.rows if self.show_baselines or e.row.experiment.status != "baseline"]

    def fill_table(self) -> None:
        table = self.query_one("#all-runs-table", FixedColumnsTable)
        selected = self.selected_id()
        table.set_rows([(str(entry.id), self.cells[entry.id]) for entry in self.visible_rows()])
        wanted = selected or self.japp.experiment_id
        if wanted is not None and str(wanted) in table.rows:
            table.move_cursor(row=table.get_row_index(str(wanted)))
        elif table.row_count:
            table.move_cursor(row=table.row_count - 1)  # the newest edit

    def selected_id(self) -> int | None:
        table = self.query_one("#all-runs-table", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return int(key) if key is not None else None

    def entry(self, experiment_id: int) -> AllRunsRow | None:
        rows = self.all_runs.rows if self.all_runs is not None else []
        return next((e for e in rows if e.id == experiment_id), None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            entry = self.entry(int(event.row_key.value))
            if entry is not None:
                self.query_one("#all-runs-detail", Static).update(detail_line(entry))
            self.post_message(ExperimentSelected(int(event.row_key.value)))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_experiment()

    def action_open_experiment(self) -> None:
        exp_id = self.selected_id()
        entry = self.entry(exp_id) if exp_id is not None else None
        if entry is None:
            return
        self.post_message(RunPicked(entry.run.id, switch_to=None))  # h then shows this experiment's run
        self.post_message(ExperimentSelected(entry.id, switch_to="experiment"))

    def action_toggle_baselines(self) -> None:
        self.show_baselines = not self.show_baselines
        self.show_title()
        self.fill_table()
