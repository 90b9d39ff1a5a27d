"""The ledger's row types (what a read returns, what a write takes) and their conversions to and from
SQLite values. Pydantic models at the boundary; no connection here (see `optimizer.ledger.Ledger`).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from optimizer.events import LedgerEvent, read_event
from optimizer.judge.types import JudgeToolCall
from optimizer.ledger.schema import FLIP_KEYS, V4_EXPERIMENT_COLUMNS
from optimizer.stats.rules import Reason
from optimizer.vocab import (
    AnswerStatus,
    DecidedBy,
    EventKind,
    ExperimentStatus,
    ReviewKind,
    RunStatus,
)

if TYPE_CHECKING:
    from optimizer.judge.providers.pricing import Usage
    from optimizer.stats.decision import AdaptiveTest
    from optimizer.stats.metrics import FlipTable, Metrics

# A stored metrics object as a mapping (some of `Metrics`' figures by name: rates, kappa, counts) and a
# stored flip table (`FLIP_KEYS` → item ids): what rows written by hand or read back hold.
MetricsRow = Mapping[str, float | int | dict[str, float | None] | None]
FlipsRow = Mapping[str, Sequence[str]]


class BatchRow(BaseModel):
    """A batch a run sent through a provider's batch API (the ``batches`` table)."""

    id: int
    run_id: str
    experiment_id: int | None
    provider: str
    endpoint: str
    model: str
    batch_id: str | None
    status: str  # submitting | submitted | collected | abandoned
    custom_ids: list[str]
    estimate_usd: float
    created: str


def utc_now() -> datetime:
    """The current time in UTC, to the second (what every ledger timestamp uses)."""
    return datetime.now(UTC).replace(microsecond=0)


def ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def new_run_id(now: datetime | None = None) -> str:
    """A sortable, unique-enough run id such as ``20261130-031502-ab12`` (UTC time + 4 hex digits)."""
    now = now or utc_now()
    return now.astimezone(UTC).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


# ---------------------------------------------------------------------------------------------
# Row models


class Run(BaseModel):
    id: str
    created: datetime
    finished: datetime | None = None
    status: RunStatus
    strategy: str
    policy: str
    split: str
    split_fingerprint: str
    start_rev: str
    branch: str
    incumbent_experiment: int | None = None
    budgets: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    pid: int | None = None
    host: str | None = None
    stop_reason: str | None = None
    # The fingerprint of the label set the run decides with (schema 9; None on older runs: the given labels).
    labels_fingerprint: str | None = None


