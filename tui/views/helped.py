"""What helped: each kept edit's gain when kept beside its contribution at the end."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from optimizer.fmt import num, signed
from tui.data import Helped, HelpedRow, bar, load_helped, one_line
from tui.messages import ExperimentSelected, HelpedLoaded
from tui.views.base import View
from tui.widgets import FixedColumnsTable

# (header, key, width); the note fills what is left.
HELPED_COLUMNS = (
    ("edit", "edit", 6),
    ("commit", "commit", 8),
    ("gain when kept", "gain", 19),
    ("at the end", "end", 19),
    ("p", "p", 5),
    ("Δκ", "dkappa", 6),
    ("ΔFPR", "dfpr", 6),
    ("fix/brk", "flips", 7),
    ("note", "note", 30),
)


def helped_note(row: HelpedRow) -> str:
    """The note on a kept edit's contribution: not measured yet, not significant, the attribution's own."""
    c = row.contribution
    note = "not measured yet: judgeloop attribute" if c is None else (c.note or "")
    if row.significant is False:
        note = "not significant at the end" + (f"; {note}" if note else "")
    return note


def helped_cells(row: HelpedRow, scale: float) -> tuple[Text, ...]:
    """A kept edit's cells: its gain when kept and its contribution at the end, each as a bar."""
    exp, c = row.experiment, row.contribution

    def bar_cell(value: float | None, style: str) -> Text:
        if value is None:
            return Text("—", style="dim")
        return Text.assemble((f"{value:+6.2f} ", ""), (bar(value, scale), "red" if value < 0 else style))

    at_end = c.items if c is not None else None
    note = helped_note(row)
    return (
        Text(f"#{exp.id}", style="bold"),
        Text((exp.commit_sha or "")[:8]),
        bar_cell(row.gain, "cyan"),
        bar_cell(at_end, "green" if row.significant else "yellow"),
        Text(num(c.p_value if c else None)),
        Text(signed(c.kappa_delta if c else None)),
        Text(signed(c.fpr_delta if c else None)),
        Text(f"+{len(c.fixed)}/-{len(c.broken)}" if c is not None and c.items is not None else "—"),
        Text(
            note or one_line(exp.rationale, 120),
            no_wrap=True,
            overflow="ellipsis",
            style="yellow" if row.significant is False else "",
        ),
    )


