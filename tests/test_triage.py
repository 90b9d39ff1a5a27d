"""Label triage through the real CLI: the label-suspects queue over a ledger's runs (its ranking and its
rules by hand), `judgeloop label-fix`, metrics as given and as corrected, and a run's label set fixed and
fingerprinted at its start (a corrections file changed mid-run, then a resume). Hostile corrections files
and side doors: tests/test_triage_corrections.py; the TUI's views and the structural judges' evidence:
tests/test_triage_views.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sklearn.metrics import cohen_kappa_score

from optimizer.answers.triage import label_suspects
from optimizer.cli import main
from optimizer.devset.corrections import apply_corrections, label_set
from optimizer.devset.labels import fingerprint, load_labels
from optimizer.devset.split import open_split
from optimizer.ledger import RunSpec
from optimizer.models import Label
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, commit_all, git, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of, toggle
from tests.support.triage import SPLIT, corrections_file, report_dict, run_cli, setup_triage, triage_runs


def _kappa_fpr(labels: dict[str, Label], answers: dict[str, bool]) -> tuple[float, float]:
    ids = sorted(labels)
    truth = [labels[t].is_positive for t in ids]
    said = [answers[t] for t in ids]
    negatives = [t for t in ids if not labels[t].is_positive]
    fpr = sum(answers[t] for t in negatives) / len(negatives)
    return float(cohen_kappa_score(truth, said)), fpr


# -- Done means: the queue ranks the planted label errors first ------------------------------------


@pytest.mark.slow
def test_the_suspects_queue_ranks_the_planted_label_errors_first(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge, planted, medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch)
        triage_runs(ws, server, monkeypatch, steps=1)  # a second run on the split: the queue counts both
    report = report_dict(ws, capsys)
    suspects = report["label_suspects"]
    ranked = [s["id"] for s in suspects]
    assert set(ranked[:3]) == set(planted)
    assert set(ranked[3:]) == set(medium)  # the low-confidence and the split items are not suspects
    top = suspects[0]
    assert all(s["score"] == 1.0 for s in suspects[:3])
    assert top["score"] == 1.0 and top["against"] == top["judged"] == top["high_against"]
    assert top["versions"] == top["versions_against"] >= 2
    # Judgements of one version (same prompts) are counted once per replicate, across runs.
    assert top["judged"] == 2 * top["versions"]
    assert all(s["score"] == 0.5 for s in suspects[3:])
    text = run_cli(capsys, "report", "-w", str(ws))[1]
    assert "label suspects (6;" in text and f"{planted[0]}  label" in text
    assert "judgeloop label-fix ID --label success|failure" in text


@pytest.mark.slow
def test_label_fix_records_a_correction_and_report_shows_both_label_sets(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge, planted, _medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch, steps=1)
    given = load_labels(open_split(Workspace.open(ws), SPLIT))
    for tid in planted:
        right = "success" if judge.truth[tid].is_positive else "failure"
        code, out, err = run_cli(
            capsys,
            "label-fix",
            "-w",
            str(ws),
            tid,
            "--label",
            right,
            "--reason",
            "the final screen shows the opposite",
            "--by",
            "ana",
        )
        assert code == 0 and err == "" and f"corrected {tid} to {right}" in out
    lines = [json.loads(x) for x in corrections_file(ws).read_text(encoding="utf-8").splitlines()]
    assert [x["id"] for x in lines] == planted
    assert all(set(x) == {"id", "label", "reason", "by", "at"} and x["by"] == "ana" for x in lines)
    # Again with another reason: replaced, never a second line; the given label again: removed.
    tid = planted[0]
    right = lines[0]["label"]
    assert (
        run_cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason", "second look")[0] == 0
    )
    lines = [json.loads(x) for x in corrections_file(ws).read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3 and next(x for x in lines if x["id"] == tid)["reason"] == "second look"
    wrong = "failure" if right == "success" else "success"
    code, out, _ = run_cli(capsys, "label-fix", "-w", str(ws), tid, "--label", wrong, "--reason", "undo")
    assert code == 0 and "removed the correction" in out
    assert tid not in corrections_file(ws).read_text(encoding="utf-8")
    assert run_cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason", "again")[0] == 0

    report = report_dict(ws, capsys)
    rows = report["labels"]["experiments"]
    assert report["labels"]["decided_with"] == "given" and report["labels"]["corrections"] == 3
    run, exps = latest(ws)
    corrected = {t: judge.truth[t] if t in planted else lab for t, lab in given.items()}
    for row in rows:
        answers = {t: bool(a.success) for t, a in ledger_of(ws).item_answers(row["id"]).items()}
        k_given, f_given = _kappa_fpr(given, answers)
        k_corr, f_corr = _kappa_fpr(corrected, answers)
        assert row["given"]["kappa"] == pytest.approx(k_given) and row["given"]["fpr"] == pytest.approx(
            f_given
        )
        assert row["corrected"]["kappa"] == pytest.approx(k_corr)
        assert row["corrected"]["fpr"] == pytest.approx(f_corr)
        assert k_corr > k_given  # the judge was right where the planted labels were wrong
    baseline = next(e for e in exps if e.seq == 0)
    assert rows[0]["id"] == baseline.id and baseline.kappa == pytest.approx(rows[0]["given"]["kappa"])
    text = run_cli(capsys, "report", "-w", str(ws))[1]
    assert "3 correction(s) in devset/small/corrections.jsonl" in text and "|  corrected kappa" in text
    assert f"corrected → {right}" in text
    assert run.labels_fingerprint == fingerprint(given.values())


def test_the_queue_needs_a_majority_and_a_minimum_count(ws: Path) -> None:
    """The score by hand, on a ledger written directly: the rules of optimizer.answers.triage's docstring."""
    from optimizer.ledger import ItemVerdict, Ledger, ReplicateVerdict

    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b, c, d = split.ids[:4]
    with Ledger(ws / "experiments" / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="manual", policy="literal", split=SPLIT, split_fingerprint="f", start_rev="0" * 40
            )
        )
        other = ledger.create_run(
            RunSpec(
                strategy="manual",
                policy="literal",
                split="elsewhere",
                split_fingerprint="f",
                start_rev="0" * 40,
            )
        )

        def record(run_id: str, prompt: str, votes: dict[str, list[tuple[bool, str | None]]]) -> None:
            exp = ledger.start_experiment(run_id, parent_id=None, strategy="x")
            conn = ledger._conn
            conn.execute("UPDATE experiments SET prompt_hash = ? WHERE id = ?", (prompt, exp.id))
            conn.commit()
            items = []
            for tid, vs in votes.items():
                pos = labels[tid].is_positive
                reps = [
                    ReplicateVerdict(replicate=i, success=pos != wrong, confidence=conf)
                    for i, (wrong, conf) in enumerate(vs)
                ]
                items.append(ItemVerdict(trajectory_id=tid, success=reps[0].success, replicates=reps))
            ledger.record_verdicts(exp.id, items)

        record(
            run.id,
            "p1",
            {
                a: [(True, "high"), (True, "medium")],
                b: [(True, "high"), (False, "high")],
                c: [(True, "high"), (True, "high")],
                d: [(True, "low"), (True, "low")],
            },
        )
        record(run.id, "p1", {a: [(True, "high"), (True, "medium")]})  # the same prompts again: not recounted
        record(
            run.id,
            "p2",
            {
                a: [(False, "high"), (True, None)],
                b: [(True, "high"), (False, "low")],
                d: [(True, "low"), (True, "low")],
            },
        )
        record(other.id, "p3", {c: [(True, "high")] * 2})  # another split's run: not counted
        suspects = label_suspects(ledger, split)
    by_id = {s.trajectory_id: s for s in suspects}
    # a: 3 of 4 against; weights 1 + 0.5 + 0.5 (no confidence) = 2 → 0.5; versions: p1 against, p2 split (not).
    assert by_id[a].score == pytest.approx(0.5) and (by_id[a].against, by_id[a].judged) == (3, 4)
    assert (by_id[a].versions, by_id[a].versions_against, by_id[a].high_against) == (2, 1, 1)
    assert b not in by_id  # 2 of 4: no majority
    assert c not in by_id  # 2 judgements: under the minimum of 3
    assert d not in by_id  # always against, with low confidence: score 0
    assert [s.trajectory_id for s in suspects] == [a]


