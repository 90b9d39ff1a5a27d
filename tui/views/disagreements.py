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

# (header, key, width); the reasoning fills what is left (hidden when narrow: shown under the table).
DISAGREEMENT_COLUMNS = (
    ("item", "id", 9),
    ("kind", "kind", 4),
    ("label type", "type", 18),
    ("judge", "judge", 7),
    ("conf.", "conf", 13),
    ("unst.", "unstable", 5),
    ("rev.", "reviewed", 4),
    ("reasoning", "reasoning", 24),
)


def judge_answer(d: Disagreement) -> str:
    return {True: "success", False: "failure", None: d.verdict.status}[d.verdict.success]


def disagreement_cells(d: Disagreement) -> tuple[Text, ...]:
    """One row's cells (DISAGREEMENT_COLUMNS): the mistake type and the confidences wrap in their
    columns; the reasoning is one line here (whole under the table)."""
    return (
        Text(d.trajectory_id[:8]),
        Text(d.kind, style="red" if d.kind == "FP" else "yellow"),
        Text(d.label.mistake_type or ("—" if d.label.positive else UNTYPED)),
        Text(judge_answer(d)),
        Text(d.confidence.replace("/", " ")),  # two replicates on one line; a third wraps at a word
        Text("yes" if d.verdict.unstable else ""),
        Text("yes" if d.reviewed else ""),
        Text(one_line(d.reasoning, 240), no_wrap=True, overflow="ellipsis"),
    )


def detail_text(d: Disagreement | None) -> Text:
    """The selected disagreement, whole and wrapped (what the narrow table's columns cannot hold)."""
    if d is None:
        return Text("")
    out = Text.assemble(
        (f"{d.trajectory_id} ", "bold"),
        (d.kind, "red" if d.kind == "FP" else "yellow"),
        f" · label {d.label.label}",
    )
    if not d.label.positive:
        out.append(f" · {d.label.mistake_type or UNTYPED}")
    out.append(f" · judge {judge_answer(d)} (confidence {d.confidence})")
    out.append(f"\n{d.reasoning or '(no reasoning)'}")
    return out


class DisagreementsView(View):
    """The items where the judge and the label disagree, for one experiment, with filters."""

    view_name = "disagreements"
    DEFAULT_CSS = """
    DisagreementsView #disagreement-table { height: 1fr; }
    DisagreementsView #disagreement-none { display: none; }
    DisagreementsView.-none #disagreement-none { display: block; }
    DisagreementsView.-none #disagreement-table, DisagreementsView.-none #disagreement-detail { display: none; }
    DisagreementsView #disagreement-detail { height: auto; max-height: 45%; padding: 0 1; border-top: solid $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_item", "Open", id="disagreements.open", tooltip="Open the selected item"),
        Binding(
            "f",
            "cycle_kind",
            "FP/FN",
            id="disagreements.kind",
            tooltip="Show all / false positives / false negatives",
        ),
        Binding(
            "t", "cycle_type", "Type", id="disagreements.type", tooltip="Filter by the label's mistake type"
        ),
        Binding(
            "u",
            "cycle_unstable",
            "Unstable",
            id="disagreements.unstable",
            tooltip="Any / unstable across replicates / stable",
        ),
        Binding(
            "n",
            "cycle_reviewed",
            "Reviewed",
            id="disagreements.reviewed",
            tooltip="Any / not reviewed / reviewed",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Disagreement] = []
        self.filters = DisagreementFilter()

    def body(self) -> ComposeResult:
        yield Static("", id="disagreement-filters", classes="hint")
        # Rows are as high as their wrapped cells (a long mistake type takes two lines, never cut); the
        # reasoning column takes the width the others leave, and below 120 columns it is hidden: the
        # selected row's reasoning is always shown whole, wrapped, under the table.
        table = FixedColumnsTable(
            id="disagreement-table",
            cursor_type="row",
            zebra_stripes=True,
            fill_column="reasoning",
            fill_min=24,
            drop_order=("reasoning",),
            row_height=None,
        )
        table.set_columns(DISAGREEMENT_COLUMNS)
        yield table
        yield Static("", id="disagreement-none", classes="empty")
        yield Static("", id="disagreement-detail")

    def reload(self) -> None:
        if self.japp.experiment_id is None:
            self.set_title("disagreements — no experiment selected (pick one in the history, h)")
            return
        self.load_items(self.japp.experiment_id)

    @work(
        thread=True, exclusive=True, group="disagreements", exit_on_error=False, name="loading disagreements"
    )
    def load_items(self, experiment_id: int) -> None:
        self.post_message(DisagreementsLoaded(*load_disagreements(self.japp.ledger(), experiment_id)))

    def on_disagreements_loaded(self, message: DisagreementsLoaded) -> None:
        exp, items = message.experiment, message.items
        self.items = items
        n_fp = sum(d.kind == "FP" for d in items)
        self.set_title(
            f"disagreements — experiment {exp.id} ({STATUS_TEXT.get(exp.status, exp.status)}): "
            f"{len(items)} items, {n_fp} FP, {len(items) - n_fp} FN"
        )
        self.fill()

    def fill(self) -> None:
        self.query_one("#disagreement-filters", Static).update(
            f"filters: {self.filters.describe()}   (f kind · t type · u unstable · n reviewed)"
        )
        table = self.query_one("#disagreement-table", FixedColumnsTable)
        shown = [d for d in self.items if self.filters.accepts(d)]
        table.set_rows([(d.trajectory_id, disagreement_cells(d)) for d in shown])
        # An empty table says why: nothing disagrees at all, or nothing passes the filters.
        if not self.items:
            none = "no disagreements: the judge agrees with every label under this experiment"
        else:
            none = (
                f"no disagreement matches these filters ({self.filters.describe()}) — {len(self.items)} "
                "without them; f t u n change them"
            )
        self.query_one("#disagreement-none", Static).update(none)
        self.set_class(not shown, "-none")
        self.show_detail()

    def selected(self) -> Disagreement | None:
        table = self.query_one("#disagreement-table", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((d for d in self.items if d.trajectory_id == key), None)

    def show_detail(self) -> None:
        """The selected disagreement in full, wrapped: its label with the whole mistake type, the judge's
        answer and the first replicate's reasoning."""
        self.query_one("#disagreement-detail", Static).update(detail_text(self.selected()))

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.show_detail()

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
        self.filters.mistake_type = (
            order[(order.index(current) + 1) % len(order)] if current in order else None
        )
        self.fill()

    def action_cycle_unstable(self) -> None:
        order: list[bool | None] = [None, True, False]
        self.filters.unstable = order[(order.index(self.filters.unstable) + 1) % 3]
        self.fill()

    def action_cycle_reviewed(self) -> None:
        order: list[bool | None] = [None, False, True]
        self.filters.reviewed = order[(order.index(self.filters.reviewed) + 1) % 3]
        self.fill()
