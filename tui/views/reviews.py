"""Every human review in the ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from tui.data import REVIEW_LABELS, one_line
from tui.messages import ItemSelected, ReviewsLoaded
from tui.views.base import View

if TYPE_CHECKING:
    from optimizer.ledger import Review


class ReviewsView(View):
    """Every human review in the ledger; enter opens the item, E exports them as JSONL."""

    view_name = "reviews"
    DEFAULT_CSS = "ReviewsView #review-table { height: 1fr; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_item", "Open", id="reviews.open", tooltip="Open the reviewed item"),
        Binding(
            "E",
            "export",
            "Export",
            id="reviews.export",
            tooltip="Write every review to experiments/reviews.jsonl (like `judgeloop reviews --export`)",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.reviews: list[Review] = []

    def body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="review-table", cursor_type="row", zebra_stripes=True)
        for label, key, width in (
            ("#", "id", 4),
            ("when", "when", 16),
            ("item", "item", 13),
            ("exp", "exp", 5),
            ("kind", "kind", 16),
            ("note", "note", 50),
            ("by", "author", 10),
        ):
            table.add_column(label, key=key, width=width)
        yield table
        yield Static(
            "reviews guide the agent strategy and feed the memory strategy; `judgeloop reviews --export FILE` "
            "writes them as JSONL",
            classes="hint",
        )

    def reload(self) -> None:
        self.load_reviews()

    @work(thread=True, exclusive=True, group="reviews", exit_on_error=False, name="loading reviews")
    def load_reviews(self) -> None:
        self.post_message(ReviewsLoaded(self.japp.ledger().reviews()))

    def not_ready(self) -> None:
        self.show_reviews([])

    def on_reviews_loaded(self, message: ReviewsLoaded) -> None:
        self.show_reviews(message.reviews)

    def show_reviews(self, reviews: list[Review]) -> None:
        self.reviews = reviews
        self.set_title(f"reviews — {len(reviews)} in the ledger")
        table = self.query_one("#review-table", DataTable)
        table.clear()
        for r in reviews:
            table.add_row(
                str(r.id),
                f"{r.created:%Y-%m-%d %H:%M}",
                r.trajectory_id[:13],
                str(r.experiment_id or "—"),
                REVIEW_LABELS[r.kind],
                one_line(r.note, 50),
                r.author,
                key=str(r.id),
            )

    def action_open_item(self) -> None:
        table = self.query_one("#review-table", DataTable)
        if table.row_count == 0:
            return
        review = self.reviews[table.cursor_row]
        self.post_message(ItemSelected(review.trajectory_id, experiment_id=review.experiment_id))

    def action_export(self) -> None:
        self.japp.export_reviews()
