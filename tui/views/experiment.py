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

from optimizer.ledger import Experiment
from optimizer.report.data import rejudged_items
from optimizer.report.lines import cache_reads_line, fp_by_type_line, test_line, token_split
from optimizer.stats.metrics import FLIP_ARROWS, FLIP_ROWS
from tui.data import PARTIAL_MARK, STATUS_TEXT, ExperimentDetail, PartialMetrics, WaveDetail, load_experiment
from tui.messages import ExperimentLoaded
from tui.views.base import View, decision_text, fmt_p, metric_rows, metric_table, status_text

FLIP_TITLES = {
    "tp_to_fn": "newly wrong: TP → FN (positive, now judged failed)",
    "fn_to_tp": "newly right: FN → TP (positive, now judged success)",
    "tn_to_fp": "newly wrong: TN → FP (negative, now judged success)",
    "fp_to_tn": "newly right: FP → TN (negative, now judged failed)",
}
# The flip table's cell (row, column) → flip key: rows as FLIP_ROWS (newly wrong, newly right), column 0
# holds the row's label, then positives, negatives.
FLIP_CELLS = {(row, col + 1): key for row, (_, keys) in enumerate(FLIP_ROWS) for col, key in enumerate(keys)}


def partial_line(partial: PartialMetrics) -> str:
    """What the partial metrics are: ``* partial: over the 9 of 24 items judged before the early stop``."""
    return (
        f"{PARTIAL_MARK} partial metrics ({partial.judged_text}): over the {partial.judged} items judged before "
        f"the early stop, beside the incumbent's over the same {partial.judged} items"
    )


def partial_rows(partial: PartialMetrics) -> list[tuple[str, str, str, str, str]]:
    """The metric table of an early-stopped candidate: its partial metrics (marked), the incumbent's on
    the same items, the difference; no interval (none was computed on part of the items)."""
    rows = []
    for name in ("kappa", "fpr", "balanced_accuracy", "tpr", "tnr"):
        before = getattr(partial.incumbent, name) if partial.incumbent is not None else None
        rows.append(
            (
                name,
                partial.cell(name),
                "—",
                "—" if before is None else f"{before:.2f}{PARTIAL_MARK}",
                partial.delta_cell(name),
            )
        )
    return rows


def wave_text(exp: Experiment, detail: WaveDetail) -> Text:
    """A wave candidate's wave: which, its Holm rank, level and p (the stored level and p, the rank
    recomputed from the wave's p-values), then every sibling with its outcome."""
    wave = detail.wave
    line = Text.assemble(
        ("wave: ", "bold"),
        f"w{wave.number}, member {wave.position(exp.id)} of "
        f"{len(wave.members)} against experiment {wave.incumbent} · Holm over {wave.size}"
        + (f" at {wave.alpha:g}" if wave.alpha is not None else ""),
    )
    full = exp.status in ("kept", "rolled_back") and not exp.early_stopped and exp.test is not None
    if full and exp.p_value is not None:
        line.append(
            f": rank {detail.rank if detail.rank is not None else '— (p = 1)'}"
            + (f", level {exp.alpha:.3g}" if exp.alpha is not None else "")
            + f", p = {fmt_p(exp.p_value)}"
        )
    elif exp.status in ("kept", "rolled_back"):
        line.append(
            ": no full test (counted as p = 1, below no level)"
            + (f", level {exp.alpha:.3g}" if exp.alpha is not None else "")
        )
    line.append("\nits wave: ", style="bold")
    if not detail.siblings:
        line.append("no other candidate")
    for i, sib in enumerate(detail.siblings):
        line.append(" · " if i else "")
        line.append(f"{sib.id} ")
        line.append_text(status_text(sib.status))
        if sib.p_value is not None:
            line.append(f" (p {'≥ ' if sib.early_stopped else ''}{fmt_p(sib.p_value)})")
    return line


