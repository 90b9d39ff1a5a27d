"""Single-purpose widgets: the live status strip, the kappa/FPR charts, the step screenshot."""

from __future__ import annotations

import os
import re
import select
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from PIL import Image as PILImage
from rich.text import Text
from textual import events
from textual.app import ComposeResult, RenderResult
from textual.binding import Binding
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Static
from textual.widgets._footer import FooterKey, FooterLabel
from textual.widgets.data_table import ColumnKey, RowKey
from textual_plotext import PlotextPlot

from tui.data import CurvePoints, x_ticks
from tui.watch import LiveState

if TYPE_CHECKING:
    # Only for the annotation: importing textual_image.widget queries the terminal (see StepImage).
    from textual_image.widget._base import Image as BaseImage

# The device status report's answer ("ESC [ 0 n", or 3 for a malfunction): the end of the replies.
_STATUS_REPLY = re.compile(rb"\x1b\[[0-9]n")


def ask_terminal_before_start(timeout_s: float = 1.0) -> None:
    """Let textual-image ask the terminal what it can show while this process still reads the input.

    textual-image asks at its first import (primary device attributes for sixel, a kitty graphics
    query, the cell size) and reads the answers from stdin; once Textual runs, its input thread reads
    them instead, as keys: "ESC [ ? 1 ; 2 c" is ``?`` (help) then ``c`` (compare). So import it here,
    before the app starts, then ask for the device status, which every VT100-compatible terminal
    answers after the earlier queries, and discard what arrives up to that answer (a late reply to
    textual-image's 0.1 s queries). Not a terminal on both ends: nothing to ask, nothing done.
    """
    stdin, stdout = sys.__stdin__, sys.__stdout__
    if stdin is None or stdout is None or not (stdin.isatty() and stdout.isatty()):
        return
    import termios
    import tty

    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd, termios.TCSANOW)  # no echo, no line buffering: the replies are read, not shown
    try:
        import textual_image.widget  # noqa: F401  (the queries run at the first import)

        stdout.write("\x1b[5n")
        stdout.flush()
        seen = b""
        deadline = time.monotonic() + timeout_s
        while _STATUS_REPLY.search(seen) is None and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            chunk = os.read(fd, 1024) if ready else b""
            if not chunk:
                break
            seen += chunk
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


class StatusStrip(Static):
    """One line: current run, stage, items judged / total, errors, tokens, dollars, elapsed."""

    DEFAULT_CSS = """
    StatusStrip { height: 1; background: $panel; color: $text; padding: 0 1; }
    StatusStrip.-running { background: $warning 30%; }
    """

    def show_state(self, state: LiveState) -> None:
        """Render ``state``; a running run gets a highlighted strip."""
        self.set_class(state.run_status == "running", "-running")
        self.update(Text(state.line(), no_wrap=True, overflow="ellipsis"))


Entry = tuple[Binding, bool, str]  # a binding, whether it is enabled, its tooltip
# A run of footer keys: its entries, whether they show as keys only, and the label after them ("" none).
Segment = tuple[list[Entry], bool, str]


