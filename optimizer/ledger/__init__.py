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
decision against the policy is `Experiment.overrule`; NULL on old rows).

- ``endpoint_passes``: with ``[judge] base_urls``, one row per evaluation pass and endpoint: calls,
  prompt and cached tokens, failed calls, drained (`optimizer.judge.endpoints`).
- ``attributions``: each `judgeloop attribute` of a run (what a kept edit still contributes at the end,
  see `optimizer.loop.attribute`): its scope, the final and baseline commits, the judge, the split,
  status, spend and the final-vs-baseline comparison (JSON); ``attribution_edits``: one row per
  measured kept edit (`EditContribution` as JSON), written as each is measured (resumable).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer import storage
from optimizer.errors import UserError
from optimizer.judge.types import JudgeToolCall
from optimizer.ledger.rows import (
    _EXPERIMENT_LIST_COLUMNS,
    _EXPERIMENT_V3_COLUMNS,
    _EXPERIMENT_V3_DEFAULTS,
    _EXPERIMENT_V4_COLUMNS,
    _EXPERIMENT_V4_DEFAULTS,
    _EXPERIMENT_V6_COLUMNS,
    _EXPERIMENT_V6_DEFAULTS,
    _EXPERIMENT_V8_COLUMNS,
    _EXPERIMENT_V8_DEFAULTS,
    _EXPERIMENT_V9_COLUMNS,
    _EXPERIMENT_V9_DEFAULTS,
    _EXPERIMENT_V10_COLUMNS,
    _EXPERIMENT_V10_DEFAULTS,
    _RUN_COLUMNS,
    Attribution,
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
    MemberVerdict,
    ReplicateVerdict,
    Review,
    ReviewRecord,
    Run,
    _detail,
    _dumps,
    _experiment_from_row,
    _flips_dict,
    _intervals_dict,
    _loads,
    _metrics_dict,
    _opt_bool,
    _opt_int,
    _run_from_row,
    _tool_calls,
    _ts,
    new_run_id,
    utc_now,
    verdict_detail,
)
from optimizer.ledger.schema import (
    _TERMINAL_RUN_STATUSES,
    FLIP_KEYS,
    SCHEMA_VERSION,
    create_schema,
    upgrade_schema,
)
from optimizer.vocab import (
    EVENT_KINDS,
    EXPERIMENT_STATUSES,
    INCUMBENT_STATUSES,
    REVIEW_KINDS,
    RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    AnswerStatus,
    DecidedBy,
    EventKind,
    ExperimentStatus,
    ReviewKind,
    RunStatus,
)

if TYPE_CHECKING:
    from optimizer.judge.providers.pricing import Usage
    from optimizer.models import Label
    from optimizer.stats.metrics import Answer, Metrics


__all__ = [
    "EXPERIMENT_STATUSES",
    "FLIP_KEYS",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "TERMINAL_RUN_STATUSES",
    "AnswerStatus",
    "Attribution",
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
    "MemberVerdict",
    "Metrics",
    "ReplicateVerdict",
    "Review",
    "ReviewKind",
    "ReviewRecord",
    "Run",
    "RunStatus",
    "create_schema",
    "new_run_id",
    "upgrade_schema",
    "utc_now",
    "verdict_detail",
]

# ---------------------------------------------------------------------------------------------
# The ledger


