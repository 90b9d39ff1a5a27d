from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from optimizer.errors import UserError
from optimizer.events import PassProgress
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import JudgeToolCall
from optimizer.ledger import (
    SCHEMA_VERSION,
    AttributionSpec,
    ExperimentOutcome,
    ItemVerdict,
    LabelRow,
    Ledger,
    ProposedEdit,
    ReplicateVerdict,
    Run,
    RunSpec,
    new_run_id,
)


def _run(ledger: Ledger, *, run_id: str | None = None, **kw: Any) -> Run:
    args: dict[str, Any] = dict(
        strategy="library", policy="paired", split="sample", split_fingerprint="fp", start_rev="abc123")
    args.update(kw)
    return ledger.create_run(RunSpec(**args), run_id=run_id)


def _item(tid: str, success: bool | None, reps: int = 3) -> ItemVerdict:
    return ItemVerdict(
        trajectory_id=tid,
        success=success,
        status="ok" if success is not None else "invalid",
        unstable=reps > 1 and tid.endswith("u"),
        replicates=[
            ReplicateVerdict(replicate=r, success=success, reasoning=f"why {tid} {r}", confidence="high", cached=r == 0)
            for r in range(reps)
        ],
    )


def test_new_run_id_has_the_documented_shape() -> None:
    rid = new_run_id()
    date, time, tail = rid.split("-")
    assert len(date) == 8 and len(time) == 6 and len(tail) == 4 and date.isdigit() and time.isdigit()


def test_run_and_experiment_round_trip(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger, budgets={"max_experiments": 3, "budget_usd": 1.5}, config={"loop": {"alpha": 0.1}})
        assert run.branch == f"judgeloop/{run.id}" and run.status == "running" and run.budgets["budget_usd"] == 1.5
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        assert base.seq == 0 and base.status == "running"
        ledger.record_decision(base.id, ExperimentOutcome(
            status="baseline", metrics={"kappa": 0.5, "fpr": 0.2, "balanced_accuracy": 0.7},
            intervals={"kappa": (0.4, 0.6)}, items_evaluated=5, usage=Usage(calls=10, cost_usd=0.25),
        ))
        cand = ledger.start_experiment(
            run.id,
            parent_id=base.id,
            strategy="library",
            commit_sha="b" * 40,
            edit=ProposedEdit(
                files_changed=["prompts/rubric.md"],
                insertions=3,
                deletions=1,
                diff_text="--- a\n+++ b\n",
                rationale="tighten the rubric",
            ),
        )
        assert cand.seq == 1
        ledger.record_decision(cand.id, ExperimentOutcome(
            status="kept", reason="kappa up", metrics={"kappa": 0.6, "fpr": 0.2},
            flips={"tp_to_fn": [], "fn_to_tp": ["x", "y"], "tn_to_fp": [], "fp_to_tn": ["z"]}, p_value=0.125,
            literal_keep=True, paired_keep=False, commit_sha="c" * 40,
        ))
        run = ledger.get_run(run.id)
        assert run.incumbent_experiment == cand.id

        got = ledger.get_experiment(cand.id)
        assert got.commit_sha == "c" * 40 and got.kappa == 0.6 and got.fpr == 0.2 and got.balanced_accuracy is None
        assert got.flip_counts() == {"tp_to_fn": 0, "fn_to_tp": 2, "tn_to_fp": 0, "fp_to_tn": 1}
        assert got.diff_text == "--- a\n+++ b\n" and got.rationale == "tighten the rubric"
        assert got.literal_keep is True and got.paired_keep is False and got.decision == "kept"
        listing = ledger.experiments(run.id)
        assert [e.seq for e in listing] == [0, 1]
        assert listing[1].diff_text is None  # the listing leaves bulky text out
        assert ledger.get_experiment(base.id).intervals == {"kappa": (0.4, 0.6)}
        assert [e.id for e in ledger.kept_chain(run.id)] == [base.id, cand.id]
        assert ledger.latest_run() == run


