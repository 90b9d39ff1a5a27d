"""The ledger's connection: open (creating or upgrading the schema, `optimizer.ledger.schema`), one
lock around the connection, write transactions, queries and the event insert every table family
shares. The tables themselves are in the sibling modules; `optimizer.ledger.Ledger` joins them.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from optimizer.errors import UserError
from optimizer.events import LedgerEvent
from optimizer.ledger.rows import (
    EXPERIMENT_LIST_COLUMNS,
    EXPERIMENT_V3_COLUMNS,
    EXPERIMENT_V3_DEFAULTS,
    EXPERIMENT_V4_COLUMNS,
    EXPERIMENT_V4_DEFAULTS,
    EXPERIMENT_V6_COLUMNS,
    EXPERIMENT_V6_DEFAULTS,
    EXPERIMENT_V8_COLUMNS,
    EXPERIMENT_V8_DEFAULTS,
    EXPERIMENT_V9_COLUMNS,
    EXPERIMENT_V9_DEFAULTS,
    EXPERIMENT_V10_COLUMNS,
    EXPERIMENT_V10_DEFAULTS,
    EXPERIMENT_V11_COLUMNS,
    EXPERIMENT_V11_DEFAULTS,
    EXPERIMENT_V13_COLUMNS,
    EXPERIMENT_V13_DEFAULTS,
    RUN_COLUMNS,
    json_or_none,
    ts,
    utc_now,
)
from optimizer.ledger.schema import SCHEMA_VERSION, create_schema, upgrade_schema
from optimizer.workspace import storage


class LedgerCore:
    """The ledger's connection and plumbing (open, upgrade, one lock, transactions, queries), what each
    table family of `optimizer.ledger.Ledger` builds on. Thread-safe; close when done."""

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
            raise UserError(
                f"{self.path} is not a readable judgeloop ledger ({exc}); move it aside and retry"
            ) from None
        except BaseException:
            self._conn.close()
            raise

    def _fault(self, exc: sqlite3.Error) -> UserError | None:
        """The one-line error for a corrupt ledger, a full disk or a read-only folder (else None)."""
        return storage.sqlite_fault(
            exc,
            self.path,
            "the ledger",
            "it is not a readable judgeloop ledger: restore it from a backup (or recover what SQLite still reads "
            "with `sqlite3 FILE .recover`), or move it aside to start a new ledger (the runs' commits stay in "
            "git); judgeloop never deletes it",
        )

    @classmethod
    def open_readonly(cls, path: Path | str) -> Self:
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
                raise UserError(
                    f"no ledger yet at {self.path} (the file is empty); run `judgeloop run` first"
                )
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

    def __enter__(self) -> Self:
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
        return RUN_COLUMNS + (", labels_fingerprint" if self.version >= 9 else ", NULL AS labels_fingerprint")

    def _experiment_columns(self) -> str:
        parts = [EXPERIMENT_LIST_COLUMNS]
        for since, columns, defaults in (
            (3, EXPERIMENT_V3_COLUMNS, EXPERIMENT_V3_DEFAULTS),
            (4, EXPERIMENT_V4_COLUMNS, EXPERIMENT_V4_DEFAULTS),
            (6, EXPERIMENT_V6_COLUMNS, EXPERIMENT_V6_DEFAULTS),
            (8, EXPERIMENT_V8_COLUMNS, EXPERIMENT_V8_DEFAULTS),
            (9, EXPERIMENT_V9_COLUMNS, EXPERIMENT_V9_DEFAULTS),
            (10, EXPERIMENT_V10_COLUMNS, EXPERIMENT_V10_DEFAULTS),
            (11, EXPERIMENT_V11_COLUMNS, EXPERIMENT_V11_DEFAULTS),
            (13, EXPERIMENT_V13_COLUMNS, EXPERIMENT_V13_DEFAULTS),
        ):
            if self.version >= since:
                parts.extend(columns)
            else:
                parts.extend(
                    f"{default} AS {column}" for column, default in zip(columns, defaults, strict=True)
                )
        return ", ".join(parts)

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise self._fault(exc) or exc from None

    @staticmethod
    def _event(
        cur: sqlite3.Cursor,
        run_id: str | None,
        experiment_id: int | None,
        event: LedgerEvent,
    ) -> int:
        """Append ``event`` to the feed inside the caller's transaction: its ``kind`` column and its own
        JSON payload (`optimizer.events`), never a hand-built one; returns the row's id."""
        cur.execute(
            "INSERT INTO events (run_id, experiment_id, created, kind, payload) VALUES (?, ?, ?, ?, ?)",
            (run_id, experiment_id, ts(utc_now()), event.kind, json_or_none(event.payload())),
        )
        return int(cur.lastrowid or 0)
