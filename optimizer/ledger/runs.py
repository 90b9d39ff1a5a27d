"""The ledger's ``runs`` and ``experiments`` tables: a run's life (created, status, incumbent) and each
candidate's row from start to decision (`ExperimentOutcome`), read back as `Run` and `Experiment`.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optimizer.errors import UserError
from optimizer.events import DecisionRecorded, RunOpened, RunStatusChanged, StageChanged
from optimizer.ledger.core import LedgerCore
from optimizer.ledger.rows import (
    RUN_COLUMNS,
    Experiment,
    ExperimentOutcome,
    ProposedEdit,
    Run,
    RunSpec,
    experiment_from_row,
    flips_dict,
    intervals_dict,
    json_or_none,
    metrics_dict,
    new_run_id,
    opt_int,
    run_from_row,
    ts,
    utc_now,
)
from optimizer.vocab import (
    INCUMBENT_STATUSES,
    TERMINAL_RUN_STATUSES,
    DecidedBy,
    ExperimentStatus,
    RunStatus,
    StageKind,
)

if TYPE_CHECKING:
    from optimizer.judge.providers.pricing import Usage


class RunTables(LedgerCore):
    """Runs and their experiments (a part of `optimizer.ledger.Ledger`)."""

    # -- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        spec: RunSpec,
        *,
        run_id: str | None = None,
        branch: str | None = None,
        status: RunStatus = "running",
        pid: int | None = None,
        host: str | None = None,
    ) -> Run:
        """Insert a run decided by ``spec`` (default id from ``new_run_id``, branch ``judgeloop/<id>``,
        this pid and host)."""
        run_id = run_id or new_run_id()
        with self.transaction() as cur:
            cur.execute(
                f"INSERT INTO runs ({RUN_COLUMNS}) VALUES (?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL)",
                (
                    run_id,
                    ts(utc_now()),
                    status,
                    spec.strategy,
                    spec.policy,
                    spec.split,
                    spec.split_fingerprint,
                    spec.start_rev,
                    branch or f"judgeloop/{run_id}",
                    json_or_none(dict(spec.budgets)),
                    json_or_none(dict(spec.config)),
                    os.getpid() if pid is None else pid,
                    host or socket.gethostname(),
                ),
            )
            if spec.labels_fingerprint is not None:
                cur.execute(
                    "UPDATE runs SET labels_fingerprint = ? WHERE id = ?", (spec.labels_fingerprint, run_id)
                )
            self._event(cur, run_id, None, RunOpened(status))
        return self.get_run(run_id)

    def set_run_status(
        self, run_id: str, status: RunStatus, *, stop_reason: str | None = None, pid: int | None = None
    ) -> None:
        """Change a run's status (sets ``finished`` for finished/stopped/crashed) and log an event."""
        finished = ts(utc_now()) if status in TERMINAL_RUN_STATUSES else None
        with self.transaction() as cur:
            cur.execute(
                "UPDATE runs SET status = ?, finished = ?, stop_reason = COALESCE(?, stop_reason), "
                "pid = COALESCE(?, pid) WHERE id = ?",
                (status, finished, stop_reason, pid, run_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no run {run_id}")
            self._event(cur, run_id, None, RunStatusChanged(status, stop_reason))

    def record_budget_top_up(self, run_id: str, usd: float, *, by: str, via: str) -> Run:
        """Raise a run's judge budget by ``usd`` (US dollars): ``budgets.budget_usd`` becomes the new total and
        ``budgets.top_ups`` gains who decided it (``by``), how they were asked (``via``), the amount, the new
        total and when; the run as it is now. The caller checked the amount (positive, finite, capped)."""
        run = self.get_run(run_id)
        budgets = dict(run.budgets or {})
        total = float(budgets.get("budget_usd") or 0.0) + usd
        entry = {"usd": usd, "budget_usd": total, "by": by, "via": via, "at": ts(utc_now())}
        budgets["budget_usd"] = total
        budgets["top_ups"] = [*budgets.get("top_ups", []), entry]
        with self.transaction() as cur:
            cur.execute("UPDATE runs SET budgets = ? WHERE id = ?", (json_or_none(budgets), run_id))
        return self.get_run(run_id)

    def set_incumbent(self, run_id: str, experiment_id: int) -> None:
        """Point the run at a new incumbent (normally done by ``record_decision``)."""
        with self.transaction() as cur:
            cur.execute("UPDATE runs SET incumbent_experiment = ? WHERE id = ?", (experiment_id, run_id))

    def runs(self) -> list[Run]:
        """Every run, newest first."""
        return [
            run_from_row(r)
            for r in self._query(f"SELECT {self._run_columns()} FROM runs ORDER BY created DESC, rowid DESC")
        ]

    def latest_run(self) -> Run | None:
        """The newest run, or None on an empty ledger."""
        rows = self._query(
            f"SELECT {self._run_columns()} FROM runs ORDER BY created DESC, rowid DESC LIMIT 1"
        )
        return run_from_row(rows[0]) if rows else None

    def get_run(self, run_id: str) -> Run:
        """One run; an unknown id is a UserError listing the newest few."""
        rows = self._query(f"SELECT {self._run_columns()} FROM runs WHERE id = ?", (run_id,))
        if not rows:
            known = ", ".join(r.id for r in self.runs()[:5]) or "none"
            raise UserError(f"no run {run_id!r} in the ledger (newest: {known}); pass one of those to --run")
        return run_from_row(rows[0])

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
        edit: ProposedEdit | None = None,
    ) -> Experiment:
        """Insert an experiment; ``seq`` defaults to the run's next (0 for the first, the baseline);
        ``edit``: what the row starts with (`ProposedEdit`; none for a row with no edit yet).

        The optimiser's figures (what proposing it cost; known before the row exists) and the
        ``proposal_meta`` are written here only; the later updates leave them as they are.
        """
        e = edit if edit is not None else ProposedEdit()
        spent = e.optimizer_usage
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
                    run_id,
                    seq,
                    parent_id,
                    strategy,
                    ts(utc_now()),
                    status,
                    commit_sha,
                    json_or_none(list(e.files_changed)),
                    e.insertions,
                    e.deletions,
                    e.diff_text,
                    e.rationale,
                    e.prompt_hash,
                    spent.calls,
                    spent.input_tokens,
                    spent.output_tokens,
                    spent.cost_usd,
                    json_or_none(dict(e.proposal_meta)) if e.proposal_meta else None,
                ),
            )
            experiment_id = int(cur.lastrowid or 0)
            self._event(cur, run_id, experiment_id, StageChanged(StageKind.EXPERIMENT_STARTED, seq=seq))
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
                (
                    usage.calls,
                    usage.input_tokens,
                    usage.output_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                    usage.cost_usd,
                    experiment_id,
                ),
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
            row = cur.execute(
                "SELECT COALESCE(MAX(pass), -1) + 1 FROM endpoint_passes WHERE experiment_id = ?",
                (experiment_id,),
            ).fetchone()
            cur.executemany(
                "INSERT INTO endpoint_passes (experiment_id, pass, endpoint, calls, prompt_tokens, cached_tokens,"
                " failures, drained) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        experiment_id,
                        row[0],
                        name,
                        int(f.get("calls", 0)),
                        int(f.get("prompt_tokens", 0)),
                        int(f.get("cached_tokens", 0)),
                        int(f.get("failures", 0)),
                        int(f.get("drained", 0)),
                    )
                    for name, f in figures.items()
                ],
            )

    def endpoint_figures(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per endpoint, over the run's passes: calls, prompt and cached tokens, failed calls, and
        ``drained``: the passes it was drained in; ``passes``: the passes it was counted in. Empty
        without base_urls (or on a ledger from before schema 9)."""
        try:
            rows = self._conn.execute(
                "SELECT p.endpoint, COUNT(*), SUM(p.calls), SUM(p.prompt_tokens), SUM(p.cached_tokens),"
                " SUM(p.failures), SUM(p.drained) FROM endpoint_passes p JOIN experiments e ON e.id = p.experiment_id"
                " WHERE e.run_id = ? GROUP BY p.endpoint ORDER BY MIN(p.id)",
                (run_id,),
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            return {}  # a ledger from before schema 9, opened read-only
        return {
            r[0]: {
                "passes": r[1],
                "calls": r[2],
                "prompt_tokens": r[3],
                "cached_tokens": r[4],
                "failures": r[5],
                "drained": r[6],
            }
            for r in rows
        }

    def add_planned_cache_reads(self, experiment_id: int, tokens: int) -> None:
        """Add a pass's planned cache-read tokens to the experiment (billed ones: ``cache_read_tokens``).
        Not a decision: no event."""
        if tokens:
            with self.transaction() as cur:
                cur.execute(
                    "UPDATE experiments SET planned_cache_read_tokens = planned_cache_read_tokens + ? "
                    "WHERE id = ?",
                    (tokens, experiment_id),
                )

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
                "policy_keep = ?, policy_reason = ?, decided_by = ?, pooled_on = ?, policy_why = ? WHERE id = ?",
                (
                    o.status,
                    None if o.status == "waiting" else ts(utc_now()),
                    o.status,
                    o.reason,
                    json_or_none(metrics_dict(o.metrics)),
                    json_or_none(intervals_dict(o.intervals)),
                    json_or_none(flips_dict(o.flips)),
                    o.p_value,
                    opt_int(o.literal_keep),
                    opt_int(o.paired_keep),
                    int(o.early_stopped),
                    o.items_evaluated,
                    o.usage.calls,
                    o.cache_hits,
                    o.usage.input_tokens,
                    o.usage.output_tokens,
                    o.cost_usd,
                    o.duration_s,
                    o.commit_sha,
                    o.prompt_hash,
                    opt_int(o.adaptive_keep),
                    o.alpha,
                    json_or_none(o.test.model_dump(mode="json") if o.test is not None else None),
                    o.rejudge.calls,
                    o.rejudge.cost_usd,
                    o.usage.cache_read_tokens,
                    o.usage.cache_write_tokens,
                    o.keep_kind,
                    o.verdict_cost_usd,
                    opt_int(o.policy_keep),
                    o.policy_reason,
                    o.decided_by,
                    o.pooled_on,
                    json_or_none(o.policy_why.model_dump(mode="json") if o.policy_why is not None else None),
                    experiment_id,
                ),
            )
            if o.status in INCUMBENT_STATUSES:
                cur.execute("UPDATE runs SET incumbent_experiment = ? WHERE id = ?", (experiment_id, run_id))
            self._event(cur, run_id, experiment_id, DecisionRecorded(o.status, o.reason))
        return self.get_experiment(experiment_id)

    def reject(self, experiment_id: int, reason: str, *, cost_usd: float = 0.0) -> Experiment:
        """The guards rejected the candidate before any judge call (``guard_rejected``); ``cost_usd``:
        the optimiser's spend on it (the row's total)."""
        return self.record_decision(
            experiment_id, ExperimentOutcome(status="guard_rejected", reason=reason, extra_cost_usd=cost_usd)
        )

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
                (status, status, reason, ts(utc_now()), commit_sha, decided_by, experiment_id),
            )
            if status in INCUMBENT_STATUSES:
                cur.execute("UPDATE runs SET incumbent_experiment = ? WHERE id = ?", (experiment_id, row[0]))
            self._event(cur, row[0], experiment_id, DecisionRecorded(status, reason))
        return self.get_experiment(experiment_id)

    def experiments(self, run_id: str) -> list[Experiment]:
        """A run's experiments in ``seq`` order, without ``diff_text`` (the fast listing)."""
        rows = self._query(
            f"SELECT {self._experiment_columns()}, NULL AS diff_text FROM experiments WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        return [experiment_from_row(r) for r in rows]

    def get_experiment(self, experiment_id: int) -> Experiment:
        """One experiment with its diff text; an unknown id is a UserError."""
        rows = self._query(
            f"SELECT {self._experiment_columns()}, diff_text FROM experiments WHERE id = ?",
            (int(experiment_id),),
        )
        if not rows:
            raise UserError(f"no experiment {experiment_id} in the ledger; see `judgeloop history` for ids")
        return experiment_from_row(rows[0])

    def experiments_with_status(
        self, status: ExperimentStatus, run_id: str | None = None
    ) -> list[Experiment]:
        """Experiments in one status (e.g. ``waiting`` or ``running``), oldest first."""
        sql = f"SELECT {self._experiment_columns()}, NULL AS diff_text FROM experiments WHERE status = ?"
        params: list[Any] = [status]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        return [experiment_from_row(r) for r in self._query(sql + " ORDER BY id", params)]

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