class Experiment(BaseModel):
    """One candidate (or the baseline, ``seq`` 0).

    ``diff_text`` is None in listings (``Ledger.experiments``); ``get_experiment`` loads it.
    ``metrics`` holds ``Metrics.model_dump()`` (the protocol metrics plus tp/fn/tn/fp) — None until
    computed, and for an early-stopped candidate only what was computed. ``intervals`` maps a metric name to a
    (low, high) pair; ``flips`` maps each of ``FLIP_KEYS`` to trajectory ids.
    ``calls``/``input_tokens``/``output_tokens`` count the judge's calls, ``optimizer_*`` the optimiser's
    (tokens in the providers' convention: input excludes cache reads/writes, which the judge's
    ``cache_read_tokens``/``cache_write_tokens`` count); ``cost_usd`` (US dollars) is the total of both,
    ``judge_cost_usd`` the judge's part.
    """

    id: int
    run_id: str
    seq: int
    parent_id: int | None = None
    strategy: str | None = None
    created: datetime
    finished: datetime | None = None
    status: ExperimentStatus
    commit_sha: str | None = None
    files_changed: list[str] = Field(default_factory=list)
    insertions: int | None = None
    deletions: int | None = None
    diff_text: str | None = None
    rationale: str | None = None
    metrics: dict[str, Any] | None = None
    intervals: dict[str, tuple[float, float]] | None = None
    flips: dict[str, list[str]] | None = None
    p_value: float | None = None
    literal_keep: bool | None = None
    paired_keep: bool | None = None
    decision: str | None = None
    reason: str | None = None
    early_stopped: bool = False
    items_evaluated: int = 0
    calls: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float | None = None
    prompt_hash: str | None = None
    optimizer_calls: int = 0
    optimizer_input_tokens: int = 0
    optimizer_output_tokens: int = 0
    optimizer_cost_usd: float = 0.0
    proposal_meta: dict[str, Any] = Field(default_factory=dict)
    # The adaptive rule's outcome, the level the deciding test ran at, and the test's record
    # (`optimizer.stats.decision.AdaptiveTest` as a dict); None on rows decided before schema 4.
    adaptive_keep: bool | None = None
    alpha: float | None = None
    test: dict[str, Any] | None = None
    # Judge calls (and their cost, US dollars) of the re-judging pass, both prompts; part of calls/cost_usd.
    rejudge_calls: int = 0
    rejudge_cost_usd: float = 0.0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # What the passes' plan expected to be read from the prompt cache (tokens; billed: cache_read_tokens).
    planned_cache_read_tokens: int = 0
    # How a kept candidate earned it: "improved" (kappa, significantly) or "cheaper" (not worse by more
    # than [loop] cheaper_margin_items, cheaper per verdict); None for other outcomes and older rows.
    keep_kind: str | None = None
    # The judge's cost per verdict under this experiment's prompts, US dollars (billed tokens with cache
    # writes priced as reads, `optimizer.judge.providers.pricing.warm_cost_usd`); None: not known.
    verdict_cost_usd: float | None = None
    # What the decision policy said (keep: True, roll back: False) and why; None when no policy decided
    # (guards, errors) and on rows before schema 10. ``decided_by``: who made the keep or roll back.
    policy_keep: bool | None = None
    policy_reason: str | None = None
    # The policy's reason as data (`policy_reason` is its text); None when no policy decided and on rows
    # decided before schema 13, whose readers fall back to the text.
    policy_why: Reason | None = None
    decided_by: DecidedBy | None = None
    # [loop] stack: the incumbent experiment this rolled-back candidate was pooled on, because it pointed the
    # right way (`optimizer.stats.pooling`); None when not pooled and on rows before schema 12.
    pooled_on: int | None = None

    @property
    def overrule(self) -> str | None:
        """The line saying a person decided against the policy ("kept by a person over the policy's roll
        back: <reason>"), or None when nobody overruled it."""
        if (
            self.decided_by != "person"
            or self.policy_keep is None
            or self.status not in ("kept", "rolled_back")
        ):
            return None
        return overrule_line(self.status == "kept", self.policy_keep, self.policy_reason)

    def _stack_ids(self, key: str) -> list[int]:
        record = self.proposal_meta.get("stack") if self.strategy == "stack" else None
        ids = record.get(key) if isinstance(record, dict) else None
        if not isinstance(ids, list):
            return []
        return [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]

    @property
    def carries(self) -> list[int]:
        """A merged candidate's parts ([loop] stack): the pooled experiments whose edits it carries (only a
        ``stack`` row's ``proposal_meta["stack"]`` counts; any other row carries nothing)."""
        return self._stack_ids("carries")

    @property
    def stack_pooled(self) -> list[int]:
        """A merged candidate's pool: every pooled experiment its merge used (carried or left out)."""
        return self._stack_ids("pooled")

    @property
    def judge_cost_usd(self) -> float:
        """What the judge's calls cost: the total less the optimiser's part (US dollars)."""
        return max(0.0, self.cost_usd - self.optimizer_cost_usd)

    def metric(self, name: str) -> float | None:
        """One metric by its protocol name, or None when it was not computed."""
        if not self.metrics:
            return None
        value = self.metrics.get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    @property
    def kappa(self) -> float | None:
        return self.metric("kappa")

    @property
    def fpr(self) -> float | None:
        return self.metric("fpr")

    @property
    def balanced_accuracy(self) -> float | None:
        return self.metric("balanced_accuracy")

    def metrics_model(self) -> Metrics | None:
        """The stored metrics as a ``metrics.Metrics``, or None when absent or partial."""
        from optimizer.stats.metrics import Metrics

        if not self.metrics:
            return None
        try:
            return Metrics.model_validate(self.metrics)
        except ValueError:
            return None

    @property
    def diff_stat(self) -> dict[str, int | None]:
        return {"insertions": self.insertions, "deletions": self.deletions}

    def flip_counts(self) -> dict[str, int]:
        """How many items moved in each direction against the incumbent (0s when not computed)."""
        return {k: len((self.flips or {}).get(k, [])) for k in FLIP_KEYS}


