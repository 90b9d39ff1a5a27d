"""What the TUI shows, read from the ledger and the workspace. No Textual here: plain data, testable alone.

Everything is computed from ``optimizer.ledger`` (runs, experiments, verdicts, labels, reviews) and,
for a trajectory itself, from the workspace's split files. Nothing here imports the loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from optimizer import fmt
from optimizer.errors import UserError
from optimizer.ledger import (
    Attribution,
    EditContribution,
    Experiment,
    LabelRow,
    Ledger,
    Run,
)
from optimizer.ledger.waves import Wave, holm_rank, waves_by_member
from optimizer.stats.metrics import Answer, Metrics, flip_table, predicted_success

DISAGREEMENT_KINDS = ("FP", "FN")
REVIEW_LABELS = {
    "judge_wrong": "judge wrong",
    "label_suspect": "label suspect",
    "rubric_ambiguous": "rubric ambiguous",
}
STATUS_STYLES = {
    "kept": "bold green",
    "baseline": "bold cyan",
    "rolled_back": "red",
    "guard_rejected": "magenta",
    "running": "bold yellow",
    "waiting": "bold yellow reverse",
    "error": "bold red reverse",
}
STATUS_TEXT = {
    "kept": "kept",
    "baseline": "baseline",
    "rolled_back": "rolled back",
    "guard_rejected": "guard-rejected",
    "running": "running",
    "waiting": "waiting",
    "error": "error",
}


# A note in a cell: its first line as written, cut to the limit with an ellipsis.
one_line = partial(fmt.one_line, first_line=True, trim=False)


# ---------------------------------------------------------------------------------------------
# The ledger, and nothing to show yet


class LedgerNotReady(UserError):
    """Nothing to show yet: the workspace has no ledger, or only the empty file a starting run has just
    created, or a ledger without a run. The views show their empty state for it and the watcher waits;
    any other UserError from the ledger (a newer schema, not SQLite) is a real problem, shown as one."""


def _schema_version(path: Path) -> int | None:
    """The file's ``PRAGMA user_version`` (0: created, schema not written yet); None if it is not SQLite."""
    try:
        with closing(sqlite3.connect(f"file:{path.resolve().as_posix()}?mode=ro", uri=True)) as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error:
        return None


def open_ledger(path: Path) -> Ledger:
    """The ledger at ``path``, read-only. LedgerNotReady while it does not exist or is still empty (a run
    creates the file, then its schema); a ledger this version cannot read stays the ledger's UserError."""
    if not path.is_file():
        raise LedgerNotReady(f"no ledger yet at {path}; run `judgeloop run` first")
    try:
        return Ledger.open_readonly(path)
    except UserError:
        # Decided by the file, not the message: gone again, or a schema not written yet, is "not yet".
        if not path.is_file() or _schema_version(path) == 0:
            raise LedgerNotReady(
                f"no ledger yet at {path} (the file is empty); run `judgeloop run` first"
            ) from None
        raise


def run_to_show(ledger: Ledger, run_id: str | None = None) -> tuple[Run, list[Run]]:
    """The run ``run_id`` (default, or when unknown: the latest) and every run, newest first;
    LedgerNotReady when the ledger has no run yet."""
    runs = ledger.runs()
    if not runs:
        raise LedgerNotReady("no runs yet; press r (or run `judgeloop run`) to start one")
    return next((r for r in runs if r.id == run_id), runs[0]) if run_id else runs[0], runs


# ---------------------------------------------------------------------------------------------
# History