class ExperimentView(View):
    """One experiment: decision and reason, metrics with intervals, the flip table, rationale, diff."""

    view_name = "experiment"
    DEFAULT_CSS = """
    ExperimentView #flip-table { height: auto; max-height: 6; margin: 1 0; }
    ExperimentView #experiment-body { height: 1fr; }
    """
    # k and x are offered (footer, help) only on a candidate waiting for a decision; elsewhere the same
    # keys reach the hidden bindings after them, which say why nothing happened.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "k",
            "decide('keep')",
            "Keep",
            id="experiment.keep",
            tooltip="Keep the waiting candidate (propose-only mode)",
        ),
        Binding(
            "x",
            "decide('discard')",
            "Discard",
            id="experiment.discard",
            tooltip="Discard the waiting candidate (propose-only mode)",
        ),
        Binding(
            "k",
            "not_waiting('keep')",
            "Keep",
            show=False,
            id="experiment.keep-refused",
            tooltip="On an experiment that is not waiting: says why nothing is kept",
        ),
        Binding(
            "x",
            "not_waiting('discard')",
            "Discard",
            show=False,
            id="experiment.discard-refused",
            tooltip="On an experiment that is not waiting: says why nothing is discarded",
        ),
        Binding(
            "f",
            "focus_flips",
            "Flips",
            id="experiment.flips",
            tooltip="Focus the flip table (enter lists items)",
        ),
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
        self.refresh_bindings()

    @property
    def waiting(self) -> bool:
        """True when the shown experiment is a candidate waiting for a keep/discard decision."""
        return self.detail is not None and self.detail.experiment.status == "waiting"

    def check_action(self, action: str, _parameters: tuple[object, ...]) -> bool | None:
        if action == "decide":
            return self.waiting
        if action == "not_waiting":
            return not self.waiting
        return True

    def on_experiment_loaded(self, message: ExperimentLoaded) -> None:
        detail = self.detail = message.detail
        exp, parent = detail.experiment, detail.parent
        self.set_title(
            Text.assemble(
                f"experiment {exp.id} (run {exp.run_id}) · {exp.strategy or 'baseline'} · ",
                decision_text(exp),
                f" · parent {parent.id}" if parent else " · no parent",
            )
        )
        decision = Text.assemble(
            ("decision: ", "bold"),
            decision_text(exp) if exp.overrule is not None else status_text(exp.decision or exp.status),
        )
        if exp.test:
            decision.append(
                f"   sign-flip p = {fmt_p(exp.test['p_value'])} at alpha {exp.test['alpha']:.3g}"
                f" · first-pass McNemar p = {fmt_p(exp.test['mcnemar_p'])}"
            )
        elif exp.p_value is not None and exp.early_stopped:
            decision.append(f"   McNemar p ≥ {exp.p_value:.4f} (a bound: stopped early)")
        elif exp.p_value is not None:
            decision.append(f"   McNemar p = {exp.p_value:.4f}")
        if exp.early_stopped and (exp.test or exp.p_value is None):
            decision.append("   (stopped early)", style="italic")
        if detail.partial is not None:
            decision.append(f"\n{partial_line(detail.partial)}", style="yellow")
        if detail.wave is not None:
            decision.append("\n")
            decision.append_text(wave_text(exp, detail.wave))
        if exp.overrule is not None:  # a person's keep against the policy: what the policy said, and why
            decision.append(f"\n{exp.overrule}", style="bold yellow")
        if exp.reason != exp.overrule:
            decision.append(f"\n{exp.reason or 'no reason recorded'}")
        if exp.status == "waiting":
            decision.append("\nthis candidate is waiting: k keeps it, x discards it", style="bold yellow")
        decision.append(
            f"\nitems {exp.items_evaluated} · calls {exp.calls} + {exp.cache_hits} cached · "
            f"{token_split(exp.input_tokens, exp.cache_read_tokens, exp.cache_write_tokens, exp.output_tokens)} · "
            f"${exp.cost_usd:.4f}" + (f" · {exp.duration_s:.0f}s" if exp.duration_s else "")
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
        rows = partial_rows(detail.partial) if detail.partial is not None else metric_rows(exp, parent)
        self.query_one("#experiment-metrics", Static).update(metric_table(rows))
        self.refresh_bindings()  # k/x are offered only now that the status is known
        counts = exp.flip_counts()
        table = self.query_one("#flip-table", DataTable)
        table.clear()
        for label, keys in FLIP_ROWS:
            table.add_row(label, *(f"{FLIP_ARROWS[k]} {counts[k]}" for k in keys), key=label)
        rationale = Text.assemble(("rationale\n", "bold"), exp.rationale or "—")
        self.query_one("#experiment-rationale", Static).update(rationale)
        diff = exp.diff_text or ""
        files = ", ".join(exp.files_changed) or "no files"
        header = Text(
            f"\ndiff against parent — {files} (+{exp.insertions or 0} −{exp.deletions or 0})", style="bold"
        )
        body = (
            Syntax(diff, "diff", theme="ansi_dark", word_wrap=True)
            if diff.strip()
            else Text("(no diff: baseline)")
        )
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
        if self.detail is None or not self.waiting:
            self.action_not_waiting(decision)
            return
        exp = self.detail.experiment
        warning = None
        if decision == "keep" and exp.policy_keep is False:
            warning = (
                f"The policy rolls it back ({exp.policy_reason or 'no reason recorded'}). Keeping it overrules "
                'the policy: the ledger, the report, the commit and this TUI will say "kept (overruled)".'
            )
        self.japp.decide_waiting(exp.id, decision, warning)

    def action_not_waiting(self, decision: str) -> None:
        """k or x on an experiment that is not waiting: say why nothing happened."""
        if self.detail is None:
            why = "no experiment is shown"
        else:
            exp = self.detail.experiment
            why = (
                f"experiment {exp.id} is {STATUS_TEXT.get(exp.status, exp.status)}, not waiting for a decision "
                "(only a waiting candidate, of a propose-only run, can be kept or discarded)"
            )
        self.notify(f"nothing to {decision}: {why}", severity="warning", timeout=6)