def overrule_line(kept: bool, policy_keep: bool, policy_reason: str | None) -> str | None:
    """What a person's keep against the policy is recorded as (ledger, report, commit trailer), or None.
    Only a keep overrules: discarding what the policy would keep loses nothing (its commit stays under
    ``refs/judgeloop/rejected/<id>``) and changes no figure the run reports."""
    if not kept or policy_keep:
        return None
    return f"kept by a person over the policy's roll back: {policy_reason or 'no reason recorded'}"


def _no_usage() -> Usage:
    # Imported when first needed: the providers' package is not part of opening a ledger (the TUI).
    from optimizer.judge.providers.pricing import Usage

    return Usage()


@dataclass(frozen=True)
class RunSpec:
    """What a new run decides with, for `Ledger.create_run`: its strategy, decision policy, split (name and
    fingerprint), the revision it starts from, the fingerprint of its label set
    (`optimizer.devset.corrections.LabelSet`; None when not recorded), its budgets and config snapshot
    (JSON objects; never keys)."""

    strategy: str
    policy: str
    split: str
    split_fingerprint: str
    start_rev: str
    labels_fingerprint: str | None = None
    budgets: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProposedEdit:
    """What a candidate's row starts with, for `Ledger.start_experiment`: the edit as proposed (files,
    diff size in lines, diff text, rationale, the prompt hash when known) and what proposing it cost.

    ``optimizer_usage``: the optimiser's calls, tokens and dollars (`Usage`; the row keeps its calls,
    input and output tokens and cost, not its cache tokens); ``proposal_meta``: what the strategy recorded
    about its proposal as data (a JSON object; None or empty for none).
    """

    files_changed: Sequence[str] = ()
    insertions: int | None = None
    deletions: int | None = None
    diff_text: str | None = None
    rationale: str | None = None
    prompt_hash: str | None = None
    optimizer_usage: Usage = field(default_factory=_no_usage)
    proposal_meta: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class AttributionSpec:
    """What determines an attribution's numbers, for `Ledger.open_attribution`: its ``key`` (a digest of
    the rest), scope (``run`` or a range), the final and baseline commits, the split, the judge, the
    replicates per item, the re-judging count and the test's level ``alpha``."""

    key: str
    scope: str
    final_commit: str
    baseline_commit: str
    split: str
    judge: str
    replicates: int
    rejudge: int
    alpha: float


@dataclass(frozen=True)
class ExperimentOutcome:
    """What an experiment ended as, for `Ledger.record_decision` (one value per outcome column).

    ``status`` is also the stored decision. ``metrics``: a ``metrics.Metrics`` (stored with its
    confusion counts) or a row of some of its figures (`MetricsRow`); ``intervals``: metric name →
    (low, high); ``flips``: a ``metrics.FlipTable`` or a mapping of ``FLIP_KEYS`` (`FlipsRow`).
    ``p_value`` … ``test``: the decision's record (`optimizer.stats.decision.Decision`; ``test`` its
    `AdaptiveTest`, stored as JSON). ``usage``: the judge's calls, tokens and dollars, every
    pass included; ``rejudge``: the re-judging passes' part of it; ``extra_cost_usd``: what else the
    row's total cost counts (the optimiser's proposal; what a resumed evaluation paid before a crash).
    ``commit_sha``/``prompt_hash`` replace the stored ones only when given.
    """

    status: ExperimentStatus
    reason: str | None = None
    metrics: Metrics | MetricsRow | None = None
    intervals: Mapping[str, Any] | None = None
    flips: FlipTable | FlipsRow | None = None
    p_value: float | None = None
    literal_keep: bool | None = None
    paired_keep: bool | None = None
    adaptive_keep: bool | None = None
    alpha: float | None = None
    test: AdaptiveTest | None = None
    early_stopped: bool = False
    items_evaluated: int = 0
    usage: Usage = field(default_factory=_no_usage)
    cache_hits: int = 0
    rejudge: Usage = field(default_factory=_no_usage)
    extra_cost_usd: float = 0.0
    duration_s: float | None = None
    commit_sha: str | None = None
    prompt_hash: str | None = None
    keep_kind: str | None = None
    verdict_cost_usd: float | None = None
    policy_keep: bool | None = None  # what the policy said (None: no policy decided)
    policy_reason: str | None = None
    policy_why: Reason | None = None  # the policy's reason as data (`policy_reason` is its text)
    decided_by: DecidedBy | None = None
    pooled_on: int | None = None  # [loop] stack: the incumbent this rolled-back candidate is pooled on

    @property
    def cost_usd(self) -> float:
        """The row's total: the judge's calls plus ``extra_cost_usd`` (US dollars)."""
        return self.usage.cost_usd + self.extra_cost_usd