@dataclass(frozen=True)
class PartialMetrics:
    """An early-stopped candidate's metrics over the items it judged before it stopped (``judged`` of the
    run's ``total`` labelled items), and its incumbent's over the same items when asked for. Shown
    marked with ``*``: a kappa of 9 items is not the kappa of 24, and a candidate judges the negatives
    first, so only the difference with the incumbent over the same items compares like with like."""

    metrics: Metrics
    judged: int
    total: int
    incumbent: Metrics | None = None

    def value(self, name: str) -> float | None:
        """The partial ``name`` as a number (what ``cell`` shows; None where it shows "—")."""
        return self._value(self.metrics, name)

    def _value(self, metrics: Metrics | None, name: str) -> float | None:
        # Kappa over items of one class only (a candidate stopped on its negatives) is as undefined as
        # balanced accuracy there: shown "—", never a 0.00 that reads like a measurement.
        if metrics is None or (name == "kappa" and (metrics.tpr is None or metrics.tnr is None)):
            return None
        value = getattr(metrics, name)
        return None if value is None else float(value)

    def cell(self, name: str) -> str:
        """One metric for a table cell, marked partial, to two places (a handful of items): ``0.31*``."""
        value = self._value(self.metrics, name)
        return "—" if value is None else f"{value:.2f}{PARTIAL_MARK}"

    def delta(self, name: str) -> float | None:
        """This minus the incumbent over the same items (None without the incumbent's figures)."""
        mine = self._value(self.metrics, name)
        theirs = self._value(self.incumbent, name)
        return None if mine is None or theirs is None else mine - theirs

    def delta_cell(self, name: str) -> str:
        """The difference for a table cell, marked partial: ``+0.05*``."""
        delta = self.delta(name)
        return "—" if delta is None else f"{delta:+.2f}{PARTIAL_MARK}"

    @property
    def judged_text(self) -> str:
        return f"{self.judged}/{self.total} judged"


PARTIAL_MARK = "*"


def _counts_metrics(
    labels: Mapping[str, LabelRow], answers: Mapping[str, Answer], ids: Iterable[str]
) -> Metrics:
    """Metrics over ``ids`` only, scored as ``metrics.score`` scores an answer (an unusable one is wrong)."""
    tp = fn = tn = fp = invalid = 0
    for tid in ids:
        label, answer = labels[tid], answers.get(tid)
        if answer is not None and not answer.usable:
            invalid += 1
        said = predicted_success(label, answer)
        if label.is_positive:
            tp, fn = (tp + 1, fn) if said else (tp, fn + 1)
        else:
            tn, fp = (tn, fp + 1) if said else (tn + 1, fp)
    return Metrics.from_counts(tp, fn, tn, fp, invalid=invalid)


def partial_metrics(
    ledger: Ledger,
    exp: Experiment,
    labels: Mapping[str, LabelRow] | None = None,
    *,
    with_incumbent: bool = False,
    against: int | None = None,
) -> PartialMetrics | None:
    """The partial metrics of an early-stopped candidate (None for any other experiment, or when it judged
    nothing): over its judged items (an answer recorded, not missing or lost to an infrastructure error);
    ``with_incumbent``: with its parent's over the same items, or experiment ``against``'s (compare)."""
    if not exp.early_stopped:
        return None
    labels = ledger.labels(exp.run_id) if labels is None else labels
    answers = ledger.item_answers(exp.id)
    judged = sorted(tid for tid, a in answers.items() if tid in labels and a.status in ("ok", "invalid"))
    if not judged:
        return None
    incumbent = None
    other = against if against is not None else exp.parent_id if with_incumbent else None
    if other is not None:
        incumbent = _counts_metrics(labels, ledger.item_answers(other), judged)
    return PartialMetrics(_counts_metrics(labels, answers, judged), len(judged), len(labels), incumbent)