class KeyFooter(Footer):
    """The footer of keys, fitted to its width so that every key the view offers shows, and ``?`` (help:
    every key with what it does) and ``q`` always with their names.

    In order: ``?``, the view's own keys, the keys that switch views, the run keys, ``q`` and the palette.
    Where not all names fit, spacing gets compact; then the view-switching keys show as keys only
    ("h e d i v c g L views"); then the run keys too ("r R s runs") and the view's own keys keep their
    names as far as they fit, in order, the rest as keys only. A key shown alone has its name as a
    tooltip, and help lists it. A view key that the focused table shadows (Enter) still shows.
    Recomposed when the width changes.
    """

    DEFAULT_CSS = "KeyFooter.-compact FooterLabel.-group { margin: 0 1 0 0; }"
    ALWAYS: ClassVar[tuple[str, ...]] = ("view.help", "app.quit")

    def __init__(self) -> None:
        super().__init__()
        self._fitted_to = 0

    def _cost(self, entry: Entry, compact: bool, key_only: bool = False) -> int:
        key = len(self.app.get_key_display(entry[0]))
        if key_only:
            return key + 1
        return key + len(entry[0].description) + (2 if compact else 3)

    def groups(self) -> tuple[list[Entry], list[Entry], list[Entry], list[Entry], list[Entry]]:
        """(help, the view's own keys, the view-switching keys, the run keys, quit) as the footer offers them."""
        own: list[Entry] = []
        views: list[Entry] = []
        other: list[Entry] = []
        actions: set[str] = set()
        active = self.screen.active_bindings
        for node, binding, enabled, tooltip in active.values():
            if not binding.show or binding.action in actions:
                continue
            actions.add(binding.action)
            entry = (binding, enabled, tooltip)
            if binding.id in self.ALWAYS:
                continue
            if node is not self.app:
                own.append(entry)
            elif binding.action.startswith("switch_view"):
                views.append(entry)
            else:
                other.append(entry)
        # A key of the view that the focused widget binds to a hidden action of its own (a table's Enter)
        # still does the view's action (the table posts a message the view handles): offer it first.
        shadowed = [
            (b, True, b.tooltip)
            for b in self.screen.BINDINGS
            if isinstance(b, Binding)
            and b.show
            and b.action not in actions
            and (hit := active.get(b.key.split(",")[0].strip())) is not None
            and hit.node is not self.screen
            and not hit.binding.show
        ]
        every = [(binding, enabled, tooltip) for _node, binding, enabled, tooltip in active.values()]
        first = [e for e in every if e[0].id == self.ALWAYS[0]][:1]  # ? and F1: one entry
        last = [e for e in every if e[0].id == self.ALWAYS[1]][:1]
        return first, shadowed + own, views, other, last

    def fitted(self, width: int) -> tuple[list[Segment], bool]:
        """At ``width`` columns: the footer's segments in order, and whether spacing is compact. Every
        key of ``groups`` is in a segment."""
        first, own, views, other, last = self.groups()
        room = (
            width
            - len(self.app.get_key_display(Binding(self.app.COMMAND_PALETTE_BINDING, "")))
            - len("palette")
            - 4
        )

        def named(entries: list[Entry], compact: bool = True) -> int:
            return sum(self._cost(e, compact) for e in entries)

        def keys(entries: list[Entry], label: str) -> int:
            return sum(self._cost(e, True, key_only=True) for e in entries) + (
                len(label) + 1 if entries else 0
            )

        for compact in (False, True):
            if named(first + own + views + other + last, compact) <= room:
                return [(first + own + views + other + last, False, "")], compact
        room -= named(first + last) + keys(views, "views")
        if named(own + other) <= room:
            return [(first + own, False, ""), (views, True, "views"), (other + last, False, "")], True
        room -= keys(other, "runs") + keys(own, "")
        shown = 0  # the view's own keys that keep their names: as many as fit, in order
        while (
            shown < len(own)
            and (extra := self._cost(own[shown], True) - self._cost(own[shown], True, True)) <= room
        ):
            room -= extra
            shown += 1
        return [
            (first + own[:shown], False, ""),
            (own[shown:], True, ""),
            (views, True, "views"),
            (other, True, "runs"),
            (last, False, ""),
        ], True

    def _key(self, entry: Entry, *, key_only: bool = False) -> FooterKey:
        binding, enabled, tooltip = entry
        return FooterKey(
            binding.key,
            self.app.get_key_display(binding),
            "" if key_only else binding.description,
            binding.action,
            disabled=not enabled,
            tooltip=(tooltip or binding.tooltip or binding.description)
            if not key_only
            else f"{binding.description}: {tooltip or binding.tooltip}",
        )

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        self._fitted_to = self.size.width or self.app.size.width
        segments, compact = self.fitted(self._fitted_to)
        self.compact = compact
        for entries, key_only, label in segments:
            for entry in entries:
                yield self._key(entry, key_only=key_only).data_bind(compact=Footer.compact)
            if entries and label:
                yield FooterLabel(label, classes="-group")
        try:
            _node, binding, enabled, _tooltip = self.screen.active_bindings[self.app.COMMAND_PALETTE_BINDING]
        except KeyError:
            return
        yield FooterKey(
            binding.key,
            self.app.get_key_display(binding),
            binding.description,
            binding.action,
            classes="-command-palette",
            disabled=not enabled,
            tooltip=binding.tooltip or binding.description,
        )

    def on_resize(self, event: events.Resize) -> None:
        if self._bindings_ready and event.size.width != self._fitted_to:
            self.call_after_refresh(self.recompose)