def test_rolled_back_experiment_does_not_move_the_incumbent(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None)
        ledger.record_decision(base.id, ExperimentOutcome(status="baseline"))
        bad = ledger.start_experiment(run.id, parent_id=base.id)
        ledger.record_decision(bad.id, ExperimentOutcome(status="rolled_back", reason="FPR rose", early_stopped=True))
        waiting = ledger.start_experiment(run.id, parent_id=base.id)
        ledger.record_decision(waiting.id, ExperimentOutcome(status="waiting", metrics={"kappa": 0.9}))
        assert ledger.get_run(run.id).incumbent_experiment == base.id
        assert [e.id for e in ledger.experiments_with_status("waiting", run.id)] == [waiting.id]
        decided = ledger.set_experiment_decision(waiting.id, status="kept", reason="human kept it")
        assert decided.kappa == 0.9 and decided.status == "kept"
        assert [e.id for e in ledger.kept_chain(run.id)] == [base.id, waiting.id]


def test_verdicts_round_trip_and_answers(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        n = ledger.record_verdicts(exp.id, [_item("t1", True), _item("t2u", False), _item("t3", None, reps=1)])
        assert n == 3
        items = ledger.item_verdicts(exp.id)
        assert [i.trajectory_id for i in items] == ["t1", "t2u", "t3"]
        assert items[1].unstable and len(items[0].replicates) == 3 and items[0].replicates[0].cached
        assert items[2].success is None and items[2].status == "invalid"
        one = ledger.item_verdicts(exp.id, "t2u")
        assert len(one) == 1 and one[0].replicates[2].reasoning == "why t2u 2"
        answers = ledger.item_answers(exp.id)
        assert answers["t1"].success is True and answers["t3"].success is None and answers["t3"].status == "invalid"
        # Recording an item again (after a resume) replaces it instead of failing or duplicating.
        ledger.record_verdicts(exp.id, [_item("t1", False)])
        assert ledger.item_answers(exp.id)["t1"].success is False
        assert len(ledger.item_verdicts(exp.id)) == 3


def test_labels_are_stored_apart_per_run(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        ledger.set_labels(run.id, [LabelRow(trajectory_id="t1", positive=True),
                                   LabelRow(trajectory_id="t2", positive=False, mistake_type="Bad Side Effect")])
        labels = ledger.labels(run.id)
        assert labels["t1"].positive and labels["t2"].mistake_type == "Bad Side Effect"
        assert ledger.labels("other") == {}


def test_newer_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    for opener in (Ledger, Ledger.open_readonly):
        with pytest.raises(UserError, match=rf"newer judgeloop \(schema {SCHEMA_VERSION + 1} > {SCHEMA_VERSION}\); upgrade"):
            opener(path)


AGENTIC_TOOLS = [
    JudgeToolCall("read_steps", {"first": 0, "last": 24}),
    JudgeToolCall("view_screenshots", {"steps": [3, 7]}),
    JudgeToolCall("frobnicate", {"x": 1}, "refused"),
    JudgeToolCall("submit_verdict"),
]


def test_tool_calls_are_stored_as_json_objects_and_old_trace_lines_are_read_as_the_same_calls(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        new, old = _item("t-new", True, reps=1), _item("t-old", True, reps=1)
        new.replicates[0].tools = old.replicates[0].tools = AGENTIC_TOOLS
        ledger.record_verdicts(exp.id, [new, old])
    conn = sqlite3.connect(path)
    [stored] = conn.execute("SELECT tools FROM verdicts WHERE trajectory_id = 't-new'").fetchone()
    assert json.loads(stored) == [
        {"name": "read_steps", "arguments": {"first": 0, "last": 24}},
        {"name": "view_screenshots", "arguments": {"steps": [3, 7]}},
        {"name": "frobnicate", "arguments": {"x": 1}, "outcome": "refused"},
        {"name": "submit_verdict"},
    ]
    # What judgeloop wrote (schema 2) before tool calls were data: the lines the TUI showed.
    lines = ["read_steps(0-24)", "view_screenshots(3, 7)", "frobnicate(…) (refused)", "submit_verdict"]
    conn.execute("UPDATE verdicts SET tools = ? WHERE trajectory_id = 't-old'", (json.dumps(lines),))
    conn.commit()
    conn.close()
    with Ledger.open_readonly(path) as ro:
        read = {i.trajectory_id: i.replicates[0].tools for i in ro.item_verdicts(exp.id)}
    assert read["t-new"] == AGENTIC_TOOLS
    assert [str(c) for c in read["t-old"]] == lines  # shown exactly as before
    assert read["t-old"][:2] == AGENTIC_TOOLS[:2] and read["t-old"][3] == AGENTIC_TOOLS[3]
    assert read["t-old"][2] == JudgeToolCall("frobnicate", None, "refused")  # its arguments were never stored


def test_a_version_1_ledger_is_read_as_is_and_upgraded_when_written(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_verdicts(exp.id, [_item("t1", True, reps=1)])
    conn = sqlite3.connect(path)  # what judgeloop with schema 1 wrote: no verdicts.tools column
    conn.execute("ALTER TABLE verdicts DROP COLUMN tools")
    _drop_schema_3_columns(conn)  # (nor what schema 3 added)
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 1")
    conn.close()

    with Ledger.open_readonly(path) as ro:  # the TUI on a ledger copied from an older install
        [item] = ro.item_verdicts(exp.id)
        assert item.replicates[0].reasoning == "why t1 0" and item.replicates[0].tools == []

    agentic = _item("t2", False, reps=1)
    agentic.replicates[0].tools = AGENTIC_TOOLS
    with Ledger(path) as ledger:  # a run writing to it upgrades it in place
        ledger.record_verdicts(exp.id, [agentic])
        tools = {i.trajectory_id: i.replicates[0].tools for i in ledger.item_verdicts(exp.id)}
    assert tools == {"t1": [], "t2": AGENTIC_TOOLS}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    assert conn.execute("SELECT COUNT(*) FROM attributions").fetchone()[0] == 0  # schema 7's tables exist
    conn.close()


SCHEMA_3_COLUMNS = ("optimizer_calls", "optimizer_input_tokens", "optimizer_output_tokens", "optimizer_cost_usd",
                    "proposal_meta")


SCHEMA_4_COLUMNS = ("adaptive_keep", "alpha", "test", "rejudge_calls", "rejudge_cost_usd")
SCHEMA_6_COLUMNS = ("cache_read_tokens", "cache_write_tokens")
SCHEMA_8_COLUMNS = ("planned_cache_read_tokens",)
SCHEMA_9_COLUMNS = ("keep_kind", "verdict_cost_usd")


def _drop_schema_4_columns(conn: sqlite3.Connection) -> None:
    """Drop what schema 4 added, and what schemas 6 and 8 added (every older ledger lacks those too)."""
    for column in SCHEMA_4_COLUMNS + SCHEMA_6_COLUMNS + SCHEMA_8_COLUMNS + SCHEMA_9_COLUMNS:
        conn.execute(f"ALTER TABLE experiments DROP COLUMN {column}")


def _drop_schema_3_columns(conn: sqlite3.Connection) -> None:
    _drop_schema_4_columns(conn)
    for column in SCHEMA_3_COLUMNS:
        conn.execute(f"ALTER TABLE experiments DROP COLUMN {column}")


def test_a_version_5_ledger_reads_no_cache_tokens_and_is_upgraded_when_written(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        ledger.record_decision(base.id, ExperimentOutcome(
            status="baseline", usage=Usage(calls=10, input_tokens=5000, cost_usd=0.25),
        ))
    conn = sqlite3.connect(path)  # what a schema-5 judgeloop wrote: no prompt-cache token columns
    for column in SCHEMA_6_COLUMNS + SCHEMA_8_COLUMNS + SCHEMA_9_COLUMNS:
        conn.execute(f"ALTER TABLE experiments DROP COLUMN {column}")
    conn.execute("DROP TABLE attribution_edits")
    conn.execute("DROP TABLE attributions")
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 5")
    conn.close()

    with Ledger.open_readonly(path) as ro:
        old = ro.get_experiment(base.id)
    assert (old.input_tokens, old.cache_read_tokens, old.cache_write_tokens) == (5000, 0, 0)
    with Ledger(path) as ledger:
        cand = ledger.start_experiment(run.id, parent_id=base.id, strategy="library")
        ledger.record_decision(cand.id, ExperimentOutcome(
            status="rolled_back",
            usage=Usage(calls=10, input_tokens=900, cache_read_tokens=4200, cache_write_tokens=300, cost_usd=0.05),
        ))
        got = ledger.get_experiment(cand.id)
        assert ledger.get_experiment(base.id).cache_read_tokens == 0
    assert (got.input_tokens, got.cache_read_tokens, got.cache_write_tokens) == (900, 4200, 300)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    conn.close()


def test_a_version_2_ledger_is_read_as_is_and_upgraded_when_written(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    tag = "Enabled library entry lib-b (this makes the judge stricter): why. [library: +lib-b -> enabled {lib-a,lib-b}]"
    with Ledger(path) as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_decision(base.id, ExperimentOutcome(
            status="baseline", usage=Usage(calls=10, input_tokens=900, cost_usd=0.25),
        ))
        library = ledger.start_experiment(
            run.id, parent_id=base.id, strategy="library", edit=ProposedEdit(rationale=tag)
        )
        ledger.record_decision(library.id, ExperimentOutcome(status="rolled_back", usage=Usage(calls=4, cost_usd=0.1)))
        reflect = ledger.start_experiment(
            run.id, parent_id=base.id, strategy="reflect", edit=ProposedEdit(rationale="x [library: y]")
        )
        ledger.record_decision(reflect.id, ExperimentOutcome(
            status="guard_rejected", usage=Usage(calls=1, input_tokens=50, cost_usd=0.02),
        ))
    conn = sqlite3.connect(path)  # what judgeloop with schema 2 wrote: no optimiser columns, no proposal meta
    _drop_schema_3_columns(conn)
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 2")
    conn.close()

    with Ledger.open_readonly(path) as ro:  # the TUI or `report` on a ledger from an older install
        old = {e.id: e for e in ro.experiments(run.id)}
        assert ro.get_experiment(reflect.id).input_tokens == 50
    assert all(e.optimizer_calls == 0 and e.optimizer_cost_usd == 0.0 and e.proposal_meta == {} for e in old.values())
    assert old[base.id].cost_usd == 0.25 and old[base.id].judge_cost_usd == 0.25
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2  # reading changed nothing
    conn.close()

    with Ledger(path) as ledger:  # a run writing to it upgrades it in place
        upgraded = {e.id: e for e in ledger.experiments(run.id)}
        # Old rows keep their figures and get 0 for the optimiser; the library's old rationale tag is
        # read once, here, into its proposal meta (other strategies' text is left alone).
        assert upgraded[base.id].calls == 10 and upgraded[base.id].optimizer_calls == 0
        assert upgraded[library.id].proposal_meta == {"library_enabled": ["lib-a", "lib-b"]}
        assert upgraded[library.id].rationale == tag
        assert upgraded[reflect.id].proposal_meta == {} and upgraded[reflect.id].optimizer_cost_usd == 0.0
        new = ledger.start_experiment(
            run.id,
            parent_id=base.id,
            strategy="reflect",
            edit=ProposedEdit(
                rationale="new",
                proposal_meta={"note": "data"},
                optimizer_usage=Usage(calls=2, input_tokens=300, output_tokens=40, cost_usd=0.05),
            ),
        )
        ledger.record_decision(new.id, ExperimentOutcome(
            status="rolled_back", usage=Usage(calls=8, input_tokens=700, cost_usd=0.3),
        ))
        got = ledger.get_experiment(new.id)
    assert (got.optimizer_calls, got.optimizer_input_tokens, got.optimizer_output_tokens) == (2, 300, 40)
    assert got.calls == 8 and got.input_tokens == 700  # finishing leaves the optimiser's figures alone
    assert got.cost_usd == 0.3 and got.judge_cost_usd == pytest.approx(0.25) and got.proposal_meta == {"note": "data"}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    assert conn.execute("SELECT COUNT(*) FROM attributions").fetchone()[0] == 0  # schema 7's tables exist
    conn.close()
    with Ledger(path) as ledger:  # the batches table (step 4 -> 5) works on the upgraded ledger
        row = ledger.record_batch(run.id, new.id, provider="openai", endpoint="https://api.openai.com/v1",
                                  model="gpt-5", custom_ids=["k1", "k2"], estimate_usd=0.5)
        ledger.update_batch(row, status="submitted", batch_id="batch_1")
        [batch] = ledger.batches(run.id, open_only=True)
    assert (batch.batch_id, batch.status, batch.custom_ids, batch.experiment_id) == ("batch_1", "submitted",
                                                                                     ["k1", "k2"], new.id)


def test_missing_ledger_opened_readonly_says_run_first(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"no ledger yet .* run `judgeloop run` first"):
        Ledger.open_readonly(tmp_path / "experiments" / "ledger.sqlite")
    assert not (tmp_path / "experiments").exists()


def test_unknown_run_is_a_user_error(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(UserError, match="has no runs yet"):
            ledger.resolve_run(None)
        run = _run(ledger)
        with pytest.raises(UserError, match=f"no run 'nope'.*{run.id}"):
            ledger.get_run("nope")


def test_exception_inside_a_transaction_leaves_nothing(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        with pytest.raises(RuntimeError, match="boom"), ledger.transaction() as cur:
            cur.execute("INSERT INTO items VALUES (?, 't9', 1, 'ok', NULL, 0)", (exp.id,))
            cur.execute("UPDATE runs SET status = 'finished' WHERE id = ?", (run.id,))
            raise RuntimeError("boom")
        assert ledger.item_verdicts(exp.id) == []
        assert ledger.get_run(run.id).status == "running"
        # A constraint failure half-way through record_verdicts also leaves no item behind.
        with pytest.raises(sqlite3.IntegrityError):
            ledger.record_verdicts(exp.id, [_item("ok1", True), ItemVerdict.model_construct(
                trajectory_id=None, success=True, status="ok", mistake_type=None, unstable=False, replicates=[])])
        assert ledger.item_verdicts(exp.id) == []


def test_reader_in_another_process_sees_commits_while_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    writer = Ledger(path)
    run = _run(writer)
    assert writer._query("PRAGMA journal_mode")[0][0] == "wal"
    reader_script = textwrap.dedent(
        f"""
        import sys, json
        from optimizer.ledger import Ledger
        reader = Ledger.open_readonly({str(path)!r})
        last = 0
        seen = []
        for line in sys.stdin:
            if line.strip() == "done":
                break
            events = reader.events_since(last, run_id={run.id!r})
            if events:
                last = events[-1].id
            seen.append(len(events))
            print(json.dumps([len(reader.experiments({run.id!r})), len(events)]), flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", reader_script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdin and proc.stdout
    try:
        observed = []
        for i in range(5):
            exp = writer.start_experiment(run.id, parent_id=None)
            writer.record_verdicts(exp.id, [_item(f"t{i}", True)])
            writer.add_event(run.id, PassProgress(done=i), experiment_id=exp.id)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            observed.append(json.loads(proc.stdout.readline()))
        proc.stdin.write("done\n")
        proc.stdin.flush()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        writer.close()
    assert [n for n, _ in observed] == [1, 2, 3, 4, 5]
    # the first poll also sees the run_status event; each later poll sees stage + progress
    assert [k for _, k in observed][1:] == [2, 2, 2, 2]


def test_reviews_export_jsonl(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        ledger.add_review("t1", "judge_wrong", "missed the save dialog", experiment_id=exp.id, author="ana")
        ledger.add_review("t2", "label_suspect", author="bo")
        with pytest.raises(UserError, match="unknown review kind"):
            ledger.add_review("t3", "nonsense")  # type: ignore[arg-type]
        assert [r.trajectory_id for r in ledger.reviews(trajectory_id="t1")] == ["t1"]
        count = ledger.export_reviews(tmp_path / "out" / "reviews.jsonl")
    lines = (tmp_path / "out" / "reviews.jsonl").read_text().splitlines()
    assert count == 2 and len(lines) == 2
    first = json.loads(lines[0])
    assert first["kind"] == "judge_wrong" and first["note"] == "missed the save dialog"
    assert first["experiment_id"] == exp.id and first["author"] == "ana"
    # reviews survive reopening
    with Ledger.open_readonly(tmp_path / "ledger.sqlite") as reader:
        assert len(reader.reviews()) == 2


def test_confirmations_are_counted_per_split(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.add_confirmation("ah", "abc", {"kappa": 0.5})
        ledger.add_confirmation("ah", "def", {"kappa": 0.6})
        ledger.add_confirmation("ahs", "def", {"kappa": 0.6})
        assert ledger.count_confirmations("ah") == 2 and ledger.count_confirmations("nope") == 0
        assert ledger.confirmations("ah")[1].metrics == {"kappa": 0.6}


def test_events_since_pages_in_order(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        start = ledger.last_event_id()
        ids = [ledger.add_event(run.id, PassProgress(done=i)) for i in range(5)]
        page = ledger.events_since(start, limit=3)
        assert [e.payload["done"] for e in page] == [0, 1, 2]
        assert [e.id for e in ledger.events_since(page[-1].id)] == ids[3:]
        with pytest.raises(ValueError):
            ledger.add_event(run.id, "bogus")  # type: ignore[arg-type]


def test_metrics_model_is_stored_whole_and_rebuilt(tmp_path: Path) -> None:
    from optimizer.stats import metrics

    m = metrics.Metrics.from_counts(5, 1, 8, 2)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        got = ledger.record_decision(exp.id, ExperimentOutcome(status="baseline", metrics=m))
    assert got.metrics_model() == m and got.kappa == m.kappa and got.metrics is not None and got.metrics["fp"] == 2


def test_a_file_that_is_not_a_ledger_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"this is not sqlite at all" * 100)
    for opener in (Ledger, Ledger.open_readonly):
        with pytest.raises(UserError, match="not a readable judgeloop ledger"):
            opener(path)


def test_latest_run_is_the_last_created_even_within_one_second(tmp_path: Path) -> None:
    # Run ids carry a random suffix, and creation times have one-second resolution: two runs started in
    # the same second must still come back newest first (insertion order), whatever their suffixes.
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ids = [_run(ledger, run_id=f"20261130-050000-{suffix}").id for suffix in ("ffff", "0000", "8888")]
        latest = ledger.latest_run()
        assert latest is not None and latest.id == ids[-1]
        assert [r.id for r in ledger.runs()] == list(reversed(ids))


def test_a_version_3_ledger_from_before_the_adaptive_policy_opens_and_reports_as_before(tmp_path: Path) -> None:
    from optimizer.report import accounting, history_lines, report_json, report_text
    from optimizer.stats.metrics import FlipTable

    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger, config={"loop": {"alpha": 0.1}})
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_decision(base.id, ExperimentOutcome(
            status="baseline", metrics={"kappa": 0.4, "fpr": 0.2, "tp": 5, "fn": 5, "tn": 8, "fp": 2},
            usage=Usage(calls=10, cost_usd=0.25),
        ))
        cand = ledger.start_experiment(run.id, parent_id=base.id, strategy="library", commit_sha="b" * 40)
        ledger.record_decision(cand.id, ExperimentOutcome(
            status="kept", p_value=0.03125, literal_keep=True, paired_keep=True, reason="kappa 0.400 → 0.600: kept",
            metrics={"kappa": 0.6, "fpr": 0.1, "tp": 7, "fn": 3, "tn": 9, "fp": 1},
            flips=FlipTable(fn_to_tp=["x1", "x2"], fp_to_tn=["x3", "x4", "x5"], tp_to_fn=[],
                                                tn_to_fp=[]),
            usage=Usage(calls=10, cost_usd=0.2),
        ))
    conn = sqlite3.connect(path)  # what a schema-3 judgeloop wrote: no decision record, batches, cache tokens
    _drop_schema_4_columns(conn)
    conn.execute("DROP TABLE batches")
    conn.execute("DROP TABLE attribution_edits")
    conn.execute("DROP TABLE attributions")
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 3")
    conn.close()

    with Ledger.open_readonly(path) as ro:
        exps = ro.experiments(run.id)
        text = report_text(ro, ro.get_run(run.id))
        data = report_json(ro, ro.get_run(run.id))
        lines = history_lines(exps)
    old = exps[1]
    assert (old.adaptive_keep, old.alpha, old.test, old.rejudge_calls) == (None, None, None, 0)
    assert old.p_value == 0.03125 and old.paired_keep and old.status == "kept"
    assert "McNemar p 0.031" in text and "literal keep, paired keep" in text and "test:" not in text
    assert data["experiments"][1]["rejudged"] == [] and data["experiments"][1]["test"] is None
    # Its candidates were tested at the run's alpha: the accounting reads it from the run's config.
    assert accounting(run, exps).expected_false_keeps == pytest.approx(0.1)
    assert data["accounting"]["tested"] == 1 and len(lines) == 3
    with Ledger(path) as ledger:  # and a new judgeloop writing to it upgrades it in place
        assert ledger.get_experiment(old.id).p_value == 0.03125
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_attribution_rows_round_trip_and_resume_by_key(tmp_path: Path) -> None:
    from optimizer.ledger import EditContribution, ItemShare

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(strategy="manual", policy="literal", split="dev", split_fingerprint="f", start_rev="s")
        )
        assert ledger.latest_attribution(run.id) is None
        spec = AttributionSpec(key="k1", scope="run", final_commit="f" * 40, baseline_commit="b" * 40, split="dev",
                               judge="openai:m", replicates=1, rejudge=2, alpha=0.1)
        att = ledger.open_attribution(run.id, spec)
        edit = EditContribution(experiment=7, commit="c" * 40, items=9.5, kappa_delta=0.4, fpr_delta=-0.2,
                                fixed=["t1"], p_value=0.01, cost_usd=0.25,
                                shares=[ItemShare(trajectory_id="t1", without_correct=0, without_total=3,
                                                  final_correct=3, final_total=3)])
        ledger.record_attribution_edit(att.id, 0, edit, new_cost_usd=0.25)
        ledger.record_attribution_edit(att.id, 1, EditContribution(experiment=5, commit="d" * 40, note="budget"),
                                       new_cost_usd=0.0)
        done = ledger.finish_attribution(att.id, status="partial", note="not measured: #5")
        assert done.status == "partial" and done.cost_usd == 0.25 and [e.experiment for e in done.edits] == [7, 5]
        assert done.edits[0] == edit and done.edits[0].shares[0].draws() == "0/3 → 3/3"
        # The same key resumes the same attribution; another key starts a new one.
        assert ledger.open_attribution(run.id, spec).id == att.id
        assert ledger.open_attribution(run.id, replace(spec, key="k2")).id != att.id
        latest = ledger.latest_attribution(run.id)
        assert latest is not None and latest.key == "k2" and latest.status == "running"


def test_only_recorded_outcomes_emit_a_decision_event_and_narrow_updates_touch_only_their_columns(
    tmp_path: Path,
) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        ledger.record_decision(base.id, ExperimentOutcome(status="baseline", metrics={"kappa": 0.5}))
        cand = ledger.start_experiment(
            run.id,
            parent_id=base.id,
            strategy="reflect",
            edit=ProposedEdit(optimizer_usage=Usage(cost_usd=0.05)),
        )
        last = ledger.last_event_id()
        got = ledger.mark_evaluating(cand.id, "c" * 40, cost_usd=0.05)
        assert (got.status, got.decision, got.reason, got.commit_sha, got.cost_usd) == (
            "running", "pending", "evaluating", "c" * 40, 0.05)
        assert got.finished is None and got.optimizer_cost_usd == 0.05
        got = ledger.add_cost(cand.id, Usage(calls=2, input_tokens=300, cache_read_tokens=7, cost_usd=0.5))
        assert (got.calls, got.input_tokens, got.cache_read_tokens) == (2, 300, 7)
        assert got.cost_usd == pytest.approx(0.55)
        assert (got.status, got.decision, got.commit_sha) == ("running", "pending", "c" * 40)
        # Neither is a decision: no event (the TUI would read "decided: running").
        assert ledger.events_since(last) == []
        assert ledger.get_run(run.id).incumbent_experiment == base.id

        rejected = ledger.start_experiment(run.id, parent_id=base.id, strategy="reflect")
        failed = ledger.start_experiment(run.id, parent_id=base.id, strategy="reflect")
        last = ledger.last_event_id()
        got = ledger.reject(rejected.id, "the proposal changed nothing", cost_usd=0.02)
        assert (got.status, got.decision, got.cost_usd, got.calls) == ("guard_rejected", "guard_rejected", 0.02, 0)
        got = ledger.record_error(failed.id, "optimiser failed: down", cost_usd=0.01, commit_sha="d" * 40)
        assert (got.status, got.decision, got.commit_sha, got.finished is not None) == ("error", "error", "d" * 40, True)
        assert [(e.experiment_id, e.kind, e.payload) for e in ledger.events_since(last)] == [
            (rejected.id, "decision",
             {"status": "guard_rejected", "decision": "guard_rejected", "reason": "the proposal changed nothing"}),
            (failed.id, "decision", {"status": "error", "decision": "error", "reason": "optimiser failed: down"}),
        ]

        # An evaluation's outcome: usage of every pass, the optimiser's part on top; waiting is not finished.
        outcome = ExperimentOutcome(status="waiting", reason="a human decides", usage=Usage(calls=9, cost_usd=0.3),
                                    rejudge=Usage(calls=4, cost_usd=0.1), extra_cost_usd=0.05, cache_hits=3)
        got = ledger.record_decision(cand.id, outcome)
        assert (got.status, got.decision, got.finished, got.calls, got.cache_hits) == ("waiting", "waiting", None, 9, 3)
        assert got.cost_usd == pytest.approx(0.35) == outcome.cost_usd
        assert (got.rejudge_calls, got.rejudge_cost_usd, got.commit_sha) == (4, 0.1, "c" * 40)


def test_a_version_7_ledger_gains_the_planned_cache_reads_and_reads_them_as_0_until_then(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
    conn = sqlite3.connect(path)  # what a schema-7 judgeloop wrote: no planned cache reads
    for column in SCHEMA_8_COLUMNS + SCHEMA_9_COLUMNS:
        conn.execute(f"ALTER TABLE experiments DROP COLUMN {column}")
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 7")
    conn.close()
    with Ledger.open_readonly(path) as ro:
        assert ro.get_experiment(base.id).planned_cache_read_tokens == 0
    with Ledger(path) as ledger:  # two passes of one experiment add up; billed reads stay apart
        ledger.add_planned_cache_reads(base.id, 30_000)
        ledger.add_planned_cache_reads(base.id, 1_500)
        ledger.record_decision(base.id, ExperimentOutcome(
            status="baseline", usage=Usage(calls=4, input_tokens=900, cache_read_tokens=20_000, cost_usd=0.05)))
        got = ledger.get_experiment(base.id)
    assert (got.planned_cache_read_tokens, got.cache_read_tokens) == (31_500, 20_000)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    conn.close()


def test_a_version_8_ledger_gains_panel_members_and_keeps_each_members_verdict(tmp_path: Path) -> None:
    from optimizer.ledger import MemberVerdict

    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        ledger.record_verdicts(base.id, [_item("t1", True, reps=1)])
    conn = sqlite3.connect(path)  # what a schema-8 judgeloop wrote: no panel members
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")
    conn.execute("PRAGMA user_version = 8")
    conn.close()
    with Ledger.open_readonly(path) as ro:
        [old] = ro.item_verdicts(base.id)
        assert old.replicates[0].members == [] and old.replicates[0].reasoning == "why t1 0"
    members = [MemberVerdict(member="strict", success=False, status="ok", reasoning="no save", cost_usd=0.01),
               MemberVerdict(member="evidence", success=None, status="invalid", reasoning="not JSON", cached=True)]
    item = _item("t2", False, reps=1)
    item.replicates[0].members = members
    with Ledger(path) as ledger:
        ledger.record_verdicts(base.id, [item])
        got = {v.trajectory_id: v for v in ledger.item_verdicts(base.id)}
    assert got["t2"].replicates[0].members == members and got["t1"].replicates[0].members == []
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    conn.close()


def test_a_version_8_ledger_gains_the_keep_kind_and_cost_per_verdict(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
    conn = sqlite3.connect(path)  # what a schema-8 judgeloop wrote
    for column in SCHEMA_9_COLUMNS:
        conn.execute(f"ALTER TABLE experiments DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 8")
    conn.close()
    with Ledger.open_readonly(path) as ro:
        old = ro.get_experiment(base.id)
        assert (old.keep_kind, old.verdict_cost_usd) == (None, None)
    with Ledger(path) as ledger:
        ledger.record_decision(base.id, ExperimentOutcome(status="kept", keep_kind="cheaper", verdict_cost_usd=0.004))
        got = ledger.get_experiment(base.id)
    assert (got.keep_kind, got.verdict_cost_usd) == ("cheaper", 0.004)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    conn.close()


def test_a_version_9_ledger_gains_who_decided_and_what_the_policy_said(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = _run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        cand = ledger.start_experiment(run.id, parent_id=base.id, strategy="scripted", seq=1)
    conn = sqlite3.connect(path)  # what a schema-9 judgeloop wrote
    for column in ("policy_keep", "policy_reason", "decided_by"):
        conn.execute(f"ALTER TABLE experiments DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 9")
    conn.close()
    with Ledger.open_readonly(path) as ro:
        old = ro.get_experiment(cand.id)
        assert (old.policy_keep, old.policy_reason, old.decided_by, old.overrule) == (None, None, None, None)
    with Ledger(path) as ledger:
        ledger.record_decision(cand.id, ExperimentOutcome(status="waiting", policy_keep=False, policy_reason="FPR rose"))
        ledger.set_experiment_decision(cand.id, status="kept", decided_by="person")
        got = ledger.get_experiment(cand.id)
    assert (got.policy_keep, got.policy_reason, got.decided_by) == (False, "FPR rose", "person")
    assert got.overrule == "kept by a person over the policy's roll back: FPR rose"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    conn.close()
