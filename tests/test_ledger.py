"""The ledger: runs, experiments, verdicts, labels, reviews and events round-trip; errors and a reader in
another process. Older schemas opened and upgraded: tests/test_ledger_migrations.py."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from optimizer.errors import UserError
from optimizer.events import PassProgress
from optimizer.judge.providers.pricing import Usage
from optimizer.ledger import (
    AttributionSpec,
    ExperimentOutcome,
    ItemVerdict,
    LabelRow,
    Ledger,
    ProposedEdit,
    RunSpec,
    new_run_id,
)
from tests.support.ledger import make_item, make_run
from tests.support.waits import EVENT_WAIT_S


def test_new_run_id_has_the_documented_shape() -> None:
    rid = new_run_id()
    date, time, tail = rid.split("-")
    assert len(date) == 8 and len(time) == 6 and len(tail) == 4 and date.isdigit() and time.isdigit()


def test_run_and_experiment_round_trip(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = make_run(
            ledger, budgets={"max_experiments": 3, "budget_usd": 1.5}, config={"loop": {"alpha": 0.1}}
        )
        assert (
            run.branch == f"judgeloop/{run.id}"
            and run.status == "running"
            and run.budgets["budget_usd"] == 1.5
        )
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        assert base.seq == 0 and base.status == "running"
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                metrics={"kappa": 0.5, "fpr": 0.2, "balanced_accuracy": 0.7},
                intervals={"kappa": (0.4, 0.6)},
                items_evaluated=5,
                usage=Usage(calls=10, cost_usd=0.25),
            ),
        )
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
        ledger.record_decision(
            cand.id,
            ExperimentOutcome(
                status="kept",
                reason="kappa up",
                metrics={"kappa": 0.6, "fpr": 0.2},
                flips={"tp_to_fn": [], "fn_to_tp": ["x", "y"], "tn_to_fp": [], "fp_to_tn": ["z"]},
                p_value=0.125,
                literal_keep=True,
                paired_keep=False,
                commit_sha="c" * 40,
            ),
        )
        run = ledger.get_run(run.id)
        assert run.incumbent_experiment == cand.id

        got = ledger.get_experiment(cand.id)
        assert (
            got.commit_sha == "c" * 40
            and got.kappa == 0.6
            and got.fpr == 0.2
            and got.balanced_accuracy is None
        )
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
        run = make_run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None)
        ledger.record_decision(base.id, ExperimentOutcome(status="baseline"))
        bad = ledger.start_experiment(run.id, parent_id=base.id)
        ledger.record_decision(
            bad.id, ExperimentOutcome(status="rolled_back", reason="FPR rose", early_stopped=True)
        )
        waiting = ledger.start_experiment(run.id, parent_id=base.id)
        ledger.record_decision(waiting.id, ExperimentOutcome(status="waiting", metrics={"kappa": 0.9}))
        assert ledger.get_run(run.id).incumbent_experiment == base.id
        assert [e.id for e in ledger.experiments_with_status("waiting", run.id)] == [waiting.id]
        decided = ledger.set_experiment_decision(waiting.id, status="kept", reason="human kept it")
        assert decided.kappa == 0.9 and decided.status == "kept"
        assert [e.id for e in ledger.kept_chain(run.id)] == [base.id, waiting.id]


def test_verdicts_round_trip_and_answers(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = make_run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        n = ledger.record_verdicts(
            exp.id, [make_item("t1", True), make_item("t2u", False), make_item("t3", None, reps=1)]
        )
        assert n == 3
        items = ledger.item_verdicts(exp.id)
        assert [i.trajectory_id for i in items] == ["t1", "t2u", "t3"]
        assert items[1].unstable and len(items[0].replicates) == 3 and items[0].replicates[0].cached
        assert items[2].success is None and items[2].status == "invalid"
        one = ledger.item_verdicts(exp.id, "t2u")
        assert len(one) == 1 and one[0].replicates[2].reasoning == "why t2u 2"
        answers = ledger.item_answers(exp.id)
        assert (
            answers["t1"].success is True
            and answers["t3"].success is None
            and answers["t3"].status == "invalid"
        )
        # Recording an item again (after a resume) replaces it instead of failing or duplicating.
        ledger.record_verdicts(exp.id, [make_item("t1", False)])
        assert ledger.item_answers(exp.id)["t1"].success is False
        assert len(ledger.item_verdicts(exp.id)) == 3


def test_labels_are_stored_apart_per_run(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = make_run(ledger)
        ledger.set_labels(
            run.id,
            [
                LabelRow(trajectory_id="t1", positive=True),
                LabelRow(trajectory_id="t2", positive=False, mistake_type="Bad Side Effect"),
            ],
        )
        labels = ledger.labels(run.id)
        assert labels["t1"].positive and labels["t2"].mistake_type == "Bad Side Effect"
        assert ledger.labels("other") == {}


def test_missing_ledger_opened_readonly_says_run_first(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"no ledger yet .* run `judgeloop run` first"):
        Ledger.open_readonly(tmp_path / "experiments" / "ledger.sqlite")
    assert not (tmp_path / "experiments").exists()


def test_unknown_run_is_a_user_error(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(UserError, match="has no runs yet"):
            ledger.resolve_run(None)
        run = make_run(ledger)
        with pytest.raises(UserError, match=f"no run 'nope'.*{run.id}"):
            ledger.get_run("nope")


def test_exception_inside_a_transaction_leaves_nothing(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = make_run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        with pytest.raises(RuntimeError, match="boom"), ledger.transaction() as cur:
            cur.execute("INSERT INTO items VALUES (?, 't9', 1, 'ok', NULL, 0)", (exp.id,))
            cur.execute("UPDATE runs SET status = 'finished' WHERE id = ?", (run.id,))
            raise RuntimeError("boom")
        assert ledger.item_verdicts(exp.id) == []
        assert ledger.get_run(run.id).status == "running"
        # A constraint failure half-way through record_verdicts also leaves no item behind.
        with pytest.raises(sqlite3.IntegrityError):
            ledger.record_verdicts(
                exp.id,
                [
                    make_item("ok1", True),
                    ItemVerdict.model_construct(
                        trajectory_id=None,
                        success=True,
                        status="ok",
                        mistake_type=None,
                        unstable=False,
                        replicates=[],
                    ),
                ],
            )
        assert ledger.item_verdicts(exp.id) == []


@pytest.mark.slow
def test_reader_in_another_process_sees_commits_while_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    writer = Ledger(path)
    run = make_run(writer)
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
        [sys.executable, "-c", reader_script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdin and proc.stdout
    try:
        observed = []
        for i in range(5):
            exp = writer.start_experiment(run.id, parent_id=None)
            writer.record_verdicts(exp.id, [make_item(f"t{i}", True)])
            writer.add_event(run.id, PassProgress(done=i), experiment_id=exp.id)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            observed.append(json.loads(proc.stdout.readline()))
        proc.stdin.write("done\n")
        proc.stdin.flush()
    finally:
        proc.stdin.close()
        proc.wait(timeout=EVENT_WAIT_S)
        writer.close()
    assert [n for n, _ in observed] == [1, 2, 3, 4, 5]
    # the first poll also sees the run_status event; each later poll sees stage + progress
    assert [k for _, k in observed][1:] == [2, 2, 2, 2]


def test_reviews_export_jsonl(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = make_run(ledger)
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
        run = make_run(ledger)
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
        run = make_run(ledger)
        exp = ledger.start_experiment(run.id, parent_id=None)
        got = ledger.record_decision(exp.id, ExperimentOutcome(status="baseline", metrics=m))
    assert (
        got.metrics_model() == m
        and got.kappa == m.kappa
        and got.metrics is not None
        and got.metrics["fp"] == 2
    )


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
        ids = [make_run(ledger, run_id=f"20261130-050000-{suffix}").id for suffix in ("ffff", "0000", "8888")]
        latest = ledger.latest_run()
        assert latest is not None and latest.id == ids[-1]
        assert [r.id for r in ledger.runs()] == list(reversed(ids))


def test_attribution_rows_round_trip_and_resume_by_key(tmp_path: Path) -> None:
    from optimizer.ledger import EditContribution, ItemShare

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(strategy="manual", policy="literal", split="dev", split_fingerprint="f", start_rev="s")
        )
        assert ledger.latest_attribution(run.id) is None
        spec = AttributionSpec(
            key="k1",
            scope="run",
            final_commit="f" * 40,
            baseline_commit="b" * 40,
            split="dev",
            judge="openai:m",
            replicates=1,
            rejudge=2,
            alpha=0.1,
        )
        att = ledger.open_attribution(run.id, spec)
        edit = EditContribution(
            experiment=7,
            commit="c" * 40,
            items=9.5,
            kappa_delta=0.4,
            fpr_delta=-0.2,
            fixed=["t1"],
            p_value=0.01,
            cost_usd=0.25,
            shares=[
                ItemShare(
                    trajectory_id="t1", without_correct=0, without_total=3, final_correct=3, final_total=3
                )
            ],
        )
        ledger.record_attribution_edit(att.id, 0, edit, new_cost_usd=0.25)
        ledger.record_attribution_edit(
            att.id, 1, EditContribution(experiment=5, commit="d" * 40, note="budget"), new_cost_usd=0.0
        )
        done = ledger.finish_attribution(att.id, status="partial", note="not measured: #5")
        assert (
            done.status == "partial"
            and done.cost_usd == 0.25
            and [e.experiment for e in done.edits] == [7, 5]
        )
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
        run = make_run(ledger)
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
            "running",
            "pending",
            "evaluating",
            "c" * 40,
            0.05,
        )
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
        assert (got.status, got.decision, got.cost_usd, got.calls) == (
            "guard_rejected",
            "guard_rejected",
            0.02,
            0,
        )
        got = ledger.record_error(failed.id, "optimiser failed: down", cost_usd=0.01, commit_sha="d" * 40)
        assert (got.status, got.decision, got.commit_sha, got.finished is not None) == (
            "error",
            "error",
            "d" * 40,
            True,
        )
        assert [(e.experiment_id, e.kind, e.payload) for e in ledger.events_since(last)] == [
            (
                rejected.id,
                "decision",
                {
                    "status": "guard_rejected",
                    "decision": "guard_rejected",
                    "reason": "the proposal changed nothing",
                },
            ),
            (
                failed.id,
                "decision",
                {"status": "error", "decision": "error", "reason": "optimiser failed: down"},
            ),
        ]

        # An evaluation's outcome: usage of every pass, the optimiser's part on top; waiting is not finished.
        outcome = ExperimentOutcome(
            status="waiting",
            reason="a human decides",
            usage=Usage(calls=9, cost_usd=0.3),
            rejudge=Usage(calls=4, cost_usd=0.1),
            extra_cost_usd=0.05,
            cache_hits=3,
        )
        got = ledger.record_decision(cand.id, outcome)
        assert (got.status, got.decision, got.finished, got.calls, got.cache_hits) == (
            "waiting",
            "waiting",
            None,
            9,
            3,
        )
        assert got.cost_usd == pytest.approx(0.35) == outcome.cost_usd
        assert (got.rejudge_calls, got.rejudge_cost_usd, got.commit_sha) == (4, 0.1, "c" * 40)


def test_the_run_and_decision_events_store_the_json_the_hand_built_payloads_stored(tmp_path: Path) -> None:
    """Run status, experiment start and decision events go through the typed events of `optimizer.events`;
    the stored payload text is byte for byte what the ledger wrote when it built them by hand (a run's
    opening status has no ``stop_reason`` key; a later change has one, null when not given)."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = make_run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha="a" * 40)
        ledger.record_decision(base.id, ExperimentOutcome(status="baseline", reason="the incumbent"))
        ledger.set_experiment_decision(base.id, status="kept")
        ledger.set_run_status(run.id, "waiting")
        ledger.set_run_status(run.id, "stopped", stop_reason="max_experiments reached")
    with sqlite3.connect(path) as conn:
        stored = conn.execute("SELECT kind, payload FROM events ORDER BY id").fetchall()
    assert stored == [
        ("run_status", '{"status":"running"}'),
        ("stage", '{"seq":0,"stage":"experiment_started"}'),
        ("decision", '{"decision":"baseline","reason":"the incumbent","status":"baseline"}'),
        ("decision", '{"decision":"kept","reason":null,"status":"kept"}'),
        ("run_status", '{"status":"waiting","stop_reason":null}'),
        ("run_status", '{"status":"stopped","stop_reason":"max_experiments reached"}'),
    ]


def test_a_budget_top_up_raises_the_runs_budget_and_records_who_decided_it(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="mcp",
                policy="literal",
                split="dev",
                split_fingerprint="f",
                start_rev="s",
                budgets={"budget_usd": 1.5, "replicates": 1},
            )
        )
        ledger.record_budget_top_up(run.id, 2.0, by="person", via="elicitation")
        after = ledger.record_budget_top_up(run.id, 0.5, by="person", via="elicitation")
    assert after.budgets["budget_usd"] == 4.0 and after.budgets["replicates"] == 1
    assert [(t["usd"], t["budget_usd"], t["by"], t["via"]) for t in after.budgets["top_ups"]] == [
        (2.0, 3.5, "person", "elicitation"),
        (0.5, 4.0, "person", "elicitation"),
    ]
    assert all(t["at"] for t in after.budgets["top_ups"])
