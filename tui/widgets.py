"""Single-purpose widgets: the live status strip, the kappa/FPR charts, the step screenshot."""

from __future__ import annotations

from pathlib import Path

from PIL import Image as PILImage
from rich.text import Text
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static
from textual_plotext import PlotextPlot

from tui.data import CurvePoints
from tui.watch import LiveState


class LiveUpdate(Message):
    """A new cumulative snapshot of the live run. A newer one replaces an older one still queued,
    so a burst of ledger events is one repaint (the toolong pattern)."""

    def __init__(self, state: LiveState) -> None:
        super().__init__()
        self.state = state

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LiveUpdate)


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


class MetricChart(PlotextPlot):
    """A metric over experiments: the kept chain as a line, every candidate as a point, baseline marked.

    Replotting clears the data first, then plots, then refreshes (otherwise plotext can keep stale axes).
    """

    DEFAULT_CSS = "MetricChart { height: 1fr; min-height: 6; }"

    def __init__(self, metric: str, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self.metric = metric

    def show_points(self, points: CurvePoints | None) -> None:
        """Plot ``points`` (None clears the chart)."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.metric)
        if points is not None and points.all_x:
            all_y = points.all_kappa if self.metric == "kappa" else points.all_fpr
            chain_y = points.chain_kappa if self.metric == "kappa" else points.chain_fpr
            plt.scatter(points.all_x, all_y, marker="dot", color="gray", label="candidates")
            if points.chain_x:
                plt.plot(points.chain_x, chain_y, marker="braille", color="green", label="kept chain")
            if points.baseline is not None:
                seq, kappa, fpr = points.baseline
                plt.scatter([seq], [kappa if self.metric == "kappa" else fpr], marker="B", color="cyan",
                            label="baseline")
            plt.xlabel("experiment")
            lo = min(all_y + chain_y)
            hi = max(all_y + chain_y)
            pad = max(0.05, (hi - lo) * 0.15)
            plt.ylim(lo - pad, hi + pad)
        self.refresh()


def load_screenshot(path: Path, max_width: int = 1024) -> PILImage.Image:
    """Decode a step screenshot for the terminal (in a worker: decoding is slow), shrunk to ``max_width``."""
    with PILImage.open(path) as img:
        img = img.convert("RGB")
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

    def __init__(self, mode: str = "auto", *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.mode = mode
        self.path: Path | None = None

    def _image_class(self) -> type[Widget]:
        from textual_image.widget import HalfcellImage, Image

        return HalfcellImage if self.mode == "halfcell" else Image

    def compose(self):  # noqa: ANN201 - Textual compose
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
