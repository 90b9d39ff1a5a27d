"""The label-suspects queue: items judged against their label by most prompt versions and replicates,
with high confidence, over every run on the shown run's split (`optimizer.answers.triage`); enter opens one,
x records a correction."""

from __future__ import annotations

import os
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from optimizer.answers.triage import Suspect
from tui.data import one_line
from tui.items import SuspectQueue, load_suspects, save_correction
from tui.messages import ItemSelected, SuspectsLoaded
from tui.modals import CorrectionModal
from tui.views.base import View
from tui.widgets import FixedColumnsTable


class SuspectsView(View):
    """The ranked label suspects of the shown run's split, with their corrections."""

    view_name = "suspects"
    DEFAULT_CSS = "SuspectsView #suspect-table { height: 1fr; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "enter",
            "open_item",
            "Open",
            id="suspects.open",
            tooltip="Open the selected item (under the latest experiment that judged it)",
        ),
        Binding(
            "x",
            "correct",
            "Correct",
            id="suspects.correct",
            tooltip="Correct the selected item's label, with a reason (devset/<split>/corrections.jsonl)",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.queue: SuspectQueue | None = None

    def body(self) -> ComposeResult:
        yield Static(
            "score: the share of judgements against the label, weighted by confidence (high 1, medium "
            "½, low 0; 1 when a unanimous panel, a review or criteria citing steps back it); every "
            "version, replicate and panel member of every run on the split",
            classes="hint",
        )
        table = FixedColumnsTable(
            id="suspect-table", cursor_type="row", zebra_stripes=True, fill_column="correction", fill_min=8
        )
        for label, key, width in (
            ("#", "rank", 3),
            ("item", "id", 9),
            ("given", "label", 7),
            ("score", "score", 5),
            ("against", "against", 7),
            ("high", "high", 4),
            ("versions", "versions", 8),
            ("correction", "correction", 8),
        ):
            table.add_column(label, key=key, width=width)
        yield table

    def reload(self) -> None:
        self.load_queue()

    @work(
        thread=True, exclusive=True, group="suspects", exit_on_error=False, name="loading the label suspects"
    )
    def load_queue(self) -> None:
        self.post_message(
            SuspectsLoaded(load_suspects(self.japp.ledger(), self.japp.ws_root, self.japp.run_id))
        )

    def not_ready(self) -> None:
        self.set_title("label suspects — no run yet (press r to start one)")

    def on_suspects_loaded(self, message: SuspectsLoaded) -> None:
        q = self.queue = message.queue
        if q.problem:
            self.set_title(Text(f"label suspects — split {q.split}: {q.problem}", style="red"))
        else:
            self.set_title(
                f"label suspects — split {q.split}: {len(q.suspects)} items, {q.corrections} corrected "
                "(x corrects the selected one)"
            )
        table = self.query_one("#suspect-table", DataTable)
        table.clear()
        for rank, s in enumerate(q.suspects, start=1):
            fixed = (
                Text(f"→ {s.correction.label}: {one_line(s.correction.reason, 200)}", style="green")
                if s.correction
                else Text("")
            )
            table.add_row(
                str(rank),
                s.trajectory_id[:8],
                s.given_word,
                f"{s.score:.2f}",
                f"{s.against}/{s.judged}",
                str(s.high_against),
                f"{s.versions_against}/{s.versions}",
                fixed,
                key=s.trajectory_id,
            )

    def selected(self) -> Suspect | None:
        table = self.query_one("#suspect-table", DataTable)
        if self.queue is None or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((s for s in self.queue.suspects if s.trajectory_id == key), None)

    def action_open_item(self) -> None:
        s = self.selected()
        if s is not None:
            self.post_message(ItemSelected(s.trajectory_id, experiment_id=s.last_experiment))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_item()

    def action_correct(self) -> None:
        s, q = self.selected(), self.queue
        if s is None or q is None:
            self.notify("no suspect selected", timeout=2)
            return

        def answered(result: tuple[str, str] | None) -> None:
            if result is not None:
                self.write_correction(q.split, s.trajectory_id, *result)

        self.app.push_screen(CorrectionModal(s.trajectory_id, s.given_word, q.split), answered)

    @work(
        thread=True,
        exclusive=False,
        group="corrections-write",
        exit_on_error=False,
        name="saving the correction",
    )
    def write_correction(self, split: str, trajectory_id: str, label: str, reason: str) -> None:
        done = save_correction(
            self.japp.ws_root, split, trajectory_id, label, reason, os.environ.get("USER") or None
        )
        self.app.call_from_thread(self.notify, done, timeout=4)
        self.app.call_from_thread(self.reload)