@dataclass(frozen=True)
class HistoryRow:
    """One experiment in the history table, with deltas against its parent (the incumbent it faced)."""

    experiment: Experiment
    d_kappa: float | None
    d_fpr: float | None
    d_bacc: float | None
    in_chain: bool
    partial: PartialMetrics | None = None  # an early-stopped candidate's metrics over its judged items
    wave: Wave | None = None  # the wave it was a candidate of (`optimizer.ledger.waves`)

    @property
    def id(self) -> int:
        return self.experiment.id

    @property
    def wave_tag(self) -> str:
        """``w3 2/4`` (wave 3, member 2 of 4), or "" for a single candidate."""
        return self.wave.tag(self.id) if self.wave is not None else ""

    @property
    def wave_order(self) -> tuple[int, int]:
        """Sorts a wave's rows together, at its first member: (first member's id, own id)."""
        return (self.wave.members[0] if self.wave is not None else self.id, self.id)

    def metric_texts(self) -> tuple[str, str, str]:
        """κ, FPR and balanced accuracy for the table: the stored ones, or an early-stopped candidate's
        partial ones marked ``*``."""
        exp, part = self.experiment, self.partial
        if part is not None:
            return part.cell("kappa"), part.cell("fpr"), part.cell("balanced_accuracy")
        return fmt.num(exp.kappa), fmt.num(exp.fpr), fmt.num(exp.balanced_accuracy)

    def delta_text(self, name: str) -> str:
        """Δκ or ΔFPR for the table: against the parent, or for an early-stopped candidate against the
        incumbent over the same judged items, marked ``*``."""
        if self.partial is not None:
            return self.partial.delta_cell(name)
        return fmt.num(self.d_kappa if name == "kappa" else self.d_fpr, signed=True)


@dataclass(frozen=True)
class History:
    run: Run
    rows: list[HistoryRow]
    chain_ids: list[int]
    runs: list[Run]
    # Kept experiments whose contribution at the end (`judgeloop attribute`) is not significant.
    weak_ids: frozenset[int] = frozenset()

    @property
    def experiments(self) -> list[Experiment]:
        return [r.experiment for r in self.rows]

    @property
    def has_waves(self) -> bool:
        """True when a row is a wave candidate (the table then shows its wave column)."""
        return any(r.wave is not None for r in self.rows)

    @property
    def partial_legend(self) -> str:
        """What ``*`` means in the table, when a row has partial metrics (else "")."""
        if not any(r.partial is not None for r in self.rows):
            return ""
        return (
            f" · {PARTIAL_MARK} = over the items judged before an early stop, Δ against the incumbent on "
            "the same items (e: how many)"
        )

    def waiting(self) -> Experiment | None:
        """The candidate waiting for a human decision (propose-only mode), if any."""
        return next((r.experiment for r in self.rows if r.experiment.status == "waiting"), None)


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def chain_from(run: Run, by_id: Mapping[int, Experiment]) -> list[int]:
    """Baseline → … → incumbent ids, following parent links back from the run's incumbent (the same
    walk as ``Ledger.kept_chain``, over experiments already read, so the history needs one query)."""
    chain: list[int] = []
    current = run.incumbent_experiment
    while current is not None and current in by_id and current not in chain:
        chain.append(current)
        current = by_id[current].parent_id
    return list(reversed(chain))


def history_rows(ledger: Ledger, run: Run) -> tuple[list[HistoryRow], list[int]]:
    """One run's history rows (deltas against each parent, early-stopped candidates' partial metrics)
    and its kept chain's ids."""
    experiments = ledger.experiments(run.id)
    by_id = {e.id: e for e in experiments}
    chain_ids = chain_from(run, by_id)
    chain = set(chain_ids)
    labels = ledger.labels(run.id) if any(e.early_stopped for e in experiments) else {}
    grouped = waves_by_member(experiments)  # once per load, not per paint
    rows = []
    for exp in experiments:
        parent = by_id.get(exp.parent_id) if exp.parent_id is not None else None
        rows.append(
            HistoryRow(
                experiment=exp,
                d_kappa=_delta(exp.kappa, parent.kappa) if parent else None,
                d_fpr=_delta(exp.fpr, parent.fpr) if parent else None,
                d_bacc=_delta(exp.balanced_accuracy, parent.balanced_accuracy) if parent else None,
                in_chain=exp.id in chain,
                partial=partial_metrics(ledger, exp, labels, with_incumbent=True),
                wave=grouped.get(exp.id),
            )
        )
    return rows, chain_ids


