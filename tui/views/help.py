"""Every key, generated from the bindings."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from tui.views.base import View


class HelpView(View):
    """Every key, generated from the bindings (so a remapped key shows as remapped)."""

    view_name = "help"

    def body(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown("", id="help-text")

    def reload(self) -> None:
        self.set_title("help — judgeloop tui")
        self.query_one("#help-text", Markdown).update(self.japp.help_markdown())
