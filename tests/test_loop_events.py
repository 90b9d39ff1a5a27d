"""The loop's typed events (`optimizer.events`): what the ledger stores parses back to the same typed
event, and a follower (the TUI's live strip) reads the feed through that one parser, so a row it
cannot read is skipped instead of ending the follower."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from optimizer.events import (
    CandidateDecided,
    CandidateProposed,
    DecisionRecorded,
    Event,
    GuardRejected,
    Judged,
    PassProgress,
    RunStatusChanged,
    RunStopped,
    StageChanged,
    StopKind,
    StopReason,
    read_event,
)
from optimizer.ledger import Ledger, RunSpec
from optimizer.loop.session import RunOptions, start_run
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge
from tui.watch import LedgerWatcher, LiveState


def _insert_raw(path: Path, run_id: str, experiment_id: int | None, kind: str, payload: str) -> None:
    """A row written beside the ledger's API (anyone with a shell can): what a follower must survive."""
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO events (run_id, experiment_id, created, kind, payload) VALUES (?, ?, ?, ?, ?)",
            (run_id, experiment_id, "2025-01-01T00:00:00+00:00", kind, payload),
        )


def test_live_strip_skips_an_event_row_it_cannot_read_and_follows_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = ledger.create_run(
            RunSpec(strategy="fake", policy="paired", split="dev", split_fingerprint="f", start_rev="0" * 40)
        )
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


@pytest.mark.slow
def test_a_runs_feed_reads_back_as_the_typed_events_it_was_written_from(ws: Path) -> None:
    """A real run (the library strategy against the fake judge): every row of its feed parses, the
    loop's own rows (stage, progress) are exactly their typed payloads (the JSON older versions wrote),
    and what a listener heard agrees with the ledger: one `CandidateDecided` per decided candidate, then
    `RunStopped` with the run's recorded stop."""
    events: list[Event] = []
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        judge = JudgeOverrides(
            provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
        )
        outcome = start_run(
            Workspace.open(ws), RunOptions(strategy="library", judge=judge, max_experiments=2), events.append
        )
    with Ledger.open_readonly(ws / "experiments" / "ledger.sqlite") as ledger:
        rows = ledger.events_since(0, run_id=outcome.run_id)
        exps = {e.id: e for e in ledger.experiments(outcome.run_id)}
        run = ledger.get_run(outcome.run_id)
    typed = [(row, row.typed()) for row in rows]
    assert all(event is not None and event.kind == row.kind for row, event in typed)
    for row, event in typed:
        if isinstance(event, StageChanged | PassProgress):
            assert event.payload() == row.payload
        if isinstance(event, DecisionRecorded):
            assert row.experiment_id is not None and event.status == exps[row.experiment_id].status
    assert {type(e) for _, e in typed} >= {StageChanged, PassProgress, DecisionRecorded, RunStatusChanged}
    decided = [e for e in events if isinstance(e, CandidateDecided)]
    assert [(d.experiment_id, d.status) for d in decided] == [
        (e.id, e.status) for e in exps.values() if e.seq > 0 and e.status in ("kept", "rolled_back", "error")
    ]
    stopped = [e for e in events if isinstance(e, RunStopped)]
    assert (
        len(stopped) == 1 and stopped[0].stop.message == run.stop_reason and stopped[0].status == run.status
    )


def test_the_terminal_prints_a_typed_event_as_the_line_it_printed_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from optimizer.cli.progress import TerminalEvents

    with TerminalEvents(progress=False) as terminal:
        terminal(GuardRejected(7, "a file outside the allowed set: judge.toml"))
        terminal(CandidateDecided(8, "kept", "kappa up", judged=Judged(12, 3, 0.01234), cheaper=True))
        terminal(CandidateDecided(9, "rolled_back", "no gain", judged=Judged(4, 0, 0.5)))
        terminal(CandidateDecided(10, "error", "not decided: budget; rolled back"))
        terminal(
            CandidateDecided(11, "waiting", "would keep it: kappa up", policy="paired", commit_sha="a" * 40)
        )
        terminal(CandidateProposed(12, 5, "library", ("prompts/rubric.md",), 3, 1))  # silent
        terminal(RunStopped("r1", "finished", StopReason(StopKind.PATIENCE, "no keep in 5 candidates")))
        terminal(
            RunStopped("r2", "waiting", StopReason(StopKind.WAITING, "w"), waiting_for=4, spent_usd=0.25)
        )
    assert capsys.readouterr() == (
        "  experiment 7: rejected by the guards: a file outside the allowed set: judge.toml\n"
        "  experiment 8: KEPT (cheaper, not worse) — kappa up (calls=12, cached=3, $0.0123)\n"
        "  experiment 9: rolled back — no gain (calls=4, cached=0, $0.5000)\n"
        "  experiment 10: not decided: budget; rolled back\n"
        "  experiment 11: evaluated; the paired policy would keep it: kappa up "
        f"(review it: `git show {'a' * 12}`, `judgeloop tui`)\n"
        "run r1 finished: no keep in 5 candidates\n"
        "run r2 waiting: experiment 4 waits for your decision: `judgeloop decide 4 keep|discard`; spent $0.2500\n",
        "",
    )


def test_a_kind_this_version_does_not_know_reads_as_none() -> None:
    assert read_event("candidate_scored", {"x": 1}) is None
    assert read_event("progress", {"done": "many"}) is None
    assert read_event("stage", {"stage": "guards", "future_field": 1}) == StageChanged("guards")
