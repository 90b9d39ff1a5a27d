from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.judge.providers.pricing import Usage
from optimizer.ledger import ExperimentOutcome, ItemVerdict, LabelRow, Ledger, ProposedEdit, RunSpec
from optimizer.report import TSV_COLUMNS, export_experiments_tsv, report_json, write_markdown_report
from optimizer.scaffold import init_workspace
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace

LABELS = {"p1": True, "p2": True, "n1": False, "n2": False}


def _answers(correct: set[str]) -> list[ItemVerdict]:
    return [
        ItemVerdict(trajectory_id=t, success=pos if t in correct else not pos) for t, pos in LABELS.items()
    ]


def _append(ws: Workspace, rel: str, text: str) -> None:
    path = ws.root / rel
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Workspace, str, dict[str, int]]:
    """A workspace with a run: baseline, one kept, one rolled back (early stopped), one guard-rejected."""
    ws = init_workspace(tmp_path / "ws")
    start = gitops.rev_parse(ws)
    ids: dict[str, int] = {}
    with Ledger(ws.ledger_path) as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="library",
                policy="paired",
                split="sample",
                split_fingerprint="f" * 64,
                start_rev=start,
                budgets={"max_experiments": 3},
            )
        )
        gitops.create_run_branch(ws, run.id, start)
        ledger.set_labels(run.id, [LabelRow(trajectory_id=t, positive=p) for t, p in LABELS.items()])

        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline", commit_sha=start)
        ledger.record_verdicts(base.id, _answers({"p1", "n1"}))
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                metrics={"kappa": 0.0, "fpr": 0.5, "balanced_accuracy": 0.5},
                intervals={"kappa": (-0.5, 0.5)},
                items_evaluated=4,
                usage=Usage(calls=4, cost_usd=0.01),
            ),
        )
        ids["baseline"] = base.id

        _append(ws, "prompts/rubric.md", "\n- Rule that helps.\n")
        kept = ledger.start_experiment(
            run.id, parent_id=base.id, strategy="library", edit=ProposedEdit(rationale="add a helpful rule")
        )
        sha = gitops.commit_candidate(ws, ["prompts/rubric.md"], "library: add a helpful rule", kept.id)
        diff = gitops.diff_against(ws, start, sha)
        ledger.record_verdicts(kept.id, _answers({"p1", "p2", "n1", "n2"}))
        final_sha = gitops.finalize_kept(
            ws, sha, {"Judgeloop-Kappa": 1.0, "Judgeloop-FPR": 0.0, "Judgeloop-Decision": "kept"}
        )
        ledger.record_decision(
            kept.id,
            ExperimentOutcome(
                status="kept",
                reason="kappa +1.000, FPR -0.500, p=0.250 < alpha",
                commit_sha=final_sha,
                metrics={"kappa": 1.0, "fpr": 0.0, "balanced_accuracy": 1.0},
                p_value=0.25,
                literal_keep=True,
                paired_keep=True,
                flips={"tp_to_fn": [], "fn_to_tp": ["p2"], "tn_to_fp": [], "fp_to_tn": ["n2"]},
                items_evaluated=4,
                usage=Usage(calls=4, cost_usd=0.02),
            ),
        )
        ids["kept"] = kept.id

        _append(ws, "prompts/judge.md", "\nBe lenient.\n")
        bad = ledger.start_experiment(
            run.id, parent_id=kept.id, strategy="library", edit=ProposedEdit(rationale="be lenient")
        )
        bad_sha = gitops.commit_candidate(ws, ["prompts/judge.md"], "library: be lenient", bad.id)
        rejected_sha = gitops.roll_back(ws, bad_sha, bad.id, final_sha, {"Judgeloop-Decision": "rolled_back"})
        ledger.record_decision(
            bad.id,
            ExperimentOutcome(
                status="rolled_back",
                reason="FPR provably rose",
                commit_sha=rejected_sha,
                early_stopped=True,
                metrics={"kappa": None, "fpr": 0.5, "balanced_accuracy": None},
                flips={"tp_to_fn": [], "fn_to_tp": [], "tn_to_fp": ["n1"], "fp_to_tn": []},
                items_evaluated=1,
                usage=Usage(calls=1, cost_usd=0.005),
            ),
        )
        ids["rolled_back"] = bad.id

        guarded = ledger.start_experiment(
            run.id, parent_id=kept.id, strategy="library", edit=ProposedEdit(rationale="edit config")
        )
        ledger.record_decision(
            guarded.id,
            ExperimentOutcome(
                status="guard_rejected",
                reason="the candidate changes judgeloop.toml",
            ),
        )
        ids["guard_rejected"] = guarded.id
        ledger.set_run_status(run.id, "finished", stop_reason="max experiments reached")
        assert diff.files_changed == ["prompts/rubric.md"]
    return ws, run.id, ids