# -- a run's label set: fixed and fingerprinted at its start ---------------------------------------


@pytest.mark.slow
def test_a_run_decides_with_the_labels_of_its_start_through_a_mid_run_edit_and_a_resume(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge, planted, _medium, _low, _split = setup_triage(ws)
    first, second = planted[0], planted[1]

    def right(tid: str) -> str:
        return "success" if judge.truth[tid].is_positive else "failure"

    assert (
        run_cli(capsys, "label-fix", "-w", str(ws), first, "--label", right(first), "--reason", "seen")[0]
        == 0
    )
    set_toml_key(ws, "loop", "labels", '"corrected"')
    commit_all(ws, "decide with the corrected labels")
    split = open_split(Workspace.open(ws), SPLIT)
    at_start = label_set(split, "corrected")
    assert list(at_start.corrections) == [first]

    def edit_mid_run() -> None:  # a person fixes another label while the baseline is being judged
        assert main(["label-fix", "-w", str(ws), second, "--label", right(second), "--reason", "later"]) == 0
        (ws / "experiments" / "STOP").write_text("", encoding="utf-8")

    judge.on_first_call = edit_mid_run
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(BAD_ENTRY)]))
    with FakeLLMServer(default=judge) as server:
        assert (
            run_loop(
                ws,
                server.openai_base_url,
                "--max-experiments",
                "2",
                "--replicates",
                "2",
                "--policy",
                "literal",
            )
            == 0
        )
        run, exps = latest(ws)
        assert run.status == "stopped" and [e.seq for e in exps] == [0]
        assert run.labels_fingerprint == at_start.fingerprint != label_set(split, "corrected").fingerprint
        code, out, err = run_cli(
            capsys,
            "run",
            "-w",
            str(ws),
            "--resume",
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
            "--concurrency",
            "8",
        )
    assert code == 0, err
    assert "corrections.jsonl changed since run" in out and "as they were at its start" in out
    run, exps = latest(ws)
    assert [e.seq for e in exps] == [0, 1, 2]
    # The file is tracked (committed above) and was edited mid-run: no reset of the run took the edit away.
    assert git(ws, "ls-files", f"devset/{SPLIT}/corrections.jsonl").strip()
    assert any(e.status == "rolled_back" for e in exps) and second in corrections_file(ws).read_text(
        encoding="utf-8"
    )
    stored = ledger_of(ws).labels(run.id)
    assert {t: r.positive for t, r in stored.items()} == {
        t: lab.is_positive for t, lab in at_start.labels.items()
    }
    for exp in (e for e in exps if not e.early_stopped):  # scored with the start's labels, not the file's
        answers = {t: bool(a.success) for t, a in ledger_of(ws).item_answers(exp.id).items()}
        assert exp.kappa == pytest.approx(_kappa_fpr(at_start.labels, answers)[0])
        now = apply_corrections(load_labels(split), label_set(split, "corrected").corrections)
        assert exp.kappa != pytest.approx(_kappa_fpr(now, answers)[0])
    # A run's stored labels that no longer match its fingerprint are refused on resume.
    (ws / "experiments" / "STOP").unlink(missing_ok=True)
    conn = sqlite3.connect(ws / "experiments" / "ledger.sqlite")
    with conn:
        conn.execute("UPDATE runs SET status = 'stopped' WHERE id = ?", (run.id,))
        conn.execute(
            "UPDATE run_labels SET positive = 1 - positive WHERE run_id = ? AND trajectory_id = ?",
            (run.id, planted[2]),
        )
    conn.close()
    code, _out, err = run_cli(
        capsys,
        "run",
        "-w",
        str(ws),
        "--resume",
        "--provider",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "fake-judge",
    )
    assert (
        code == 2
        and "do not match the fingerprint it started with" in err
        and len(err.strip().splitlines()) == 1
    )