class MemberVerdict(BaseModel):
    """One panel member's verdict behind a replicate (judge.toml [panel]); ``member`` is its label."""

    member: str
    success: bool | None
    status: AnswerStatus = "ok"
    reasoning: str = ""
    confidence: str | None = None
    mistake_type: str | None = None
    cached: bool = False
    cost_usd: float = 0.0


class CriterionCheck(BaseModel):
    """One criterion of a ``structure = "criteria"`` verdict: met or not, and the steps cited."""

    text: str
    met: bool
    steps: list[int] = Field(default_factory=list)
    required: bool = True


class ReviewRecord(BaseModel):
    """A ``review = "success"`` call on a success verdict: ``applied`` when it turned it into a failure
    (``first_verdict`` then holds the verdict before the review); ``error`` why a reply was not usable."""

    violation: bool | None = None
    applied: bool = False
    steps: list[int] = Field(default_factory=list)
    reasoning: str = ""
    mistake_type: str | None = None
    error: str | None = None
    first_verdict: dict[str, Any] | None = None


class CascadeRecord(BaseModel):
    """A cascade's record behind a verdict (`optimizer.judge.cascade`): the rule, whether the item went on
    to the second judge (then its verdict is the final one), and the first judge's verdict."""

    rule: str = ""
    escalated: bool = False
    final: str = "first"
    first_status: str = "ok"
    first: dict[str, Any] | None = None
    # What each stage's call cost when made (US dollars; the second's 0 where the item stayed).
    first_cost_usd: float = 0.0
    second_cost_usd: float = 0.0


class ReplicateVerdict(BaseModel):
    """One judge call's verdict (one replicate of one item). ``success`` is None when invalid. A
    panel's replicate is the vote of ``members`` (empty for a single judge)."""

    replicate: int = Field(ge=0)
    success: bool | None
    status: AnswerStatus = "ok"
    reasoning: str = ""
    confidence: str | None = None
    mistake_type: str | None = None
    raw: str | None = None  # the model's text, kept only for parse failures
    cached: bool = False
    cost_usd: float = 0.0
    tools: list[JudgeToolCall] = Field(default_factory=list)  # the agentic judge's tool calls, in order
    members: list[MemberVerdict] = Field(default_factory=list)
    # A criteria verdict's checked criteria, any verdict's evidence steps, a review pass's record.
    criteria: list[CriterionCheck] = Field(default_factory=list)
    evidence_steps: list[int] = Field(default_factory=list)
    review: ReviewRecord | None = None
    cascade: CascadeRecord | None = None

    def detail_json(self) -> str | None:
        """The ``verdicts.detail`` column: criteria, evidence steps and review as JSON (None: none)."""
        detail: dict[str, Any] = {}
        if self.criteria:
            detail["criteria"] = [c.model_dump() for c in self.criteria]
        if self.evidence_steps:
            detail["evidence_steps"] = self.evidence_steps
        if self.review is not None:
            detail["review"] = self.review.model_dump()
        if self.cascade is not None:
            detail["cascade"] = self.cascade.model_dump()
        return json.dumps(detail, separators=(",", ":")) if detail else None