def test_report_json_has_exactly_the_documented_shape(
    filled: tuple[Workspace, str, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, run_id, ids = filled
    assert main(["report", "--json", "-w", str(ws.root)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == [
        "format_version",
        "run",
        "branch",
        "policy",
        "experiments",
        "accounting",
        "attribution",
        "final_vs_baseline",
        "attribution_meta",
        "label_suspects",
        "labels",
    ]
    assert data["format_version"] == 1  # a script reading it can tell the shape it was written in
    # Nothing was decided by a recorded test level here; the paired run's candidates count at its alpha.
    assert data["accounting"] == {
        "tested": 1,
        "cheaper_tested": 0,
        "expected_false_keeps": 0.1,
        "fdr": None,
        "kept": [
            {
                "experiment": ids["kept"],
                "kind": None,
                "p_value": data["experiments"][1]["p_value"],
                "alpha": 0.1,
                "rejudge_calls": 0,
                "rejudged_items": 0,
                "cost_usd": data["experiments"][1]["cost_usd"],
            }
        ],
    }
    # Null until `judgeloop attribute` has measured the run (tests/loop/test_attribute.py fills them).
    assert (
        data["attribution"] is None and data["final_vs_baseline"] is None and data["attribution_meta"] is None
    )
    assert data["run"] == run_id and data["branch"] == f"judgeloop/{run_id}" and data["policy"] == "paired"
    rows = data["experiments"]
    assert all(
        list(r)
        == [
            "id",
            "parent",
            "commit",
            "decision",
            "reason",
            "early_stopped",
            "kappa",
            "fpr",
            "balanced_accuracy",
            "p_value",
            "calls",
            "cost_usd",
            "optimizer_calls",
            "optimizer_input_tokens",
            "optimizer_output_tokens",
            "optimizer_cost_usd",
            "input_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "planned_cache_read_tokens",
            "output_tokens",
            "judge_cost_usd",
            "fp_by_type",
            "incumbent_fp_by_type",
            "alpha",
            "adaptive_keep",
            "rejudge_calls",
            "rejudge_cost_usd",
            "rejudged",
            "test",
            "decided_by",
            "overrule",
            "panel_cost",
            "cascade",
        ]
        for r in rows
    )
    assert all(
        r["panel_cost"] is None and r["cascade"] is None for r in rows
    )  # a single judge: no cost split by member
    # Per-type false positives on the items each experiment was judged on (these labels are untyped):
    # the baseline let n2 through, the kept candidate let nothing through; no verdicts, no counts.
    none = {
        "Critical Mistake": 0,
        "Bad Side Effect": 0,
        "Misunderstanding of the Instruction": 0,
        "untyped": 0,
    }
    assert rows[0]["fp_by_type"] == {**none, "untyped": 1} and rows[0]["incumbent_fp_by_type"] is None
    assert rows[1]["fp_by_type"] == none and rows[1]["incumbent_fp_by_type"] == {**none, "untyped": 1}
    assert rows[2]["fp_by_type"] is None and rows[3]["fp_by_type"] is None
    assert [r["decision"] for r in rows] == ["baseline", "kept", "rolled_back", "guard_rejected"]
    assert rows[0]["parent"] is None and rows[1]["parent"] == ids["baseline"]
    early = rows[2]
    assert (
        early["early_stopped"] is True
        and early["kappa"] is None
        and early["fpr"] == 0.5
        and early["p_value"] is None
    )
    assert rows[3]["kappa"] is None and rows[3]["commit"] is None and rows[3]["calls"] == 0
    assert rows[1]["commit"] == gitops.rev_parse(ws, f"judgeloop/{run_id}")


def test_report_text_shows_chain_flips_spend_rejections_and_agrees_with_git(
    filled: tuple[Workspace, str, dict[str, int]],
) -> None:
    from optimizer.report import report_text

    ws, run_id, ids = filled
    with Ledger.open_readonly(ws.ledger_path) as ledger:
        text = report_text(ledger, ledger.get_run(run_id), ws)
    assert f"#{ids['baseline']} (κ 0.000, FPR 0.500) → #{ids['kept']} (κ 1.000, FPR 0.000)" in text
    # Flips in the TUI's words: a row is what happened to the answer, each arrow under the words true of it.
    assert "flips newly wrong TP→FN 0, TN→FP 0 · newly right FN→TP 1, FP→TN 1" in text
    assert "newly right FN→TP (1): p2" in text and "newly right FP→TN (1): n2" in text
    assert (
        "FP by type (incumbent → this, same items): Critical Mistake 0 → 0, Bad Side Effect 0 → 0, "
        "Misunderstanding of the Instruction 0 → 0, untyped 1 → 0"
    ) in text
    assert f"#{ids['guard_rejected']}: the candidate changes judgeloop.toml" in text
    assert "spend: $0.0350 over 9 calls" in text
    assert "kappa 0.000 [-0.500, 0.500]" in text and "McNemar p 0.250" in text
    assert (
        "1/1 kept candidates on" in text
        and "1/1 rolled-back candidates under refs/judgeloop/rejected/" in text
    )
    assert "WARNING" not in text


def test_history_prints_one_line_per_experiment(
    filled: tuple[Workspace, str, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, run_id, _ = filled
    assert main(["history", "--run", run_id, "-w", str(ws.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"run {run_id}") and len(out) == 2 + 4
    assert "kept" in out[3] and "+1.000" in out[3] and "-0.500" in out[3] and "add a helpful rule" in out[3]


def test_tsv_and_markdown_exports(filled: tuple[Workspace, str, dict[str, int]], tmp_path: Path) -> None:
    ws, run_id, ids = filled
    with Ledger.open_readonly(ws.ledger_path) as ledger:
        tsv = export_experiments_tsv(ledger, run_id, tmp_path / "out" / "experiments.tsv")
        md = write_markdown_report(ledger, run_id, ws.experiments_dir / "runs" / run_id / "report.md", ws)
    rows = list(csv.DictReader(tsv.open(encoding="utf-8"), delimiter="\t"))
    assert list(rows[0]) == list(TSV_COLUMNS) and len(rows) == 4
    assert (
        rows[1]["decision"] == "kept" and float(rows[1]["kappa_delta"]) == 1.0 and rows[1]["fn_to_tp"] == "1"
    )
    assert rows[2]["kappa"] == "" and rows[2]["early_stopped"] == "1"
    text = md.read_text(encoding="utf-8")
    assert (
        text.startswith(f"# judgeloop run {run_id}") and f"| {ids['kept']} | kept | 1.000 | +1.000 |" in text
    )


def test_reviews_list_and_export(
    filled: tuple[Workspace, str, dict[str, int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, _, ids = filled
    assert main(["reviews", "-w", str(ws.root)]) == 0
    assert "no reviews yet" in capsys.readouterr().out
    with Ledger(ws.ledger_path) as ledger:
        ledger.add_review(
            "n1", "label_suspect", "the file was saved after all", experiment_id=ids["kept"], author="ana"
        )
    assert main(["reviews", "-w", str(ws.root)]) == 0
    assert "label_suspect" in capsys.readouterr().out
    out = tmp_path / "reviews.jsonl"
    assert main(["reviews", "--export", str(out), "-w", str(ws.root)]) == 0
    assert json.loads(out.read_text().splitlines()[0])["note"] == "the file was saved after all"


def test_report_without_a_ledger_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = init_workspace(tmp_path / "ws")
    assert main(["report", "-w", str(ws.root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no ledger yet" in err and "judgeloop run" in err


def test_report_json_function_on_an_unknown_run_is_a_user_error(
    filled: tuple[Workspace, str, dict[str, int]],
) -> None:
    from optimizer.errors import UserError

    ws, _, _ = filled
    with Ledger.open_readonly(ws.ledger_path) as ledger, pytest.raises(UserError, match="no run 'x'"):
        report_json(ledger, ledger.resolve_run("x"))


def test_report_shows_the_optimisers_spend_apart_from_the_judges(tmp_path: Path) -> None:
    from optimizer.report import report_json, report_text, spend

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="reflect",
                policy="paired",
                split="sample",
                split_fingerprint="f" * 64,
                start_rev="a" * 40,
            )
        )
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        ledger.record_decision(
            base.id,
            ExperimentOutcome(
                status="baseline",
                items_evaluated=4,
                usage=Usage(calls=4, input_tokens=400, output_tokens=40, cost_usd=0.01),
            ),
        )
        cand = ledger.start_experiment(
            run.id,
            parent_id=base.id,
            strategy="reflect",
            edit=ProposedEdit(
                rationale="tighten",
                optimizer_usage=Usage(calls=2, input_tokens=300, output_tokens=40, cost_usd=0.05),
            ),
        )
        ledger.record_decision(
            cand.id,
            ExperimentOutcome(
                status="rolled_back",
                items_evaluated=3,
                usage=Usage(
                    calls=3,
                    input_tokens=300,
                    output_tokens=30,
                    cache_read_tokens=9000,
                    cache_write_tokens=120,
                    cost_usd=0.08,
                ),
            ),
        )
        text = report_text(ledger, ledger.get_run(run.id))
        totals = spend(ledger.experiments(run.id))
        cand_json = report_json(ledger, ledger.get_run(run.id))["experiments"][1]
    assert (
        "    judge: 3 items, 3 calls, 0 cached, 300 in (+9,000 cache read, 120 cache write) / 30 out tokens, $0.0300"
        in text
    )
    assert "    judge: 4 items, 4 calls, 0 cached, 400 in / 40 out tokens, $0.0100" in text
    assert (totals["cache_read_tokens"], totals["cache_write_tokens"]) == (9000, 120)
    assert {
        k: cand_json[k] for k in ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")
    } == {"input_tokens": 300, "cache_read_tokens": 9000, "cache_write_tokens": 120, "output_tokens": 30}
    assert cand_json["judge_cost_usd"] == pytest.approx(0.03)
    assert "    optimiser: 2 calls, 300+40 tokens, $0.0500 (experiment total $0.0800)" in text
    assert "spend: $0.0900 over 7 calls" in text
    assert "  judge $0.0400 (7 calls); optimiser $0.0500 (2 calls, 300+40 tokens)" in text
    assert totals["cost_usd"] == pytest.approx(totals["judge_cost_usd"] + totals["optimizer_cost_usd"])
