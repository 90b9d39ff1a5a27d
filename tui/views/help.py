"""Every key, generated from the bindings."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.views.base import View


class HelpView(View):
    """Every key, generated from the bindings: what to press for the main review path, then a compact
    two-column table per section (everywhere, then each view's own keys), then a few notes."""

    view_name = "help"
    DEFAULT_CSS = "HelpView #help-scroll { padding: 0 1; }"

    def body(self) -> ComposeResult:
        with VerticalScroll(id="help-scroll"):
            yield Static("", id="help-text")

    def reload(self) -> None:
        self.set_title("help — every key (↑/↓ or PgUp/PgDn scroll; h goes back to the history)")
        self.query_one("#help-text", Static).update(self.render_help())
        self.query_one("#help-scroll", VerticalScroll).focus()

    def render_help(self) -> RenderableType:
        parts: list[RenderableType] = [Text(self.japp.HELP_INTRO), Text("")]
        for heading, rows in self.japp.help_sections():
            table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0), expand=False)
            table.add_column("keys", style="bold", no_wrap=True, min_width=10)
            table.add_column("what")
            for keys, what in rows:
                table.add_row(keys, what)
            parts += [Text(heading, style="bold underline"), table, Text("")]
        parts += [Text(f"• {note}") for note in self.japp.HELP_NOTES]
        return Group(*parts)
