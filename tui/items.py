"""What the TUI shows of single items, read from the ledger and the workspace: an experiment's
disagreements with the labels (and their filters), one item's detail (steps, replicate verdicts, label,
a person's correction), the label-suspects queue and saving a correction. No Textual here: plain data,
testable alone (the run- and experiment-level figures are in `tui.data`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.answers.triage import Suspect
from optimizer.devset.markdown import action_string
from optimizer.errors import UserError
from optimizer.ledger import Experiment, ItemVerdict, LabelRow, Ledger, Review
from optimizer.report.data import CascadeCost, cascade_cost
from optimizer.vocab import UNTYPED
from tui.data import run_to_show

if TYPE_CHECKING:
    from optimizer.devset.corrections import Correction
    from optimizer.devset.split import Split
    from optimizer.models import Trajectory


# ---------------------------------------------------------------------------------------------
# Disagreements


@dataclass(frozen=True)
class Disagreement:
    """An item where the judge's majority answer and the label disagree (invalid answers included)."""

    trajectory_id: str
    kind: str  # "FP" (judged success, label negative) or "FN" (judged failure or invalid, label positive)
    label: LabelRow
    verdict: ItemVerdict
    reviewed: bool

    @property
    def confidence(self) -> str:
        return "/".join(r.confidence or "?" for r in self.verdict.replicates) or "—"

    @property
    def reasoning(self) -> str:
        reps = self.verdict.replicates
        return reps[0].reasoning if reps else ""


def is_disagreement(label: LabelRow, verdict: ItemVerdict) -> bool:
    """Wrong answers (missing/invalid count as wrong, like ``metrics.score``) disagree with the label."""
    return verdict.success is None or verdict.success != label.positive


def disagreements(
    labels: Mapping[str, LabelRow], verdicts: Iterable[ItemVerdict], reviewed_ids: set[str]
) -> list[Disagreement]:
    """Every disagreeing item, false positives first, then by id."""
    out = []
    for v in verdicts:
        label = labels.get(v.trajectory_id)
        if label is None or not is_disagreement(label, v):
            continue
        kind = "FN" if label.positive else "FP"
        out.append(Disagreement(v.trajectory_id, kind, label, v, v.trajectory_id in reviewed_ids))
    return sorted(out, key=lambda d: (d.kind != "FP", d.trajectory_id))


@dataclass
class DisagreementFilter:
    """The disagreement list's filters; None means "any"."""

    kind: str | None = None  # "FP" | "FN"
    mistake_type: str | None = None
    unstable: bool | None = None
    reviewed: bool | None = None

    def accepts(self, d: Disagreement) -> bool:
        if self.kind and d.kind != self.kind:
            return False
        # A type filter shows negatives only: a positive has no mistake type ("untyped" is a negative's).
        if self.mistake_type and (d.label.positive or (d.label.mistake_type or UNTYPED) != self.mistake_type):
            return False
        if self.unstable is not None and d.verdict.unstable != self.unstable:
            return False
        return not (self.reviewed is not None and d.reviewed != self.reviewed)

    def describe(self) -> str:
        parts = [
            self.kind or "FP+FN",
            self.mistake_type or "any type",
            {None: "stable or not", True: "unstable only", False: "stable only"}[self.unstable],
            {None: "reviewed or not", True: "reviewed", False: "not reviewed"}[self.reviewed],
        ]
        return " · ".join(parts)


def load_disagreements(ledger: Ledger, experiment_id: int) -> tuple[Experiment, list[Disagreement]]:
    exp = ledger.get_experiment(experiment_id)
    reviewed = {r.trajectory_id for r in ledger.reviews()}
    return exp, disagreements(ledger.labels(exp.run_id), ledger.item_verdicts(experiment_id), reviewed)


# ---------------------------------------------------------------------------------------------
# Items


@dataclass(frozen=True)
class StepLine:
    index: int
    action: str
    screenshot: Path | None  # resolved and checked inside the split (`step_lines`); shown and opened as is
    problem: str | None = None  # why the screenshot is refused (a link outside the split)


def step_lines(split: Split, traj: Trajectory) -> list[StepLine]:
    """The item's steps with their screenshot files. A screenshot outside the split is refused
    (no path, the reason instead): the image view and the open action never reach such a file."""
    lines = []
    for i, step in enumerate(traj.steps):
        try:
            lines.append(StepLine(i, action_string(step.action), split.screenshot_file(step)))
        except UserError as exc:
            lines.append(StepLine(i, action_string(step.action), None, str(exc)))
    return lines