class ItemVerdict(BaseModel):
    """An item's majority answer in an experiment plus every replicate behind it."""

    trajectory_id: str
    success: bool | None
    status: AnswerStatus = "ok"
    mistake_type: str | None = None
    unstable: bool = False
    replicates: list[ReplicateVerdict] = Field(default_factory=list)


class LabelRow(BaseModel):
    """A label as stored for a run; quacks like ``models.Label`` for ``metrics`` (``is_positive``)."""

    trajectory_id: str
    positive: bool
    mistake_type: str | None = None

    @property
    def is_positive(self) -> bool:
        return self.positive

    @property
    def label(self) -> str:
        return "positive" if self.positive else "negative"


class Review(BaseModel):
    id: int
    created: datetime
    experiment_id: int | None = None
    trajectory_id: str
    kind: ReviewKind
    note: str = ""
    author: str = ""


class Event(BaseModel):
    """One row of the event feed; `typed` is its event (`optimizer.events.read_event`)."""

    id: int
    run_id: str | None = None
    experiment_id: int | None = None
    created: datetime
    kind: EventKind
    payload: dict[str, Any] = Field(default_factory=dict)

    def typed(self) -> LedgerEvent | None:
        """The row's typed event, or None when this version cannot read its payload."""
        return read_event(self.kind, self.payload)


class Confirmation(BaseModel):
    """One use of `judgeloop confirm`: the metrics it recorded and (schema 11, None before) the split's
    benchmark (its import format), fingerprint and item ids."""

    id: int
    run_id: str | None = None
    split: str
    created: datetime
    revision: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    benchmark: str | None = None
    fingerprint: str | None = None
    items: list[str] | None = None


@dataclass(frozen=True)
class MeasuredSplit:
    """What a `confirm` measured, recorded with its figures: the split's benchmark (its import format,
    `optimizer.devset.split.SplitMeta.benchmark`), fingerprint and item ids."""

    benchmark: str
    fingerprint: str
    items: tuple[str, ...]


class ItemShare(BaseModel):
    """One item in an attribution: correct / total judgements without the edit and at the end."""

    trajectory_id: str
    without_correct: int
    without_total: int
    final_correct: int
    final_total: int

    @property
    def difference(self) -> float:
        """Share of correct judgements at the end minus without the edit (in items, −1 … 1)."""
        return self.final_correct / self.final_total - self.without_correct / self.without_total

    def draws(self) -> str:
        """How it reads: "1/3 → 3/3" (without the edit → at the end)."""
        return f"{self.without_correct}/{self.without_total} → {self.final_correct}/{self.final_total}"


class EditContribution(BaseModel):
    """What a kept edit still contributes at the end of a run: the final prompts against the final
    prompts with the edit reverted (``experiment`` None: the whole chain, final against baseline).

    ``items``: Σ over items of (share of correct judgements at the end − without the edit), the
    disagreeing items re-judged; ``kappa_delta``/``fpr_delta``: final minus without (majority over
    all judgements; a helpful edit raises kappa and lowers FPR); ``fixed``/``broken``: items right
    only at the end / only without the edit; ``p_value``: one-sided sign-flip test that the edit
    helps; ``cost_usd``: what measuring it cost now (US dollars; cached calls are free);
    ``entangled_with``: kept edits whose lines it shares (its revert conflicts with theirs) and which
    were reverted together with it — ``reverted`` lists every experiment reverted for the measurement.
    ``items`` is None when it could not be measured (``note`` says why).
    """

    experiment: int | None
    commit: str
    items: float | None = None
    kappa_delta: float | None = None
    fpr_delta: float | None = None
    fixed: list[str] = Field(default_factory=list)
    broken: list[str] = Field(default_factory=list)
    p_value: float | None = None
    cost_usd: float = 0.0
    entangled_with: list[int] = Field(default_factory=list)
    reverted: list[int] = Field(default_factory=list)
    rejudged: int = 0
    calls: int = 0
    cache_hits: int = 0
    shares: list[ItemShare] = Field(default_factory=list)
    note: str | None = None

    def public(self) -> dict[str, Any]:
        """The keys `report --json` and `attribute --json` show for it."""
        return {
            "experiment": self.experiment,
            "commit": self.commit,
            "items": self.items,
            "kappa_delta": self.kappa_delta,
            "fpr_delta": self.fpr_delta,
            "fixed": self.fixed,
            "broken": self.broken,
            "p_value": self.p_value,
            "cost_usd": self.cost_usd,
            "entangled_with": self.entangled_with,
        }