def load_history(ledger: Ledger, run_id: str | None = None) -> History:
    """The run's experiments (the latest run by default) with deltas and the kept chain; LedgerNotReady
    if there is no run."""
    run, runs = run_to_show(ledger, run_id)
    rows, chain_ids = history_rows(ledger, run)
    return History(run=run, rows=rows, chain_ids=chain_ids, runs=runs, weak_ids=weak_edits(ledger, run.id))


# ---------------------------------------------------------------------------------------------
# Every run: the run picker and the runs side by side


@dataclass(frozen=True)
class RunSummary:
    """One line of the run picker. ``number``: the run's place in time, 1 for the oldest."""

    run: Run
    number: int
    experiments: int
    kept: int


def run_summaries(ledger: Ledger) -> list[RunSummary]:
    """Every run, newest first, with its experiment and kept counts; LedgerNotReady when there is none."""
    _, runs = run_to_show(ledger)
    out = []
    for i, run in enumerate(runs):
        experiments = ledger.experiments(run.id)
        out.append(
            RunSummary(run, len(runs) - i, len(experiments), sum(e.status == "kept" for e in experiments))
        )
    return out


def check_run(ledger_path: Path, run_id: str) -> str:
    """``run_id`` if the workspace's ledger has that run; else a UserError naming the newest runs
    (``judgeloop tui --run``)."""
    with open_ledger(ledger_path) as ledger:
        return ledger.get_run(run_id).id


@dataclass(frozen=True)
class AllRunsRow:
    """One experiment of the runs-side-by-side table: its run (and the run's number) and its history row."""

    run: Run
    number: int
    row: HistoryRow

    @property
    def id(self) -> int:
        return self.row.id


@dataclass(frozen=True)
class AllRuns:
    runs: list[Run]  # oldest first
    rows: list[AllRunsRow]  # run by run, oldest first; each run's experiments in order


def load_all_runs(ledger: Ledger) -> AllRuns:
    """Every run's experiments in one list, oldest run first: the one-run-per-edit manual workflow's
    edits one after another. LedgerNotReady when there is no run."""
    _, newest_first = run_to_show(ledger)
    runs = list(reversed(newest_first))
    rows: list[AllRunsRow] = []
    for number, run in enumerate(runs, start=1):
        rows.extend(AllRunsRow(run, number, row) for row in history_rows(ledger, run)[0])
    return AllRuns(runs=runs, rows=rows)


def weak_edits(ledger: Ledger, run_id: str) -> frozenset[int]:
    """Kept experiments whose measured contribution at the end is not significant at the attribution's
    alpha (empty before `judgeloop attribute` ran)."""
    from optimizer.report.data import significant

    attribution = ledger.latest_attribution(run_id)
    if attribution is None:
        return frozenset()
    return frozenset(
        e.experiment
        for e in attribution.edits
        if e.experiment is not None and significant(e, attribution.alpha) is False
    )


# ---------------------------------------------------------------------------------------------
# What helped (attribution)


@dataclass(frozen=True)
class HelpedRow:
    """A kept edit: its gain when it was kept and (once measured) its contribution at the end."""

    experiment: Experiment
    gain: float | None
    contribution: EditContribution | None
    significant: bool | None


@dataclass(frozen=True)
class Helped:
    run: Run
    attribution: Attribution | None
    rows: list[HelpedRow]  # newest kept edit first

    @property
    def final_vs_baseline(self) -> EditContribution | None:
        return self.attribution.final_vs_baseline if self.attribution is not None else None


