"""The judge-call cache: SQLite in ``experiments/cache.sqlite``.

One row per judge call that returned a model output, keyed by everything that determines the call
(provider, model, sampling, output schema, the request fingerprint, the replicate index, and the
endpoint when it is not the provider's default — never an API key). Parse failures are model outputs
and are cached; transport errors never reach this module.

Concurrency: WAL mode, one connection per thread (``sqlite3`` connections must not be shared across
threads). The evaluator uses it from the asyncio event-loop thread only; the TUI or a second process
may read at the same time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

from optimizer.errors import UserError
from optimizer.evaluation.batchstore import (
    OPEN_BATCH_STATUSES,
    BatchRecord,
    BatchStatus,
    batch_status,
)
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import JudgeRequest, Sampling, stable_json
from optimizer.workspace import storage

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    replicate INTEGER NOT NULL,
    request_fingerprint TEXT NOT NULL,
    reply_text TEXT NOT NULL,
    reply_model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    duration_s REAL NOT NULL,
    created REAL NOT NULL
);
-- Rendered-request memo: what a trajectory renders to (its fingerprint and preprocessing notes),
-- keyed by the inputs of rendering, so a fully cached item needs no image work at all.
CREATE TABLE IF NOT EXISTS requests (
    memo_key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    notes TEXT NOT NULL,
    created REAL NOT NULL
);
-- Batches submitted by `judgeloop eval --batch` (and `confirm --batch`), recorded before submission
-- (batch_id NULL until the provider answers) so the same command after a kill collects them.
-- custom_ids: JSON list of the judge-call cache keys the batch answers.
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    provider TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    batch_id TEXT,
    status TEXT NOT NULL,
    custom_ids TEXT NOT NULL,
    estimate_usd REAL NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
"""


def _normal_url(url: str) -> str:
    """``url`` as one spelling per server: scheme and host lower-case, a default port dropped, no
    credentials, query, fragment or trailing slash."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:  # not a number: keep the text as given, still one key per spelling
        port = None
        host = parts.netloc.rpartition("@")[2].lower()
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    return f"{scheme}://{host}{parts.path.rstrip('/')}"


def endpoint_of(base_url: str | None, default: str | None) -> str | None:
    """The endpoint as the cache keys it: None for the provider's default endpoint (no base URL, or
    one naming the default), else the normalised base URL."""
    if not base_url:
        return None
    normal = _normal_url(base_url)
    return None if default and normal == _normal_url(default) else normal


def provider_endpoint(provider: object) -> str | None:
    """The endpoint of ``provider`` as the cache keys it (see `endpoint_of`). A provider without a
    default endpoint of its own (the local judge, whose server takes a new port each start, test
    doubles) has none: its model name says everything. Several replicas (``[judge] base_urls``) are
    keyed as the whole set, each normalised, sorted and space-separated: any of them may answer an item
    (its ring owner, or another once that one is drained), so replacing one is a new endpoint."""
    default = getattr(provider, "default_base_url", None)
    if not isinstance(default, str):
        return None
    urls = getattr(provider, "base_urls", None)
    if isinstance(urls, tuple) and len(urls) > 1:
        return " ".join(sorted({_normal_url(str(url)) for url in urls}))
    base_url = getattr(provider, "base_url", None)
    return endpoint_of(base_url if isinstance(base_url, str) else None, default)


def cache_key(
    *,
    provider: str,
    model: str,
    sampling: Sampling,
    schema: dict[str, Any],
    request: JudgeRequest | str,
    replicate: int,
    endpoint: str | None = None,
    member: str | None = None,
) -> str:
    """sha256 (hex) over a stable JSON of everything that determines one judge call.

    ``request`` is a `JudgeRequest` or its precomputed ``fingerprint()``. ``endpoint`` (from
    `provider_endpoint`) is where the calls go when that is not the provider's default: two servers
    may serve different weights under one model name. It is left out of the key material for the
    default endpoint, so entries cached before endpoints were keyed still hit there. ``member``: the
    panel member making the call (judge.toml [panel]); left out for the single judge, whose keys are
    as they were before panels existed.
    """
    fingerprint = request if isinstance(request, str) else request.fingerprint()
    payload: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "provider": provider,
        "model": model,
        "sampling": sampling.as_dict(),
        "schema": schema,
        "request": fingerprint,
        "replicate": replicate,
    }
    if endpoint is not None:
        payload["endpoint"] = endpoint
    if member is not None:
        payload["member"] = member
    return hashlib.sha256(stable_json(payload).encode()).hexdigest()


@dataclass(frozen=True)
class CachedCall:
    """A stored judge call: the raw reply text and what it cost when it was made."""

    key: str
    provider: str
    model: str
    replicate: int
    reply_text: str
    reply_model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    duration_s: float
    created: float


def cached_usage(hit: CachedCall) -> Usage:
    """A cached call's usage as it was when the call was made."""
    return Usage(
        calls=1,
        input_tokens=hit.input_tokens,
        output_tokens=hit.output_tokens,
        cache_read_tokens=hit.cache_read_tokens,
        cache_write_tokens=hit.cache_write_tokens,
        cost_usd=hit.cost_usd,
    )


