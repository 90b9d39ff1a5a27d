"""The ledger's schemas: a newer one refused, every older one read as is and upgraded in place when
written (what each version lacked dropped from a fresh ledger, then opened read-only and read-write)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from optimizer.errors import UserError
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import JudgeToolCall
from optimizer.ledger import SCHEMA_VERSION, ExperimentOutcome, Ledger, ProposedEdit
from tests.support.ledger import make_item, make_run


def test_newer_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    for opener in (Ledger, Ledger.open_readonly):
        with pytest.raises(
            UserError, match=rf"newer judgeloop \(schema {SCHEMA_VERSION + 1} > {SCHEMA_VERSION}\); upgrade"
        ):
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
        run = make_run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        new, old = make_item("t-new", True, reps=1), make_item("t-old", True, reps=1)
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
        run = make_run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_verdicts(exp.id, [make_item("t1", True, reps=1)])
    conn = sqlite3.connect(path)  # what judgeloop with schema 1 wrote: no verdicts.tools column
    conn.execute("ALTER TABLE verdicts DROP COLUMN tools")
    _drop_schema_3_columns(conn)  # (nor what schema 3 added)
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 1")
    conn.close()

    with Ledger.open_readonly(path) as ro:  # the TUI on a ledger copied from an older install
        [item] = ro.item_verdicts(exp.id)
        assert item.replicates[0].reasoning == "why t1 0" and item.replicates[0].tools == []

    agentic = make_item("t2", False, reps=1)
    agentic.replicates[0].tools = AGENTIC_TOOLS
    with Ledger(path) as ledger:  # a run writing to it upgrades it in place
        ledger.record_verdicts(exp.id, [agentic])
        tools = {i.trajectory_id: i.replicates[0].tools for i in ledger.item_verdicts(exp.id)}
    assert tools == {"t1": [], "t2": AGENTIC_TOOLS}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    assert conn.execute("SELECT COUNT(*) FROM attributions").fetchone()[0] == 0  # schema 7's tables exist
    conn.close()


SCHEMA_3_COLUMNS = (
    "optimizer_calls",
    "optimizer_input_tokens",
    "optimizer_output_tokens",
    "optimizer_cost_usd",
    "proposal_meta",
)


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
        run = make_run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                usage=Usage(calls=10, input_tokens=5000, cost_usd=0.25),
            ),
        )
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
        ledger.record_decision(
            cand.id,
            ExperimentOutcome(
                status="rolled_back",
                usage=Usage(
                    calls=10, input_tokens=900, cache_read_tokens=4200, cache_write_tokens=300, cost_usd=0.05
                ),
            ),
        )
        got = ledger.get_experiment(cand.id)
        assert ledger.get_experiment(base.id).cache_read_tokens == 0
    assert (got.input_tokens, got.cache_read_tokens, got.cache_write_tokens) == (900, 4200, 300)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()


def test_a_version_2_ledger_is_read_as_is_and_upgraded_when_written(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    tag = "Enabled library entry lib-b (this makes the judge stricter): why. [library: +lib-b -> enabled {lib-a,lib-b}]"
    with Ledger(path) as ledger:
        run = make_run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                usage=Usage(calls=10, input_tokens=900, cost_usd=0.25),
            ),
        )
        library = ledger.start_experiment(
            run.id, parent_id=base.id, strategy="library", edit=ProposedEdit(rationale=tag)
        )
        ledger.record_decision(
            library.id, ExperimentOutcome(status="rolled_back", usage=Usage(calls=4, cost_usd=0.1))
        )
        reflect = ledger.start_experiment(
            run.id, parent_id=base.id, strategy="reflect", edit=ProposedEdit(rationale="x [library: y]")
        )
        ledger.record_decision(
            reflect.id,
            ExperimentOutcome(
                status="guard_rejected",
                usage=Usage(calls=1, input_tokens=50, cost_usd=0.02),
            ),
        )
    conn = sqlite3.connect(path)  # what judgeloop with schema 2 wrote: no optimiser columns, no proposal meta
    _drop_schema_3_columns(conn)
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")  # (nor what schema 9 added)
    conn.execute("PRAGMA user_version = 2")
    conn.close()

    with Ledger.open_readonly(path) as ro:  # the TUI or `report` on a ledger from an older install
        old = {e.id: e for e in ro.experiments(run.id)}
        assert ro.get_experiment(reflect.id).input_tokens == 50
    assert all(
        e.optimizer_calls == 0 and e.optimizer_cost_usd == 0.0 and e.proposal_meta == {} for e in old.values()
    )
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
        ledger.record_decision(
            new.id,
            ExperimentOutcome(
                status="rolled_back",
                usage=Usage(calls=8, input_tokens=700, cost_usd=0.3),
            ),
        )
        got = ledger.get_experiment(new.id)
    assert (got.optimizer_calls, got.optimizer_input_tokens, got.optimizer_output_tokens) == (2, 300, 40)
    assert got.calls == 8 and got.input_tokens == 700  # finishing leaves the optimiser's figures alone
    assert (
        got.cost_usd == 0.3
        and got.judge_cost_usd == pytest.approx(0.25)
        and got.proposal_meta == {"note": "data"}
    )
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    assert conn.execute("SELECT COUNT(*) FROM attributions").fetchone()[0] == 0  # schema 7's tables exist
    conn.close()
    with Ledger(path) as ledger:  # the batches table (step 4 -> 5) works on the upgraded ledger
        row = ledger.record_batch(
            run.id,
            new.id,
            provider="openai",
            endpoint="https://api.openai.com/v1",
            model="gpt-5",
            custom_ids=["k1", "k2"],
            estimate_usd=0.5,
        )
        ledger.update_batch(row, status="submitted", batch_id="batch_1")
        [batch] = ledger.batches(run.id, open_only=True)
    assert (batch.batch_id, batch.status, batch.custom_ids, batch.experiment_id) == (
        "batch_1",
        "submitted",
        ["k1", "k2"],
        new.id,
    )


def test_a_version_3_ledger_from_before_the_adaptive_policy_opens_and_reports_as_before(
    tmp_path: Path,
) -> None:
    from optimizer.report import accounting, history_lines, report_json, report_text
    from optimizer.stats.metrics import FlipTable

    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = make_run(ledger, config={"loop": {"alpha": 0.1}})
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                metrics={"kappa": 0.4, "fpr": 0.2, "tp": 5, "fn": 5, "tn": 8, "fp": 2},
                usage=Usage(calls=10, cost_usd=0.25),
            ),
        )
        cand = ledger.start_experiment(run.id, parent_id=base.id, strategy="library", commit_sha="b" * 40)
        ledger.record_decision(
            cand.id,
            ExperimentOutcome(
                status="kept",
                p_value=0.03125,
                literal_keep=True,
                paired_keep=True,
                reason="kappa 0.400 → 0.600: kept",
                metrics={"kappa": 0.6, "fpr": 0.1, "tp": 7, "fn": 3, "tn": 9, "fp": 1},
                flips=FlipTable(fn_to_tp=["x1", "x2"], fp_to_tn=["x3", "x4", "x5"], tp_to_fn=[], tn_to_fp=[]),
                usage=Usage(calls=10, cost_usd=0.2),
            ),
        )
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


def test_a_version_7_ledger_gains_the_planned_cache_reads_and_reads_them_as_0_until_then(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = make_run(ledger)
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
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                usage=Usage(calls=4, input_tokens=900, cache_read_tokens=20_000, cost_usd=0.05),
            ),
        )
        got = ledger.get_experiment(base.id)
    assert (got.planned_cache_read_tokens, got.cache_read_tokens) == (31_500, 20_000)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()


def test_a_version_8_ledger_gains_panel_members_and_keeps_each_members_verdict(tmp_path: Path) -> None:
    from optimizer.ledger import MemberVerdict

    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = make_run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        ledger.record_verdicts(base.id, [make_item("t1", True, reps=1)])
    conn = sqlite3.connect(path)  # what a schema-8 judgeloop wrote: no panel members
    conn.execute("ALTER TABLE verdicts DROP COLUMN members")
    conn.execute("PRAGMA user_version = 8")
    conn.close()
    with Ledger.open_readonly(path) as ro:
        [old] = ro.item_verdicts(base.id)
        assert old.replicates[0].members == [] and old.replicates[0].reasoning == "why t1 0"
    members = [
        MemberVerdict(member="strict", success=False, status="ok", reasoning="no save", cost_usd=0.01),
        MemberVerdict(member="evidence", success=None, status="invalid", reasoning="not JSON", cached=True),
    ]
    item = make_item("t2", False, reps=1)
    item.replicates[0].members = members
    with Ledger(path) as ledger:
        ledger.record_verdicts(base.id, [item])
        got = {v.trajectory_id: v for v in ledger.item_verdicts(base.id)}
    assert got["t2"].replicates[0].members == members and got["t1"].replicates[0].members == []
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()


def test_a_version_8_ledger_gains_the_keep_kind_and_cost_per_verdict(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = make_run(ledger)
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
        ledger.record_decision(
            base.id, ExperimentOutcome(status="kept", keep_kind="cheaper", verdict_cost_usd=0.004)
        )
        got = ledger.get_experiment(base.id)
    assert (got.keep_kind, got.verdict_cost_usd) == ("cheaper", 0.004)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()


def test_a_version_9_ledger_gains_who_decided_and_what_the_policy_said(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = make_run(ledger)
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
        ledger.record_decision(
            cand.id, ExperimentOutcome(status="waiting", policy_keep=False, policy_reason="FPR rose")
        )
        ledger.set_experiment_decision(cand.id, status="kept", decided_by="person")
        got = ledger.get_experiment(cand.id)
    assert (got.policy_keep, got.policy_reason, got.decided_by) == (False, "FPR rose", "person")
    assert got.overrule == "kept by a person over the policy's roll back: FPR rose"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()