def load_helped(ledger: Ledger, run_id: str | None = None) -> Helped:
    """The run's kept edits (newest first) with their gain when kept and their contribution at the end
    from the run's latest attribution (the attribution's edits when there is one; else the kept chain);
    LedgerNotReady if there is no run."""
    from optimizer.report.data import gain_when_kept, significant

    run, _ = run_to_show(ledger, run_id)
    attribution = ledger.latest_attribution(run.id)
    rows: list[HelpedRow] = []
    if attribution is not None:
        for edit in attribution.edits:
            if edit.experiment is None:
                continue
            exp = ledger.get_experiment(edit.experiment)
            rows.append(HelpedRow(exp, gain_when_kept(exp), edit, significant(edit, attribution.alpha)))
    else:
        for exp in reversed(ledger.kept_chain(run.id)):
            if exp.seq > 0:
                rows.append(HelpedRow(exp, gain_when_kept(exp), None, None))
    return Helped(run=run, attribution=attribution, rows=rows)


def bar(value: float | None, scale: float, width: int = 10) -> str:
    """A horizontal bar of ``value`` on a ``scale`` that fills ``width`` cells (eighths of a cell);
    negative values are drawn the same way (the caller colours them)."""
    if value is None or scale <= 0:
        return ""
    eighths = round(min(abs(value) / scale, 1.0) * width * 8)
    full, rest = divmod(eighths, 8)
    return "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])


def matches_filter(row: HistoryRow, text: str) -> bool:
    """A history filter: every word must appear in the row's id, wave tag (``w3``), strategy, status or
    rationale (``status:kept`` style words match the status exactly)."""
    exp = row.experiment
    hay = " ".join(
        [
            str(exp.id),
            row.wave_tag,
            exp.strategy or "",
            STATUS_TEXT.get(exp.status, exp.status),
            exp.status,
            "overruled" if exp.overrule is not None else "",
            exp.rationale or "",
            exp.reason or "",
        ]
    ).lower()
    for word in text.lower().split():
        if word.startswith("status:"):
            if exp.status != word.split(":", 1)[1] and STATUS_TEXT.get(exp.status) != word.split(":", 1)[1]:
                return False
        elif word not in hay:
            return False
    return True


@dataclass(frozen=True)
class CurvePoints:
    """What the charts plot, by experiment id (the number the history table, ``judgeloop decide``,
    ``report`` and ``refs/judgeloop/rejected/<id>`` use; a run's ids increase with its experiments).

    - ``chain_*``: the incumbent over time as a step line — each kept value held flat until the next
      kept experiment, then a vertical step (two points share that x), through the last experiment.
    - ``evaluated_*``: fully evaluated candidates (kept or rolled back with metrics) at their value.
    - ``stopped_*``: candidates stopped early (rolled back before the end) at what was measured: their
      partial metrics over the items judged before the stop, the ``1.00*`` the history and experiment
      views show (never at the incumbent's level, which nobody measured). None where nothing can be
      drawn (kappa over one class only: "—" in the table); ``unplotted`` counts those per metric.
    - ``rejected``: guard-rejected or failed candidates — never evaluated, so not plotted; the legend
      gives their count.
    - ``experiment_ids``: every experiment of the run, in order (where the x axis may put a tick).
    """

    chain_x: list[int]
    chain_kappa: list[float]
    chain_fpr: list[float]
    evaluated_x: list[int]
    evaluated_kappa: list[float]
    evaluated_fpr: list[float]
    stopped_x: list[int]
    stopped_kappa: list[float | None]
    stopped_fpr: list[float | None]
    rejected: int
    baseline: tuple[int, float, float] | None
    experiment_ids: list[int] = field(default_factory=list)

    def values(self, metric: str) -> tuple[list[float], list[float]]:
        """(chain, evaluated) y values for ``metric`` ("kappa" or "fpr")."""
        if metric == "kappa":
            return self.chain_kappa, self.evaluated_kappa
        return self.chain_fpr, self.evaluated_fpr

    def stopped(self, metric: str) -> tuple[list[int], list[float]]:
        """The early-stopped candidates that have a partial ``metric``: (x, y)."""
        ys = self.stopped_kappa if metric == "kappa" else self.stopped_fpr
        pairs = [(x, y) for x, y in zip(self.stopped_x, ys, strict=True) if y is not None]
        return [x for x, _ in pairs], [y for _, y in pairs]

    def unplotted(self, metric: str) -> int:
        """How many early-stopped candidates have no partial ``metric`` to draw."""
        return len(self.stopped_x) - len(self.stopped(metric)[0])

    def x_range(self) -> tuple[int, int]:
        """The x axis limits: first to last experiment id (one on either side of a lone experiment)."""
        if not self.experiment_ids:
            return 0, 1
        first, last = self.experiment_ids[0], self.experiment_ids[-1]
        return (first - 1, last + 1) if first == last else (first, last)


