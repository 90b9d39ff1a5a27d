"""Two experiments side by side."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Static

from optimizer.stats.metrics import FLIP_ARROWS, FLIP_ROWS
from tui.data import load_comparison, one_line
from tui.messages import ComparisonLoaded
from tui.views.base import View, metric_rows, metric_table, status_text
from tui.views.experiment import partial_line, partial_rows


class CompareView(View):
    """Two experiments side by side: metrics, decision, diff, and the flips from left to right."""

    view_name = "compare"
    DEFAULT_CSS = """
    CompareView #compare-flips { height: auto; padding: 0 1; }
    CompareView #compare-main { height: 1fr; }
    CompareView .side { width: 1fr; border-right: solid $panel; padding: 0 1; }
    CompareView.-stacked #compare-main { layout: vertical; overflow-y: auto; }
    CompareView.-stacked .side { height: auto; border-right: none; border-bottom: solid $panel; }
    """
    # Below this width the two sides are one above the other: side by side, each half is too narrow for
    # the metric table's intervals.
    STACKED_BELOW = 120

    def body(self) -> ComposeResult:
        yield Static("", id="compare-flips")
        with Horizontal(id="compare-main"):
            with VerticalScroll(classes="side"):
                yield Static("", id="compare-left")
            with VerticalScroll(classes="side"):
                yield Static("", id="compare-right")

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < self.STACKED_BELOW, "-stacked")

    def reload(self) -> None:
        self.set_class(self.app.size.width < self.STACKED_BELOW, "-stacked")
        pair = self.japp.compare_pair()
        if pair is None:
            self.set_title("compare — select an experiment (and mark another with m in the history)")
            return
        self.load_pair(*pair)

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False, name="loading the comparison")
    def load_pair(self, left: int | None, right: int) -> None:
        ledger = self.japp.ledger()
        if left is None:  # nothing marked: compare with the incumbent it faced
            left = ledger.get_experiment(right).parent_id
        self.post_message(
            ComparisonLoaded(load_comparison(ledger, left, right) if left is not None else None)
        )

    def on_comparison_loaded(self, message: ComparisonLoaded) -> None:
        comparison = message.comparison
        if comparison is None:
            self.set_title(
                "compare — the baseline has no parent: mark another experiment with m in the history"
            )
            return
        left, right = comparison.left, comparison.right
        self.set_title(f"compare — experiment {left.id} (left) vs {right.id} (right)")
        f = comparison.flips
        self.query_one("#compare-flips", Static).update(
            "left → right: "
            + ", ".join(
                f"{sum(len(f[k]) for k in keys)} {words} ("
                + ", ".join(f"{FLIP_ARROWS[k]} {len(f[k])}" for k in keys)
                + ")"
                for words, keys in FLIP_ROWS
            )
        )
        for side, exp, other, partial in (
            ("#compare-left", left, right, comparison.left_partial),
            ("#compare-right", right, left, comparison.right_partial),
        ):
            # An early-stopped side: its partial metrics and the other side's on the same items (as the
            # experiment view shows them), not the "—" of metrics it never computed over every item.
            parts: list[Any] = [
                Text.assemble(
                    (f"experiment {exp.id} ", "bold"),
                    status_text(exp.status),
                    f" · {exp.strategy or 'baseline'}",
                ),
                *([Text(partial_line(partial), style="yellow")] if partial is not None else []),
                metric_table(partial_rows(partial) if partial is not None else metric_rows(exp, other)),
                Text(f"\n{one_line(exp.reason, 200)}\n", style="italic"),
                Text(one_line(exp.rationale, 200) + "\n"),
            ]
            if exp.diff_text:
                parts.append(Syntax(exp.diff_text, "diff", theme="ansi_dark", word_wrap=True))
            self.query_one(side, Static).update(Group(*parts))
