"""The ledger: SQLite in ``experiments/ledger.sqlite``, the single source of truth for runs.

One writer (the loop), many readers (the TUI, ``report``): the database is in WAL mode so readers
never block the writer, and every connection waits (``busy_timeout``) instead of failing when the
writer holds the lock. Every state change is one transaction (``Ledger.transaction``), so a crash
or ``kill -9`` leaves either the whole change or none of it.

Tables
------
- ``runs``: one row per ``judgeloop run`` (budgets and the config snapshot as JSON; never keys).
- ``experiments``: one row per candidate; ``id`` is global and user-facing, ``seq`` 0 is the
  baseline. ``diff_text`` is the only bulky column and listing queries leave it out. ``calls``,
  ``input_tokens``, ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens`` are the judge's
  (input excludes cache reads and writes); ``optimizer_*`` what the optimiser spent
  proposing the candidate; ``cost_usd`` is the experiment's total, judge + optimiser (what budgets
  and spend sums use). ``proposal_meta``: what the strategy recorded about its proposal as data
  (JSON object, e.g. ``{"library_enabled": [...]}``; NULL for none).
- ``items``: the per-item majority answer of an experiment (what metrics score).
- ``verdicts``: every replicate's verdict (``raw`` only for parse failures; ``tools``: the agentic
  judge's tool calls as a JSON list of `JudgeToolCall` objects, NULL for a direct judge; rows written
  before tool calls were data hold their display strings instead, parsed once when read).
- ``run_labels``: the split's labels as the run scored them (for the TUI and report; labels are
  never judge input, and they live in their own table).
- ``reviews``: human reviews (judge_wrong / label_suspect / rubric_ambiguous).
- ``events``: an append-only feed the TUI follows with ``events_since(last_id)``.
- ``confirmations``: each use of ``judgeloop confirm`` on a held-out split.

The connection and its plumbing are in `optimizer.ledger.core`; each family of tables has its module
(``runs``: runs and experiments; ``verdicts``: items, verdicts, labels; ``journal``: reviews, events,
confirmations, batches; ``attributions``); ``rows`` holds the row types; `Ledger` joins them.

``PRAGMA user_version`` holds the schema version; a newer one is refused in one line. An older one
is upgraded in place when opened for writing (version 1 → 2 adds ``verdicts.tools``; 2 → 3 adds the
``experiments.optimizer_*`` columns, 0 on old rows, and ``experiments.proposal_meta``; 3 → 4 adds
the adaptive policy's ``adaptive_keep``, ``alpha``, ``test`` (JSON), ``rejudge_calls`` and
``rejudge_cost_usd``, empty on old rows; 4 → 5 the ``batches`` table; 5 → 6
``experiments.cache_read_tokens`` and ``cache_write_tokens``, 0 on old rows) and read as it is
when opened read-only (missing columns read as 0 / empty; no attribution before schema 7); 6 → 7
adds the ``attributions`` and ``attribution_edits`` tables; 7 → 8 ``experiments.planned_cache_read_tokens``
(the cache reads the passes planned, `optimizer.evaluation.warmup`; 0 on old rows); 8 → 9
``runs.labels_fingerprint`` (the label set a run decides with, `optimizer.devset.corrections`; NULL on old rows);
``verdicts.members`` (a panel's member verdicts, JSON) and ``verdicts.detail`` (criteria, evidence steps and
review of a structured verdict as JSON; both NULL on old rows and for a single judge);
``experiments.keep_kind`` and ``verdict_cost_usd`` (cheaper-not-worse keeps; empty on old rows); the
``endpoint_passes`` table (none on old runs); 9 → 10 ``experiments.policy_keep``, ``policy_reason`` and
``decided_by`` (what the policy said and who decided: the policy, a person or an MCP client; a person's
decision against the policy is `Experiment.overrule`; NULL on old rows); 10 → 11
``confirmations.benchmark``, ``fingerprint`` and ``items`` (what a `confirm` measured: the split's import
format, fingerprint and item ids; NULL on old rows, which are rationed by split name); 11 → 12
``experiments.pooled_on`` (the incumbent a rolled-back candidate was pooled on, `optimizer.loop.stack`;
NULL on old rows); 12 → 13
``experiments.policy_why`` (the policy's reason as data, `optimizer.stats.rules.Reason`; NULL on old rows,
whose ``policy_reason`` text is read instead).

- ``endpoint_passes``: with ``[judge] base_urls``, one row per evaluation pass and endpoint: calls,
  prompt and cached tokens, failed calls, drained (`optimizer.judge.endpoints`).
- ``attributions``: each `judgeloop attribute` of a run (what a kept edit still contributes at the end,
  see `optimizer.loop.attribute`): its scope, the final and baseline commits, the judge, the split,
  status, spend and the final-vs-baseline comparison (JSON); ``attribution_edits``: one row per
  measured kept edit (`EditContribution` as JSON), written as each is measured (resumable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizer.judge.types import JudgeToolCall
from optimizer.ledger.attributions import AttributionTables
from optimizer.ledger.journal import JournalTables
from optimizer.ledger.rows import (
    Attribution,
    AttributionSpec,
    BatchRow,
    Confirmation,
    CriterionCheck,
    EditContribution,
    Event,
    Experiment,
    ExperimentOutcome,
    ItemShare,
    ItemVerdict,
    LabelRow,
    MeasuredSplit,
    MemberVerdict,
    ProposedEdit,
    ReplicateVerdict,
    Review,
    ReviewRecord,
    Run,
    RunSpec,
    new_run_id,
    utc_now,
    verdict_detail,
)
from optimizer.ledger.runs import RunTables
from optimizer.ledger.schema import (
    FLIP_KEYS,
    SCHEMA_VERSION,
    create_schema,
    upgrade_schema,
)
from optimizer.ledger.verdicts import VerdictTables
from optimizer.vocab import (
    EXPERIMENT_STATUSES,
    RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    AnswerStatus,
    EventKind,
    ExperimentStatus,
    ReviewKind,
    RunStatus,
)

if TYPE_CHECKING:
    from optimizer.stats.metrics import Metrics


__all__ = [
    "EXPERIMENT_STATUSES",
    "FLIP_KEYS",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "TERMINAL_RUN_STATUSES",
    "AnswerStatus",
    "Attribution",
    "AttributionSpec",
    "BatchRow",
    "Confirmation",
    "CriterionCheck",
    "EditContribution",
    "Event",
    "EventKind",
    "Experiment",
    "ExperimentOutcome",
    "ExperimentStatus",
    "ItemShare",
    "ItemVerdict",
    "JudgeToolCall",
    "LabelRow",
    "Ledger",
    "MeasuredSplit",
    "MemberVerdict",
    "Metrics",
    "ProposedEdit",
    "ReplicateVerdict",
    "Review",
    "ReviewKind",
    "ReviewRecord",
    "Run",
    "RunSpec",
    "RunStatus",
    "create_schema",
    "new_run_id",
    "upgrade_schema",
    "utc_now",
    "verdict_detail",
]

# ---------------------------------------------------------------------------------------------
# The ledger


class Ledger(RunTables, VerdictTables, JournalTables, AttributionTables):
    """A connection to the ledger. Thread-safe (one lock around the connection); close when done.

    ``Ledger(path)`` opens for writing, creating the file and schema if needed.
    ``Ledger.open_readonly(path)`` is for readers (TUI, report) and never creates anything.
    """