TICK_STEPS = (1, 2, 5)


def x_ticks(experiment_ids: Sequence[int], max_ticks: int) -> list[int]:
    """Integer ticks for the charts' x axis: experiment ids only, every ``step``-th id (the smallest of
    1, 2, 5, 10, 20, 50, … that gives at most ``max_ticks``), at multiples of the step; the first id if
    no multiple falls in the run."""
    ids = sorted(set(experiment_ids))
    if not ids:
        return []
    max_ticks = max(1, max_ticks)
    scale = 1
    while True:
        for base in TICK_STEPS:
            step = base * scale
            ticks = [i for i in ids if i % step == 0]
            if len(ticks) <= max_ticks:
                return ticks or [ids[0]]
        scale *= 10


def curve_points(history: History) -> CurvePoints:
    """The charts' points for ``history`` (see ``CurvePoints``)."""
    experiments = history.experiments
    ids = [e.id for e in experiments]
    last_x = max(ids, default=0)
    chain_set = set(history.chain_ids)
    # The incumbent's value at each experiment: the latest chain member at or before it.
    steps: list[tuple[int, float, float]] = [
        (e.id, e.kappa, e.fpr)
        for e in experiments
        if e.id in chain_set and e.kappa is not None and e.fpr is not None
    ]
    chain_x: list[int] = []
    chain_k: list[float] = []
    chain_f: list[float] = []
    for i, (x, kappa, fpr) in enumerate(steps):
        if i:  # the vertical step: the previous value, then this one, at the same x
            chain_x.append(x)
            chain_k.append(chain_k[-1])
            chain_f.append(chain_f[-1])
        chain_x.append(x)
        chain_k.append(kappa)
        chain_f.append(fpr)
    if steps and last_x > steps[-1][0]:
        chain_x.append(last_x)
        chain_k.append(chain_k[-1])
        chain_f.append(chain_f[-1])

    ev_x: list[int] = []
    ev_k: list[float] = []
    ev_f: list[float] = []
    st_x: list[int] = []
    st_k: list[float | None] = []
    st_f: list[float | None] = []
    rejected = 0
    base = None
    partial = {r.id: r.partial for r in history.rows}
    for e in experiments:
        if e.status == "baseline":
            if e.kappa is not None and e.fpr is not None:
                base = (e.id, e.kappa, e.fpr)
            continue
        if e.kappa is not None and e.fpr is not None:
            ev_x.append(e.id)
            ev_k.append(e.kappa)
            ev_f.append(e.fpr)
        elif e.early_stopped:  # what it measured before the stop, as the table's ``*`` figures
            part = partial.get(e.id)
            st_x.append(e.id)
            st_k.append(part.value("kappa") if part is not None else None)
            st_f.append(part.value("fpr") if part is not None else None)
        elif e.status not in ("running", "waiting"):  # guard-rejected, error: never evaluated
            rejected += 1
    return CurvePoints(
        chain_x=chain_x,
        chain_kappa=chain_k,
        chain_fpr=chain_f,
        evaluated_x=ev_x,
        evaluated_kappa=ev_k,
        evaluated_fpr=ev_f,
        stopped_x=st_x,
        stopped_kappa=st_k,
        stopped_fpr=st_f,
        rejected=rejected,
        baseline=base,
        experiment_ids=ids,
    )


