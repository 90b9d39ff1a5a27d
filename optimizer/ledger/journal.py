"""What the ledger keeps around runs: human ``reviews``, the ``events`` feed live followers read,
``confirmations`` of held-out splits and the ``batches`` sent through a provider's batch API.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.errors import UserError
from optimizer.events import LedgerEvent
from optimizer.ledger.core import LedgerCore
from optimizer.ledger.rows import (
    BatchRow,
    Confirmation,
    Event,
    MeasuredSplit,
    MetricsRow,
    Review,
    json_or_none,
    json_value,
    metrics_dict,
    ts,
    utc_now,
)
from optimizer.vocab import (
    EVENT_KINDS,
    REVIEW_KINDS,
    EventKind,
    ReviewKind,
)

if TYPE_CHECKING:
    from optimizer.stats.metrics import Metrics


class JournalTables(LedgerCore):
    """Reviews, events, confirmations and batches (a part of `optimizer.ledger.Ledger`)."""

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
                (ts(utc_now()), experiment_id, trajectory_id, kind, note, author),
            )
            review_id = int(cur.lastrowid or 0)
        return self.reviews(review_id=review_id)[0]

    def reviews(
        self,
        *,
        trajectory_id: str | None = None,
        experiment_id: int | None = None,
        review_id: int | None = None,
    ) -> list[Review]:
        """Reviews, oldest first, optionally filtered by item, experiment or id."""
        clauses, params = [], []
        for column, value in (
            ("trajectory_id", trajectory_id),
            ("experiment_id", experiment_id),
            ("id", review_id),
        ):
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

    def add_event(self, run_id: str | None, event: LedgerEvent, *, experiment_id: int | None = None) -> int:
        """Append a typed event (`optimizer.events.LedgerEvent`: its ``kind`` and JSON payload) for live
        followers, who read it back with `Event.typed`; returns its id."""
        kind = getattr(event, "kind", event)  # a bare name is no event: refused like an unknown kind
        if kind not in EVENT_KINDS or isinstance(event, str):
            raise ValueError(f"unknown event kind {kind!r}")
        with self.transaction() as cur:
            return self._event(cur, run_id, experiment_id, event)

    def events_since(self, last_id: int = 0, *, run_id: str | None = None, limit: int = 1000) -> list[Event]:
        """Events with id > ``last_id`` in id order (at most ``limit``), optionally of one run."""
        sql = "SELECT id, run_id, experiment_id, created, kind, payload FROM events WHERE id > ?"
        params: list[Any] = [last_id]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        rows = self._query(sql + " ORDER BY id LIMIT ?", [*params, limit])
        return [_event_row(r) for r in rows]

    def last_event(self, run_id: str, kind: EventKind, *, experiment_id: int | None = None) -> Event | None:
        """The newest event of one kind for a run (for one of its experiments, if given), or None."""
        mine = "" if experiment_id is None else " AND experiment_id = ?"
        rows = self._query(
            "SELECT id, run_id, experiment_id, created, kind, payload FROM events "
            f"WHERE run_id = ? AND kind = ?{mine} ORDER BY id DESC LIMIT 1",
            (run_id, kind) if experiment_id is None else (run_id, kind, experiment_id),
        )
        return _event_row(rows[0]) if rows else None

    def last_event_id(self) -> int:
        """The newest event id (0 when there are none): where a new follower starts."""
        return int(self._query("SELECT COALESCE(MAX(id), 0) FROM events")[0][0])

    # -- confirmations ----------------------------------------------------------------------------

    def add_confirmation(
        self,
        split: str,
        revision: str,
        metrics: Metrics | MetricsRow | None,
        *,
        run_id: str | None = None,
        measured: MeasuredSplit | None = None,
    ) -> Confirmation:
        """Record one use of ``judgeloop confirm`` on a held-out split (``measured``: its benchmark,
        fingerprint and item ids)."""
        with self.transaction() as cur:
            cur.execute(
                "INSERT INTO confirmations (run_id, split, created, revision, metrics, benchmark, fingerprint, "
                "items) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    split,
                    ts(utc_now()),
                    revision,
                    json_or_none(metrics_dict(metrics) or {}),
                    None if measured is None else measured.benchmark,
                    None if measured is None else measured.fingerprint,
                    None if measured is None else json.dumps(list(measured.items)),
                ),
            )
            confirmation_id = int(cur.lastrowid or 0)
        return next(c for c in self.confirmations() if c.id == confirmation_id)

    def confirmations(self, split: str | None = None) -> list[Confirmation]:
        """Recorded confirmations, oldest first, optionally on one split."""
        since = "benchmark, fingerprint, items" if self.version >= 11 else "NULL, NULL, NULL"
        sql = f"SELECT id, run_id, split, created, revision, metrics, {since} FROM confirmations"
        params: list[Any] = []
        if split is not None:
            sql += " WHERE split = ?"
            params.append(split)
        rows = self._query(sql + " ORDER BY id", params)
        return [
            Confirmation(
                id=r[0],
                run_id=r[1],
                split=r[2],
                created=r[3],
                revision=r[4],
                metrics=json_value(r[5]) or {},
                benchmark=r[6],
                fingerprint=r[7],
                items=_id_list(json_value(r[8])),
            )
            for r in rows
        ]

    # -- batches (`judgeloop run --batch`) ---------------------------------------------------------

    def record_batch(
        self,
        run_id: str,
        experiment_id: int | None,
        *,
        provider: str,
        endpoint: str,
        model: str,
        custom_ids: list[str],
        estimate_usd: float,
    ) -> int:
        """Record a batch about to be submitted for ``experiment_id`` (status ``submitting``); its row id."""
        now = ts(utc_now())
        with self.transaction() as cur:
            cur.execute(
                "INSERT INTO batches (run_id, experiment_id, provider, endpoint, model, batch_id, status, custom_ids,"
                " estimate_usd, created, updated) VALUES (?, ?, ?, ?, ?, NULL, 'submitting', ?, ?, ?, ?)",
                (
                    run_id,
                    experiment_id,
                    provider,
                    endpoint,
                    model,
                    json_or_none(custom_ids),
                    estimate_usd,
                    now,
                    now,
                ),
            )
            return int(cur.lastrowid or 0)

    def update_batch(self, row_id: int, *, status: str, batch_id: str | None = None) -> None:
        """Set a recorded batch's status (and its provider id, once known)."""
        with self.transaction() as cur:
            cur.execute(
                "UPDATE batches SET status = ?, batch_id = COALESCE(?, batch_id), updated = ? WHERE id = ?",
                (status, batch_id, ts(utc_now()), row_id),
            )

    def batches(self, run_id: str, *, open_only: bool = False) -> list[BatchRow]:
        """The run's recorded batches, oldest first (``open_only``: those not yet collected or abandoned)."""
        sql = (
            "SELECT id, run_id, experiment_id, provider, endpoint, model, batch_id, status, custom_ids,"
            " estimate_usd, created FROM batches WHERE run_id = ?"
        )
        if open_only:
            sql += " AND status IN ('submitting', 'submitted')"
        rows = self._query(sql + " ORDER BY id", (run_id,))
        return [
            BatchRow(
                id=r[0],
                run_id=r[1],
                experiment_id=r[2],
                provider=r[3],
                endpoint=r[4],
                model=r[5],
                batch_id=r[6],
                status=r[7],
                custom_ids=json_value(r[8]) or [],
                estimate_usd=r[9],
                created=r[10],
            )
            for r in rows
        ]

    def count_confirmations(self, split: str) -> int:
        """How many times a held-out split has been evaluated by ``confirm`` (across all runs)."""
        return int(self._query("SELECT COUNT(*) FROM confirmations WHERE split = ?", (split,))[0][0])

    def item_uses(self, split: str, ids: Collection[str]) -> tuple[int, list[Confirmation]]:
        """Held-out rationing by item: the most times any of ``ids`` has been measured by ``confirm``
        (whatever the split's name was then), and the confirmations that measured some of them."""
        wanted = set(ids)
        uses = dict.fromkeys(wanted, 0)
        touching = []
        for c in self.confirmations():
            if c.items is None:
                if c.split != split:
                    continue
                hit = wanted
            else:
                hit = wanted.intersection(c.items)
            if hit:
                touching.append(c)
                for tid in hit:
                    uses[tid] += 1
        return max(uses.values(), default=0), touching


def _event_row(r: Any) -> Event:
    """An events row (id, run_id, experiment_id, created, kind, payload); a payload that is not a JSON
    object (written beside the ledger's API) reads as empty, so `Event.typed` skips it."""
    payload = json_value(r[5])
    return Event(
        id=r[0],
        run_id=r[1],
        experiment_id=r[2],
        created=r[3],
        kind=r[4],
        payload=payload if isinstance(payload, dict) else {},
    )


def _id_list(value: Any) -> list[str] | None:
    """A stored JSON list of item ids (None for a row from before schema 11, or a value not such a list)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None
