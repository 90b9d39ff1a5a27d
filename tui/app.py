"""`judgeloop tui`: the Textual app — history, experiments, disagreements, items, reviews, runs.

The app reads only the ledger (``optimizer.ledger``, read-only connection) and the workspace's split
files; it never imports the loop. Runs are separate processes (``tui.runs``), so closing the TUI
never stops one. Views are single-key switchable; every binding has an id (for ``App.set_keymap``);
the command palette (ctrl+p) lists every view and action; help (? or F1) lists every key, and every
key a view offers is in its footer at any width from 80 columns (``widgets.KeyFooter``).

One truth across views: an early-stopped candidate is shown at its partial metrics (marked ``*``) in
the history, chart, compare and experiment views; a person's keep against the policy reads
"kept (overruled)" (``views.base.decision_text``).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import ModalScreen
from textual.worker import Worker, WorkerState

from optimizer.errors import UserError
from optimizer.ledger import Ledger
from optimizer.workspace.paths import WorkspacePaths
from tui import runs
from tui.data import LedgerNotReady, open_ledger, run_summaries
from tui.messages import CompareMarked, ExperimentSelected, ItemSelected, LiveUpdate, RunPicked, WatchFailed
from tui.modals import (
    ALL_RUNS,
    ConfirmModal,
    ErrorModal,
    ErrorScreen,
    ItemListModal,
    ReviewModal,
    RunPickerModal,
    StartRunModal,
)
from tui.views import (
    AllRunsView,
    CompareView,
    DisagreementsView,
    ExperimentView,
    HelpedView,
    HelpView,
    HistoryView,
    ItemView,
    ReviewsView,
    SuspectsView,
    View,
)
from tui.watch import LedgerWatcher, LiveState, initial_state
from tui.widgets import StatusStrip, ask_terminal_before_start

# Key names as the help shows them (Textual's display names where they differ from a keyboard's).
HELP_KEY_NAMES = {"⏎": "Enter", "esc": "Esc", "period": "."}

VIEWS: dict[str, type[View]] = {
    "history": HistoryView,
    "runs": AllRunsView,
    "experiment": ExperimentView,
    "disagreements": DisagreementsView,
    "item": ItemView,
    "reviews": ReviewsView,
    "compare": CompareView,
    "helped": HelpedView,
    "suspects": SuspectsView,
    "help": HelpView,
}


class JudgeloopCommands(Provider):
    """Command palette entries: every view and every app-level action."""

    def _commands(self) -> list[tuple[str, str, Callable[[], Any]]]:
        app: JudgeloopApp = self.app  # type: ignore[assignment]
        entries: list[tuple[str, str, Callable[[], Any]]] = [
            (f"View: {name}", f"switch to the {name} view", partial(app.switch_view, name)) for name in VIEWS
        ]
        entries += [
            ("Run: start a run", "start `judgeloop run` as a separate process", app.action_start_run),
            ("Runs: pick a run, or every run side by side", "the run the history shows", app.action_pick_run),
            (
                "Run: stop the run",
                "create experiments/STOP; the loop stops after its current step",
                app.action_stop_run,
            ),
            ("Reviews: export as JSONL", "write experiments/reviews.jsonl", app.export_reviews),
            (
                "Compare: selected experiment vs its parent",
                "or the experiment marked with m",
                partial(app.switch_view, "compare"),
            ),
        ]
        return entries

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


class JudgeloopApp(App[None]):
    """The TUI over one workspace. ``image_mode="halfcell"`` forces half-block screenshots (tests, SVG);
    ``watch=False`` turns off the live ledger watcher (screenshots).

    The app alone holds the selection (``experiment_id``, ``item_id``, ``compare_left``: read-only
    outside it); views ask for a change with a message (``ExperimentSelected``, ``ItemSelected``,
    ``CompareMarked``) and the app tells the current view when the selection moved.
    """

    TITLE = "judgeloop"
    COMMANDS: ClassVar = App.COMMANDS | {JudgeloopCommands}
    BINDINGS: ClassVar = [
        Binding(
            "h",
            "switch_view('history')",
            "History",
            id="view.history",
            tooltip="The history: the experiments table and the kappa and FPR curves",
        ),
        Binding(
            "e",
            "switch_view('experiment')",
            "Experiment",
            id="view.experiment",
            tooltip="The selected experiment: its edit (diff), rationale, metrics and flips",
        ),
        Binding(
            "d",
            "switch_view('disagreements')",
            "Disagree",
            id="view.disagreements",
            tooltip="The items where judge and label disagree",
        ),
        Binding(
            "i",
            "switch_view('item')",
            "Item",
            id="view.item",
            tooltip="The selected item: verdicts, steps, screenshot",
        ),
        Binding(
            "v", "switch_view('reviews')", "Reviews", id="view.reviews", tooltip="The reviews you recorded"
        ),
        Binding(
            "c",
            "switch_view('compare')",
            "Compare",
            id="view.compare",
            tooltip="Compare the selected experiment with its parent (or with the one marked with m)",
        ),
        Binding(
            "g",
            "switch_view('helped')",
            "Helped",
            id="view.helped",
            tooltip="What helped: each kept edit's gain when kept beside its contribution at the end",
        ),
        Binding(
            "L",
            "switch_view('suspects')",
            "Suspects",
            id="view.suspects",
            tooltip="Label suspects: items most prompt versions and replicates judge against their label",
        ),
        Binding(
            "question_mark,f1",
            "switch_view('help')",
            "Help",
            id="view.help",
            tooltip="This list of every key",
        ),
        Binding("r", "start_run", "Run", id="run.start", tooltip="Start a run (a separate process)"),
        Binding(
            "R",
            "pick_run",
            "Runs",
            id="run.pick",
            tooltip="Pick the run the history shows, or every run's experiments side by side",
        ),
        Binding(
            "s",
            "stop_run",
            "Stop",
            id="run.stop",
            tooltip="Ask the running loop to stop after its current step (creates experiments/STOP)",
        ),
        Binding("q", "quit", "Quit", id="app.quit", tooltip="Quit (a running run keeps going)"),
    ]

    def __init__(
        self,
        ws_root: Path | str,
        *,
        image_mode: str = "auto",
        start_view: str = "history",
        experiment_id: int | None = None,
        item_id: str | None = None,
        watch: bool = True,
        watch_interval_s: float = 0.5,
        run_id: str | None = None,
    ) -> None:
        super().__init__()
        if start_view not in VIEWS:
            raise UserError(f"unknown screen {start_view!r}; use one of {', '.join(VIEWS)}")
        self.ws_root = Path(ws_root).resolve()
        self.ledger_path = WorkspacePaths(self.ws_root).ledger
        self.image_mode = image_mode
        self.start_view = start_view
        self._experiment_id = experiment_id
        self._item_id = item_id
        self.run_id: str | None = run_id  # the run the history shows (None: the latest); R picks another
        self._compare_left: int | None = None
        self.live = LiveState()
        self.fatal: str | None = None
        self._watch = watch
        self._watch_interval_s = watch_interval_s
        self._watcher: LedgerWatcher | None = None
        self._reader: Ledger | None = None
        self._reader_lock = threading.Lock()
        self._seen_changes: int | None = None
        self.current_view = start_view

    def run(self, *, headless: bool = False, **kwargs: Any) -> None:
        """Run in the terminal; first the image library's terminal queries, which must be answered
        before Textual reads the input (or their replies arrive as keys: see ask_terminal_before_start)."""
        if not headless:
            ask_terminal_before_start()
        super().run(headless=headless, **kwargs)

    # -- the selection ----------------------------------------------------------------------------

    @property
    def experiment_id(self) -> int | None:
        """The selected experiment (the history's cursor, the experiment an item is shown under)."""
        return self._experiment_id

    @property
    def item_id(self) -> str | None:
        """The selected item (trajectory id)."""
        return self._item_id

    @property
    def compare_left(self) -> int | None:
        """The experiment marked with m as the compare view's left side."""
        return self._compare_left

    def select(
        self, *, experiment_id: int | None = None, item_id: str | None = None, switch_to: str | None = None
    ) -> None:
        """The one place the selection changes: then show ``switch_to``, or tell the current view."""
        if experiment_id is not None:
            self._experiment_id = experiment_id
        if item_id is not None:
            self._item_id = item_id
        if switch_to is not None:
            self.switch_view(switch_to)
        elif isinstance(self.screen, View):
            self.screen.selection_changed()

    def on_experiment_selected(self, message: ExperimentSelected) -> None:
        self.select(experiment_id=message.experiment_id, switch_to=message.switch_to)

    def on_item_selected(self, message: ItemSelected) -> None:
        self.select(
            experiment_id=message.experiment_id, item_id=message.trajectory_id, switch_to=message.switch_to
        )

    def on_compare_marked(self, message: CompareMarked) -> None:
        self._compare_left = message.experiment_id
        self.notify(
            f"experiment {message.experiment_id} marked: select another and press c to compare", timeout=3
        )

    # -- the ledger -------------------------------------------------------------------------------

    def ledger(self) -> Ledger:
        """The shared read-only ledger connection (thread-safe). LedgerNotReady while the workspace has
        no ledger yet; a ledger this version cannot read (newer schema, not SQLite) raises UserError."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = open_ledger(self.ledger_path)
            return self._reader

    def on_mount(self) -> None:
        try:
            self.ledger()
            ready = True
        except LedgerNotReady:
            ready = False
            self._seen_changes = 0  # nothing shown yet: the first snapshot (a run starting) reloads the view
        except UserError as exc:
            self.fatal = str(exc)
            self.push_screen(ErrorScreen(self.fatal))
            return
        self.push_screen(VIEWS[self.start_view]())
        if ready and not self._watch:  # the watcher computes the same snapshot first thing
            self.load_live_state()
        if self._watch:
            self._watcher = LedgerWatcher(
                self.ledger_path,
                lambda state: self.post_message(LiveUpdate(state)),
                on_error=lambda error: self.post_message(WatchFailed(error)),
                interval_s=self._watch_interval_s,
            )
            self._watcher.start()

    @work(thread=True, exclusive=True, group="live", exit_on_error=False, name="reading the run's status")
    def load_live_state(self) -> None:
        """The status strip's first snapshot, off the UI thread (it replays recent events)."""
        try:
            ledger = self.ledger()
        except LedgerNotReady:
            return
        self.post_message(LiveUpdate(initial_state(ledger)))

    @property
    def live_pending(self) -> bool:
        """True until the first live snapshot of an existing ledger has arrived."""
        return self._seen_changes is None

    def on_unmount(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()

    def on_live_update(self, message: LiveUpdate) -> None:
        """A newer live snapshot: repaint the strip; reload the view when experiments or runs changed."""
        self.live = message.state
        for strip in self.screen.query(StatusStrip):
            strip.show_state(self.live)
        if self._seen_changes is None:  # the first snapshot: the views loaded this state already
            self._seen_changes = message.state.changes
        elif message.state.changes != self._seen_changes:
            self._seen_changes = message.state.changes
            if isinstance(self.screen, HistoryView | ExperimentView | AllRunsView):
                self.screen.reload()

    def on_watch_failed(self, message: WatchFailed) -> None:
        """The watcher met a ledger it cannot read and stopped: say so (the views would only say "no runs")."""
        self.show_error("cannot follow the run", message.error)

    # -- views ------------------------------------------------------------------------------------

    def switch_view(self, name: str) -> None:
        """Replace the current view with ``name`` (ignored under a modal or the error screen)."""
        if self.fatal is not None or isinstance(self.screen, ModalScreen):
            return
        self.current_view = name
        view = VIEWS[name]()
        if len(self.screen_stack) <= 1:
            self.push_screen(view)
        else:
            self.switch_screen(view)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Over the unreadable-ledger screen only quitting is offered (the views and runs need a ledger):
        the footer then holds only what works there, uncut at 80 columns."""
        if self.fatal is not None and action not in ("quit", "command_palette"):
            return False
        return super().check_action(action, parameters)

    def action_switch_view(self, name: str) -> None:
        self.switch_view(name)

    def compare_pair(self) -> tuple[int | None, int] | None:
        """(left, right) for the compare view: the marked experiment (None: the right one's parent) and
        the selected one."""
        if self.experiment_id is None:
            return None
        left = self.compare_left if self.compare_left != self.experiment_id else None
        return left, self.experiment_id

    def key_names(self, binding: Binding) -> str:
        """A binding's keys as a person reads them: ``? / F1``, ``→ / .``, ``Enter`` (not ``question_mark,f1``)."""
        names = []
        for key in binding.key.split(","):
            name = self.get_key_display(Binding(key.strip(), ""))
            names.append(HELP_KEY_NAMES.get(name, name.upper() if re.fullmatch(r"f\d+", name) else name))
        return " / ".join(names)

    def help_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """(heading, [(keys, what they do)]) for the app's keys, then each view's: the help view's text."""

        def rows(bindings: list[Binding]) -> list[tuple[str, str]]:
            return [(self.key_names(b), b.tooltip or b.description) for b in bindings]

        sections = [
            (
                "Everywhere",
                [
                    *rows([b for b in self.BINDINGS if isinstance(b, Binding)]),
                    ("ctrl+p", "The palette: every view and action by name"),
                ],
            )
        ]
        for name, view in VIEWS.items():
            own = [b for b in view.BINDINGS if isinstance(b, Binding)]
            if own:
                sections.append((f"In the {name} view", rows(own)))
        return sections

    HELP_INTRO = (
        "Review a run: d lists the items where judge and label disagree, Enter opens one, w / l / a record "
        "a review. e shows the selected experiment's edit and decision, c compares it with its parent; h "
        "goes back to the history. L lists the label suspects (items most prompt versions judge against "
        "their label); x there records a correction."
    )
    HELP_NOTES = (
        "A run started with r is a separate process: its log is in experiments/runs/, and quitting the TUI "
        "never stops it (s asks it to stop after its current step).",
        "In a narrow terminal the footer shows the view keys as letters only (h e d i v c g L) and the history "
        "hides its least important columns (+rej, time, strategy, bal.acc, ΔFPR, in that order).",
    )

    def help_text(self) -> str:
        """The help as plain text (what the help view shows, without its layout)."""
        lines = [self.HELP_INTRO, ""]
        for heading, rows in self.help_sections():
            lines += [heading, *(f"  {keys:<10} {what}" for keys, what in rows), ""]
        return "\n".join([*lines, *self.HELP_NOTES])

    # -- errors -----------------------------------------------------------------------------------

    def show_error(self, title: str, error: BaseException | str | None) -> None:
        """One way to show a failure: a modal with the UserError sentence or the exception."""
        text = str(error) if isinstance(error, (UserError, str)) else f"{type(error).__name__}: {error}"
        self.push_screen(ErrorModal(title, text))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.show_error(f"{event.worker.name or 'background work'} failed", event.worker.error)

    # -- actions ----------------------------------------------------------------------------------

    def action_start_run(self) -> None:
        if self.fatal is not None:
            return

        def started(options: runs.RunOptions | None) -> None:
            if options is not None:
                self.run_id = None  # the history follows the new run (R picks another again)
                self.start_run(options)

        try:
            choices = runs.run_choices(self.ws_root)
        except UserError as exc:
            self.show_error("cannot start a run", exc)
            return
        self.push_screen(StartRunModal(choices), started)

    def action_pick_run(self) -> None:
        """The run picker: a run for the history, or every run side by side."""
        if self.fatal is not None or isinstance(self.screen, ModalScreen):
            return

        def picked(choice: str | None) -> None:
            if choice == ALL_RUNS:
                self.switch_view("runs")
            elif choice is not None:
                self.post_message(RunPicked(choice))

        self.push_screen(RunPickerModal(lambda: run_summaries(self.ledger()), self.run_id), picked)

    def on_run_picked(self, message: RunPicked) -> None:
        self.run_id = message.run_id
        if message.switch_to is not None:
            self.switch_view(message.switch_to)

    @work(thread=True, exclusive=True, group="run-control", exit_on_error=False, name="starting the run")
    def start_run(self, options: runs.RunOptions) -> runs.StartedRun:
        started = runs.start_run(self.ws_root, options)
        outcome = runs.early_outcome(started)  # a refusal is one line in the log within a moment
        log = started.log_path.relative_to(self.ws_root)
        if outcome is not None and outcome[0] != 0:
            self.call_from_thread(
                self.notify,
                f"the run stopped at once (exit {outcome[0]}): {outcome[1]} (log: {log})",
                title="judgeloop run",
                severity="error",
                timeout=12,
            )
        else:
            done = f"; already finished: {outcome[1]}" if outcome is not None else ""
            self.call_from_thread(
                self.notify,
                f"run started (pid {started.pid}); log: {log}{done}",
                title="judgeloop run",
                timeout=6,
            )
        return started

    def action_stop_run(self) -> None:
        if self.fatal is not None:
            return
        path = runs.request_stop(self.ws_root)
        if path is None:
            self.notify("no run is going in this workspace: nothing to stop", severity="warning", timeout=5)
            return
        self.notify(
            f"created {path.relative_to(self.ws_root)}: the run stops after its current step", timeout=5
        )

    def decide_waiting(self, experiment_id: int, decision: str, warning: str | None = None) -> None:
        """Ask (saying ``warning``: a keep the policy rolls back is an overrule), then keep or discard it in
        a worker (the engine's `decide`, as `judgeloop decide` does)."""

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_decide(experiment_id, decision)

        question = f"{decision} experiment {experiment_id}? (judgeloop decide {experiment_id} {decision})"
        self.push_screen(ConfirmModal(question + (f"\n\n{warning}" if warning else "")), answered)

    @work(thread=True, exclusive=True, group="run-control", exit_on_error=False, name="judgeloop decide")
    def run_decide(self, experiment_id: int, decision: str) -> None:
        result = runs.decide(self.ws_root, experiment_id, decision)
        if result.returncode != 0:
            self.call_from_thread(
                self.show_error, f"could not {decision} experiment {experiment_id}", result.output
            )
            return
        self.call_from_thread(
            self.notify, result.output.splitlines()[-1] if result.output else "decided", timeout=5
        )
        if isinstance(self.screen, View):
            self.call_from_thread(self.screen.reload)

    def review_item(
        self,
        trajectory_id: str,
        kind: str,
        experiment_id: int | None,
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        """Ask for the review's kind and note, then store it (a short-lived writer connection)."""

        def answered(result: tuple[str, str] | None) -> None:
            if result is not None:
                self.save_review(trajectory_id, result[0], result[1], experiment_id, on_saved)

        self.push_screen(ReviewModal(trajectory_id, kind), answered)

    @work(thread=True, exclusive=False, group="reviews-write", exit_on_error=False, name="saving the review")
    def save_review(
        self,
        trajectory_id: str,
        kind: str,
        note: str,
        experiment_id: int | None,
        on_saved: Callable[[], None] | None,
    ) -> None:
        with Ledger(self.ledger_path) as writer:  # WAL: fine while a run writes
            writer.add_review(trajectory_id, kind, note, experiment_id=experiment_id)  # type: ignore[arg-type]
        self.call_from_thread(
            self.notify, f"review saved: {kind.replace('_', ' ')} on {trajectory_id[:13]}", timeout=3
        )
        if on_saved is not None:
            self.call_from_thread(on_saved)

    @work(thread=True, exclusive=True, group="reviews-export", exit_on_error=False, name="exporting reviews")
    def export_reviews(self) -> None:
        try:
            ledger = self.ledger()
        except LedgerNotReady:
            self.call_from_thread(self.notify, "no ledger yet: nothing to export", severity="warning")
            return
        target = WorkspacePaths(self.ws_root).reviews_export
        n = ledger.export_reviews(target)
        self.call_from_thread(
            self.notify, f"exported {n} review(s) to {target.relative_to(self.ws_root)}", timeout=5
        )

    def open_item_list(self, title: str, ids: list[str], experiment_id: int) -> None:
        """The items behind a flip-table cell; choosing one opens the item view."""
        if not ids:
            self.notify(f"{title}: no items", timeout=2)
            return

        def chosen(tid: str | None) -> None:
            if tid:
                self.select(experiment_id=experiment_id, item_id=tid, switch_to="item")

        self.push_screen(ItemListModal(title, ids), chosen)

    def open_outside(self, path: Path | None) -> None:
        """Open a screenshot with $OPENER / xdg-open; without one, say where the file is."""
        if path is None or not path.is_file():
            self.notify("this step has no screenshot file", severity="warning")
            return
        command = runs.opener_command(path, dict(os.environ))
        if command is None:
            self.notify(
                f"no program to open images (set $OPENER or install xdg-open); the file is {path}",
                severity="warning",
                timeout=8,
            )
            return
        try:
            subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self.show_error("could not open the screenshot", f"{' '.join(command)}: {exc}")
            return
        self.notify(f"opened {path.name}", timeout=2)


# ---------------------------------------------------------------------------------------------
# Headless screenshots and the CLI handler


def parse_size(text: str) -> tuple[int, int]:
    """``"120x40"`` → (120, 40); anything else is a UserError."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise UserError(f"--size {text!r} is not WIDTHxHEIGHT; pass e.g. --size 120x40") from None
    if width < 40 or height < 12:
        raise UserError(f"--size {text} is too small; use at least 40x12")
    return width, height


def screenshot_defaults(
    ledger_path: Path, experiment_id: int | None, run_id: str | None = None
) -> tuple[int | None, str | None]:
    """The experiment (default: the incumbent of run ``run_id``, else of the latest run) and item (its
    first disagreement, else its first item) a headless screenshot shows."""
    from tui.items import disagreements

    try:
        reader = open_ledger(ledger_path)
    except LedgerNotReady:
        return experiment_id, None
    with reader as ledger:
        run = ledger.get_run(run_id) if run_id else ledger.latest_run()
        if run is None:
            return experiment_id, None
        if experiment_id is None:
            experiment_id = run.incumbent_experiment
        if experiment_id is None:
            return None, None
        exp = ledger.get_experiment(experiment_id)
        verdicts = ledger.item_verdicts(experiment_id)
        wrong = disagreements(ledger.labels(exp.run_id), verdicts, set())
        item = wrong[0].trajectory_id if wrong else (verdicts[0].trajectory_id if verdicts else None)
        return experiment_id, item


async def settle(app: App[Any], pilot: Any, rounds: int = 4) -> None:
    """Wait until workers are done and their messages are handled (workers may start more workers)."""
    for _ in range(rounds):
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()


async def render_screenshot(
    ws_root: Path,
    out: Path,
    *,
    screen: str = "history",
    experiment_id: int | None = None,
    size: tuple[int, int] = (120, 40),
    run_id: str | None = None,
) -> Path:
    """Render one view headlessly at ``size`` (half-block images, no live watcher) and save it as SVG."""
    experiment_id, item_id = screenshot_defaults(WorkspacePaths(Path(ws_root)).ledger, experiment_id, run_id)
    app = JudgeloopApp(
        ws_root,
        image_mode="halfcell",
        start_view=screen,
        experiment_id=experiment_id,
        item_id=item_id,
        watch=False,
        run_id=run_id,
    )
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))
    return out
