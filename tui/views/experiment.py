"""One experiment: decision and reason, metrics with intervals, the flip table, rationale, diff."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from optimizer.metrics import FLIP_ARROWS, FLIP_ROWS
from optimizer.report.data import rejudged_items
from optimizer.report.lines import cache_reads_line, fp_by_type_line, test_line, token_split
from tui.data import ExperimentDetail, load_experiment
from tui.messages import ExperimentLoaded
from tui.views.base import View, fmt_p, metric_rows, metric_table, status_text

FLIP_TITLES = {
    "tp_to_fn": "newly wrong: TP → FN (positive, now judged failed)",
    "fn_to_tp": "newly right: FN → TP (positive, now judged success)",
    "tn_to_fp": "newly wrong: TN → FP (negative, now judged success)",
    "fp_to_tn": "newly right: FP → TN (negative, now judged failed)",
}
# The flip table's cell (row, column) → flip key: rows as FLIP_ROWS (newly wrong, newly right), column 0
# holds the row's label, then positives, negatives.
FLIP_CELLS = {(row, col + 1): key for row, (_, keys) in enumerate(FLIP_ROWS) for col, key in enumerate(keys)}


class ExperimentView(View):
    """One experiment: decision and reason, metrics with intervals, the flip table, rationale, diff."""

    view_name = "experiment"
    DEFAULT_CSS = """
    ExperimentView #flip-table { height: auto; max-height: 6; margin: 1 0; }
    ExperimentView #experiment-body { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
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
        self.post_message(ExperimentLoaded(load_experiment(self.japp.ledger(), experiment_id)))

    def not_ready(self) -> None:
        self.detail = None

    def on_experiment_loaded(self, message: ExperimentLoaded) -> None:
        detail = self.detail = message.detail
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
        reads = cache_reads_line(exp.planned_cache_read_tokens, exp.cache_read_tokens)
        if reads is not None:
            decision.append("\n" + reads, style="bold yellow" if "WARNING" in reads else "")
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
