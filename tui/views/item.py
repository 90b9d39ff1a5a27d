"""One item under one experiment: instruction, label, every replicate, steps and screenshot."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from optimizer.judge.types import VIEW_SCREENSHOTS
from tui.data import REVIEW_LABELS, STATUS_TEXT
from tui.items import ItemDetail, load_item
from tui.messages import ExperimentSelected, ItemLoaded, StepDecoded
from tui.views.base import View
from tui.widgets import FixedColumnsTable, StepImage, load_screenshot

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from optimizer.ledger import ReplicateVerdict
    from optimizer.report.data import CascadeCost


class ItemView(View):
    """One item under one experiment: instruction, label, every replicate, steps and screenshot."""

    view_name = "item"
    DEFAULT_CSS = """
    ItemView #item-main { height: 1fr; }
    ItemView #item-left { width: 1fr; }
    ItemView #item-right { width: 1fr; }
    ItemView #step-table { height: 1fr; min-height: 4; }
    ItemView #step-image { height: 2fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "right,period",
            "step(1)",
            "Next step",
            id="item.next-step",
            tooltip="Select the next step",
            key_display="→",
        ),
        Binding(
            "left,comma",
            "step(-1)",
            "Prev step",
            id="item.prev-step",
            tooltip="Select the previous step",
            key_display="←",
        ),
        Binding(
            "n",
            "cited(1)",
            "Next cited",
            id="item.next-cited",
            tooltip="Jump to the next step a criterion, the evidence or the review cites",
        ),
        Binding(
            "p",
            "cited(-1)",
            "Prev cited",
            id="item.prev-cited",
            tooltip="Jump to the previous step a criterion, the evidence or the review cites",
            show=False,
        ),
        Binding(
            "o",
            "open_png",
            "Open PNG",
            id="item.open-png",
            tooltip="Open the full screenshot outside (xdg-open/$OPENER)",
        ),
        Binding(
            "right_square_bracket",
            "other_experiment(1)",
            "Next exp",
            id="item.next-experiment",
            tooltip="The same item under the next experiment that judged it (of any run)",
        ),
        Binding(
            "left_square_bracket",
            "other_experiment(-1)",
            "Prev exp",
            id="item.prev-experiment",
            tooltip="The same item under the previous experiment that judged it (of any run)",
        ),
        Binding(
            "w",
            "review('judge_wrong')",
            "Judge wrong",
            id="item.review-judge-wrong",
            tooltip="Review: the judge is wrong on this item",
        ),
        Binding(
            "l",
            "review('label_suspect')",
            "Label suspect",
            id="item.review-label-suspect",
            tooltip="Review: the label looks wrong",
        ),
        Binding(
            "a",
            "review('rubric_ambiguous')",
            "Rubric ambiguous",
            id="item.review-rubric-ambiguous",
            tooltip="Review: the rubric does not settle this item",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.detail: ItemDetail | None = None
        self.step_index = 0
        self.cited: list[int] = []  # the steps the verdicts cite (criteria, evidence, review), in order

    def body(self) -> ComposeResult:
        with Horizontal(id="item-main"):
            with VerticalScroll(id="item-left"):
                yield Static("", id="item-info")
                yield Static("", id="item-replicates")
                yield Static("", id="item-reviews")
            with Vertical(id="item-right"):
                # The action takes the width the step number leaves (one line: the selected step's action
                # is shown whole above its screenshot).
                table = FixedColumnsTable(
                    id="step-table", cursor_type="row", fill_column="action", fill_min=10
                )
                table.set_columns((("step", "step", 5), ("action", "action", 70)))
                yield table
                yield StepImage(self.japp.image_mode, id="step-image")

    def reload(self) -> None:
        if self.japp.experiment_id is None or self.japp.item_id is None:
            self.set_title("item — none selected (open one from the disagreements, d)")
            return
        self.load_item(self.japp.experiment_id, self.japp.item_id)

    @work(thread=True, exclusive=True, group="item", exit_on_error=False, name="loading the item")
    def load_item(self, experiment_id: int, trajectory_id: str) -> None:
        self.post_message(
            ItemLoaded(load_item(self.japp.ledger(), self.japp.ws_root, experiment_id, trajectory_id))
        )

    def selection_changed(self) -> None:
        """Another experiment (or item) selected here: show the item under it."""
        shown = (self.detail.experiment.id, self.detail.trajectory_id) if self.detail is not None else None
        if shown != (self.japp.experiment_id, self.japp.item_id):
            self.reload()

    def on_item_loaded(self, message: ItemLoaded) -> None:
        detail = self.detail = message.detail
        exp = detail.experiment
        others = detail.other_experiments
        where = (
            f" · {others.index(exp.id) + 1} of {len(others)} experiments that judged it (] / [)"
            if exp.id in others and len(others) > 1
            else ""
        )
        self.set_title(
            f"item {detail.trajectory_id} under experiment {exp.id} of run {exp.run_id} "
            f"({STATUS_TEXT.get(exp.status, exp.status)}){where}"
        )
        info = Text()
        info.append("instruction\n", style="bold")
        info.append((detail.instruction or detail.trajectory_error or "—") + "\n\n")
        if detail.label is not None:
            info.append("label: ", style="bold")
            info.append(detail.label.label, style="green" if detail.label.positive else "red")
            if detail.label.mistake_type:
                info.append(f" · {detail.label.mistake_type}")
        else:
            info.append("label: not stored for this run", style="italic")
        show_correction(info, detail)
        self.query_one("#item-info", Static).update(info)
        reps = Text()
        verdict = detail.verdict
        if verdict is None:
            reps.append("\nthis experiment has no verdict for this item (stopped early?)", style="italic")
        else:
            majority = {True: "success", False: "failure", None: verdict.status}[verdict.success]
            agree = detail.label is not None and verdict.success == detail.label.positive
            reps.append("\njudge (majority): ", style="bold")
            reps.append(majority, style="green" if agree else "bold red")
            if verdict.unstable:
                reps.append("  unstable across replicates", style="yellow")
            show_escalation_share(reps, detail.cascade)
            for rep in verdict.replicates:
                answer = {True: "success", False: "failure", None: rep.status}[rep.success]
                reps.append(f"\n\nreplicate {rep.replicate}: ", style="bold")
                reps.append(f"{answer} · confidence {rep.confidence or '?'}")
                show_cascade(reps, rep)
                if rep.mistake_type:
                    reps.append(f" · {rep.mistake_type}")
                if rep.cached:
                    reps.append(" · cached", style="dim")
                if rep.tools:
                    reps.append(f"\ntools: {' · '.join(str(c) for c in rep.tools)}", style="dim")
                if rep.members:  # a panel: the vote's line, then each member's verdict and reason
                    reps.append(f"\n{rep.reasoning or '(no reasoning)'}", style="dim")
                    for member in rep.members:
                        said = {True: "success", False: "failure", None: member.status}[member.success]
                        reps.append(f"\n  member {member.member}: ", style="bold")
                        reps.append(said, style="green" if member.success else "red")
                        if member.mistake_type:
                            reps.append(f" · {member.mistake_type}")
                        reps.append(
                            f" · ${member.cost_usd:.4f}" + (" · cached" if member.cached else ""), style="dim"
                        )
                        reps.append(f"\n  {member.reasoning or '(no reasoning)'}")
                    continue
                reps.append(f"\n{rep.reasoning or rep.raw or '(no reasoning)'}")
                show_structure(reps, rep)
        self.query_one("#item-replicates", Static).update(reps)
        self.show_reviews()
        table = self.query_one("#step-table", FixedColumnsTable)
        viewed = viewed_steps(detail.verdict.replicates if detail.verdict else [])
        self.cited = sorted(cited_steps(detail.verdict.replicates if detail.verdict else []))
        rows = []
        for step in detail.steps:
            # ● marks a step whose screenshot an agentic judge looked at (in any replicate); ◆ a cited step.
            mark = ("●" if step.index in viewed else "") + ("◆" if step.index in self.cited else "")
            index = Text(f"{step.index}{mark}", style="bold cyan") if mark else Text(str(step.index))
            rows.append((str(step.index), (index, Text(step.action, no_wrap=True, overflow="ellipsis"))))
        table.set_rows(rows)
        self.step_index = min(self.step_index, max(0, len(detail.steps) - 1))
        if detail.steps:
            table.move_cursor(row=self.step_index)
            self.show_step()
        else:
            self.query_one(StepImage).show(None, None, detail.trajectory_error or "no steps")

    def show_reviews(self) -> None:
        if self.detail is None:
            return
        text = Text("\nreviews of this item", style="bold")
        if not self.detail.reviews:
            text.append("\nnone yet — w judge wrong · l label suspect · a rubric ambiguous", style="dim")
        for r in self.detail.reviews:
            text.append(
                f"\n{r.created:%Y-%m-%d %H:%M} {REVIEW_LABELS[r.kind]}"
                f"{f' (exp {r.experiment_id})' if r.experiment_id else ''}: {r.note or '—'}"
            )
        self.query_one("#item-reviews", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if (
            event.data_table.id == "step-table"
            and event.row_key.value is not None
            and int(event.row_key.value) != self.step_index
        ):
            self.step_index = int(event.row_key.value)
            self.show_step()

    def show_step(self) -> None:
        if self.detail is None or not self.detail.steps:
            return
        step = self.detail.steps[self.step_index]
        if step.problem is not None:  # a screenshot outside the split: refused, never decoded or opened
            self.query_one(StepImage).show(None, None, f"step {step.index}: {step.action}\n{step.problem}")
            return
        self.query_one(StepImage).show(
            None, step.screenshot, f"step {step.index}: {step.action}\nloading screenshot…"
        )
        self.decode_step(step.index, step.screenshot)

    @work(
        thread=True, exclusive=True, group="item-image", exit_on_error=False, name="decoding the screenshot"
    )
    def decode_step(self, index: int, path: Path | None) -> None:
        if path is None or not path.is_file():
            self.post_message(StepDecoded(index, None, path))
            return
        self.post_message(StepDecoded(index, load_screenshot(path), path))

    def on_step_decoded(self, message: StepDecoded) -> None:
        if message.index != self.step_index:
            return  # the user already moved on
        # The step's whole action (the table's column may cut it), then its screenshot's name.
        action = self.detail.steps[message.index].action if self.detail is not None else ""
        note = f"step {message.index}: {action}\n{message.path.name if message.path else 'no screenshot'}"
        if message.path is not None and message.image is None:
            note = f"step {message.index}: {action}\nscreenshot missing ({message.path})"
        self.query_one(StepImage).show(message.image, message.path, note)

    def action_step(self, delta: int) -> None:
        if self.detail is None or not self.detail.steps:
            return
        self.step_index = max(0, min(len(self.detail.steps) - 1, self.step_index + delta))
        self.query_one("#step-table", DataTable).move_cursor(row=self.step_index)
        self.show_step()

    def action_cited(self, delta: int) -> None:
        """Select the next (or previous) cited step after (before) the selected one, wrapping round."""
        if self.detail is None or not self.detail.steps:
            return
        cited = [s for s in self.cited if s < len(self.detail.steps)]
        if not cited:
            self.notify("no verdict of this item cites a step", timeout=2)
            return
        after = [s for s in cited if (s > self.step_index if delta > 0 else s < self.step_index)]
        target = (after[0] if delta > 0 else after[-1]) if after else (cited[0] if delta > 0 else cited[-1])
        self.action_step(target - self.step_index)

    def action_open_png(self) -> None:
        path = self.query_one(StepImage).path
        self.japp.open_outside(path)

    def action_other_experiment(self, delta: int) -> None:
        if self.detail is None or not self.detail.other_experiments:
            return
        others = self.detail.other_experiments
        current = self.detail.experiment.id
        idx = others.index(current) if current in others else -1
        target = others[(idx + delta) % len(others)]
        if target == current:
            self.notify("no other experiment judged this item", timeout=2)
            return
        self.post_message(ExperimentSelected(target))

    def action_review(self, kind: str) -> None:
        if self.detail is None:
            return
        self.japp.review_item(
            self.detail.trajectory_id, kind, self.detail.experiment.id, on_saved=self.reload
        )


def show_correction(out: Text, detail: ItemDetail) -> None:
    """A person's correction of the item's label: as given → corrected, the reason, who and when, and
    which of the two the shown run decided with."""
    if detail.correction_problem:
        out.append(f"\ncorrections: {detail.correction_problem}", style="red")
    fix = detail.correction
    if fix is None:
        return
    given = {True: "success", False: "failure", None: "?"}[detail.given_positive]
    out.append("\ncorrected: ", style="bold")
    out.append(f"{given} as given → ")
    out.append(fix.label, style="bold green" if fix.positive else "bold red")
    out.append(f"\n  reason: {fix.reason}")
    out.append(f"\n  by {fix.by or 'someone unnamed'} at {fix.at}", style="dim")
    if detail.label is not None:
        used = "the corrected label" if detail.label.positive == fix.positive else "the label as given"
        out.append(f"\n  this run decided with {used}", style="dim")


def _step_list(steps: Iterable[int]) -> str:
    values = list(steps)
    if not values:
        return "no step cited"
    return ("step " if len(values) == 1 else "steps ") + ", ".join(str(s) for s in values)


def show_escalation_share(out: Text, cascade: CascadeCost | None) -> None:
    """A cascade experiment's escalation share and each stage's cost per verdict (nothing for a single judge)."""
    if cascade is None:
        return
    out.append("\ncascade: ", style="bold")
    out.append(
        f"{cascade.escalated} of {cascade.verdicts} verdicts escalated "
        f"({cascade.escalated / cascade.verdicts:.0%}) in this experiment; per verdict "
        f"${cascade.first_per_verdict_usd:.4f} first + ${cascade.second_per_verdict_usd:.4f} second"
    )


def show_cascade(out: Text, rep: ReplicateVerdict) -> None:
    """A cascade replicate's two stages: the first judge's verdict, whether the rule sent it on, and which
    verdict is final (the second judge's, shown as the replicate's answer, where it was escalated)."""
    record = rep.cascade
    if record is None:
        return
    first = record.first or {}
    success = first.get("success")
    said = "success" if success is True else "failure" if success is False else record.first_status
    out.append("\n  first judge: ", style="bold")
    out.append(said, style="green" if success is True else "red")
    if first.get("confidence"):
        out.append(f" · confidence {first['confidence']}")
    if record.escalated:
        final = {True: "success", False: "failure", None: rep.status}[rep.success]
        out.append(f" → escalated (rule {record.rule})", style="yellow")
        out.append("\n  second judge: ", style="bold")
        out.append(final, style="green" if rep.success else "red")
        out.append(" · final", style="bold")
    else:
        out.append(f" · final (rule {record.rule}: not escalated)", style="dim")
    out.append(f"\n  cost ${record.first_cost_usd:.4f} + ${record.second_cost_usd:.4f}", style="dim")


def show_structure(out: Text, rep: ReplicateVerdict) -> None:
    """A replicate's criteria (met / unmet, with their cited steps), evidence steps and review."""
    if rep.criteria:
        met = sum(1 for c in rep.criteria if c.met)
        out.append(
            f"\ncriteria ({met}/{len(rep.criteria)} met; n jumps to the next cited step)", style="bold"
        )
        for c in rep.criteria:
            out.append("\n  ✓ " if c.met else "\n  ✗ ", style="green" if c.met else "red")
            out.append(c.text + ("" if c.required else " (optional)"))
            out.append(f" — {_step_list(c.steps)}", style="cyan")
    if rep.evidence_steps:
        out.append("\nevidence: ", style="bold")
        out.append(_step_list(rep.evidence_steps), style="cyan")
    review = rep.review
    if review is not None:
        out.append("\nreview: ", style="bold")
        if review.applied:
            first = "success" if (review.first_verdict or {}).get("success") else "the first verdict"
            out.append(f"turned {first} into failure", style="bold red")
            out.append(f" — {_step_list(review.steps)}", style="cyan")
        elif review.violation is False:
            out.append("found no violation")
        else:
            out.append(f"left the verdict ({review.error or 'no cited steps'})", style="yellow")
        if review.reasoning:
            out.append(f"\n  {review.reasoning}")


def cited_steps(replicates: Iterable[ReplicateVerdict]) -> set[int]:
    """Steps a verdict cites — a criterion's steps, its evidence steps, an applied review's steps."""
    steps: set[int] = set()
    for rep in replicates:
        for c in rep.criteria:
            steps.update(c.steps)
        steps.update(rep.evidence_steps)
        if rep.review is not None:
            steps.update(rep.review.steps)
    return steps


def viewed_steps(replicates: Iterable[ReplicateVerdict]) -> set[int]:
    """Steps whose screenshot an agentic judge asked to view (calls it was not refused), in any replicate."""
    steps: set[int] = set()
    for rep in replicates:
        for call in rep.tools:
            if call.name == VIEW_SCREENSHOTS and call.outcome == "ok" and call.arguments:
                requested = call.arguments.get("steps")
                if isinstance(requested, list):
                    steps.update(s for s in requested if isinstance(s, int) and not isinstance(s, bool))
    return steps