class Ledger:
    """A connection to the ledger. Thread-safe (one lock around the connection); close when done.

    ``Ledger(path)`` opens for writing, creating the file and schema if needed.
    ``Ledger.open_readonly(path)`` is for readers (TUI, report) and never creates anything.
    """

    def __init__(self, path: Path | str, *, readonly: bool = False, busy_timeout_ms: int = 10_000) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        try:
            if readonly:
                if not self.path.is_file():
                    raise UserError(f"no ledger yet at {self.path}; run `judgeloop run` first")
                uri = f"file:{self.path.resolve().as_posix()}?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except OSError as exc:
            raise storage.os_fault(exc, self.path.parent) or exc from None
        except sqlite3.Error as exc:
            raise self._fault(exc) or exc from None
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._prepare()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            fault = self._fault(exc)
            if fault is not None:
                raise fault from None
            raise UserError(f"{self.path} is not a readable judgeloop ledger ({exc}); move it aside and retry") from None
        except BaseException:
            self._conn.close()
            raise

    def _fault(self, exc: sqlite3.Error) -> UserError | None:
        """The one-line error for a corrupt ledger, a full disk or a read-only folder (else None)."""
        return storage.sqlite_fault(
            exc, self.path, "the ledger",
            "it is not a readable judgeloop ledger: restore it from a backup (or recover what SQLite still reads "
            "with `sqlite3 FILE .recover`), or move it aside to start a new ledger (the runs' commits stay in "
            "git); judgeloop never deletes it",
        )

    @classmethod
    def open_readonly(cls, path: Path | str) -> Ledger:
        """Open an existing ledger for reading; a missing one is a one-line UserError."""
        return cls(path, readonly=True)

    def _prepare(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UserError(
                f"{self.path} was written by a newer judgeloop (schema {version} > {SCHEMA_VERSION}); "
                "upgrade judgeloop"
            )
        self.version = version
        if self.readonly:
            if version == 0:
                raise UserError(f"no ledger yet at {self.path} (the file is empty); run `judgeloop run` first")
            return
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        if version == 0:
            with self.transaction() as cur:
                # Re-check under the write lock: another process may have created it meanwhile.
                if cur.execute("PRAGMA user_version").fetchone()[0] == 0:
                    create_schema(cur)
        elif version < SCHEMA_VERSION:
            with self.transaction() as cur:
                # Re-read under the write lock (another writer may have upgraded it), then step up.
                upgrade_schema(cur)
        self.version = SCHEMA_VERSION

    # -- plumbing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction (BEGIN IMMEDIATE … COMMIT); any exception rolls all of it back."""
        if self.readonly:
            raise RuntimeError("this ledger was opened read-only")
        with self._lock:
            try:
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
                try:
                    yield cur
                except BaseException:
                    if self._conn.in_transaction:  # SQLite may have rolled back itself (a full disk)
                        cur.execute("ROLLBACK")
                    raise
                else:
                    try:
                        cur.execute("COMMIT")
                    except sqlite3.Error:
                        if self._conn.in_transaction:  # a failed COMMIT leaves it open: end it
                            cur.execute("ROLLBACK")
                        raise
                finally:
                    cur.close()
            except sqlite3.Error as exc:
                raise self._fault(exc) or exc from None

    def _run_columns(self) -> str:
        # Schema 9: the fingerprint of the label set a run decides with (NULL before it).
        return _RUN_COLUMNS + (", labels_fingerprint" if self.version >= 9 else ", NULL AS labels_fingerprint")

    def _experiment_columns(self) -> str:
        parts = [_EXPERIMENT_LIST_COLUMNS]
        for since, columns, defaults in ((3, _EXPERIMENT_V3_COLUMNS, _EXPERIMENT_V3_DEFAULTS),
                                         (4, _EXPERIMENT_V4_COLUMNS, _EXPERIMENT_V4_DEFAULTS),
                                         (6, _EXPERIMENT_V6_COLUMNS, _EXPERIMENT_V6_DEFAULTS),
                                         (8, _EXPERIMENT_V8_COLUMNS, _EXPERIMENT_V8_DEFAULTS),
                                         (9, _EXPERIMENT_V9_COLUMNS, _EXPERIMENT_V9_DEFAULTS),
                                         (10, _EXPERIMENT_V10_COLUMNS, _EXPERIMENT_V10_DEFAULTS)):
            if self.version >= since:
                parts.extend(columns)
            else:
                parts.extend(f"{default} AS {column}" for column, default in zip(columns, defaults, strict=True))
        return ", ".join(parts)

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise self._fault(exc) or exc from None

    # -- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        *,
        strategy: str,
        policy: str,
        split: str,
        split_fingerprint: str,
        start_rev: str,
        run_id: str | None = None,
        branch: str | None = None,
        budgets: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        status: RunStatus = "running",
        pid: int | None = None,
        host: str | None = None,
        labels_fingerprint: str | None = None,
    ) -> Run:
        """Insert a run (default id from ``new_run_id``, branch ``judgeloop/<id>``, this pid and host);
        ``labels_fingerprint``: of the label set it decides with (`optimizer.devset.corrections.LabelSet`)."""
        run_id = run_id or new_run_id()
        with self.transaction() as cur:
            cur.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL)",
                (
                    run_id, _ts(utc_now()), status, strategy, policy, split, split_fingerprint, start_rev,
                    branch or f"judgeloop/{run_id}", _dumps(dict(budgets or {})), _dumps(dict(config or {})),
                    os.getpid() if pid is None else pid, host or socket.gethostname(),
                ),
            )
            if labels_fingerprint is not None:
                cur.execute("UPDATE runs SET labels_fingerprint = ? WHERE id = ?", (labels_fingerprint, run_id))
            self._event(cur, run_id, None, "run_status", {"status": status})
        return self.get_run(run_id)

    def set_run_status(
        self, run_id: str, status: RunStatus, *, stop_reason: str | None = None, pid: int | None = None
    ) -> None:
        """Change a run's status (sets ``finished`` for finished/stopped/crashed) and log an event."""
        finished = _ts(utc_now()) if status in _TERMINAL_RUN_STATUSES else None
        with self.transaction() as cur:
            cur.execute(
                "UPDATE runs SET status = ?, finished = ?, stop_reason = COALESCE(?, stop_reason), "
                "pid = COALESCE(?, pid) WHERE id = ?",
                (status, finished, stop_reason, pid, run_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no run {run_id}")
            self._event(cur, run_id, None, "run_status", {"status": status, "stop_reason": stop_reason})

    def set_incumbent(self, run_id: str, experiment_id: int) -> None:
        """Point the run at a new incumbent (normally done by ``record_decision``)."""
        with self.transaction() as cur:
            cur.execute("UPDATE runs SET incumbent_experiment = ? WHERE id = ?", (experiment_id, run_id))

    def runs(self) -> list[Run]:
        """Every run, newest first."""
        return [_run_from_row(r) for r in self._query(f"SELECT {self._run_columns()} FROM runs ORDER BY created DESC, rowid DESC")]

    def latest_run(self) -> Run | None:
        """The newest run, or None on an empty ledger."""
        rows = self._query(f"SELECT {self._run_columns()} FROM runs ORDER BY created DESC, rowid DESC LIMIT 1")
        return _run_from_row(rows[0]) if rows else None

    def get_run(self, run_id: str) -> Run:
        """One run; an unknown id is a UserError listing the newest few."""
        rows = self._query(f"SELECT {self._run_columns()} FROM runs WHERE id = ?", (run_id,))
        if not rows:
            known = ", ".join(r.id for r in self.runs()[:5]) or "none"
            raise UserError(f"no run {run_id!r} in the ledger (newest: {known}); pass one of those to --run")
        return _run_from_row(rows[0])

    def resolve_run(self, run_id: str | None) -> Run:
        """``run_id`` if given, else the latest run; an empty ledger is a UserError."""
        if run_id:
            return self.get_run(run_id)
        run = self.latest_run()
        if run is None:
            raise UserError(f"the ledger {self.path} has no runs yet; run `judgeloop run` first")
        return run

    # -- experiments ------------------------------------------------------------------------------

    def start_experiment(
        self,
        run_id: str,
        *,
        parent_id: int | None,
        strategy: str | None = None,
        seq: int | None = None,
        status: ExperimentStatus = "running",
        commit_sha: str | None = None,
        files_changed: Iterable[str] = (),
        insertions: int | None = None,
        deletions: int | None = None,
        diff_text: str | None = None,
        rationale: str | None = None,
        prompt_hash: str | None = None,
        optimizer_calls: int = 0,
        optimizer_input_tokens: int = 0,
        optimizer_output_tokens: int = 0,
        optimizer_cost_usd: float = 0.0,
        proposal_meta: Mapping[str, Any] | None = None,
    ) -> Experiment:
        """Insert an experiment; ``seq`` defaults to the run's next (0 for the first, the baseline).

        The ``optimizer_*`` figures (what proposing it cost; known before the row exists) and
        ``proposal_meta`` are written here only; the later updates leave them as they are.
        """
        with self.transaction() as cur:
            if seq is None:
                seq = cur.execute(
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM experiments WHERE run_id = ?", (run_id,)
                ).fetchone()[0]
            cur.execute(
                "INSERT INTO experiments (run_id, seq, parent_id, strategy, created, status, commit_sha, "
                "files_changed, insertions, deletions, diff_text, rationale, prompt_hash, optimizer_calls, "
                "optimizer_input_tokens, optimizer_output_tokens, optimizer_cost_usd, proposal_meta) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id, seq, parent_id, strategy, _ts(utc_now()), status, commit_sha,
                    _dumps(list(files_changed)), insertions, deletions, diff_text, rationale, prompt_hash,
                    optimizer_calls, optimizer_input_tokens, optimizer_output_tokens, optimizer_cost_usd,
                    _dumps(dict(proposal_meta)) if proposal_meta else None,
                ),
            )
            experiment_id = int(cur.lastrowid or 0)
            self._event(cur, run_id, experiment_id, "stage", {"stage": "experiment_started", "seq": seq})
        return self.get_experiment(experiment_id)

    def mark_evaluating(self, experiment_id: int, commit_sha: str, *, cost_usd: float) -> Experiment:
        """The candidate is committed (``commit_sha``) and its evaluation starts: status ``running``,
        decision ``pending``, reason "evaluating"; ``cost_usd``: what the row has cost so far (the
        optimiser's proposal). Not a decision: no event (the loop's "evaluating" stage follows)."""
        with self.transaction() as cur:
            cur.execute(
                "UPDATE experiments SET status = 'running', decision = 'pending', reason = 'evaluating', "
                "finished = NULL, commit_sha = ?, cost_usd = ? WHERE id = ?",
                (commit_sha, cost_usd, experiment_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no experiment {experiment_id}")
        return self.get_experiment(experiment_id)

    def add_cost(self, experiment_id: int, usage: Usage) -> Experiment:
        """Add ``usage`` (calls, tokens and dollars) to the experiment's judge figures and total cost,
        leaving everything else as it is (e.g. what an interrupted evaluation paid before a crash).
        Not a decision: no event."""
        with self.transaction() as cur:
            cur.execute(
                "UPDATE experiments SET calls = calls + ?, input_tokens = input_tokens + ?, "
                "output_tokens = output_tokens + ?, cache_read_tokens = cache_read_tokens + ?, "
                "cache_write_tokens = cache_write_tokens + ?, cost_usd = cost_usd + ? WHERE id = ?",
                (usage.calls, usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
                 usage.cache_write_tokens, usage.cost_usd, experiment_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no experiment {experiment_id}")
        return self.get_experiment(experiment_id)

    def add_endpoint_pass(self, experiment_id: int, figures: Mapping[str, Mapping[str, int]]) -> None:
        """Record one pass's figures per endpoint (`EvalRun.endpoints`) as the experiment's next pass.
        Not a decision: no event."""
        if not figures:
            return
        with self.transaction() as cur:
            row = cur.execute("SELECT COALESCE(MAX(pass), -1) + 1 FROM endpoint_passes WHERE experiment_id = ?",
                              (experiment_id,)).fetchone()
            cur.executemany(
                "INSERT INTO endpoint_passes (experiment_id, pass, endpoint, calls, prompt_tokens, cached_tokens,"
                " failures, drained) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(experiment_id, row[0], name, int(f.get("calls", 0)), int(f.get("prompt_tokens", 0)),
                  int(f.get("cached_tokens", 0)), int(f.get("failures", 0)), int(f.get("drained", 0)))
                 for name, f in figures.items()])

    def endpoint_figures(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per endpoint, over the run's passes: calls, prompt and cached tokens, failed calls, and
        ``drained``: the passes it was drained in; ``passes``: the passes it was counted in. Empty
        without base_urls (or on a ledger from before schema 9)."""
        try:
            rows = self._conn.execute(
                "SELECT p.endpoint, COUNT(*), SUM(p.calls), SUM(p.prompt_tokens), SUM(p.cached_tokens),"
                " SUM(p.failures), SUM(p.drained) FROM endpoint_passes p JOIN experiments e ON e.id = p.experiment_id"
                " WHERE e.run_id = ? GROUP BY p.endpoint ORDER BY MIN(p.id)", (run_id,)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            return {}  # a ledger from before schema 9, opened read-only
        return {r[0]: {"passes": r[1], "calls": r[2], "prompt_tokens": r[3], "cached_tokens": r[4],
                       "failures": r[5], "drained": r[6]} for r in rows}

    def add_planned_cache_reads(self, experiment_id: int, tokens: int) -> None:
        """Add a pass's planned cache-read tokens to the experiment (billed ones: ``cache_read_tokens``).
        Not a decision: no event."""
        if tokens:
            with self.transaction() as cur:
                cur.execute("UPDATE experiments SET planned_cache_read_tokens = planned_cache_read_tokens + ? "
                            "WHERE id = ?", (tokens, experiment_id))

    def record_decision(self, experiment_id: int, outcome: ExperimentOutcome) -> Experiment:
        """Record what an experiment ended as (`ExperimentOutcome`) in one transaction, with one
        ``decision`` event (the TUI's "decided: …").

        Every outcome column is written from ``outcome`` (an unset field stores its default);
        ``commit_sha``/``prompt_hash`` replace the stored values only when given (a kept commit's
        sha changes when its message is finalised). A ``baseline`` or ``kept`` status also makes this
        experiment the run's incumbent, in the same transaction; ``waiting`` leaves the finish time
        empty (a human decides later, `set_experiment_decision`).
        """
        o = outcome
        with self.transaction() as cur:
            row = cur.execute("SELECT run_id FROM experiments WHERE id = ?", (experiment_id,)).fetchone()
            if row is None:
                raise KeyError(f"no experiment {experiment_id}")
            run_id = row[0]
            cur.execute(
                "UPDATE experiments SET status = ?, finished = ?, decision = ?, reason = ?, metrics = ?, "
                "intervals = ?, flips = ?, p_value = ?, literal_keep = ?, paired_keep = ?, early_stopped = ?, "
                "items_evaluated = ?, calls = ?, cache_hits = ?, input_tokens = ?, output_tokens = ?, "
                "cost_usd = ?, duration_s = ?, commit_sha = COALESCE(?, commit_sha), "
                "prompt_hash = COALESCE(?, prompt_hash), "
                "adaptive_keep = ?, alpha = ?, test = ?, rejudge_calls = ?, rejudge_cost_usd = ?, "
                "cache_read_tokens = ?, cache_write_tokens = ?, keep_kind = ?, verdict_cost_usd = ?, "
                "policy_keep = ?, policy_reason = ?, decided_by = ? WHERE id = ?",
                (
                    o.status, None if o.status == "waiting" else _ts(utc_now()), o.status, o.reason,
                    _dumps(_metrics_dict(o.metrics)), _dumps(_intervals_dict(o.intervals)), _dumps(_flips_dict(o.flips)),
                    o.p_value, _opt_int(o.literal_keep), _opt_int(o.paired_keep),
                    int(o.early_stopped), o.items_evaluated, o.usage.calls, o.cache_hits, o.usage.input_tokens,
                    o.usage.output_tokens, o.cost_usd, o.duration_s, o.commit_sha, o.prompt_hash,
                    _opt_int(o.adaptive_keep), o.alpha, _dumps(o.test), o.rejudge.calls, o.rejudge.cost_usd,
                    o.usage.cache_read_tokens, o.usage.cache_write_tokens, o.keep_kind, o.verdict_cost_usd,
                    _opt_int(o.policy_keep), o.policy_reason, o.decided_by, experiment_id,
                ),
            )
            if o.status in INCUMBENT_STATUSES:
                cur.execute("UPDATE runs SET incumbent_experiment = ? WHERE id = ?", (experiment_id, run_id))
            self._event(cur, run_id, experiment_id, "decision",
                        {"status": o.status, "decision": o.status, "reason": o.reason})
        return self.get_experiment(experiment_id)

    def reject(self, experiment_id: int, reason: str, *, cost_usd: float = 0.0) -> Experiment:
        """The guards rejected the candidate before any judge call (``guard_rejected``); ``cost_usd``:
        the optimiser's spend on it (the row's total)."""
        return self.record_decision(
            experiment_id, ExperimentOutcome(status="guard_rejected", reason=reason, extra_cost_usd=cost_usd))

    def record_error(
        self, experiment_id: int, reason: str, *, cost_usd: float = 0.0, commit_sha: str | None = None
    ) -> Experiment:
        """The experiment ended in an error before it was evaluated (the optimiser failed, its commit
        cannot be judged with, it was interrupted before its evaluation): status ``error``; ``cost_usd``
        the row's total, ``commit_sha`` where its commit is kept (when given). An evaluation that ended
        undecided is recorded with `record_decision` and its usage."""
        return self.record_decision(
            experiment_id,
            ExperimentOutcome(status="error", reason=reason, extra_cost_usd=cost_usd, commit_sha=commit_sha),
        )

    def set_experiment_decision(
        self,
        experiment_id: int,
        *,
        status: ExperimentStatus,
        reason: str | None = None,
        commit_sha: str | None = None,
        decided_by: DecidedBy | None = None,
    ) -> Experiment:
        """Change only the decision of an experiment (e.g. a ``waiting`` one decided by a person);
        ``decided_by``: who decided (kept as stored when None).

        Keeps its metrics and counters; ``kept`` makes it the run's incumbent in the same transaction.
        """
        with self.transaction() as cur:
            row = cur.execute("SELECT run_id FROM experiments WHERE id = ?", (experiment_id,)).fetchone()
            if row is None:
                raise KeyError(f"no experiment {experiment_id}")
            cur.execute(
                "UPDATE experiments SET status = ?, decision = ?, reason = COALESCE(?, reason), finished = ?, "
                "commit_sha = COALESCE(?, commit_sha), decided_by = COALESCE(?, decided_by) WHERE id = ?",
                (status, status, reason, _ts(utc_now()), commit_sha, decided_by, experiment_id),
            )
            if status in INCUMBENT_STATUSES:
                cur.execute("UPDATE runs SET incumbent_experiment = ? WHERE id = ?", (experiment_id, row[0]))
            self._event(cur, row[0], experiment_id, "decision", {"status": status, "decision": status, "reason": reason})
        return self.get_experiment(experiment_id)

    def experiments(self, run_id: str) -> list[Experiment]:
        """A run's experiments in ``seq`` order, without ``diff_text`` (the fast listing)."""
        rows = self._query(
            f"SELECT {self._experiment_columns()}, NULL AS diff_text FROM experiments WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        return [_experiment_from_row(r) for r in rows]

    def get_experiment(self, experiment_id: int) -> Experiment:
        """One experiment with its diff text; an unknown id is a UserError."""
        rows = self._query(
            f"SELECT {self._experiment_columns()}, diff_text FROM experiments WHERE id = ?", (int(experiment_id),)
        )
        if not rows:
            raise UserError(f"no experiment {experiment_id} in the ledger; see `judgeloop history` for ids")
        return _experiment_from_row(rows[0])

    def experiments_with_status(self, status: ExperimentStatus, run_id: str | None = None) -> list[Experiment]:
        """Experiments in one status (e.g. ``waiting`` or ``running``), oldest first."""
        sql = f"SELECT {self._experiment_columns()}, NULL AS diff_text FROM experiments WHERE status = ?"
        params: list[Any] = [status]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        return [_experiment_from_row(r) for r in self._query(sql + " ORDER BY id", params)]

    def kept_chain(self, run_id: str) -> list[Experiment]:
        """Baseline → … → incumbent, following parent links back from the run's incumbent."""
        run = self.get_run(run_id)
        by_id = {e.id: e for e in self.experiments(run_id)}
        chain: list[Experiment] = []
        current = run.incumbent_experiment
        while current is not None and current in by_id:
            exp = by_id[current]
            chain.append(exp)
            current = exp.parent_id
        return list(reversed(chain))

    # -- verdicts ---------------------------------------------------------------------------------

    def record_verdicts(self, experiment_id: int, items: Iterable[ItemVerdict]) -> int:
        """Store items (majority answers) and every replicate in one transaction; replaces rows with the
        same keys, so recording an item twice (e.g. after a resume) is harmless. Returns the item count.
        """
        item_rows: list[tuple[Any, ...]] = []
        verdict_rows: list[tuple[Any, ...]] = []
        for item in items:
            item_rows.append((
                experiment_id, item.trajectory_id, None if item.success is None else int(item.success),
                item.status, item.mistake_type, int(item.unstable),
            ))
            for rep in item.replicates:
                verdict_rows.append((
                    experiment_id, item.trajectory_id, rep.replicate,
                    None if rep.success is None else int(rep.success), rep.status, rep.reasoning,
                    rep.confidence, rep.mistake_type, rep.raw, int(rep.cached), rep.cost_usd,
                    json.dumps([c.to_json() for c in rep.tools]) if rep.tools else None,
                    json.dumps([m.model_dump(mode="json") for m in rep.members]) if rep.members else None,
                    rep.detail_json(),
                ))
        with self.transaction() as cur:
            cur.executemany("INSERT OR REPLACE INTO items VALUES (?, ?, ?, ?, ?, ?)", item_rows)
            cur.executemany(
                "INSERT OR REPLACE INTO verdicts (experiment_id, trajectory_id, replicate, success, status, reasoning,"
                " confidence, mistake_type, raw, cached, cost_usd, tools, members, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                verdict_rows,
            )
        return len(item_rows)

    def item_verdicts(self, experiment_id: int, trajectory_id: str | None = None) -> list[ItemVerdict]:
        """An experiment's items (in trajectory id order) with their replicates; optionally one item."""
        where = "experiment_id = ?" + (" AND trajectory_id = ?" if trajectory_id else "")
        params: tuple[Any, ...] = (experiment_id, trajectory_id) if trajectory_id else (experiment_id,)
        reps: dict[str, list[ReplicateVerdict]] = {}
        for r in self._query(
            "SELECT trajectory_id, replicate, success, status, reasoning, confidence, mistake_type, raw, cached, "
            f"cost_usd, {'tools' if self.version >= 2 else 'NULL'}, {'members' if self.version >= 9 else 'NULL'}, {'detail' if self.version >= 9 else 'NULL'} "
            f"FROM verdicts WHERE {where} "
            "ORDER BY trajectory_id, replicate",
            params,
        ):
            # model_construct: rows were validated on the way in; this keeps a 162×3 load fast.
            reps.setdefault(r[0], []).append(ReplicateVerdict.model_construct(
                replicate=r[1], success=_opt_bool(r[2]), status=r[3], reasoning=r[4] or "", confidence=r[5],
                mistake_type=r[6], raw=r[7], cached=bool(r[8]), cost_usd=r[9],
                tools=_tool_calls(r[10]),
                members=[MemberVerdict.model_validate(m) for m in json.loads(r[11])] if r[11] else [],
                **_detail(r[12]),
            ))
        return [
            ItemVerdict.model_construct(
                trajectory_id=r[0], success=_opt_bool(r[1]), status=r[2], mistake_type=r[3], unstable=bool(r[4]),
                replicates=reps.get(r[0], []),
            )
            for r in self._query(
                f"SELECT trajectory_id, success, status, mistake_type, unstable FROM items WHERE {where} "
                "ORDER BY trajectory_id",
                params,
            )
        ]

    def item_judgements(self, experiment_id: int) -> dict[str, list[Answer]]:
        """An experiment's replicate verdicts as ``metrics.Answer`` per item, in replicate order."""
        from optimizer.stats.metrics import Answer

        out: dict[str, list[Answer]] = {}
        for r in self._query(
            "SELECT trajectory_id, success, status, mistake_type FROM verdicts WHERE experiment_id = ? "
            "ORDER BY trajectory_id, replicate",
            (experiment_id,),
        ):
            out.setdefault(r[0], []).append(Answer(success=_opt_bool(r[1]), mistake_type=r[3], status=r[2]))
        return out

    def experiments_judging(self, trajectory_id: str) -> list[int]:
        """Every experiment, of every run, with a verdict on ``trajectory_id``, by id (the TUI's ``]``/``[``)."""
        return [int(r[0]) for r in self._query(
            "SELECT DISTINCT experiment_id FROM items WHERE trajectory_id = ? ORDER BY experiment_id",
            (trajectory_id,))]

    def item_answers(self, experiment_id: int) -> dict[str, Answer]:
        """An experiment's majority answers as ``metrics.Answer`` (what ``metrics.score`` takes)."""
        from optimizer.stats.metrics import Answer

        return {
            r[0]: Answer(success=_opt_bool(r[1]), mistake_type=r[3], status=r[2])
            for r in self._query(
                "SELECT trajectory_id, success, status, mistake_type FROM items WHERE experiment_id = ?",
                (experiment_id,),
            )
        }

    def split_judgements(self, split: str) -> list[tuple[int, str, str, int, bool | None, str | None]]:
        """Every replicate verdict of every experiment of every run on ``split``, oldest first, as
        ``(experiment_id, version, trajectory_id, replicate, success, confidence)``; ``version`` names
        the prompts judged (the prompt hash, else the commit, else the experiment) — what the label
        suspects queue (`optimizer.triage`) counts."""
        return [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), _opt_bool(r[4]), r[5])
            for r in self._query(
                "SELECT v.experiment_id, COALESCE(e.prompt_hash, e.commit_sha, 'experiment-' || e.id), "
                "v.trajectory_id, v.replicate, v.success, v.confidence FROM verdicts v "
                "JOIN experiments e ON e.id = v.experiment_id JOIN runs r ON r.id = e.run_id "
                "WHERE r.split = ? ORDER BY v.experiment_id, v.trajectory_id, v.replicate",
                (split,),
            )
        ]

    def split_evidence(self, split: str) -> list[tuple[int, str, str, ReplicateVerdict]]:
        """`split_judgements` with what the structural judges said: ``(experiment_id, version,
        trajectory_id, verdict)``, the verdict holding success, confidence, a panel's members and a
        criteria/review verdict's detail (no reasoning or raw text) — what `optimizer.triage` counts."""
        rows = self._query(
            "SELECT v.experiment_id, COALESCE(e.prompt_hash, e.commit_sha, 'experiment-' || e.id), "
            "v.trajectory_id, v.replicate, v.success, v.confidence, "
            f"{'v.members' if self.version >= 9 else 'NULL'}, {'v.detail' if self.version >= 9 else 'NULL'} "
            "FROM verdicts v JOIN experiments e ON e.id = v.experiment_id JOIN runs r ON r.id = e.run_id "
            "WHERE r.split = ? ORDER BY v.experiment_id, v.trajectory_id, v.replicate",
            (split,),
        )
        return [
            (int(r[0]), str(r[1]), str(r[2]), ReplicateVerdict.model_construct(
                replicate=int(r[3]), success=_opt_bool(r[4]), confidence=r[5],
                members=[MemberVerdict.model_validate(m) for m in json.loads(r[6])] if r[6] else [],
                **_detail(r[7])))
            for r in rows
        ]

    # -- labels (stored apart from verdicts; never judge input) -----------------------------------

    def set_labels(self, run_id: str, labels: Mapping[str, Label] | Iterable[LabelRow]) -> None:
        """Store the run's split labels (``devset.load_labels`` output or LabelRows), in one transaction."""
        if isinstance(labels, Mapping):
            rows = [(run_id, tid, int(lab.is_positive), lab.mistake_type) for tid, lab in labels.items()]
        else:
            rows = [(run_id, lab.trajectory_id, int(lab.positive), lab.mistake_type) for lab in labels]
        with self.transaction() as cur:
            cur.execute("DELETE FROM run_labels WHERE run_id = ?", (run_id,))
            cur.executemany("INSERT INTO run_labels VALUES (?, ?, ?, ?)", rows)

    def labels(self, run_id: str) -> dict[str, LabelRow]:
        """The labels stored for a run, by trajectory id (empty if none were stored)."""
        return {
            r[0]: LabelRow(trajectory_id=r[0], positive=bool(r[1]), mistake_type=r[2])
            for r in self._query(
                "SELECT trajectory_id, positive, mistake_type FROM run_labels WHERE run_id = ?", (run_id,)
            )
        }

    # -- reviews ----------------------------------------------------------------------------------

    def add_review(
        self,
        trajectory_id: str,
        kind: ReviewKind,
        note: str = "",
        *,
        experiment_id: int | None = None,
        author: str | None = None,
    ) -> Review:
        """Record a human review of an item (optionally under an experiment)."""
        if kind not in REVIEW_KINDS:
            raise UserError(f"unknown review kind {kind!r}; use one of {', '.join(REVIEW_KINDS)}")
        author = author if author is not None else (os.environ.get("USER") or "human")
        with self.transaction() as cur:
            cur.execute(
                "INSERT INTO reviews (created, experiment_id, trajectory_id, kind, note, author) VALUES (?, ?, ?, ?, ?, ?)",
                (_ts(utc_now()), experiment_id, trajectory_id, kind, note, author),
            )
            review_id = int(cur.lastrowid or 0)
        return self.reviews(review_id=review_id)[0]

    def reviews(
        self, *, trajectory_id: str | None = None, experiment_id: int | None = None, review_id: int | None = None
    ) -> list[Review]:
        """Reviews, oldest first, optionally filtered by item, experiment or id."""
        clauses, params = [], []
        for column, value in (("trajectory_id", trajectory_id), ("experiment_id", experiment_id), ("id", review_id)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        rows = self._query(
            f"SELECT id, created, experiment_id, trajectory_id, kind, note, author FROM reviews{where} ORDER BY id",
            params,
        )
        return [Review.model_validate(dict(r)) for r in rows]

    def export_reviews(self, path: Path | str) -> int:
        """Write every review as JSONL (one object per line, oldest first); returns how many."""
        reviews = self.reviews()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", encoding="utf-8") as fh:
            for review in reviews:
                fh.write(review.model_dump_json() + "\n")
        return len(reviews)

    # -- events -----------------------------------------------------------------------------------

    @staticmethod
    def _event(
        cur: sqlite3.Cursor, run_id: str | None, experiment_id: int | None, kind: str, payload: Mapping[str, Any]
    ) -> int:
        cur.execute(
            "INSERT INTO events (run_id, experiment_id, created, kind, payload) VALUES (?, ?, ?, ?, ?)",
            (run_id, experiment_id, _ts(utc_now()), kind, _dumps(dict(payload))),
        )
        return int(cur.lastrowid or 0)

    def add_event(
        self, run_id: str | None, kind: EventKind, payload: Mapping[str, Any] | None = None,
        *, experiment_id: int | None = None,
    ) -> int:
        """Append an event for live followers; returns its id."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        with self.transaction() as cur:
            return self._event(cur, run_id, experiment_id, kind, payload or {})

    def events_since(self, last_id: int = 0, *, run_id: str | None = None, limit: int = 1000) -> list[Event]:
        """Events with id > ``last_id`` in id order (at most ``limit``), optionally of one run."""
        sql = "SELECT id, run_id, experiment_id, created, kind, payload FROM events WHERE id > ?"
        params: list[Any] = [last_id]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        rows = self._query(sql + " ORDER BY id LIMIT ?", [*params, limit])
        return [
            Event(id=r[0], run_id=r[1], experiment_id=r[2], created=r[3], kind=r[4], payload=_loads(r[5]) or {})
            for r in rows
        ]

    def last_event(self, run_id: str, kind: EventKind, *, experiment_id: int | None = None) -> Event | None:
        """The newest event of one kind for a run (for one of its experiments, if given), or None."""
        mine = "" if experiment_id is None else " AND experiment_id = ?"
        rows = self._query(
            "SELECT id, run_id, experiment_id, created, kind, payload FROM events "
            f"WHERE run_id = ? AND kind = ?{mine} ORDER BY id DESC LIMIT 1",
            (run_id, kind) if experiment_id is None else (run_id, kind, experiment_id),
        )
        if not rows:
            return None
        r = rows[0]
        return Event(id=r[0], run_id=r[1], experiment_id=r[2], created=r[3], kind=r[4], payload=_loads(r[5]) or {})

    def last_event_id(self) -> int:
        """The newest event id (0 when there are none): where a new follower starts."""
        return int(self._query("SELECT COALESCE(MAX(id), 0) FROM events")[0][0])

    # -- confirmations ----------------------------------------------------------------------------

    def add_confirmation(
        self, split: str, revision: str, metrics: Any, *, run_id: str | None = None
    ) -> Confirmation:
        """Record one use of ``judgeloop confirm`` on a held-out split."""
        with self.transaction() as cur:
            cur.execute(
                "INSERT INTO confirmations (run_id, split, created, revision, metrics) VALUES (?, ?, ?, ?, ?)",
                (run_id, split, _ts(utc_now()), revision, _dumps(_metrics_dict(metrics) or {})),
            )
            confirmation_id = int(cur.lastrowid or 0)
        return next(c for c in self.confirmations() if c.id == confirmation_id)

    def confirmations(self, split: str | None = None) -> list[Confirmation]:
        """Recorded confirmations, oldest first, optionally on one split."""
        sql = "SELECT id, run_id, split, created, revision, metrics FROM confirmations"
        params: list[Any] = []
        if split is not None:
            sql += " WHERE split = ?"
            params.append(split)
        rows = self._query(sql + " ORDER BY id", params)
        return [
            Confirmation(id=r[0], run_id=r[1], split=r[2], created=r[3], revision=r[4], metrics=_loads(r[5]) or {})
            for r in rows
        ]

    # -- batches (`judgeloop run --batch`) ---------------------------------------------------------

    def record_batch(self, run_id: str, experiment_id: int | None, *, provider: str, endpoint: str, model: str,
                     custom_ids: list[str], estimate_usd: float) -> int:
        """Record a batch about to be submitted for ``experiment_id`` (status ``submitting``); its row id."""
        now = _ts(utc_now())
        with self.transaction() as cur:
            cur.execute(
                "INSERT INTO batches (run_id, experiment_id, provider, endpoint, model, batch_id, status, custom_ids,"
                " estimate_usd, created, updated) VALUES (?, ?, ?, ?, ?, NULL, 'submitting', ?, ?, ?, ?)",
                (run_id, experiment_id, provider, endpoint, model, _dumps(custom_ids), estimate_usd, now, now),
            )
            return int(cur.lastrowid or 0)

    def update_batch(self, row_id: int, *, status: str, batch_id: str | None = None) -> None:
        """Set a recorded batch's status (and its provider id, once known)."""
        with self.transaction() as cur:
            cur.execute("UPDATE batches SET status = ?, batch_id = COALESCE(?, batch_id), updated = ? WHERE id = ?",
                        (status, batch_id, _ts(utc_now()), row_id))

    def batches(self, run_id: str, *, open_only: bool = False) -> list[BatchRow]:
        """The run's recorded batches, oldest first (``open_only``: those not yet collected or abandoned)."""
        sql = ("SELECT id, run_id, experiment_id, provider, endpoint, model, batch_id, status, custom_ids,"
               " estimate_usd, created FROM batches WHERE run_id = ?")
        if open_only:
            sql += " AND status IN ('submitting', 'submitted')"
        rows = self._query(sql + " ORDER BY id", (run_id,))
        return [
            BatchRow(id=r[0], run_id=r[1], experiment_id=r[2], provider=r[3], endpoint=r[4], model=r[5],
                     batch_id=r[6], status=r[7], custom_ids=_loads(r[8]) or [], estimate_usd=r[9], created=r[10])
            for r in rows
        ]

    def count_confirmations(self, split: str) -> int:
        """How many times a held-out split has been evaluated by ``confirm`` (across all runs)."""
        return int(self._query("SELECT COUNT(*) FROM confirmations WHERE split = ?", (split,))[0][0])

    # -- attributions (schema 7) ------------------------------------------------------------------

    _ATTRIBUTION_COLUMNS = (
        "id, run_id, key, scope, final_commit, baseline_commit, split, judge, replicates, rejudge, alpha, "
        "created, updated, status, note, cost_usd, final_vs_baseline"
    )

    def _attribution(self, row: sqlite3.Row) -> Attribution:
        d = dict(row)
        d["final_vs_baseline"] = _loads(d["final_vs_baseline"])
        d["edits"] = [
            EditContribution.model_validate_json(r[0]) for r in self._query(
                "SELECT result FROM attribution_edits WHERE attribution_id = ? ORDER BY position", (d["id"],))
        ]
        return Attribution.model_validate(d)

    def open_attribution(
        self, run_id: str, *, key: str, scope: str, final_commit: str, baseline_commit: str, split: str,
        judge: str, replicates: int, rejudge: int, alpha: float,
    ) -> Attribution:
        """The run's attribution with this ``key`` (what determines its numbers: scope, commits, split,
        judge, replicates, re-judging), to resume; a new one (status running) when there is none."""
        with self.transaction() as cur:
            row = cur.execute("SELECT id FROM attributions WHERE run_id = ? AND key = ? ORDER BY id DESC LIMIT 1",
                              (run_id, key)).fetchone()
            if row is not None:
                attribution_id = int(row[0])
                cur.execute("UPDATE attributions SET status = 'running', updated = ? WHERE id = ?",
                            (_ts(utc_now()), attribution_id))
            else:
                now = _ts(utc_now())
                cur.execute(
                    "INSERT INTO attributions (run_id, key, scope, final_commit, baseline_commit, split, judge, "
                    "replicates, rejudge, alpha, created, updated, status) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
                    (run_id, key, scope, final_commit, baseline_commit, split, judge, replicates, rejudge, alpha,
                     now, now),
                )
                attribution_id = int(cur.lastrowid or 0)
        return self.get_attribution(attribution_id)

    def record_attribution_edit(
        self, attribution_id: int, position: int, edit: EditContribution, *, new_cost_usd: float,
    ) -> None:
        """Store one kept edit's row (position 0 = the newest; replaces an earlier row of the edit) and add
        ``new_cost_usd`` (what was spent on it now, US dollars) to the attribution's spend."""
        if edit.experiment is None:
            raise ValueError("record_attribution_edit: a kept edit has an experiment id")
        with self.transaction() as cur:
            cur.execute("INSERT OR REPLACE INTO attribution_edits VALUES (?, ?, ?, ?)",
                        (attribution_id, edit.experiment, position, edit.model_dump_json()))
            cur.execute("UPDATE attributions SET cost_usd = cost_usd + ?, updated = ? WHERE id = ?",
                        (new_cost_usd, _ts(utc_now()), attribution_id))

    def finish_attribution(
        self, attribution_id: int, *, status: str, note: str | None,
        final_vs_baseline: EditContribution | None = None, extra_cost_usd: float = 0.0,
    ) -> Attribution:
        """Record how the attribution ended (``complete`` or ``partial``, with a note saying what was not
        measured), the final-vs-baseline comparison, and spend not already on an edit row."""
        with self.transaction() as cur:
            cur.execute(
                "UPDATE attributions SET status = ?, note = ?, updated = ?, cost_usd = cost_usd + ?, "
                "final_vs_baseline = COALESCE(?, final_vs_baseline) WHERE id = ?",
                (status, note, _ts(utc_now()), extra_cost_usd,
                 final_vs_baseline.model_dump_json() if final_vs_baseline is not None else None, attribution_id),
            )
        return self.get_attribution(attribution_id)

    def get_attribution(self, attribution_id: int) -> Attribution:
        rows = self._query(f"SELECT {self._ATTRIBUTION_COLUMNS} FROM attributions WHERE id = ?", (attribution_id,))
        if not rows:
            raise KeyError(f"no attribution {attribution_id}")
        return self._attribution(rows[0])

    def latest_attribution(self, run_id: str) -> Attribution | None:
        """The run's newest attribution, or None (also on a ledger older than schema 7)."""
        if self.version < 7:
            return None
        rows = self._query(
            f"SELECT {self._ATTRIBUTION_COLUMNS} FROM attributions WHERE run_id = ? ORDER BY id DESC LIMIT 1",
            (run_id,),
        )
        return self._attribution(rows[0]) if rows else None
