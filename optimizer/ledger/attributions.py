"""The ledger's ``attributions`` and ``attribution_edits`` tables (schema 7): each `judgeloop attribute`
of a run and its measured kept edits, written as each is measured so an attribution resumes.
"""

from __future__ import annotations

import sqlite3

from optimizer.ledger.core import LedgerCore
from optimizer.ledger.rows import (
    Attribution,
    AttributionSpec,
    EditContribution,
    json_value,
    ts,
    utc_now,
)


class AttributionTables(LedgerCore):
    """Attributions and their measured edits (a part of `optimizer.ledger.Ledger`)."""

    # -- attributions (schema 7) ------------------------------------------------------------------

    _ATTRIBUTION_COLUMNS = (
        "id, run_id, key, scope, final_commit, baseline_commit, split, judge, replicates, rejudge, alpha, "
        "created, updated, status, note, cost_usd, final_vs_baseline"
    )

    def _attribution(self, row: sqlite3.Row) -> Attribution:
        d = dict(row)
        d["final_vs_baseline"] = json_value(d["final_vs_baseline"])
        d["edits"] = [
            EditContribution.model_validate_json(r[0])
            for r in self._query(
                "SELECT result FROM attribution_edits WHERE attribution_id = ? ORDER BY position", (d["id"],)
            )
        ]
        return Attribution.model_validate(d)

    def open_attribution(self, run_id: str, spec: AttributionSpec) -> Attribution:
        """The run's attribution with ``spec.key`` (what determines its numbers: scope, commits, split,
        judge, replicates, re-judging), to resume; a new one (status running) when there is none."""
        with self.transaction() as cur:
            row = cur.execute(
                "SELECT id FROM attributions WHERE run_id = ? AND key = ? ORDER BY id DESC LIMIT 1",
                (run_id, spec.key),
            ).fetchone()
            if row is not None:
                attribution_id = int(row[0])
                cur.execute(
                    "UPDATE attributions SET status = 'running', updated = ? WHERE id = ?",
                    (ts(utc_now()), attribution_id),
                )
            else:
                now = ts(utc_now())
                cur.execute(
                    "INSERT INTO attributions (run_id, key, scope, final_commit, baseline_commit, split, judge, "
                    "replicates, rejudge, alpha, created, updated, status) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
                    (
                        run_id,
                        spec.key,
                        spec.scope,
                        spec.final_commit,
                        spec.baseline_commit,
                        spec.split,
                        spec.judge,
                        spec.replicates,
                        spec.rejudge,
                        spec.alpha,
                        now,
                        now,
                    ),
                )
                attribution_id = int(cur.lastrowid or 0)
        return self.get_attribution(attribution_id)

    def record_attribution_edit(
        self,
        attribution_id: int,
        position: int,
        edit: EditContribution,
        *,
        new_cost_usd: float,
    ) -> None:
        """Store one kept edit's row (position 0 = the newest; replaces an earlier row of the edit) and add
        ``new_cost_usd`` (what was spent on it now, US dollars) to the attribution's spend."""
        if edit.experiment is None:
            raise ValueError("record_attribution_edit: a kept edit has an experiment id")
        with self.transaction() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO attribution_edits VALUES (?, ?, ?, ?)",
                (attribution_id, edit.experiment, position, edit.model_dump_json()),
            )
            cur.execute(
                "UPDATE attributions SET cost_usd = cost_usd + ?, updated = ? WHERE id = ?",
                (new_cost_usd, ts(utc_now()), attribution_id),
            )

    def finish_attribution(
        self,
        attribution_id: int,
        *,
        status: str,
        note: str | None,
        final_vs_baseline: EditContribution | None = None,
        extra_cost_usd: float = 0.0,
    ) -> Attribution:
        """Record how the attribution ended (``complete`` or ``partial``, with a note saying what was not
        measured), the final-vs-baseline comparison, and spend not already on an edit row."""
        with self.transaction() as cur:
            cur.execute(
                "UPDATE attributions SET status = ?, note = ?, updated = ?, cost_usd = cost_usd + ?, "
                "final_vs_baseline = COALESCE(?, final_vs_baseline) WHERE id = ?",
                (
                    status,
                    note,
                    ts(utc_now()),
                    extra_cost_usd,
                    final_vs_baseline.model_dump_json() if final_vs_baseline is not None else None,
                    attribution_id,
                ),
            )
        return self.get_attribution(attribution_id)

    def get_attribution(self, attribution_id: int) -> Attribution:
        rows = self._query(
            f"SELECT {self._ATTRIBUTION_COLUMNS} FROM attributions WHERE id = ?", (attribution_id,)
        )
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
