"""The ledger's SQLite schema and its upgrades: the DDL of every table, the schema version, and the
steps that bring an older ledger up to it (see `optimizer.ledger` for what each table holds and
which version added what). Pure SQL text and cursor steps; the connection lives in `Ledger`.
"""

from __future__ import annotations

import json
import re
import sqlite3

from optimizer.vocab import (
    EVENT_KINDS,
    EXPERIMENT_STATUSES,
    REVIEW_KINDS,
    RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
)

SCHEMA_VERSION = 13
# Schema 4: the adaptive policy's record of each decision (see optimizer.stats.decision.AdaptiveTest).
V4_EXPERIMENT_COLUMNS = (
    ("adaptive_keep", "INTEGER"),
    ("alpha", "REAL"),
    ("test", "TEXT"),
    ("rejudge_calls", "INTEGER NOT NULL DEFAULT 0"),
    ("rejudge_cost_usd", "REAL NOT NULL DEFAULT 0"),
)
# Schema 5: the batches table (batch evaluation, see optimizer.evaluation.batch).
# Schema 6: the judge's prompt-cache reads and writes per experiment.
# Schema 8: the cache reads the experiment's passes planned (vs billed: cache_read_tokens).
# Schema 9 (one step for the additions of one release): runs.labels_fingerprint, the label set (given or
# corrected) a run decides with; verdicts.members, a panel's member verdicts behind each replicate (JSON;
# NULL: single judge); verdicts.detail, a criteria verdict's criteria, evidence steps and review (JSON);
# experiments.keep_kind ("improved" | "cheaper") and experiments.verdict_cost_usd, the cost per verdict;
# the endpoint_passes table (per pass, per [judge] base_urls endpoint: what it served).

_V9_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("runs", "labels_fingerprint", "TEXT"),
    ("verdicts", "members", "TEXT"),
    ("verdicts", "detail", "TEXT"),
    ("experiments", "keep_kind", "TEXT"),
    ("experiments", "verdict_cost_usd", "REAL"),
)
# Schema 10: who decided each experiment, and what its policy said (`optimizer.loop.trust`): policy_keep
# (1 keep, 0 roll back, NULL: no policy decision), policy_reason, decided_by (`optimizer.vocab.DecidedBy`).
_V10_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("experiments", "policy_keep", "INTEGER"),
    ("experiments", "policy_reason", "TEXT"),
    ("experiments", "decided_by", "TEXT"),
)
# Schema 11: what each `confirm` measured (issue 35): the held-out split's benchmark (its import format),
# its fingerprint and its item ids (JSON), so confirmations are rationed by item and a certificate can
# tell a confirmation on another benchmark (transfer evidence) from one on the dev split's own.
_V11_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("confirmations", "benchmark", "TEXT"),
    ("confirmations", "fingerprint", "TEXT"),
    ("confirmations", "items", "TEXT"),
)
# Schema 12: stacking ([loop] stack, optimizer.loop.stack): pooled_on, the incumbent experiment a rolled-back
# candidate that pointed the right way was pooled on (NULL: not pooled), written with its decision.
_V12_COLUMNS: tuple[tuple[str, str, str], ...] = (("experiments", "pooled_on", "INTEGER"),)
# Schema 13: the policy's reason as data (`optimizer.stats.rules.Reason`, JSON): policy_why (NULL: no policy
# decided, or a row decided before it; such a row's policy_reason text is read instead).
_V13_COLUMNS: tuple[tuple[str, str, str], ...] = (("experiments", "policy_why", "TEXT"),)

# The names (statuses, kinds) are `optimizer.vocab`'s; the CHECK constraints below are generated from
# its tuples, so an unchanged set keeps the same schema text (no migration).
_TERMINAL_RUN_STATUSES = TERMINAL_RUN_STATUSES
FLIP_KEYS: tuple[str, ...] = ("tp_to_fn", "fn_to_tp", "tn_to_fp", "fp_to_tn")


