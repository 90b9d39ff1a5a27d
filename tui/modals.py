"""Modal dialogs: errors, confirmations, the review form, the start-run form, the run picker, item lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Checkbox, Footer, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from optimizer.vocab import REVIEW_KINDS
from tui.data import REVIEW_LABELS, STATUS_TEXT, LedgerNotReady, RunSummary
from tui.messages import RunsListed
from tui.runs import STRATEGIES, STRATEGY_LABELS, RunChoices, RunOptions

_MODAL_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 76; max-width: 100%; height: auto; max-height: 100%;
    border: thick $accent; background: $surface; padding: 1 2;
}}
{name} > Vertical > Label {{ width: 100%; }}
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
    """Mark an item: judge wrong / label suspect / rubric ambiguous, with its note (why). Saved only with a
    note (an empty one is refused, saying so); moving the focus round the dialog keeps what was typed."""

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
            yield Select(
                [(REVIEW_LABELS[k], k) for k in REVIEW_KINDS],
                value=self.kind,
                allow_blank=False,
                id="review-kind",
            )
            # A focus that comes back (Tab round the dialog) leaves the note as typed, cursor at its end:
            # Textual selects an input's whole text on focus, and the next key replaced the note.
            yield Input(placeholder="note (why?) — enter saves", id="review-note", select_on_focus=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#review-note", Input).focus()

    def _save(self) -> None:
        note = self.query_one("#review-note", Input).value.strip()
        if not note:  # a review is its note: the agent strategy and the memory read why, not only what
            self.notify(
                "the note is empty: say why (the note is what the review is kept for), or Esc to cancel",
                severity="warning",
            )
            self.query_one("#review-note", Input).focus()
            return
        kind = self.query_one("#review-kind", Select).value
        self.dismiss((str(kind), note))

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self._save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self._save()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class CorrectionModal(ModalScreen["tuple[str, str] | None"]):
    """Correct an item's label: the right label and why (devset/<split>/corrections.jsonl, like
    `judgeloop label-fix`). The item's given label again removes its correction."""

    DEFAULT_CSS = _MODAL_CSS.format(name="CorrectionModal")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="correction.cancel", tooltip="Close without saving"),
    ]

    def __init__(self, trajectory_id: str, given: str, split: str) -> None:
        super().__init__()
        self.trajectory_id = trajectory_id
        self.given = given
        self.split = split

    def compose(self) -> ComposeResult:
        other = "failure" if self.given == "success" else "success"
        with Vertical():
            yield Label(
                f"Correct the label of [b]{self.trajectory_id}[/b] (given: {self.given}; split {self.split})"
            )
            yield Select(
                [(f"{other} (the correction)", other), (f"{self.given} (remove a correction)", self.given)],
                value=other,
                allow_blank=False,
                id="correction-label",
            )
            yield Input(
                placeholder="reason (why is the given label wrong?) — enter saves",
                id="correction-reason",
                select_on_focus=False,
            )
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#correction-reason", Input).focus()

    def _save(self) -> None:
        reason = self.query_one("#correction-reason", Input).value.strip()
        if not reason:
            self.notify(
                "say why the label is wrong: the reason is kept with the correction", severity="warning"
            )
            return
        self.dismiss((str(self.query_one("#correction-label", Select).value), reason))

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
    """The start-run form: strategy, split, policy, provider and limits. The split, policy and provider
    start at the workspace config's values (``RunChoices``) and are passed to the run; the empty
    limits leave them to the config. Held-out splits are never offered."""

    DEFAULT_CSS = (
        _MODAL_CSS.format(name="StartRunModal")
        + """
    StartRunModal > Vertical { overflow-y: auto; }
    StartRunModal Horizontal.field { height: auto; }
    StartRunModal Horizontal.field Label { width: 18; }
    StartRunModal Horizontal.field Input, StartRunModal Horizontal.field Select { width: 1fr; }
    StartRunModal #run-error { color: $error; }
    StartRunModal .note { color: $text-muted; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="start.cancel", tooltip="Close without starting"),
    ]

    def __init__(self, choices: RunChoices) -> None:
        super().__init__()
        self.choices = choices

    def compose(self) -> ComposeResult:
        c = self.choices

        def field(label: str, widget: Input | Select[str]) -> Horizontal:
            return Horizontal(Label(label), widget, classes="field")

        def chosen(values: tuple[str, ...], default: str) -> list[tuple[str, str]]:
            # A configured value the run's flag refuses (provider = "command") is kept by passing no flag.
            kept = [] if default in values else [(f"{default} (judgeloop.toml)", "")]
            return [*kept, *[(f"{v} (judgeloop.toml)" if v == default else v, v) for v in values]]

        def start(values: tuple[str, ...], default: str) -> str:
            return default if default in values else ""

        with Vertical():
            yield Label("[b]Start a run[/b] (a separate process: closing the TUI does not stop it)")
            yield field(
                "strategy",
                Select(
                    [("config default", ""), *[(STRATEGY_LABELS.get(s, s), s) for s in STRATEGIES]],
                    value="",
                    allow_blank=False,
                    id="run-strategy",
                    compact=True,
                ),
            )
            yield field(
                "split",
                Select(
                    chosen(c.splits, c.split), value=c.split, allow_blank=False, id="run-split", compact=True
                ),
            )
            yield field(
                "policy",
                Select(
                    chosen(c.policies, c.policy),
                    value=c.policy,
                    allow_blank=False,
                    id="run-policy",
                    compact=True,
                ),
            )
            yield field(
                "provider",
                Select(
                    chosen(c.providers, c.provider),
                    value=start(c.providers, c.provider),
                    allow_blank=False,
                    id="run-provider",
                    compact=True,
                ),
            )
            yield field(
                "max experiments",
                Input(
                    placeholder="config default",
                    id="run-max",
                    type="integer",
                    select_on_focus=False,
                    compact=True,
                ),
            )
            yield field(
                "budget (USD)",
                Input(
                    placeholder="config default",
                    id="run-budget",
                    type="number",
                    select_on_focus=False,
                    compact=True,
                ),
            )
            yield field(
                "hours",
                Input(
                    placeholder="config default",
                    id="run-hours",
                    type="number",
                    select_on_focus=False,
                    compact=True,
                ),
            )
            if c.heldout:
                yield Static(
                    f"held out, never offered for a run: {', '.join(c.heldout)} (`judgeloop confirm`)",
                    classes="note",
                )
            yield Checkbox(
                "propose-only (stop at one candidate for me to keep or discard)",
                id="run-propose",
                compact=True,
            )
            yield Checkbox("resume the last unfinished run instead", id="run-resume", compact=True)
            yield Static("", id="run-error")
            with Horizontal(classes="buttons"):
                yield Button("Start", variant="primary", id="start", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def options(self) -> RunOptions:
        """The form as RunOptions (ValueError on a malformed number)."""

        def value(widget_id: str, cast: type) -> object:
            text = self.query_one(widget_id, Input).value.strip()
            return cast(text) if text else None

        def choice(widget_id: str) -> str | None:
            picked = self.query_one(widget_id, Select).value
            return picked or None if isinstance(picked, str) else None

        return RunOptions(
            strategy=choice("#run-strategy"),
            max_experiments=value("#run-max", int),  # type: ignore[arg-type]
            budget_usd=value("#run-budget", float),  # type: ignore[arg-type]
            hours=value("#run-hours", float),  # type: ignore[arg-type]
            propose_only=self.query_one("#run-propose", Checkbox).value,
            resume=self.query_one("#run-resume", Checkbox).value,
            split=choice("#run-split"),
            policy=choice("#run-policy"),
            provider=choice("#run-provider"),
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


ALL_RUNS = "__all__"  # the run picker's "every run side by side" entry


def run_line(summary: RunSummary, current: bool, *, started: bool = True) -> Text:
    """One run in the picker: number, id, start time, strategy, policy, split, experiments, kept, status
    (``started=False``: no start time column, for a narrow terminal — the id begins with it)."""
    run = summary.run
    split = run.split if len(run.split) <= 8 else run.split[:7] + "…"
    when = f"{run.created:%m-%d %H:%M} " if started else ""
    line = Text(
        f"{'▸' if current else ' '}{summary.number:>2} {run.id:<20} {when}{run.strategy:<9}"
        f"{run.policy:<9}{split:<9}{summary.experiments:>4}{summary.kept:>5}  "
    )
    line.append(
        STATUS_TEXT.get(run.status, run.status),
        style="bold yellow" if run.status in ("running", "waiting") else "",
    )
    return line


def run_header(*, started: bool = True) -> str:
    return (
        f"  # {'run':<20} {'started     ' if started else ''}{'strategy':<9}{'policy':<9}{'split':<9}"
        f"{'exps':>4}{'kept':>5}  status"
    )


# Below this width the picker leaves out the start time column (the run id starts with it).
NARROW_PICKER = 100


class RunPickerModal(ModalScreen["str | None"]):
    """Pick the run the history (and what helped) shows, or every run side by side. Dismisses with a
    run id, ``ALL_RUNS``, or None (closed). ``load`` reads the runs (in a worker: it queries the ledger)."""

    DEFAULT_CSS = (
        _MODAL_CSS.format(name="RunPickerModal")
        + """
    RunPickerModal > Vertical { width: 100; padding: 0 1; }
    RunPickerModal OptionList { max-height: 18; }
    RunPickerModal #runs-header { color: $text-muted; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Close", id="runs.close", tooltip="Close the run picker"),
    ]

    def __init__(self, load: Callable[[], list[RunSummary]], current: str | None) -> None:
        super().__init__()
        self.load = load
        self.current = current
        self.summaries: list[RunSummary] = []

    @property
    def wide(self) -> bool:
        """Room for the start time column."""
        return self.app.size.width >= NARROW_PICKER

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(
                "[b]Runs[/b] — enter shows one in the history (first line: all side by side)", id="runs-title"
            )
            yield Static(run_header(started=self.wide), id="runs-header")
            yield OptionList(id="run-options")

    def on_mount(self) -> None:
        self.list_runs()

    @work(thread=True, exclusive=True, group="run-picker", exit_on_error=False, name="listing the runs")
    def list_runs(self) -> None:
        self.post_message(RunsListed(self.load()))

    def on_runs_listed(self, message: RunsListed) -> None:
        self.summaries = message.summaries
        options = self.query_one("#run-options", OptionList)
        options.clear_options()
        options.add_option(
            Option(
                Text(
                    f"  all {len(self.summaries)} runs side by side: every experiment in one table",
                    style="bold",
                ),
                id=ALL_RUNS,
            )
        )
        current = self.current or (self.summaries[0].run.id if self.summaries else None)
        for summary in self.summaries:
            options.add_option(
                Option(run_line(summary, summary.run.id == current, started=self.wide), id=summary.run.id)
            )
        ids = [ALL_RUNS, *(s.run.id for s in self.summaries)]
        options.highlighted = ids.index(current) if current in ids else 0
        options.focus()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            text = str(error) if isinstance(error, LedgerNotReady) else f"cannot list the runs: {error}"
            self.query_one("#runs-title", Label).update(f"[b]Runs[/b] — {text}")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

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