@dataclass(frozen=True)
class NewCall:
    """One answered judge call to store (`JudgeCache.put`): who answered which replicate of which
    request, the reply, and what it cost when made (tokens; US dollars; seconds)."""

    provider: str
    model: str
    replicate: int
    request_fingerprint: str
    reply_text: str
    reply_model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0


@dataclass(frozen=True)
class CacheStats:
    entries: int
    cost_usd: float  # what the stored calls cost when they were made
    hits: int  # lookups answered by this JudgeCache object
    misses: int
    writes: int


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _faults_mapped(
    method: Callable[Concatenate[JudgeCache, _P], _R],
) -> Callable[Concatenate[JudgeCache, _P], _R]:
    """``method`` with a corrupt file, a full disk or a read-only folder as one-line UserErrors."""

    @functools.wraps(method)
    def mapped(self: JudgeCache, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise self._fault(exc) or exc from None

    return mapped


def _batch_record(row: tuple[Any, ...]) -> BatchRecord:
    """A ``batches`` row (id, provider, endpoint, model, batch_id, status, custom_ids, estimate_usd)."""
    return BatchRecord(
        record_id=row[0],
        provider=row[1],
        endpoint=row[2],
        model=row[3],
        batch_id=row[4],
        status=batch_status(row[5]),
        custom_ids=tuple(json.loads(row[6])),
        estimate_usd=row[7],
    )


class JudgeCache:
    """SQLite judge-call cache; `get`, `put`, `stats`. Safe to use from several threads."""

    @_faults_mapped
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage.os_fault(exc, self.path.parent) or exc from None
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.writes = 0
        conn = self._conn()
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if version is None:
            with conn:
                conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
        elif int(version[0]) > SCHEMA_VERSION:
            raise UserError(
                f"{self.path} was written by a newer judgeloop (cache schema {version[0]}); "
                "upgrade judgeloop or move the file away"
            )

    def _fault(self, exc: sqlite3.Error) -> UserError | None:
        return storage.sqlite_fault(
            exc,
            self.path,
            "the judge-call cache",
            "move it aside (judgeloop then starts an empty cache, and calls it held are paid for again); "
            "judgeloop never deletes it",
        )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=30.0)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
            except sqlite3.DatabaseError as exc:
                fault = self._fault(exc)
                if fault is not None:
                    raise fault from None
                raise UserError(
                    f"{self.path}: cannot open the judge-call cache ({exc}); move the file away"
                ) from None
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    @_faults_mapped
    def get(self, key: str) -> CachedCall | None:
        """The stored call for ``key``, or None. Counts a hit or a miss."""
        row = (
            self._conn()
            .execute(
                "SELECT key, provider, model, replicate, reply_text, reply_model, input_tokens, output_tokens,"
                " cache_read_tokens, cache_write_tokens, cost_usd, duration_s, created FROM calls WHERE key=?",
                (key,),
            )
            .fetchone()
        )
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return CachedCall(*row)

    @_faults_mapped
    def get_many(self, keys: list[str]) -> dict[str, CachedCall]:
        """Every stored call among ``keys`` in one query (no hit/miss counting)."""
        found: dict[str, CachedCall] = {}
        conn = self._conn()
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                "SELECT key, provider, model, replicate, reply_text, reply_model, input_tokens, output_tokens,"
                f" cache_read_tokens, cache_write_tokens, cost_usd, duration_s, created FROM calls WHERE key IN ({marks})",
                chunk,
            ):
                found[row[0]] = CachedCall(*row)
        return found

    @_faults_mapped
    def put(self, key: str, new: NewCall) -> CachedCall:
        """Store one model output (one transaction). An existing row for ``key`` is replaced."""
        call = CachedCall(
            key=key,
            provider=new.provider,
            model=new.model,
            replicate=new.replicate,
            reply_text=new.reply_text,
            reply_model=new.reply_model,
            input_tokens=new.input_tokens,
            output_tokens=new.output_tokens,
            cache_read_tokens=new.cache_read_tokens,
            cache_write_tokens=new.cache_write_tokens,
            cost_usd=new.cost_usd,
            duration_s=new.duration_s,
            created=time.time(),
        )
        conn = self._conn()
        with conn:
            conn.execute(
                "INSERT OR REPLACE INTO calls (key, provider, model, replicate, request_fingerprint, reply_text,"
                " reply_model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd,"
                " duration_s, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    key,
                    call.provider,
                    call.model,
                    call.replicate,
                    new.request_fingerprint,
                    call.reply_text,
                    call.reply_model,
                    call.input_tokens,
                    call.output_tokens,
                    call.cache_read_tokens,
                    call.cache_write_tokens,
                    call.cost_usd,
                    call.duration_s,
                    call.created,
                ),
            )
        self.writes += 1
        return call

    @_faults_mapped
    def get_request(self, memo_key: str) -> tuple[str, tuple[str, ...]] | None:
        """The memoised (request fingerprint, notes) for ``memo_key``, or None."""
        row = (
            self._conn()
            .execute("SELECT fingerprint, notes FROM requests WHERE memo_key=?", (memo_key,))
            .fetchone()
        )
        if row is None:
            return None
        return row[0], tuple(json.loads(row[1]))

    @_faults_mapped
    def put_request(self, memo_key: str, fingerprint: str, notes: tuple[str, ...]) -> None:
        """Remember what the rendering inputs ``memo_key`` render to."""
        conn = self._conn()
        with conn:
            conn.execute(
                "INSERT OR REPLACE INTO requests (memo_key, fingerprint, notes, created) VALUES (?,?,?,?)",
                (memo_key, fingerprint, json.dumps(list(notes)), time.time()),
            )

    # -- the batch store of `eval --batch` (see `optimizer.evaluation.batch.BatchStore`) --------------

    @_faults_mapped
    def record_batch(
        self, *, provider: str, endpoint: str, model: str, custom_ids: list[str], estimate_usd: float
    ) -> int:
        """Record a batch about to be submitted (status ``submitting``); its record id."""
        now = time.time()
        conn = self._conn()
        with conn:
            cur = conn.execute(
                "INSERT INTO batches (provider, endpoint, model, batch_id, status, custom_ids, estimate_usd, created,"
                " updated) VALUES (?,?,?,NULL,'submitting',?,?,?,?)",
                (provider, endpoint, model, json.dumps(custom_ids), estimate_usd, now, now),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    @_faults_mapped
    def update_batch(self, record_id: int, *, status: BatchStatus, batch_id: str | None = None) -> None:
        """Set a recorded batch's status (and its provider id, once known)."""
        conn = self._conn()
        with conn:
            conn.execute(
                "UPDATE batches SET status=?, batch_id=COALESCE(?, batch_id), updated=? WHERE id=?",
                (status, batch_id, time.time(), record_id),
            )

    @_faults_mapped
    def open_batches(self, *, provider: str, endpoint: str, model: str) -> list[BatchRecord]:
        """Batches recorded for this provider, endpoint and model and not yet collected, oldest first."""
        marks = ",".join("?" * len(OPEN_BATCH_STATUSES))
        rows = (
            self._conn()
            .execute(
                "SELECT id, provider, endpoint, model, batch_id, status, custom_ids, estimate_usd FROM batches"
                f" WHERE provider=? AND endpoint=? AND model=? AND status IN ({marks}) ORDER BY id",
                (provider, endpoint, model, *OPEN_BATCH_STATUSES),
            )
            .fetchall()
        )
        return [_batch_record(r) for r in rows]

    @_faults_mapped
    def batches(self) -> list[BatchRecord]:
        """Every recorded batch, oldest first."""
        rows = (
            self._conn()
            .execute(
                "SELECT id, provider, endpoint, model, batch_id, status, custom_ids, estimate_usd FROM batches"
                " ORDER BY id"
            )
            .fetchall()
        )
        return [_batch_record(r) for r in rows]

    @_faults_mapped
    def stats(self) -> CacheStats:
        """Rows stored, their original total cost, and this object's hit/miss/write counters."""
        entries, cost = (
            self._conn().execute("SELECT COUNT(*), COALESCE(SUM(cost_usd), 0) FROM calls").fetchone()
        )
        return CacheStats(
            entries=entries, cost_usd=float(cost), hits=self.hits, misses=self.misses, writes=self.writes
        )

    @_faults_mapped
    def cost_since(self, created_after: float) -> float:
        """Summed original cost (US dollars) of the calls stored at or after ``created_after`` (seconds
        since the epoch, as ``time.time()``): what was paid since then, e.g. before a crash."""
        row = (
            self._conn()
            .execute("SELECT COALESCE(SUM(cost_usd), 0) FROM calls WHERE created >= ?", (created_after,))
            .fetchone()
        )
        return float(row[0])

    def close(self) -> None:
        """Close every connection this object opened (call from the owning thread at the end)."""
        with self._lock:
            conns, self._connections = self._connections, []
        for conn in conns:
            # A connection made in another thread refuses close() from here; it closes with its thread.
            with contextlib.suppress(sqlite3.ProgrammingError):
                conn.close()
        self._local = threading.local()

    def __enter__(self) -> JudgeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