class FixedColumnsTable(DataTable):  # type: ignore[type-arg]
    """A DataTable whose columns all have fixed widths, with one optional ``fill_column`` that takes
    the width left over (so the table never needs a horizontal scrollbar at its own width).

    Given its columns with ``set_columns`` and its rows with ``set_rows``, the table also hides
    columns when narrow: those in ``drop_order``, first to last, until the others and ``fill_min``
    columns of the fill column fit (the fill column then takes what is left, even below
    ``fill_min``, rather than overflow; it is hidden itself only if ``drop_order`` names it: a view
    that shows its text elsewhere). ``hidden`` names what is hidden now.

    DataTable measures every cell of every new row to size auto-width columns; with fixed widths that
    is wasted work (6,000 measurements for a 500-experiment history: about 50 ms on the UI thread at
    every load, of a ~0.4 s open; benchmarks/tui_open.py). When every column is fixed and every row
    one line high, only the virtual size is recomputed. This overrides a private DataTable method:
    tests/test_tui.py pins the contract (a DataTable measures each new cell there; this, none).
    """

    def __init__(
        self,
        *args: Any,
        fill_column: str | None = None,
        fill_min: int = 20,
        drop_order: Sequence[str] = (),
        row_height: int | None = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.row_height = row_height  # of set_rows' rows; None: as high as their wrapped cells
        self.fill_column = fill_column
        self.fill_min = fill_min
        self.drop_order = tuple(drop_order)
        self.hidden: tuple[str, ...] = ()
        self._specs: list[tuple[str, str, int]] = []
        self._rows: list[tuple[str, Sequence[Text]]] = []

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        new_rows = list(new_rows)
        if (
            any(column.auto_width for column in self.columns.values())
            or self._labelled_row_exists
            or any(
                row.auto_height or row.label is not None
                for row in (self.rows.get(k) for k in new_rows)
                if row
            )
        ):
            super()._update_dimensions(new_rows)
            return
        width = (
            sum(column.get_render_width(self) for column in self.columns.values())
            + self._row_label_column_width
        )
        header = self.header_height if self.show_header else 0
        self.virtual_size = Size(width, self._total_row_height + header)

    def set_columns(self, specs: Sequence[tuple[str, str, int]]) -> None:
        """Every column as (header, key, width), in order; which show depends on the width."""
        self._specs = list(specs)
        self._show(self.columns_for(self.size.width or self.app.size.width))

    def set_rows(self, rows: Sequence[tuple[str, Sequence[Text]]]) -> None:
        """Replace the rows: (key, one cell per column of ``set_columns``)."""
        self._rows = list(rows)
        self.clear()
        self._add_rows()

    def columns_for(self, width: int) -> tuple[str, ...]:
        """The keys of the columns to hide at ``width`` (a prefix of ``drop_order``)."""
        usable = width - self.styles.scrollbar_size_vertical
        needed = {key: w + 2 * self.cell_padding for _, key, w in self._specs if key != self.fill_column}
        if self.fill_column is not None:  # hidden only when listed in drop_order (its text shown elsewhere)
            needed[self.fill_column] = self.fill_min + 2 * self.cell_padding
        total = sum(needed.values())
        hidden: list[str] = []
        for key in self.drop_order:
            if total <= usable:
                break
            if key in needed:
                hidden.append(key)
                total -= needed[key]
        return tuple(hidden)

    def _show(self, hidden: tuple[str, ...]) -> None:
        self.hidden = hidden
        selected = (
            self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value if self.row_count else None
        )
        self.clear(columns=True)
        for label, key, width in self._specs:
            if key not in hidden:
                self.add_column(label, key=key, width=width)
        self._add_rows()
        if selected is not None and selected in self.rows:
            self.move_cursor(row=self.get_row_index(selected))
        self.fit_fill_column()

    def _add_rows(self) -> None:
        shown = [i for i, (_, key, _) in enumerate(self._specs) if key not in self.hidden]
        for key, cells in self._rows:
            self.add_row(*(cells[i] for i in shown), key=key, height=self.row_height)

    def on_resize(self) -> None:
        if self._specs and (hidden := self.columns_for(self.size.width)) != self.hidden:
            self._show(hidden)
        else:
            self.fit_fill_column()

    def fit_fill_column(self) -> None:
        """Give the fill column whatever the other columns leave of the table's width."""
        if self.fill_column is None or self.fill_column not in self.columns or not self.size.width:
            return
        column = self.columns[ColumnKey(self.fill_column)]
        others = sum(c.get_render_width(self) for k, c in self.columns.items() if k.value != self.fill_column)
        # Leave room for the vertical scrollbar even before the rows that need it have arrived.
        spare = self.size.width - self.styles.scrollbar_size_vertical - others - 2 * self.cell_padding
        # With set_columns, columns_for left fill_min unless nothing more could be hidden: then the fill
        # column takes what is left rather than push the last column past the edge.
        width = max(1 if self._specs else self.fill_min, spare)
        if width != column.width:
            column.width = width
            self._clear_caches()
            self._require_update_dimensions = True
            self.refresh(layout=True)


class MetricChart(PlotextPlot):
    """A metric over experiments, x = experiment id (integer ticks only, the ids the history table shows):
    the kept chain as a step line, evaluated candidates as points, early-stopped candidates as ``x`` at
    their partial value (the ``*`` figure of the history and experiment views), the baseline as ``B``;
    the title counts the guard-rejected/failed candidates, and the early-stopped ones without a partial
    value, that have nothing to plot.

    Replotting clears the data first, then plots, then refreshes (otherwise plotext can keep stale axes).
    Building a plotext figure costs tens of milliseconds, so the rendered text is cached per size and
    data: layout passes, cursor moves elsewhere and live-strip repaints do not rebuild it.
    """

    DEFAULT_CSS = "MetricChart { height: 1fr; min-height: 6; }"

    def __init__(self, metric: str, *, id: str | None = None) -> None:  # (id: Textual's name)
        super().__init__(id=id)
        self.metric = metric
        self.points: CurvePoints | None = None
        self._version = 0
        self._rendered: tuple[tuple[object, ...], RenderResult] | None = None

    def show_points(self, points: CurvePoints | None) -> None:
        """Plot ``points`` (None clears the chart); the same points again are a no-op."""
        if points == self.points and self._version:
            return
        self.points = points
        self._version += 1
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        title = self.metric if self.metric == "kappa" else f"{self.metric} (markers as in kappa)"
        if points is not None and points.rejected:
            title += f" · {points.rejected} guard-rejected/failed not plotted"
        if points is not None and (unplotted := points.unplotted(self.metric)):
            title += f" · {unplotted} stopped early without a partial {self.metric} (one class judged)"
        plt.title(title)
        # One legend, on the kappa chart: kappa rises from the left, so its top-left corner is free,
        # while the FPR chart's top-left is where the baseline usually sits (the legend would hide it).
        legend = self.metric == "kappa"
        if points is not None and (points.chain_x or points.evaluated_x or points.baseline):
            chain_y, evaluated_y = points.values(self.metric)
            stopped_x, stopped_y = points.stopped(self.metric)
            # Drawn in this order so the chain is over the points and the early-stopped markers stay
            # visible over it.
            if points.evaluated_x:
                plt.scatter(
                    points.evaluated_x,
                    evaluated_y,
                    marker="•",
                    color="white",
                    label="evaluated candidate" if legend else None,
                )
            if points.chain_x:
                plt.plot(
                    points.chain_x,
                    chain_y,
                    marker="braille",
                    color="green",
                    label="kept chain (incumbent)" if legend else None,
                )
            if stopped_x:
                plt.scatter(
                    stopped_x,
                    stopped_y,
                    marker="x",
                    color="orange",
                    label="stopped early (partial *)" if legend else None,
                )
            ys = chain_y + evaluated_y + stopped_y
            if points.baseline is not None:
                x, kappa, fpr = points.baseline
                value = kappa if self.metric == "kappa" else fpr
                plt.scatter([x], [value], marker="B", color="cyan", label="baseline" if legend else None)
                ys = [*ys, value]
            plt.xlabel("experiment id")
            plt.xlim(*points.x_range())
            lo, hi = min(ys), max(ys)
            pad = max(0.05, (hi - lo) * 0.15)
            plt.ylim(lo - pad, hi + (3 * pad if legend else pad))  # headroom for the legend's rows
        self.refresh()

    def render(self) -> RenderResult:
        key = (self.size, self._version, self.app.theme, self.theme)
        if self._rendered is None or self._rendered[0] != key:
            self._set_x_ticks()
            self._rendered = (key, super().render())
        return self._rendered[1]

    def _set_x_ticks(self) -> None:
        """Experiment ids as the x ticks, as many as the width holds (plotext's own would be 0.00, 0.75, …)."""
        if self.points is None or not self.points.experiment_ids:
            return
        digits = len(str(max(self.points.experiment_ids)))
        # The y labels and axis take about 8 columns; a label needs its digits and a gap either side.
        ticks = x_ticks(self.points.experiment_ids, (self.size.width - 8) // (digits + 3))
        self.plt.xticks(list[float](ticks), [str(t) for t in ticks])


def load_screenshot(path: Path, max_width: int = 1024) -> PILImage.Image:
    """Decode a step screenshot for the terminal (in a worker: decoding is slow), shrunk to ``max_width``."""
    with PILImage.open(path) as src:
        img = src.convert("RGB")
        if img.width > max_width:
            img = img.resize((max_width, round(img.height * max_width / img.width)))
        return img


class StepImage(Widget):
    """The selected step's screenshot: a real image protocol when the terminal has one, half-blocks
    otherwise (``mode="halfcell"`` forces half-blocks, as the tests and SVG screenshots do)."""

    DEFAULT_CSS = """
    StepImage { height: 1fr; min-height: 6; }
    StepImage > .-image { width: auto; height: 1fr; }
    StepImage > Static { color: $text-muted; }
    """

    def __init__(self, mode: str = "auto", *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.mode = mode
        self.path: Path | None = None

    def _image_class(self) -> type[BaseImage]:
        from textual_image.widget import HalfcellImage, Image

        return HalfcellImage if self.mode == "halfcell" else Image

    def compose(self) -> ComposeResult:
        yield Static("no screenshot", id="image-note")
        image = self._image_class()(None, classes="-image")
        image.display = False
        yield image

    def show(self, image: PILImage.Image | None, path: Path | None, note: str = "") -> None:
        """Show a decoded image (or only ``note`` when there is none)."""
        self.path = path
        widget = self.query_one(".-image")
        label = self.query_one("#image-note", Static)
        label.update(note or (path.name if path else "no screenshot for this step"))
        widget.image = image  # type: ignore[attr-defined]
        widget.display = image is not None