class Attribution(BaseModel):
    """One `judgeloop attribute` of a run; ``edits`` newest kept edit first (measured ones only)."""

    id: int
    run_id: str
    key: str
    scope: Literal["history", "run"]
    final_commit: str
    baseline_commit: str
    split: str
    judge: str
    replicates: int
    rejudge: int
    alpha: float
    created: datetime
    updated: datetime
    status: Literal["running", "complete", "partial"]
    note: str | None = None
    cost_usd: float = 0.0
    final_vs_baseline: EditContribution | None = None
    edits: list[EditContribution] = Field(default_factory=list)

    def edit(self, experiment_id: int) -> EditContribution | None:
        return next((e for e in self.edits if e.experiment == experiment_id), None)


# ---------------------------------------------------------------------------------------------
# Conversions


def json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def json_value(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def tool_calls(value: str | None) -> list[JudgeToolCall]:
    """The ``verdicts.tools`` column: JSON objects, or (rows written before tool calls were data) the
    trace lines they display as, parsed here once."""
    if not value:
        return []
    return [
        JudgeToolCall.from_text(c) if isinstance(c, str) else JudgeToolCall.from_json(c)
        for c in json.loads(value)
    ]


def verdict_detail(verdict: Any) -> dict[str, Any]:
    """A parsed verdict's criteria, evidence steps and review (`optimizer.judge.criteria`) as
    `ReplicateVerdict` fields; {} for a verdict without them (or None)."""
    extra = getattr(verdict, "model_extra", None) or {}
    out: dict[str, Any] = {}
    if isinstance(extra.get("criteria"), list):
        out["criteria"] = [CriterionCheck.model_validate(c) for c in extra["criteria"]]
    if isinstance(extra.get("evidence_steps"), list):
        out["evidence_steps"] = list(extra["evidence_steps"])
    if isinstance(extra.get("review"), dict):
        out["review"] = ReviewRecord.model_validate(
            {**extra["review"], "first_verdict": extra.get("first_verdict")}
        )
    if isinstance(extra.get("cascade"), dict):
        out["cascade"] = CascadeRecord.model_validate(extra["cascade"])
    return out


def detail_dict(value: str | None) -> dict[str, Any]:
    """The ``verdicts.detail`` column as `ReplicateVerdict` fields (criteria, evidence_steps, review, cascade)."""
    if not value:
        return {}
    data = json.loads(value)
    return {
        "criteria": [CriterionCheck.model_validate(c) for c in data.get("criteria", [])],
        "evidence_steps": list(data.get("evidence_steps", [])),
        "review": None if data.get("review") is None else ReviewRecord.model_validate(data["review"]),
        "cascade": None if data.get("cascade") is None else CascadeRecord.model_validate(data["cascade"]),
    }


def opt_bool(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def opt_int(value: bool | None) -> int | None:
    return None if value is None else int(value)


def metrics_dict(metrics: Metrics | MetricsRow | None) -> dict[str, Any] | None:
    """Accept a ``metrics.Metrics`` (stored whole: protocol keys plus the confusion counts, so it
    can be rebuilt with ``Metrics.model_validate``), any pydantic model, or a mapping."""
    if metrics is None:
        return None
    if isinstance(metrics, BaseModel):
        return metrics.model_dump(mode="json")
    return dict(metrics)


def flips_dict(flips: FlipTable | FlipsRow | None) -> dict[str, list[str]] | None:
    """Accept a metrics.FlipTable (attributes) or a mapping with the four FLIP_KEYS."""
    if flips is None:
        return None
    if isinstance(flips, Mapping):
        return {k: sorted(flips.get(k, [])) for k in FLIP_KEYS}
    return {k: sorted(getattr(flips, k)) for k in FLIP_KEYS}


def intervals_dict(intervals: Mapping[str, Any] | None) -> dict[str, list[float]] | None:
    if intervals is None:
        return None
    return {k: [float(v[0]), float(v[1])] for k, v in intervals.items()}


RUN_COLUMNS = (
    "id, created, finished, status, strategy, policy, split, split_fingerprint, start_rev, branch, "
    "incumbent_experiment, budgets, config, pid, host, stop_reason"
)
EXPERIMENT_LIST_COLUMNS = (
    "id, run_id, seq, parent_id, strategy, created, finished, status, commit_sha, files_changed, "
    "insertions, deletions, rationale, metrics, intervals, flips, p_value, literal_keep, paired_keep, "
    "decision, reason, early_stopped, items_evaluated, calls, cache_hits, input_tokens, output_tokens, "
    "cost_usd, duration_s, prompt_hash"
)
# Added by schema 3; a read-only ledger of an older schema reads them as their defaults.
EXPERIMENT_V3_COLUMNS = (
    "optimizer_calls",
    "optimizer_input_tokens",
    "optimizer_output_tokens",
    "optimizer_cost_usd",
    "proposal_meta",
)
EXPERIMENT_V3_DEFAULTS = ("0", "0", "0", "0.0", "NULL")
EXPERIMENT_V4_COLUMNS = tuple(column for column, _ in V4_EXPERIMENT_COLUMNS)
EXPERIMENT_V4_DEFAULTS = ("NULL", "NULL", "NULL", "0", "0.0")
# Added by schema 6: the judge's prompt-cache reads and writes (tokens, the providers' convention).
EXPERIMENT_V6_COLUMNS = ("cache_read_tokens", "cache_write_tokens")
EXPERIMENT_V6_DEFAULTS = ("0", "0")
# Added by schema 8: the cache-read tokens the passes planned (`optimizer.evaluation.warmup.CacheReads`).
EXPERIMENT_V8_COLUMNS = ("planned_cache_read_tokens",)
EXPERIMENT_V8_DEFAULTS = ("0",)
# Added by schema 9: how a keep was earned, and the cost per verdict ([loop] cheaper_margin_items).
EXPERIMENT_V9_COLUMNS = ("keep_kind", "verdict_cost_usd")
EXPERIMENT_V9_DEFAULTS = ("NULL", "NULL")
# Added by schema 10: what the policy said, and who decided (`optimizer.vocab.DecidedBy`).
EXPERIMENT_V10_COLUMNS = ("policy_keep", "policy_reason", "decided_by")
EXPERIMENT_V10_DEFAULTS = ("NULL", "NULL", "NULL")
# Added by schema 12: the incumbent a rolled-back candidate was pooled on ([loop] stack).
EXPERIMENT_V11_COLUMNS = ("pooled_on",)
EXPERIMENT_V11_DEFAULTS = ("NULL",)
# Added by schema 13: the policy's reason as data (`optimizer.stats.rules.Reason`, JSON).
EXPERIMENT_V13_COLUMNS = ("policy_why",)
EXPERIMENT_V13_DEFAULTS = ("NULL",)


def run_from_row(r: sqlite3.Row) -> Run:
    d = dict(r)
    d["budgets"] = json_value(d["budgets"]) or {}
    d["config"] = json_value(d["config"]) or {}
    return Run.model_validate(d)


def experiment_from_row(r: sqlite3.Row) -> Experiment:
    d = dict(r)
    for key in ("files_changed", "metrics", "intervals", "flips", "proposal_meta", "test", "policy_why"):
        d[key] = json_value(d[key])
    d["files_changed"] = d["files_changed"] or []
    d["proposal_meta"] = d["proposal_meta"] or {}
    for key in ("literal_keep", "paired_keep", "adaptive_keep", "policy_keep"):
        d[key] = opt_bool(d[key])
    d["early_stopped"] = bool(d["early_stopped"])
    return Experiment.model_validate(d)


# The tag the library strategy appended to its rationale before schema 3 recorded its enabled set as
# data: "[library: +a -b -> enabled {a,c}]". Read once, when a schema-2 ledger is upgraded.
