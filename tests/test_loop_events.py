"""The loop's typed events (`optimizer.events`): what the ledger stores parses back to the same typed
event, and a follower (the TUI's live strip) reads the feed through that one parser, so a row it
cannot read is skipped instead of ending the follower."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from optimizer.ledger import Ledger
from tui.watch import LedgerWatcher, LiveState


def _insert_raw(path: Path, run_id: str, experiment_id: int | None, kind: str, payload: str) -> None:
    """A row written beside the ledger's API (anyone with a shell can): what a follower must survive."""
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO events (run_id, experiment_id, created, kind, payload) VALUES (?, ?, ?, ?, ?)",
                   (run_id, experiment_id, "2025-01-01T00:00:00+00:00", kind, payload))


def test_live_strip_skips_an_event_row_it_cannot_read_and_follows_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = ledger.create_run(strategy="fake", policy="paired", split="dev", split_fingerprint="f",
                                start_rev="0" * 40)
        exp = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", seq=0)
    _insert_raw(path, run.id, exp.id, "progress", json.dumps({"done": "many", "total": [88]}))
    _insert_raw(path, run.id, exp.id, "stage", json.dumps(["evaluating"]))
    _insert_raw(path, run.id, exp.id, "progress", json.dumps({"done": 3, "total": 88, "errors": 1}))
    seen: list[LiveState] = []

    def on_state(state: LiveState) -> None:
        seen.append(state)
        watcher.stop()  # one snapshot is enough: `run` returns after it, in this thread

    def on_error(exc: Exception) -> None:
        raise AssertionError(f"the watcher gave up: {exc}")

    watcher = LedgerWatcher(path, on_state, on_error=on_error, interval_s=0.0)
    watcher.run()  # the watcher thread's own body, run here
    assert len(seen) == 1
    line = seen[0].line()
    assert f"run {run.id}" in line and "judged 3/88" in line and "1 errors" in line, line
