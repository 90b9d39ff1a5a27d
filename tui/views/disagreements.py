"""The items where the judge and the label disagree, for one experiment, with filters."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from optimizer.vocab import MISTAKE_TYPES, UNTYPED
from tui.data import STATUS_TEXT, one_line
from tui.items import Disagreement, DisagreementFilter, load_disagreements
from tui.messages import DisagreementsLoaded, ItemSelected
from tui.views.base import View
from tui.widgets import FixedColumnsTable


class DisagreementsView(View):
    """The items where the judge and the label disagree, for one experiment, with filters."""

    view_name = "disagreements"
    DEFAULT_CSS = "DisagreementsView #disagreement-table { height: 1fr; }"
    BINDINGS: ClassVar[list[BindingType]] = [
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
        self.post_message(DisagreementsLoaded(*load_disagreements(self.japp.ledger(), experiment_id)))

    def on_disagreements_loaded(self, message: DisagreementsLoaded) -> None:
        exp, items = message.experiment, message.items
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
            self.post_message(ItemSelected(key))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_item()

    def action_cycle_kind(self) -> None:
        order: list[str | None] = [None, "FP", "FN"]
        self.filters.kind = order[(order.index(self.filters.kind) + 1) % len(order)]
        self.fill()

    def action_cycle_type(self) -> None:
        order: list[str | None] = [None, *MISTAKE_TYPES, UNTYPED]
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