def _in(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


# Batches a run sent through a provider's batch API (`judgeloop run --batch`), recorded before
# submission (batch_id NULL until the provider answers) so `run --resume` collects them instead of
# submitting again. custom_ids: JSON list of the judge-call cache keys the batch answers.
_BATCHES = """
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    experiment_id INTEGER,
    provider TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    batch_id TEXT,
    status TEXT NOT NULL,
    custom_ids TEXT NOT NULL,
    estimate_usd REAL NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
"""


_SCHEMA = f"""
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    finished TEXT,
    status TEXT NOT NULL CHECK (status IN {_in(RUN_STATUSES)}),
    strategy TEXT NOT NULL,
    policy TEXT NOT NULL,
    split TEXT NOT NULL,
    split_fingerprint TEXT NOT NULL,
    start_rev TEXT NOT NULL,
    branch TEXT NOT NULL,
    incumbent_experiment INTEGER,
    budgets TEXT NOT NULL DEFAULT '{{}}',
    config TEXT NOT NULL DEFAULT '{{}}',
    pid INTEGER,
    host TEXT,
    stop_reason TEXT,
    labels_fingerprint TEXT
);
CREATE TABLE experiments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    parent_id INTEGER REFERENCES experiments(id),
    strategy TEXT,
    created TEXT NOT NULL,
    finished TEXT,
    status TEXT NOT NULL CHECK (status IN {_in(EXPERIMENT_STATUSES)}),
    commit_sha TEXT,
    files_changed TEXT NOT NULL DEFAULT '[]',
    insertions INTEGER,
    deletions INTEGER,
    diff_text TEXT,
    rationale TEXT,
    metrics TEXT,
    intervals TEXT,
    flips TEXT,
    p_value REAL,
    literal_keep INTEGER,
    paired_keep INTEGER,
    decision TEXT,
    reason TEXT,
    early_stopped INTEGER NOT NULL DEFAULT 0,
    items_evaluated INTEGER NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    cache_hits INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    duration_s REAL,
    prompt_hash TEXT,
    optimizer_calls INTEGER NOT NULL DEFAULT 0,
    optimizer_input_tokens INTEGER NOT NULL DEFAULT 0,
    optimizer_output_tokens INTEGER NOT NULL DEFAULT 0,
    optimizer_cost_usd REAL NOT NULL DEFAULT 0,
    proposal_meta TEXT,
    adaptive_keep INTEGER,
    alpha REAL,
    test TEXT,
    rejudge_calls INTEGER NOT NULL DEFAULT 0,
    rejudge_cost_usd REAL NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    planned_cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    keep_kind TEXT,
    verdict_cost_usd REAL,
    policy_keep INTEGER,
    policy_reason TEXT,
    decided_by TEXT,
    pooled_on INTEGER,
    policy_why TEXT,
    UNIQUE (run_id, seq)
);
CREATE INDEX experiments_by_run ON experiments (run_id, seq);
CREATE TABLE items (
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    trajectory_id TEXT NOT NULL,
    success INTEGER,
    status TEXT NOT NULL,
    mistake_type TEXT,
    unstable INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (experiment_id, trajectory_id)
) WITHOUT ROWID;
CREATE TABLE verdicts (
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    trajectory_id TEXT NOT NULL,
    replicate INTEGER NOT NULL,
    success INTEGER,
    status TEXT NOT NULL,
    reasoning TEXT,
    confidence TEXT,
    mistake_type TEXT,
    raw TEXT,
    cached INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    tools TEXT,
    members TEXT,
    detail TEXT,
    PRIMARY KEY (experiment_id, trajectory_id, replicate)
) WITHOUT ROWID;
CREATE TABLE run_labels (
    run_id TEXT NOT NULL REFERENCES runs(id),
    trajectory_id TEXT NOT NULL,
    positive INTEGER NOT NULL,
    mistake_type TEXT,
    PRIMARY KEY (run_id, trajectory_id)
) WITHOUT ROWID;
CREATE TABLE reviews (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    experiment_id INTEGER REFERENCES experiments(id),
    trajectory_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN {_in(REVIEW_KINDS)}),
    note TEXT NOT NULL DEFAULT '',
    author TEXT NOT NULL DEFAULT ''
);
CREATE INDEX reviews_by_item ON reviews (trajectory_id);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT,
    experiment_id INTEGER,
    created TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN {_in(EVENT_KINDS)}),
    payload TEXT NOT NULL DEFAULT '{{}}'
);
CREATE INDEX events_by_run ON events (run_id, id);
CREATE TABLE confirmations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT,
    split TEXT NOT NULL,
    created TEXT NOT NULL,
    revision TEXT NOT NULL,
    metrics TEXT NOT NULL DEFAULT '{{}}',
    benchmark TEXT,
    fingerprint TEXT,
    items TEXT
);
{_BATCHES}"""
# Schema 7 (`judgeloop attribute`): created with a new ledger and by the 6 → 7 upgrade step.
_ATTRIBUTION_SCHEMA = """
CREATE TABLE IF NOT EXISTS attributions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    scope TEXT NOT NULL,
    final_commit TEXT NOT NULL,
    baseline_commit TEXT NOT NULL,
    split TEXT NOT NULL,
    judge TEXT NOT NULL,
    replicates INTEGER NOT NULL,
    rejudge INTEGER NOT NULL,
    alpha REAL NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    status TEXT NOT NULL,
    note TEXT,
    cost_usd REAL NOT NULL DEFAULT 0,
    final_vs_baseline TEXT
);
CREATE INDEX IF NOT EXISTS attributions_by_run ON attributions (run_id, id);
CREATE TABLE IF NOT EXISTS attribution_edits (
    attribution_id INTEGER NOT NULL REFERENCES attributions(id),
    experiment_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    result TEXT NOT NULL,
    PRIMARY KEY (attribution_id, experiment_id)
) WITHOUT ROWID;
"""


# Schema 9: one row per evaluation pass (first pass, each side's re-judging) and endpoint of
# [judge] base_urls: calls answered, prompt tokens, of them cached, failed calls, drained (1/0).
_ENDPOINT_PASSES = """
CREATE TABLE IF NOT EXISTS endpoint_passes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    pass INTEGER NOT NULL,
    endpoint TEXT NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    drained INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS endpoint_passes_by_experiment ON endpoint_passes (experiment_id, pass);
"""


def create_schema(cur: sqlite3.Cursor) -> None:
    """Create every table of a new ledger and stamp it with `SCHEMA_VERSION` (inside the caller's transaction)."""
    for statement in (_SCHEMA + _ATTRIBUTION_SCHEMA + _ENDPOINT_PASSES).split(";"):
        if statement.strip():
            cur.execute(statement)
    cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def upgrade_schema(cur: sqlite3.Cursor) -> None:
    """Step an older ledger up to `SCHEMA_VERSION`, one version at a time (inside the caller's
    transaction; the version is re-read under the write lock: another writer may have upgraded it)."""
    current = cur.execute("PRAGMA user_version").fetchone()[0]
    if current == 1:
        cur.execute("ALTER TABLE verdicts ADD COLUMN tools TEXT")
        current = 2
    if current == 2:
        for column, decl in (
            ("optimizer_calls", "INTEGER NOT NULL DEFAULT 0"),
            ("optimizer_input_tokens", "INTEGER NOT NULL DEFAULT 0"),
            ("optimizer_output_tokens", "INTEGER NOT NULL DEFAULT 0"),
            ("optimizer_cost_usd", "REAL NOT NULL DEFAULT 0"),
            ("proposal_meta", "TEXT"),
        ):
            cur.execute(f"ALTER TABLE experiments ADD COLUMN {column} {decl}")
        _backfill_library_meta(cur)
        current = 3
    if current == 3:
        for column, decl in V4_EXPERIMENT_COLUMNS:
            cur.execute(f"ALTER TABLE experiments ADD COLUMN {column} {decl}")
        current = 4
    if current == 4:
        cur.execute(_BATCHES)
        current = 5
    if current == 5:
        for column in ("cache_read_tokens", "cache_write_tokens"):
            cur.execute(f"ALTER TABLE experiments ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
        current = 6
    if current == 6:
        for statement in _ATTRIBUTION_SCHEMA.split(";"):
            if statement.strip():
                cur.execute(statement)
        current = 7
    if current == 7:
        cur.execute("ALTER TABLE experiments ADD COLUMN planned_cache_read_tokens INTEGER NOT NULL DEFAULT 0")
        current = 8
    if current == 8:
        # Each column checked first: a ledger stepped down by hand (the tests' old ledgers) may keep some.
        for table, column, sql_type in _V9_COLUMNS:
            if column not in {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        for statement in _ENDPOINT_PASSES.split(";"):
            if statement.strip():
                cur.execute(statement)
        current = 9
    if current == 9:
        for table, column, sql_type in _V10_COLUMNS:
            if column not in {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        current = 10
    if current == 10:
        for table, column, sql_type in _V11_COLUMNS:
            if column not in {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        current = 11
    if current == 11:
        for table, column, sql_type in _V12_COLUMNS:
            if column not in {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        current = 12
    if current == 12:
        for table, column, sql_type in _V13_COLUMNS:
            if column not in {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        current = 13
    cur.execute(f"PRAGMA user_version = {current}")


_OLD_LIBRARY_TAG = re.compile(r"\[library: [^\]]*?-> enabled \{([^}]*)\}\]")


def _backfill_library_meta(cur: sqlite3.Cursor) -> None:
    """Give library experiments of a pre-schema-3 ledger their ``proposal_meta`` from the old tag, so
    a run resumed across the upgrade still never proposes a set it already tried."""
    rows = cur.execute(
        "SELECT id, rationale FROM experiments WHERE strategy = 'library' AND rationale LIKE '%[library: %'"
    ).fetchall()
    for experiment_id, rationale in rows:
        tags = _OLD_LIBRARY_TAG.findall(rationale)
        if tags:
            enabled = sorted(x.strip() for x in tags[-1].split(",") if x.strip())
            cur.execute(
                "UPDATE experiments SET proposal_meta = ? WHERE id = ?",
                (
                    json.dumps({"library_enabled": enabled}, separators=(",", ":"), sort_keys=True),
                    experiment_id,
                ),
            )