class HelpedView(View):
    """What helped: the kept edits (newest first), each one's gain when kept beside its contribution at
    the end (`judgeloop attribute`), as bars; the selected edit's diff and the items that depend on it."""

    view_name = "helped"
    DEFAULT_CSS = """
    HelpedView #helped-table { height: auto; max-height: 45%; min-height: 4; overflow-x: hidden; }
    HelpedView #helped-detail { height: 1fr; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "enter",
            "open_items",
            "Items",
            id="helped.items",
            tooltip="List the items that depend on the selected edit (enter opens one)",
        ),
        Binding(
            "e",
            "open_experiment",
            "Experiment",
            id="helped.experiment",
            tooltip="Open the selected edit's experiment (its decision when it was kept)",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.helped: Helped | None = None
        self.diffs: dict[int, str] = {}

    def body(self) -> ComposeResult:
        yield Static("", id="helped-summary", classes="hint")
        # Narrow, the fix/brk, commit and note columns go (in that order): the detail below shows them.
        table = FixedColumnsTable(
            id="helped-table",
            cursor_type="row",
            zebra_stripes=True,
            fill_column="note",
            drop_order=("flips", "commit", "note"),
        )
        table.set_columns(HELPED_COLUMNS)
        yield table
        with VerticalScroll(id="helped-detail"):
            yield Static("", id="helped-items")
            yield Static("", id="helped-diff")

    def reload(self) -> None:
        self.query_one("#helped-table", DataTable).focus()
        self.load_helped()

    @work(thread=True, exclusive=True, group="helped", exit_on_error=False, name="loading what helped")
    def load_helped(self) -> None:
        ledger = self.japp.ledger()
        helped = load_helped(ledger, self.japp.run_id)
        values = [
            abs(v)
            for r in helped.rows
            for v in (r.gain, r.contribution.items if r.contribution else None)
            if v is not None
        ]
        scale = max(values, default=1.0) or 1.0
        diffs = {r.experiment.id: ledger.get_experiment(r.experiment.id).diff_text or "" for r in helped.rows}
        self.post_message(
            HelpedLoaded(helped, {r.experiment.id: helped_cells(r, scale) for r in helped.rows}, diffs)
        )

    def not_ready(self) -> None:
        self.set_title("what helped — no runs yet")

    def on_helped_loaded(self, message: HelpedLoaded) -> None:
        helped = self.helped = message.helped
        cells, self.diffs = message.cells, message.diffs
        a = helped.attribution
        self.set_title(f"what helped — run {helped.run.id}: {len(helped.rows)} kept edit(s), newest first")
        if a is None:
            summary = Text(
                "contribution at the end not measured yet: run `judgeloop attribute` "
                "(each kept edit reverted from the final prompts, re-judged on the dev split)",
                style="yellow",
            )
        else:
            fvb = a.final_vs_baseline
            summary = Text(
                f"attribution {a.id} ({a.status}) · final {a.final_commit[:8]} vs it without each edit · "
                f"{a.judge} · items = Σ change in the share of correct judgements · ${a.cost_usd:.4f}"
            )
            if fvb is not None and fvb.items is not None:
                summary.append(
                    f"\nfinal vs baseline {a.baseline_commit[:8]}: {fvb.items:+.2f} items, "
                    f"Δκ {signed(fvb.kappa_delta)}, ΔFPR {signed(fvb.fpr_delta)}, "
                    f"p {num(fvb.p_value)}",
                    style="bold",
                )
            if a.note:
                summary.append(f"\n{a.note}", style="yellow")
        self.query_one("#helped-summary", Static).update(summary)
        table = self.query_one("#helped-table", FixedColumnsTable)
        table.set_rows([(str(row.experiment.id), cells[row.experiment.id]) for row in helped.rows])
        if helped.rows:
            self.show_detail(helped.rows[0])

    def selected(self) -> HelpedRow | None:
        table = self.query_one("#helped-table", DataTable)
        if self.helped is None or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.helped.rows if str(r.experiment.id) == key), None)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(ExperimentSelected(row.experiment.id))
            self.show_detail(row)

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_items()

    def show_detail(self, row: HelpedRow) -> None:
        exp, c = row.experiment, row.contribution
        items = Text.assemble((f"#{exp.id} ", "bold"), f"{one_line(exp.rationale, 160)}\n")
        # What the table's hidden columns hold when narrow: the commit, the fixed/broken counts, the note.
        facts = [f"commit {(exp.commit_sha or '—')[:8]}"]
        if c is not None and c.items is not None:
            facts.append(f"fixed {len(c.fixed)}, broke {len(c.broken)}")
        note = helped_note(row)
        items.append(
            " · ".join(facts) + (f" · {note}" if note else "") + "\n",
            style="yellow" if row.significant is False else "dim",
        )
        if c is None or c.items is None:
            items.append(
                c.note if c is not None and c.note else "its contribution at the end is not measured yet",
                style="italic",
            )
        else:
            if c.entangled_with:
                items.append(
                    f"entangled with {', '.join(f'#{e}' for e in c.entangled_with)}: measured by reverting "
                    "them together\n",
                    style="yellow",
                )
            items.append(
                "items that depend on it (share of correct judgements without it → at the end):\n",
                style="bold",
            )
            shares = sorted(c.shares, key=lambda s: -abs(s.difference))
            for share in shares[:40]:
                style = "green" if share.difference > 0 else ("red" if share.difference < 0 else "dim")
                items.append(
                    f"  {share.trajectory_id[:13]:<13} {share.draws():<12} {share.difference:+.2f}\n",
                    style=style,
                )
            if not shares:
                items.append("  none: no item changed\n", style="dim")
        self.query_one("#helped-items", Static).update(items)
        diff = self.diffs.get(exp.id, "")
        body = (
            Syntax(diff, "diff", theme="ansi_dark", word_wrap=True)
            if diff.strip()
            else Text("(no diff recorded)")
        )
        self.query_one("#helped-diff", Static).update(Group(Text("\nits diff", style="bold"), body))

    def action_open_items(self) -> None:
        row = self.selected()
        if row is None or row.contribution is None:
            return
        c = row.contribution
        self.japp.open_item_list(
            f"items that depend on #{row.experiment.id}: fixed {len(c.fixed)}, broken {len(c.broken)}",
            [*c.fixed, *c.broken],
            row.experiment.id,
        )

    def action_open_experiment(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(ExperimentSelected(row.experiment.id, switch_to="experiment"))
