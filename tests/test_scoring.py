"""`judgeloop score`: reading verdict folders and the protocol numbers, computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.answers.scoring import parse_result_file, read_results_dir
from optimizer.errors import UserError
from optimizer.models import Label
from optimizer.stats.metrics import score
from optimizer.workspace.workspace import Workspace

CM, BSE, MIS = "Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction"

# 4 positives, 6 negatives (2 CM, 2 BSE, 1 MIS, 1 untyped).
LABEL_ROWS = [
    {"trajectory_id": "p1", "label": "positive"},
    {"trajectory_id": "p2", "label": "positive"},
    {"trajectory_id": "p3", "label": "positive"},
    {"trajectory_id": "p4", "label": "positive"},
    {"trajectory_id": "n1", "label": "negative", "mistake_type": CM},
    {"trajectory_id": "n2", "label": "negative", "mistake_type": CM},
    {"trajectory_id": "n3", "label": "negative", "mistake_type": BSE},
    {"trajectory_id": "n4", "label": "negative", "mistake_type": BSE},
    {"trajectory_id": "n5", "label": "negative", "mistake_type": "Misunderstanding of the Instructions"},
    {"trajectory_id": "n6", "label": "negative"},
]
IDS = [row["trajectory_id"] for row in LABEL_ROWS]
LABELS = {row["trajectory_id"]: Label(original_id=row["trajectory_id"], **row) for row in LABEL_ROWS}  # type: ignore[arg-type]


def write_mixed_results(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)

    def put(tid: str, text: str) -> None:
        (folder / f"{tid}.json").write_text(text, encoding="utf-8")

    put(
        "p1", json.dumps({"success": True, "reasoning": "done", "confidence": "high", "mistake_type": None})
    )  # TP
    put("p2", json.dumps({"success": "true"}))  # string ⇒ invalid ⇒ scored FN
    put("p3", '{"success": true, "reasoning": ')  # truncated JSON ⇒ invalid ⇒ FN
    # p4: no file ⇒ missing ⇒ FN
    put("n1", json.dumps({"success": False, "mistake_type": CM}))  # TN, type recalled
    put(
        "n2", json.dumps({"success": False, "mistake_type": "Misunderstanding of the Instructions"})
    )  # TN, wrong type
    put("n3", json.dumps({"success": "false", "mistake_type": BSE}))  # the string "false" ⇒ invalid ⇒ FP
    put("n4", json.dumps([{"success": False}]))  # not an object ⇒ invalid ⇒ FP
    put("n5", json.dumps({"success": False, "mistake_type": MIS}))  # TN, type recalled (label spelled plural)
    put("n6", json.dumps({"reasoning": "forgot the verdict"}))  # no success key ⇒ invalid ⇒ FP
    put("_summary.json", json.dumps({"calls": 10}))  # not a verdict: ignored
    (folder / "notes.txt").write_text("not a verdict", encoding="utf-8")  # ignored
    return folder


def test_read_results_dir_classifies_every_kind_of_file(tmp_path: Path) -> None:
    answers = read_results_dir(write_mixed_results(tmp_path / "res"), IDS)
    assert list(answers) == IDS
    status = {tid: a.status for tid, a in answers.items()}
    assert status == {
        "p1": "ok", "p2": "invalid", "p3": "invalid", "p4": "missing", "n1": "ok",
        "n2": "ok", "n3": "invalid", "n4": "invalid", "n5": "ok", "n6": "invalid",
    }  # fmt: skip
    assert answers["n2"].mistake_type == MIS  # plural spelling folded
    assert answers["p1"].success is True and answers["n1"].success is False


def test_score_of_a_mixed_folder_matches_hand_arithmetic(tmp_path: Path) -> None:
    m = score(LABELS, read_results_dir(write_mixed_results(tmp_path / "res"), IDS))
    # Positives: p1 TP; p2, p3 invalid and p4 missing are scored FN  ⇒ tp=1, fn=3
    # Negatives: n1, n2, n5 TN; n3, n4, n6 invalid ⇒ scored FP       ⇒ tn=3, fp=3
    assert (m.tp, m.fn, m.tn, m.fp) == (1, 3, 3, 3)
    assert m.n == 10 and m.invalid == 5 and m.missing == 1
    assert m.tpr == pytest.approx(1 / 4) and m.fnr == pytest.approx(3 / 4)  # 0.25, 0.75
    assert m.tnr == pytest.approx(3 / 6) and m.fpr == pytest.approx(3 / 6)  # 0.5, 0.5
    assert m.balanced_accuracy == pytest.approx((0.25 + 0.5) / 2)  # 0.375
    # po = (1+3)/10 = 0.4; judged positive = tp+fp = 4, labelled positive = 4
    # pe = (4·4 + 6·6)/100 = 0.52; kappa = (0.4 − 0.52)/(1 − 0.52) = −0.12/0.48 = −0.25
    assert m.kappa == pytest.approx(-0.25)
    # Recall over typed negatives: CM 1/2 (n1; n2 named MIS), BSE 0/2 (both invalid), MIS 1/1 (n5);
    # overall 2/5 (n6 untyped is left out).
    assert m.mistake_type_recall == {CM: 0.5, BSE: 0.0, MIS: 1.0, "overall": pytest.approx(0.4)}


STRANGER = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"  # a trajectory id (a UUID) in no split here


def test_an_id_outside_the_manifest_is_refused_naming_it(tmp_path: Path) -> None:
    folder = write_mixed_results(tmp_path / "res")
    (folder / f"{STRANGER}.json").write_text('{"success": true}', encoding="utf-8")
    with pytest.raises(UserError, match=STRANGER):
        read_results_dir(folder, IDS)


def test_files_the_official_workflow_adds_are_skipped_not_scored(tmp_path: Path) -> None:
    folder = write_mixed_results(tmp_path / "res")
    before = read_results_dir(folder, IDS)
    # The official analysis step writes analysis.json into the results folder; other runners write
    # summary.json. Neither is named by a trajectory id, and neither holds a verdict.
    (folder / "analysis.json").write_text(
        '{"summary": {"total_results": 9}, "metrics": {}}', encoding="utf-8"
    )
    (folder / "summary.json").write_text('{"success": true}', encoding="utf-8")
    (folder / "analysis.md").write_text("# Evaluation Analysis Report\n", encoding="utf-8")
    skipped: list[str] = []
    assert read_results_dir(folder, IDS, skipped) == before
    assert skipped == ["analysis.json", "summary.json"]


def test_a_results_path_that_is_not_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a folder"):
        read_results_dir(tmp_path / "nope", IDS)


@pytest.mark.parametrize(
    "raw",
    [b'{"success": "false"}', b'{"success": null}', b'{"success": 0}', b'{"success": 1}', b"{}", b"[]",
     b"true", b"\xff\xfe", b""],
)  # fmt: skip
def test_anything_but_a_json_boolean_success_is_invalid(raw: bytes) -> None:
    assert parse_result_file(raw).status == "invalid"


# --- the CLI --------------------------------------------------------------------------------------


def make_split(ws_root: Path, name: str) -> None:
    """A split written in the documented layout (manifest, split.json, labels.jsonl)."""
    from optimizer.devset.labels import fingerprint

    root = ws_root / "devset" / name
    root.mkdir(parents=True)
    (root / "manifest.txt").write_text("".join(f"{tid}\n" for tid in IDS), encoding="utf-8")
    rows = [row | {"original_id": row["trajectory_id"]} for row in LABEL_ROWS]
    (root / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    meta = {
        "name": name,
        "fingerprint": fingerprint(LABELS.values()),
        "source": "test",
        "created": "",
        "counts": {},
    }
    (root / "split.json").write_text(json.dumps(meta), encoding="utf-8")


def test_cli_score_json_prints_exactly_the_protocol_object(
    tmp_path: Path, empty_workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.cli import main

    make_split(empty_workspace.root, "mini")
    results = write_mixed_results(tmp_path / "res")
    code = main(["score", str(results), "--split", "mini", "--json", "-w", str(empty_workspace.root)])
    out = capsys.readouterr().out
    assert code == 0 and out.count("\n") == 1
    data = json.loads(out)
    assert list(data) == [
        "n", "balanced_accuracy", "tpr", "tnr", "fpr", "fnr", "kappa", "invalid", "missing", "mistake_type_recall",
    ]  # fmt: skip
    assert data["n"] == 10 and data["invalid"] == 5 and data["missing"] == 1
    assert data["balanced_accuracy"] == pytest.approx(0.375) and data["kappa"] == pytest.approx(-0.25)
    assert data["fpr"] == pytest.approx(0.5) and data["mistake_type_recall"]["overall"] == pytest.approx(0.4)


def test_cli_score_table_and_errors(
    tmp_path: Path, empty_workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.cli import main

    make_split(empty_workspace.root, "mini")
    results = write_mixed_results(tmp_path / "res")
    assert main(["score", str(results), "--split", "mini", "-w", str(empty_workspace.root)]) == 0
    table = capsys.readouterr().out
    assert "n=10 (positives 4, negatives 6); invalid 5, missing 1" in table
    assert "FPR" in table and "3/6" in table and "-0.250" in table
    (results / "analysis.json").write_text('{"summary": {}}', encoding="utf-8")
    assert main(["score", str(results), "--split", "mini", "-w", str(empty_workspace.root)]) == 0
    captured = capsys.readouterr()
    assert captured.out == table  # the same numbers: analysis.json is not a verdict
    assert "skipped 1 file(s) not named by a trajectory id: analysis.json" in captured.err
    (results / f"{STRANGER}.json").write_text('{"success": true}', encoding="utf-8")
    assert main(["score", str(results), "--split", "mini", "-w", str(empty_workspace.root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{STRANGER}'" in err
    assert main(["score", str(results), "--split", "nosuch", "-w", str(empty_workspace.root)]) == 2
    assert "no split named 'nosuch'" in capsys.readouterr().err
