"""Modal dialogs: errors, confirmations, the review form, the start-run form, item lists."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Checkbox, Footer, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from optimizer.vocab import REVIEW_KINDS
from tui.data import REVIEW_LABELS
from tui.runs import STRATEGIES, STRATEGY_LABELS, RunOptions

_MODAL_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 76; max-width: 100%; height: auto; max-height: 100%;
    border: thick $accent; background: $surface; padding: 1 2;
}}
{name} .buttons {{ height: auto; align-horizontal: right; margin-top: 1; }}
{name} Button {{ margin-left: 1; }}
"""


class ErrorModal(ModalScreen[None]):
    """A failure shown instead of a crash (worker errors, failed commands). Any key in the list closes it."""

    DEFAULT_CSS = _MODAL_CSS.format(name="ErrorModal") + "ErrorModal > Vertical { border: thick $error; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "dismiss_modal", "Close", id="error.close", tooltip="Close this message"),
    ]

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"[b]{self.title_text}[/b]")
            yield Static(self.message, id="error-message")
            with Horizontal(classes="buttons"):
                yield Button("Close", variant="error", id="close")

    def action_dismiss_modal(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, _event: Button.Pressed) -> None:
        self.dismiss(None)


class ConfirmModal(ModalScreen[bool]):
    """Yes/no before an action that changes something (keeping or discarding a candidate)."""

    DEFAULT_CSS = _MODAL_CSS.format(name="ConfirmModal")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes", tooltip="Confirm"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no", tooltip="Cancel"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="primary", id="yes")
                yield Button("No (n)", id="no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class ReviewModal(ModalScreen["tuple[str, str] | None"]):
    """Mark an item: judge wrong / label suspect / rubric ambiguous, with a free note."""

    DEFAULT_CSS = _MODAL_CSS.format(name="ReviewModal")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="review.cancel", tooltip="Close without saving"),
    ]

    def __init__(self, trajectory_id: str, kind: str) -> None:
        super().__init__()
        self.trajectory_id = trajectory_id
        self.kind = kind

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Review item [b]{self.trajectory_id}[/b]")
            yield Select([(REVIEW_LABELS[k], k) for k in REVIEW_KINDS], value=self.kind, allow_blank=False,
                         id="review-kind")
            yield Input(placeholder="note (why?) — enter saves", id="review-note")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#review-note", Input).focus()

    def _save(self) -> None:
        kind = self.query_one("#review-kind", Select).value
        self.dismiss((str(kind), self.query_one("#review-note", Input).value.strip()))

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self._save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self._save()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class StartRunModal(ModalScreen["RunOptions | None"]):
    """The start-run form: strategy and limits (empty fields: the workspace config decides)."""

    DEFAULT_CSS = _MODAL_CSS.format(name="StartRunModal") + """
    StartRunModal Horizontal.field { height: auto; }
    StartRunModal Horizontal.field Label { width: 24; padding-top: 1; }
    StartRunModal Horizontal.field Input, StartRunModal Horizontal.field Select { width: 1fr; }
    StartRunModal #run-error { color: $error; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="start.cancel", tooltip="Close without starting"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Start a run[/b] (a separate process: closing the TUI does not stop it)")
            with Horizontal(classes="field"):
                yield Label("strategy")
                yield Select([("config default", ""), *[(STRATEGY_LABELS.get(s, s), s) for s in STRATEGIES]],
                             value="", allow_blank=False, id="run-strategy")
            with Horizontal(classes="field"):
                yield Label("max experiments")
                yield Input(placeholder="config default", id="run-max", type="integer")
            with Horizontal(classes="field"):
                yield Label("budget (USD)")
                yield Input(placeholder="config default", id="run-budget", type="number")
            with Horizontal(classes="field"):
                yield Label("hours")
                yield Input(placeholder="config default", id="run-hours", type="number")
            yield Checkbox("propose-only (stop at one candidate for me to keep or discard)", id="run-propose")
            yield Checkbox("resume the last unfinished run instead", id="run-resume")
            yield Static("", id="run-error")
            with Horizontal(classes="buttons"):
                yield Button("Start", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def options(self) -> RunOptions:
        """The form as RunOptions (ValueError on a malformed number)."""
        def value(widget_id: str, cast: type) -> object:
            text = self.query_one(widget_id, Input).value.strip()
            return cast(text) if text else None

        strategy = self.query_one("#run-strategy", Select).value
        return RunOptions(
            strategy=str(strategy) or None if isinstance(strategy, str) else None,
            max_experiments=value("#run-max", int),  # type: ignore[arg-type]
            budget_usd=value("#run-budget", float),  # type: ignore[arg-type]
            hours=value("#run-hours", float),  # type: ignore[arg-type]
            propose_only=self.query_one("#run-propose", Checkbox).value,
            resume=self.query_one("#run-resume", Checkbox).value,
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "start":
            self.dismiss(None)
            return
        try:
            self.dismiss(self.options())
        except ValueError as exc:
            self.query_one("#run-error", Static).update(f"not a number: {exc}")

    def action_cancel(self) -> None:
        self.dismiss(None)


class ItemListModal(ModalScreen["str | None"]):
    """The items behind one flip-table cell; choosing one opens it."""

    DEFAULT_CSS = _MODAL_CSS.format(name="ItemListModal") + "ItemListModal OptionList { max-height: 16; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Close", id="items.close", tooltip="Close the list"),
    ]

    def __init__(self, title: str, ids: list[str]) -> None:
        super().__init__()
        self.title_text = title
        self.ids = ids

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"[b]{self.title_text}[/b] — {len(self.ids)} item(s); enter opens one")
            yield OptionList(*[Option(tid, id=tid) for tid in self.ids], id="item-options")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ErrorScreen(Screen[None]):
    """The whole-app error for a ledger the TUI cannot read (newer schema, not a ledger): one clear message."""

    DEFAULT_CSS = """
    ErrorScreen { align: center middle; }
    ErrorScreen > Vertical { width: 80%; height: auto; border: thick $error; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "app.quit", "Quit", id="error-screen.quit", tooltip="Quit judgeloop tui"),
    ]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]judgeloop cannot open this ledger[/b]")
            yield Static(self.message, id="error-text")
            yield Static("Press q to quit.")
        yield Footer()