# ---------------------------------------------------------------------------------------------
# Experiments


@dataclass(frozen=True)
class ExperimentDetail:
    experiment: Experiment
    parent: Experiment | None
    labels: dict[str, LabelRow]
    # False positives per mistake type, this experiment's and its incumbent's on the same items.
    fp_by_type: tuple[dict[str, int], dict[str, int] | None] | None = None
    partial: PartialMetrics | None = None  # early-stopped: the metrics over the items it judged
    wave: WaveDetail | None = None  # a wave candidate's wave


@dataclass(frozen=True)
class WaveDetail:
    """A wave candidate's wave: the wave, its other members (id order) and its own Holm rank
    (`optimizer.ledger.waves.holm_rank`; None without a full test)."""

    wave: Wave
    siblings: list[Experiment]
    rank: int | None


def wave_detail(ledger: Ledger, exp: Experiment) -> WaveDetail | None:
    """``exp``'s wave, or None for a single candidate. Only a row with a wave record, or an error (an
    old wave's optimiser failure has none), costs the listing of the run's rows."""
    if "wave" not in exp.proposal_meta and exp.status != "error":
        return None
    rows = ledger.experiments(exp.run_id)
    wave = waves_by_member(rows).get(exp.id)
    if wave is None:
        return None
    members = [e for e in rows if e.id in wave.members]
    mine = next((e for e in members if e.id == exp.id), exp)
    return WaveDetail(wave, [e for e in members if e.id != exp.id], holm_rank(mine, members))


def load_experiment(ledger: Ledger, experiment_id: int) -> ExperimentDetail:
    """One experiment with its diff text and its parent (the incumbent it was compared with); an
    early-stopped candidate with its partial metrics and the incumbent's on the same items."""
    exp = ledger.get_experiment(experiment_id)
    parent = ledger.get_experiment(exp.parent_id) if exp.parent_id is not None else None
    from optimizer.report.data import fp_by_type

    fps = fp_by_type(ledger, ledger.get_run(exp.run_id), exp)
    labels = ledger.labels(exp.run_id)
    return ExperimentDetail(
        experiment=exp,
        parent=parent,
        labels=labels,
        fp_by_type=fps,
        partial=partial_metrics(ledger, exp, labels, with_incumbent=True),
        wave=wave_detail(ledger, exp),
    )


# ---------------------------------------------------------------------------------------------
# Compare


@dataclass(frozen=True)
class Comparison:
    left: Experiment
    right: Experiment
    flips: dict[str, list[str]]  # left → right, the four FLIP_KEYS
    # An early-stopped side's partial metrics, beside the other side's over the same items (the figures
    # the history and experiment views show as ``1.00*``, not "—").
    left_partial: PartialMetrics | None = None
    right_partial: PartialMetrics | None = None


def load_comparison(ledger: Ledger, left_id: int, right_id: int) -> Comparison:
    """Two experiments with their diffs and the paired flip table from ``left`` to ``right``."""
    left, right = ledger.get_experiment(left_id), ledger.get_experiment(right_id)
    labels = ledger.labels(left.run_id) or ledger.labels(right.run_id)
    a, b = ledger.item_answers(left_id), ledger.item_answers(right_id)
    common = {tid: lab for tid, lab in labels.items() if tid in a and tid in b}
    table = flip_table(common, {t: a[t] for t in common}, {t: b[t] for t in common})
    return Comparison(
        left,
        right,
        {k: list(getattr(table, k)) for k in ("tp_to_fn", "fn_to_tp", "tn_to_fp", "fp_to_tn")},
        left_partial=partial_metrics(ledger, left, labels, against=right_id),
        right_partial=partial_metrics(ledger, right, labels, against=left_id),
    )
