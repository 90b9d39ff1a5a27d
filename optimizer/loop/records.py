"""The typed records a candidate is handed on in, room to room (`optimizer.loop.propose` →
`optimizer.loop.evaluate` → `optimizer.loop.settle`), and the ledger's and git's words for them.

- `Rejected`: a candidate that ended before evaluation (optimiser failure, the guards), its row decided.
- `Prepared`: a candidate committed on the incumbent and recorded ``running``: its id, commit and what the
  optimiser's proposal cost (US dollars).
- `Evaluated`: a candidate's evaluation (first pass, re-judging passes), the decision on it (None when the
  evaluation is incomplete) and its typed flip table.
- `EvaluationInterrupted`: the run's stop request cut an evaluation before it could be decided.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

from optimizer.evaluation.results import EvalRun
from optimizer.judge.providers import Usage
from optimizer.ledger import (
    AnswerStatus,
    Experiment,
    ExperimentOutcome,
    ExperimentStatus,
    ItemVerdict,
    MemberVerdict,
    ReplicateVerdict,
    verdict_detail,
)
from optimizer.models import Label
from optimizer.stats.decision import Decision, Reason
from optimizer.stats.metrics import FlipTable, Metrics


@dataclass(frozen=True)
class Rejected:
    """A candidate that ended before any judge call (optimiser failure, guards): its decided row."""

    experiment: Experiment


@dataclass(frozen=True)
class Prepared:
    """A candidate committed on the incumbent, its row ``running``: ``optimiser_cost_usd`` is what its
    proposal cost (US dollars), counted on its row's total."""

    experiment_id: int
    commit_sha: str
    optimiser_cost_usd: float


@dataclass
class Evaluated:
    """A candidate's evaluation and the decision on it."""

    run: EvalRun
    decision: Decision | None  # None when the evaluation is incomplete (infra errors, budget)
    metrics: Metrics | None
    intervals: dict[str, tuple[float, float]] | None
    flips: FlipTable | None
    error: str | None = None
    # The re-judging passes (incumbent's, then candidate's) under the adaptive policy.
    rejudge: list[EvalRun] = field(default_factory=list)
    # The first pass's cost per paid verdict (`optimizer.loop.costs.verdict_cost`); None when unknown.
    verdict_cost: float | None = None

    @property
    def rejudge_usage(self) -> Usage:
        return sum((p.usage for p in self.rejudge), Usage())

    @property
    def usage(self) -> Usage:
        """The judge's calls of every pass (first pass and re-judging)."""
        return self.run.usage + self.rejudge_usage

    @property
    def calls(self) -> int:
        return self.usage.calls

    def outcome(
        self,
        status: ExperimentStatus,
        reason: str,
        *,
        extra_cost_usd: float = 0.0,
        commit_sha: str | None = None,
        prompt_hash: str | None = None,
        pooled_on: int | None = None,
    ) -> ExperimentOutcome:
        """The ledger's record of this evaluation ending as ``status``; ``extra_cost_usd``: what else
        the row's total counts (the optimiser's proposal, or what was paid before a crash); ``pooled_on``:
        the incumbent a rolled-back candidate is pooled on (`optimizer.loop.stack`)."""
        d = self.decision
        return ExperimentOutcome(
            status=status,
            reason=reason,
            metrics=self.metrics,
            intervals=self.intervals,
            flips=self.flips,
            p_value=d.p_value if d else None,
            literal_keep=d.literal_keep if d else None,
            paired_keep=d.paired_keep if d else None,
            adaptive_keep=d.adaptive_keep if d else None,
            alpha=d.alpha if d else None,
            test=d.test if d else None,
            early_stopped=bool(d and d.early_stopped),
            items_evaluated=len(self.run.items),
            usage=self.usage,
            cache_hits=self.run.cache_hits + sum(p.cache_hits for p in self.rejudge),
            rejudge=self.rejudge_usage,
            extra_cost_usd=extra_cost_usd,
            duration_s=self.run.duration_s + sum(p.duration_s for p in self.rejudge),
            commit_sha=commit_sha,
            prompt_hash=prompt_hash,
            keep_kind=(d.keep_kind or "improved") if d and status == "kept" else None,
            verdict_cost_usd=self.verdict_cost,
            policy_keep=d.keep if d else None,
            policy_reason=d.reason if d else None,
            policy_why=d.why if d else None,
            # The policy decided when the status is its keep or roll back; a waiting one is a person's to decide.
            decided_by="policy" if d and status in ("kept", "rolled_back") else None,
            pooled_on=pooled_on,
        )