@dataclass(frozen=True)
class ItemDetail:
    """One item under one experiment: instruction, label, every replicate, the steps and reviews."""

    experiment: Experiment
    trajectory_id: str
    instruction: str
    label: LabelRow | None
    verdict: ItemVerdict | None
    steps: list[StepLine]
    reviews: list[Review]
    other_experiments: list[int] = field(
        default_factory=list
    )  # experiments (every run's) that judged this item
    trajectory_error: str | None = None
    # A person's correction of the item's label (devset/<split>/corrections.jsonl) and the label as given.
    correction: Correction | None = None
    given_positive: bool | None = None
    correction_problem: str | None = None  # why the corrections file could not be read
    # A cascade experiment: its escalation share and each stage's cost per verdict (None: not a cascade).
    cascade: CascadeCost | None = None


def load_item(ledger: Ledger, ws_root: Path, experiment_id: int, trajectory_id: str) -> ItemDetail:
    """Read an item's verdicts from the ledger and its trajectory from the run's split in the workspace.

    A split missing from this workspace (a ledger copied from another machine) is not an error: the
    item view shows the verdicts and says where the trajectory was expected.
    """
    from optimizer.devset.split import open_split
    from optimizer.workspace.workspace import Workspace

    exp = ledger.get_experiment(experiment_id)
    run = ledger.get_run(exp.run_id)
    verdicts = ledger.item_verdicts(experiment_id, trajectory_id)
    label = ledger.labels(run.id).get(trajectory_id)
    others = ledger.experiments_judging(trajectory_id)  # across runs: every experiment that judged the item
    instruction, steps, problem = "", [], None
    try:
        split = open_split(Workspace.open(ws_root), run.split)
        traj = split.trajectory(trajectory_id)
        instruction = traj.task.instruction.strip()
        steps = step_lines(split, traj)
    except (UserError, OSError, ValueError) as exc:
        problem = str(exc)
    correction, given, fix_problem = _item_correction(ws_root, run.split, trajectory_id)
    return ItemDetail(
        experiment=exp,
        trajectory_id=trajectory_id,
        instruction=instruction,
        label=label,
        verdict=verdicts[0] if verdicts else None,
        steps=steps,
        reviews=ledger.reviews(trajectory_id=trajectory_id),
        other_experiments=others,
        trajectory_error=problem,
        correction=correction,
        given_positive=given,
        correction_problem=fix_problem,
        cascade=cascade_cost(ledger, experiment_id),
    )


def _item_correction(
    ws_root: Path, split_name: str, trajectory_id: str
) -> tuple[Correction | None, bool | None, str | None]:
    """The item's correction, its label as given (labels.jsonl) and why the corrections file is unreadable;
    a broken file must not hide the item, so its problem is returned, not raised."""
    from optimizer.devset.corrections import read_corrections
    from optimizer.devset.labels import load_labels
    from optimizer.devset.split import open_split
    from optimizer.workspace.workspace import Workspace

    try:
        split = open_split(Workspace.open(ws_root), split_name)
        given = load_labels(split)
        correction = read_corrections(split, given).get(trajectory_id)
    except (UserError, OSError, ValueError) as exc:
        return None, None, str(exc)
    label = given.get(trajectory_id)
    return correction, None if label is None else label.is_positive, None


# ---------------------------------------------------------------------------------------------
# Label suspects (`optimizer.answers.triage`)


@dataclass(frozen=True)
class SuspectQueue:
    """The label-suspects queue of the split the shown run judged (every run on it counts); ``problem``:
    why it could not be computed (a broken corrections file, a split no longer there)."""

    split: str
    suspects: list[Suspect]
    corrections: int
    problem: str | None = None


def load_suspects(ledger: Ledger, ws_root: Path, run_id: str | None) -> SuspectQueue:
    """The queue for the run ``run_id`` shows (default: the latest); LedgerNotReady without a run."""
    from optimizer.answers.triage import label_suspects
    from optimizer.devset.corrections import read_corrections
    from optimizer.devset.split import open_split
    from optimizer.workspace.workspace import Workspace

    run, _ = run_to_show(ledger, run_id)
    try:
        split = open_split(Workspace.open(ws_root), run.split)
        fixes = read_corrections(split)
        return SuspectQueue(run.split, label_suspects(ledger, split, corrections=fixes), len(fixes))
    except UserError as exc:
        return SuspectQueue(run.split, [], 0, problem=str(exc))


def save_correction(
    ws_root: Path, split_name: str, trajectory_id: str, label: str, reason: str, by: str | None
) -> str:
    """Record a person's correction (`optimizer.devset.corrections.record_correction`); its one-line outcome."""
    from optimizer.devset.corrections import record_correction
    from optimizer.devset.split import open_split
    from optimizer.workspace.workspace import Workspace

    ws = Workspace.open(ws_root)
    return record_correction(ws, open_split(ws, split_name), trajectory_id, label, reason, by)