class EvaluationInterrupted(Exception):
    """The run's `StopRequest` stopped an evaluation before it could be decided; the experiment stays
    ``running`` (what was judged is cached), so `judgeloop run --resume` finishes it. ``cost_usd``: what
    its judge calls so far cost (US dollars)."""

    def __init__(self, experiment_id: int, judged: int, total: int, cost_usd: float) -> None:
        super().__init__(f"experiment {experiment_id} interrupted after {judged}/{total} items")
        self.experiment_id, self.judged, self.total, self.cost_usd = experiment_id, judged, total, cost_usd


def evaluation_order(labels: Mapping[str, Label], ids: list[str]) -> list[str]:
    """Negatives first (the FPR guard needs only them), then positives; manifest order within each."""
    return [t for t in ids if not labels[t].is_positive] + [t for t in ids if labels[t].is_positive]


def answer_status(status: str) -> AnswerStatus:
    """A replicate's or member's status in the ledger's words (ok, infra_error, else invalid)."""
    return "ok" if status == "ok" else ("infra_error" if status == "infra_error" else "invalid")


def item_verdicts(run: EvalRun) -> list[ItemVerdict]:
    """Ledger rows for every evaluated item (majority answer and each replicate)."""
    rows = []
    for item in run.items:
        reps = [
            ReplicateVerdict(
                replicate=r.index,
                success=r.success,
                status=answer_status(r.status),
                reasoning=r.verdict.reasoning if r.verdict else (r.parse_error or r.infra_error or ""),
                confidence=r.verdict.confidence if r.verdict else None,
                mistake_type=r.verdict.mistake_type if r.verdict else None,
                raw=r.reply_text if r.verdict is None else None,
                cached=r.cached,
                cost_usd=r.cost_usd,
                tools=list(r.trace),
                members=[
                    MemberVerdict(
                        member=m.member or str(k),
                        success=m.success,
                        status=answer_status(m.status),
                        reasoning=m.verdict.reasoning
                        if m.verdict
                        else (m.parse_error or m.infra_error or ""),
                        confidence=m.verdict.confidence if m.verdict else None,
                        mistake_type=m.verdict.mistake_type if m.verdict else None,
                        cached=m.cached,
                        cost_usd=m.cost_usd,
                    )
                    for k, m in enumerate(r.members)
                ],
                **verdict_detail(r.verdict),
            )
            for r in item.replicates
        ]
        rows.append(
            ItemVerdict(
                trajectory_id=item.trajectory_id,
                success=item.answer.success,
                status=item.answer.status,
                mistake_type=item.answer.mistake_type,
                unstable=item.unstable,
                replicates=reps,
            )
        )
    return rows


def unified_diff(changed: Mapping[str, tuple[str | None, str | None]]) -> tuple[str, int, int]:
    """A git-style unified diff of the candidate's files, with insertion and deletion counts."""
    chunks: list[str] = []
    ins = dels = 0
    for path, (old, new) in sorted(changed.items()):
        lines = list(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"a/{path}",
                tofile=f"b/{path}",
            )
        )
        for line in lines:
            if line.startswith("+") and not line.startswith("+++"):
                ins += 1
            elif line.startswith("-") and not line.startswith("---"):
                dels += 1
        chunks.append("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return "".join(chunks), ins, dels


def decision_trailers(exp_id: int, metrics: Metrics | None, decision: str) -> dict[str, object]:
    """The git trailers of a decided candidate's commit (experiment, kappa, FPR, decision)."""
    return {
        "Judgeloop-Experiment": exp_id,
        "Judgeloop-Kappa": "n/a" if metrics is None or metrics.kappa is None else f"{metrics.kappa:.3f}",
        "Judgeloop-FPR": "n/a" if metrics is None or metrics.fpr is None else f"{metrics.fpr:.3f}",
        "Judgeloop-Decision": decision,
    }


def as_advice(reason: Reason | None, text: str) -> str:
    """A policy's reason worded as advice to the person who decides (--propose-only): "would roll it
    back (why)…" / "would keep it…", then the figures. ``reason``: the typed reason (`Reason.advice`);
    None only for a row stored before reasons were typed, whose ``text`` is then read (`stored_advice`)."""
    return reason.advice() if reason is not None else stored_advice(text)


def stored_advice(reason: str) -> str:
    """Advice from a stored reason's text, for rows recorded before reasons were typed (ledger schema <
    13): its outcome ("…: rolled back (why)", "…: kept") first; any other wording is quoted ("says: …")."""
    for done, would in ((": rolled back", "would roll it back"), (": kept", "would keep it")):
        evidence, found, rest = reason.rpartition(done)
        if found and (not rest or rest[0] in " ;"):
            return f"{would}{rest}: {evidence}"
    return f"says: {reason}"


def fmt3(x: float | None) -> str:
    """A figure with three decimals, or ``n/a``."""
    return "n/a" if x is None else f"{x:.3f}"


def one_line(text: str, limit: int = 72) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
