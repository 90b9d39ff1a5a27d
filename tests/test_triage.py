"""Label triage through the real CLI: the label-suspects queue over a ledger's runs, `judgeloop label-fix`
and ``corrections.jsonl`` (its hostile forms), metrics as given and as corrected, and a run's label set
fixed and fingerprinted at its start (a corrections file changed mid-run, then a resume)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sklearn.metrics import cohen_kappa_score

from optimizer.answers.triage import label_suspects
from optimizer.cli import main
from optimizer.devset.corrections import apply_corrections, label_set
from optimizer.devset.labels import fingerprint, load_labels
from optimizer.devset.split import open_split
from optimizer.errors import UserError
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger, RunSpec
from optimizer.loop.guards import DevMaterial, check_candidate
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.models import Label
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, commit_all, git, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of, toggle
from tests.support.triage import SPLIT, corrections_file, setup_triage, triage_runs


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _report(ws: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code, out, err = _cli(capsys, "report", "-w", str(ws), "--json", *extra)
    assert code == 0, err
    return dict(json.loads(out))


def _kappa_fpr(labels: dict[str, Label], answers: dict[str, bool]) -> tuple[float, float]:
    ids = sorted(labels)
    truth = [labels[t].is_positive for t in ids]
    said = [answers[t] for t in ids]
    negatives = [t for t in ids if not labels[t].is_positive]
    fpr = sum(answers[t] for t in negatives) / len(negatives)
    return float(cohen_kappa_score(truth, said)), fpr


# -- Done means: the queue ranks the planted label errors first ------------------------------------


def test_the_suspects_queue_ranks_the_planted_label_errors_first(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge, planted, medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch)
        triage_runs(ws, server, monkeypatch, steps=1)  # a second run on the split: the queue counts both
    report = _report(ws, capsys)
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
    text = _cli(capsys, "report", "-w", str(ws))[1]
    assert "label suspects (6;" in text and f"{planted[0]}  label" in text
    assert "judgeloop label-fix ID --label success|failure" in text


def test_label_fix_records_a_correction_and_report_shows_both_label_sets(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge, planted, _medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch, steps=1)
    given = load_labels(open_split(Workspace.open(ws), SPLIT))
    for tid in planted:
        right = "success" if judge.truth[tid].is_positive else "failure"
        code, out, err = _cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason",
                              "the final screen shows the opposite", "--by", "ana")
        assert code == 0 and err == "" and f"corrected {tid} to {right}" in out
    lines = [json.loads(x) for x in corrections_file(ws).read_text(encoding="utf-8").splitlines()]
    assert [x["id"] for x in lines] == planted
    assert all(set(x) == {"id", "label", "reason", "by", "at"} and x["by"] == "ana" for x in lines)
    # Again with another reason: replaced, never a second line; the given label again: removed.
    tid = planted[0]
    right = lines[0]["label"]
    assert _cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason", "second look")[0] == 0
    lines = [json.loads(x) for x in corrections_file(ws).read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3 and next(x for x in lines if x["id"] == tid)["reason"] == "second look"
    wrong = "failure" if right == "success" else "success"
    code, out, _ = _cli(capsys, "label-fix", "-w", str(ws), tid, "--label", wrong, "--reason", "undo")
    assert code == 0 and "removed the correction" in out
    assert tid not in corrections_file(ws).read_text(encoding="utf-8")
    assert _cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason", "again")[0] == 0

    report = _report(ws, capsys)
    rows = report["labels"]["experiments"]
    assert report["labels"]["decided_with"] == "given" and report["labels"]["corrections"] == 3
    run, exps = latest(ws)
    corrected = {t: judge.truth[t] if t in planted else lab for t, lab in given.items()}
    for row in rows:
        answers = {t: bool(a.success) for t, a in ledger_of(ws).item_answers(row["id"]).items()}
        k_given, f_given = _kappa_fpr(given, answers)
        k_corr, f_corr = _kappa_fpr(corrected, answers)
        assert row["given"]["kappa"] == pytest.approx(k_given) and row["given"]["fpr"] == pytest.approx(f_given)
        assert row["corrected"]["kappa"] == pytest.approx(k_corr)
        assert row["corrected"]["fpr"] == pytest.approx(f_corr)
        assert k_corr > k_given  # the judge was right where the planted labels were wrong
    baseline = next(e for e in exps if e.seq == 0)
    assert rows[0]["id"] == baseline.id and baseline.kappa == pytest.approx(rows[0]["given"]["kappa"])
    text = _cli(capsys, "report", "-w", str(ws))[1]
    assert "3 correction(s) in devset/small/corrections.jsonl" in text and "|  corrected kappa" in text
    assert f"corrected → {right}" in text
    assert run.labels_fingerprint == fingerprint(given.values())


# -- a run's label set: fixed and fingerprinted at its start ---------------------------------------


def test_a_run_decides_with_the_labels_of_its_start_through_a_mid_run_edit_and_a_resume(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge, planted, _medium, _low, _split = setup_triage(ws)
    first, second = planted[0], planted[1]

    def right(tid: str) -> str:
        return "success" if judge.truth[tid].is_positive else "failure"

    assert _cli(capsys, "label-fix", "-w", str(ws), first, "--label", right(first), "--reason", "seen")[0] == 0
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
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2", "--replicates", "2",
                        "--policy", "literal") == 0
        run, exps = latest(ws)
        assert run.status == "stopped" and [e.seq for e in exps] == [0]
        assert run.labels_fingerprint == at_start.fingerprint != label_set(split, "corrected").fingerprint
        code, out, err = _cli(capsys, "run", "-w", str(ws), "--resume", "--provider", "openai", "--base-url",
                              server.openai_base_url, "--model", "fake-judge", "--concurrency", "8")
    assert code == 0, err
    assert "corrections.jsonl changed since run" in out and "as they were at its start" in out
    run, exps = latest(ws)
    assert [e.seq for e in exps] == [0, 1, 2]
    # The file is tracked (committed above) and was edited mid-run: no reset of the run took the edit away.
    assert git(ws, "ls-files", f"devset/{SPLIT}/corrections.jsonl").strip()
    assert any(e.status == "rolled_back" for e in exps) and second in corrections_file(ws).read_text(encoding="utf-8")
    stored = ledger_of(ws).labels(run.id)
    assert {t: r.positive for t, r in stored.items()} == {t: lab.is_positive for t, lab in at_start.labels.items()}
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
        conn.execute("UPDATE run_labels SET positive = 1 - positive WHERE run_id = ? AND trajectory_id = ?",
                     (run.id, planted[2]))
    conn.close()
    code, _out, err = _cli(capsys, "run", "-w", str(ws), "--resume", "--provider", "openai", "--base-url",
                           "http://127.0.0.1:9/v1", "--model", "fake-judge")
    assert code == 2 and "do not match the fingerprint it started with" in err and len(err.strip().splitlines()) == 1


# -- hostile corrections files and candidates -------------------------------------------------------


@pytest.mark.parametrize("case", ["unknown_id", "bad_label", "duplicate", "huge_line", "same_label", "not_json"])
def test_a_crafted_corrections_file_is_one_clear_line_and_nothing_is_written(
    ws: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b = split.ids[0], split.ids[1]

    def line(tid: str, label: str | None = None, **extra: Any) -> str:
        flipped = "failure" if labels[tid].is_positive else "success"
        return json.dumps({"id": tid, "label": label or flipped, "reason": "r", "at": "2026-12-01T10:00:00+00:00",
                           **extra}) + "\n"

    crafted, expected = {
        "unknown_id": (line(a) + json.dumps({"id": "no-such-item", "label": "success", "reason": "r",
                                             "at": "2026-12-01T10:00:00+00:00"}) + "\n",
                       "corrections.jsonl:2: id 'no-such-item' is not an item of split 'small'"),
        "bad_label": (line(a, "positive"), "corrections.jsonl:1: label 'positive' is not success or failure"),
        "duplicate": (line(a) + line(b) + line(a), f"corrections.jsonl:3: id {a} is corrected twice (first on line 1)"),
        "huge_line": (line(a, reason="x" * 10_000_000), "corrections.jsonl:1: a line of 10,000,"),
        "same_label": (line(a, "success" if labels[a].is_positive else "failure"), f"id {a} is already labelled"),
        "not_json": ("{not json\n", "corrections.jsonl:1: not valid JSON"),
    }[case]
    if case == "huge_line":
        crafted = json.dumps({"id": a, "label": "success", "reason": "x" * 10_000_000, "at": "2026"}) + "\n"
    corrections_file(ws).write_text(crafted, encoding="utf-8")
    before = corrections_file(ws).read_bytes()
    code, out, err = _cli(capsys, "label-fix", "-w", str(ws), b, "--label",
                          "failure" if labels[b].is_positive else "success", "--reason", "r")
    assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1
    assert len(err) < 500 and corrections_file(ws).read_bytes() == before
    code, _out, err = _cli(capsys, "devset", "verify", SPLIT, "-w", str(ws))  # listed with the split's problems
    assert code != 0 and f"problem: {ws}/devset/{SPLIT}/" in err and expected in err
    # A run deciding with the corrected labels refuses to start, in the same line; no run is recorded.
    set_toml_key(ws, "loop", "labels", '"corrected"')
    commit_all(ws, "corrected labels")
    code, out, err = _cli(capsys, "run", "-w", str(ws), "--provider", "openai", "--base-url",
                          "http://127.0.0.1:9/v1", "--model", "fake-judge")
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert not (ws / "experiments" / "ledger.sqlite").exists() or not ledger_of(ws).runs()


def test_the_cli_refuses_an_unknown_id_an_empty_reason_and_a_label_already_given(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = open_split(Workspace.open(ws), SPLIT)
    tid = split.ids[0]
    given = "success" if load_labels(split)[tid].is_positive else "failure"
    for argv, expected in (
        (["nope", "--label", "success", "--reason", "r"], "'nope' is not an item of split 'small'"),
        ([tid, "--label", "failure" if given == "success" else "success", "--reason", "  "], "--reason is empty"),
        ([tid, "--label", given, "--reason", "r"], f"{tid} is already labelled {given}"),
    ):
        code, out, err = _cli(capsys, "label-fix", "-w", str(ws), *argv)
        assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1
    assert not corrections_file(ws).exists()
    code, _out, err = _cli(capsys, "label-fix", "-w", str(ws), tid, "--label", "maybe", "--reason", "r")
    assert code == 2 and "invalid choice: 'maybe'" in err


def test_no_candidate_can_write_or_read_the_corrections_file(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.loop.strategies.tools import ToolState, run_tool

    target = f"devset/{SPLIT}/corrections.jsonl"
    split = open_split(Workspace.open(ws), SPLIT)
    tid = split.ids[0]
    flipped = "failure" if load_labels(split)[tid].is_positive else "success"
    assert main(["label-fix", "-w", str(ws), tid, "--label", flipped, "--reason", "a person's"]) == 0
    before = corrections_file(ws).read_bytes()
    forged = json.dumps({"id": split.ids[1], "label": "success", "reason": "mine", "at": "2026-12-01"}) + "\n"

    def forge(ctx: ProposalContext) -> Proposal:
        # Both spellings: the canonical path and one through prompts/..
        return Proposal(files={target: forged, f"prompts/../{target}": forged,
                               RUBRIC_MD: ctx.current_files[RUBRIC_MD] + "\n- Check the end state.\n"},
                        rationale="fix the labels")

    seen: list[ProposalContext] = []

    def tools(ctx: ProposalContext) -> Proposal:
        seen.append(ctx)
        state = ToolState(ctx)
        read = run_tool(state, "read_file", {"path": target})
        wrote = run_tool(state, "write_file", {"path": target, "text": forged})
        assert read.is_error and wrote.is_error and "not an allowed file" in read.text + wrote.text
        assert "a person's" not in read.text
        return toggle(GOOD_ENTRY)(ctx)

    install(monkeypatch, ScriptedStrategy([forge, tools]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2", "--replicates", "1") == 0
    _run, exps = latest(ws)
    assert exps[1].status == "guard_rejected" and "outside the allowed files" in (exps[1].reason or "")
    assert target in (exps[1].reason or "") and "mine" not in (exps[1].diff_text or "")
    assert corrections_file(ws).read_bytes() == before and seen
    # The guard alone, as every candidate meets it; and a configuration naming the file is refused.
    guard = check_candidate(
        {target: (before.decode(), forged)},
        ["prompts/judge.md", "prompts/rubric.md"],
        100,
        DevMaterial([], [], []),
    )
    assert not guard.ok and guard.guard == "allowed_files"
    set_toml_key(ws, "optimizer", "allowed_files", f'["prompts/rubric.md", "{target}"]')
    code, _out, err = _cli(capsys, "run", "-w", str(ws), "--provider", "openai", "--base-url",
                           "http://127.0.0.1:9/v1", "--model", "fake-judge")
    assert code == 2 and "allowed_files" in err and len(err.strip().splitlines()) == 1


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
                reps = [ReplicateVerdict(replicate=i, success=pos != wrong, confidence=conf)
                        for i, (wrong, conf) in enumerate(vs)]
                items.append(ItemVerdict(trajectory_id=tid, success=reps[0].success, replicates=reps))
            ledger.record_verdicts(exp.id, items)

        record(run.id, "p1", {a: [(True, "high"), (True, "medium")], b: [(True, "high"), (False, "high")],
                              c: [(True, "high"), (True, "high")], d: [(True, "low"), (True, "low")]})
        record(run.id, "p1", {a: [(True, "high"), (True, "medium")]})  # the same prompts again: not recounted
        record(run.id, "p2", {a: [(False, "high"), (True, None)], b: [(True, "high"), (False, "low")],
                              d: [(True, "low"), (True, "low")]})
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


# -- the TUI's suspects view -------------------------------------------------------------------------


def test_the_tui_suspects_view_ranks_opens_and_corrects(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.tui_driving import drive, screen_rows, svg_text, wait_until
    from tui.app import JudgeloopApp, settle
    from tui.views import ItemView, SuspectsView

    judge, planted, medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch, steps=1)
    app = JudgeloopApp(ws, image_mode="halfcell", watch=False)
    first = sorted(planted)[0]
    right = "success" if judge.truth[first].is_positive else "failure"

    async def scenario(pilot: Any) -> None:
        await pilot.press("L")
        await settle(app, pilot)
        assert isinstance(app.screen, SuspectsView)
        text = svg_text(app)
        assert "label suspects — split small: 6 items, 0 corrected" in text
        rows = [r for r in screen_rows(app) if r.strip()[:2].strip().isdigit()]
        assert [r.split()[1] for r in rows[:3]] == [t[:8] for t in sorted(planted)]
        assert {r.split()[1] for r in rows[3:6]} == {t[:8] for t in medium}
        assert "L Suspects" in screen_rows(app)[-1] or " L " in screen_rows(app)[-1]
        await pilot.press("x")
        await settle(app, pilot)
        await pilot.press(*"seen on the last screen")
        await pilot.press("enter")
        await settle(app, pilot)
        await wait_until(pilot, corrections_file(ws).is_file, "the correction's write (a worker)")
        await settle(app, pilot)
        assert f"→ {right}: seen on the last screen" in svg_text(app)
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView) and app.item_id == first

    drive(app, scenario, size=(120, 36))
    [line] = corrections_file(ws).read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["id"] == first and json.loads(line)["label"] == right
    assert json.loads(line)["reason"] == "seen on the last screen"


# -- the structural judges' evidence: panel members, reviews and criteria ---------------------------


def _record_structural(ws: Path) -> tuple[list[str], dict[str, Label]]:
    """A ledger written directly (one run on the small split, three prompt versions): ``a`` a planted
    error only a panel's unanimous members expose, ``b`` a panel split 2-1 against its label, ``c`` a
    review that cited steps against a success, ``d`` criteria citing steps against a failure label,
    ``e`` a review with no steps. The single judge (version s) agrees with every label but b's and e's."""
    from optimizer.ledger import (
        CriterionCheck,
        ItemVerdict,
        Ledger,
        MemberVerdict,
        ReplicateVerdict,
        ReviewRecord,
    )

    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    positives = [t for t in split.ids if labels[t].is_positive]
    negatives = [t for t in split.ids if not labels[t].is_positive]
    a, b, c, e = positives[:4]
    d = negatives[0]
    with Ledger(ws / "experiments" / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="manual", policy="literal", split=SPLIT, split_fingerprint="f", start_rev="0" * 40
            )
        )

        def record(prompt: str, reps: dict[str, list[ReplicateVerdict]]) -> None:
            exp = ledger.start_experiment(run.id, parent_id=None, strategy="x")
            ledger._conn.execute("UPDATE experiments SET prompt_hash = ? WHERE id = ?", (prompt, exp.id))
            ledger._conn.commit()
            ledger.record_verdicts(exp.id, [ItemVerdict(trajectory_id=t, success=r[0].success, replicates=r)
                                            for t, r in reps.items()])

        def single(i: int, success: bool, confidence: str = "high", **extra: Any) -> ReplicateVerdict:
            return ReplicateVerdict(replicate=i, success=success, confidence=confidence, **extra)

        def panel(i: int, votes: list[tuple[bool, str]]) -> ReplicateVerdict:
            members = [MemberVerdict(member=f"m{k}", success=s, confidence=conf) for k, (s, conf) in enumerate(votes)]
            agree = len({s for s, _ in votes}) == 1
            return ReplicateVerdict(replicate=i, success=sum(s for s, _ in votes) * 2 > len(votes),
                                    confidence="high" if agree else "low", members=members)

        # Version s: a single judge, with high confidence, on the labels' side for a, c, d; against b and e.
        record("s", {a: [single(0, True), single(1, True)], b: [single(0, False), single(1, False)],
                     c: [single(0, True), single(1, True)], d: [single(0, False), single(1, False)],
                     e: [single(0, False, "medium"), single(1, False, "medium")]})
        # Version p: a panel of three. a: every member says failure (medium confidence each); b: two of three.
        record("p", {a: [panel(i, [(False, "medium")] * 3) for i in range(2)],
                     b: [panel(i, [(False, "medium"), (False, "medium"), (True, "high")]) for i in range(2)]})
        # Version r: review and criteria. c: the review turned the success into a failure, citing steps
        # (the first verdict medium); e: a review that found nothing citable leaves e's medium failure.
        review = ReviewRecord(violation=True, applied=True, steps=[3, 4], reasoning="the file was deleted")
        met = [CriterionCheck(text="the file is saved", met=True, steps=[5]),
               CriterionCheck(text="nothing else changed", met=True, steps=[2, 6])]
        record("r", {c: [single(i, False, "medium", review=review) for i in range(3)],
                     d: [single(i, True, "medium", criteria=met) for i in range(3)],
                     e: [single(i, False, "medium", review=ReviewRecord(violation=False)) for i in range(3)]})
    return [a, b, c, d, e], labels


def test_a_panels_unanimous_members_rank_a_planted_error_above_a_split_panel(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each valid member a judgement; a unanimous replicate's members weigh 1 (optimizer.answers.triage's
    docstring). Through `judgeloop report --json`, and the figures by hand."""
    (a, b, *_rest), _labels = _record_structural(ws)
    suspects = {s["id"]: s for s in _report(ws, capsys)["label_suspects"]}
    # a: 2 single judgements for the label, 6 members against, unanimous → 6 × 1 / 8. Counting the
    # panel's vote alone (one judgement a replicate) it would be 2 of 4: no majority, no suspect.
    assert (suspects[a]["against"], suspects[a]["judged"]) == (6, 8)
    assert suspects[a]["score"] == pytest.approx(6 / 8) and suspects[a]["structural_against"] == 6
    assert (suspects[a]["versions"], suspects[a]["versions_against"]) == (2, 1)
    # b: 2 single judgements against (high), 4 of 6 members against (medium, split) → (2 + 4 × 0.5) / 8.
    assert (suspects[b]["against"], suspects[b]["judged"]) == (6, 8)
    assert suspects[b]["score"] == pytest.approx(4 / 8) and suspects[b]["structural_against"] == 0
    ranked = [s["id"] for s in _report(ws, capsys)["label_suspects"]]
    assert ranked.index(a) < ranked.index(b)
    text = _cli(capsys, "report", "-w", str(ws))[1]
    assert f"{a}  label success  score 0.75  against 6/8 judgements (0 high confidence, 6 structural)" in text


def test_reviews_and_criteria_that_cite_steps_against_the_label_weigh_as_high_confidence(ws: Path) -> None:
    (a, b, c, d, e), labels = _record_structural(ws)
    with Ledger(ws / "experiments" / "ledger.sqlite") as ledger:
        by_id = {s.trajectory_id: s for s in label_suspects(ledger, open_split(Workspace.open(ws), SPLIT))}
    # c (a success): 2 for, 3 reviewed failures against citing steps — each weighs 1, not its medium.
    assert (by_id[c].against, by_id[c].judged, by_id[c].structural_against) == (3, 5, 3)
    assert by_id[c].score == pytest.approx(3 / 5)
    # d (a failure): 3 criteria successes, every required criterion met with steps cited → 3 × 1 / 5.
    assert not labels[d].is_positive and by_id[d].score == pytest.approx(3 / 5)
    assert by_id[d].structural_against == 3
    # e: five medium failures against a success, the review cited nothing → 5 × 0.5 / 5, none structural.
    assert by_id[e].score == pytest.approx(0.5) and by_id[e].structural_against == 0
    with Ledger(ws / "experiments" / "ledger.sqlite") as ledger:
        ranked = [s.trajectory_id for s in label_suspects(ledger, open_split(Workspace.open(ws), SPLIT))]
    # The cited evidence lifts c and d above the uncited medium disagreements of b and e.
    assert ranked[0] == a and set(ranked[1:3]) == {c, d} and set(ranked[3:]) == {b, e}


def test_the_tui_item_view_shows_a_correction_and_the_suspects_view_marks_it(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.tui_driving import drive, screen_rows, svg_text
    from tui.app import JudgeloopApp, settle
    from tui.views import ItemView, SuspectsView

    judge, planted, _medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch, steps=1)
    first, second = sorted(planted)[:2]
    given = "success" if load_labels(open_split(Workspace.open(ws), SPLIT))[first].is_positive else "failure"
    right = "failure" if given == "success" else "success"
    code, _out, err = _cli(capsys, "label-fix", "-w", str(ws), first, "--label", right, "--reason",
                           "step 7 shows the dialog cancelled", "--by", "ana")
    assert code == 0, err
    at = json.loads(corrections_file(ws).read_text(encoding="utf-8"))["at"]
    app = JudgeloopApp(ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("L")
        await settle(app, pilot)
        assert isinstance(app.screen, SuspectsView)
        rows = {r.split()[1]: r for r in screen_rows(app) if r.strip()[:2].strip().isdigit()}
        assert f"→ {right}: step 7 shows the dialog" in rows[first[:8]]
        assert "→" not in rows[second[:8]]  # an uncorrected suspect carries no mark
        assert "1 corrected" in svg_text(app)
        await pilot.press("enter")  # the first row: the corrected item
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView) and app.item_id == first
        text = svg_text(app)
        assert f"corrected: {given} as given → {right}" in text
        assert "reason: step 7 shows the dialog cancelled" in text and f"by ana at {at}" in text
        assert "this run decided with the label as given" in text
        await pilot.press("L")
        await settle(app, pilot)
        assert isinstance(app.screen, SuspectsView)
        await pilot.press("down", "enter")  # the second suspect: no correction shown
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView) and app.item_id == second
        assert "corrected:" not in svg_text(app)

    drive(app, scenario, size=(140, 40))


def test_no_optimiser_surface_shows_a_correction_or_the_suspects_queue(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Corrections are answers. In a real run, on a split with suspects and a correction: every field
    of the strategies' ProposalContext, reflect's prompts, and every agent tool (read_file on the file
    in any spelling, the list/read tools on the corrected item, add_case/edit_case naming it) say
    nothing of the correction or the queue."""
    from optimizer.loop.strategies.reflect import build_user_message, system_prompt
    from optimizer.loop.strategies.tools import ToolState, run_tool

    judge, planted, _medium, _low, _split = setup_triage(ws)
    with FakeLLMServer(default=judge) as server:
        triage_runs(ws, server, monkeypatch, steps=1)
    tid = sorted(planted)[0]
    reason = "SECRET-the-ninth-screenshot-shows-it-saved"
    right = "success" if judge.truth[tid].is_positive else "failure"
    assert _cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason", reason, "--by", "ana")[0] == 0
    split = open_split(Workspace.open(ws), SPLIT)
    assert tid in {s.trajectory_id for s in label_suspects(ledger_of(ws), split)}  # the queue holds it
    set_toml_key(ws, "optimizer", "allowed_files", '["prompts/judge.md", "prompts/rubric.md", '
                 '"prompts/memory/principles.md", "prompts/memory/cases.jsonl"]')
    commit_all(ws, "the memory is allowed")
    target = f"devset/{SPLIT}/corrections.jsonl"
    said: dict[str, str] = {}

    def probe(ctx: ProposalContext) -> Proposal:
        for f in dataclasses.fields(ctx):
            if f.name not in ("split", "workspace_root"):  # the split object: manifests and files, no text
                said[f"ctx.{f.name}"] = repr(getattr(ctx, f.name))
        said["reflect.system"] = system_prompt(ctx, 40)
        said["reflect.user"] = build_user_message(ctx)
        state = ToolState(ctx)
        for path in (target, f"./{target}", str(ws / target), f"prompts/../{target}",
                     f"prompts/memory/../../{target}", f"devset/{SPLIT}/../{SPLIT}/corrections.jsonl"):
            out = run_tool(state, "read_file", {"path": path})
            assert out.is_error and "not an allowed file" in out.text, path
            said[f"read_file {path}"] = out.text.replace(path, "<the path asked>")  # the refusal names it
        for name, args in (("list_disagreements", {}), ("read_trajectory", {"trajectory_id": tid}),
                           ("read_history", {}), ("read_guidance", {}), ("read_structure", {}),
                           ("add_case", {"text": "A saved file counts only when the last screen shows it.",
                                         "source_items": [tid], "id": "saved"}),
                           ("edit_case", {"id": "saved", "text": "The last screen decides.",
                                          "source_items": [tid]})):
            out = run_tool(state, name, args)
            said[name] = out.text
        assert not run_tool(state, "add_case", {"text": "x", "source_items": [tid], "id": "two"}).is_error
        return toggle(GOOD_ENTRY)(ctx)

    install(monkeypatch, ScriptedStrategy([probe]))
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1", "--replicates", "1",
                        "--policy", "literal") == 0
    assert said["list_disagreements"] and "added case saved" in said["add_case"] and "saved" in said["edit_case"]
    assert tid in said["ctx.disagreements"] or tid in said["list_disagreements"]  # the item itself is visible
    for name, text in said.items():
        assert reason not in text, name
        assert "corrected" not in text.lower() and "corrections.jsonl" not in text, name
        assert "label suspects" not in text.lower() and "suspects" not in text.lower(), name


# -- side doors into the corrections (issue s24, item 7) ---------------------------------------------


def _flipped(labels: dict[str, Label], tid: str) -> str:
    return "failure" if labels[tid].is_positive else "success"


def test_a_corrections_file_edited_outside_label_fix_is_refused_at_the_next_run_and_eval(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b = split.ids[0], split.ids[1]
    assert main(["label-fix", "-w", str(ws), a, "--label", _flipped(labels, a), "--reason", "a person's"]) == 0
    set_toml_key(ws, "loop", "labels", '"corrected"')
    commit_all(ws, "decide with the corrected labels")
    recorded = corrections_file(ws).read_bytes()
    # An agent with file access appends a line in the file's own format: valid, but no person wrote it.
    forged = json.dumps({"id": b, "label": _flipped(labels, b), "reason": "obviously", "by": "ana",
                         "at": "2026-12-01T10:00:00+00:00"}) + "\n"
    corrections_file(ws).write_bytes(recorded + forged.encode())
    code, out, err = _cli(capsys, "run", "-w", str(ws), "--provider", "openai", "--base-url",
                          "http://127.0.0.1:9/v1", "--model", "fake-judge")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"devset/{SPLIT}/corrections.jsonl" in err and "label-fix" in err and "label-adopt" in err
    assert not (ws / "experiments" / "ledger.sqlite").exists() or not ledger_of(ws).runs()
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        code, out, err = _cli(capsys, "eval", "-w", str(ws), "--provider", "openai", "--base-url",
                              server.openai_base_url, "--model", "fake-judge")
        assert server.inference_requests() == []
    assert code == 2 and "kappa" not in out.lower() and len(err.strip().splitlines()) == 1
    assert f"devset/{SPLIT}/corrections.jsonl" in err
    # A person's later label-fix refuses too: it must not bless the forged line by rewriting the file.
    c = split.ids[2]
    code, _out, err = _cli(capsys, "label-fix", "-w", str(ws), c, "--label", _flipped(labels, c), "--reason", "r")
    assert code == 2 and "corrections.jsonl" in err and b"obviously" in corrections_file(ws).read_bytes()
    # A file replaced by hand is refused, and so is one where no correction was ever recorded.
    corrections_file(ws).write_text(forged, encoding="utf-8")
    with pytest.raises(UserError, match=r"corrections\.jsonl was changed outside"):
        label_set(split, "corrected")
    ref = f"refs/judgeloop/corrections/{SPLIT}"
    record = git(ws, "rev-parse", ref).strip()
    git(ws, "update-ref", "-d", ref)
    with pytest.raises(UserError, match=r"corrections\.jsonl holds corrections no"):
        label_set(split, "corrected")
    git(ws, "update-ref", ref, record)
    # Back as recorded, it is read; a person who wants the hand edit adopts it, seeing what it changes.
    corrections_file(ws).write_bytes(recorded)
    assert list(label_set(split, "corrected").corrections) == [a]
    corrections_file(ws).write_bytes(recorded + forged.encode())
    code, out, err = _cli(capsys, "label-adopt", "-w", str(ws))
    assert code == 0 and b in out and "1 added" in out, err
    assert list(label_set(split, "corrected").corrections) == [a, b]


def test_concurrent_label_fix_processes_and_the_tui_writer_lose_no_correction(ws: Path) -> None:
    from tui.items import save_correction

    split = open_split(Workspace.open(ws), "sample")
    labels = load_labels(split)
    ids = split.ids
    assert len(ids) >= 88
    script = ("import sys\nfrom optimizer.cli import main\n"
              "for arg in sys.argv[3:]:\n"
              "    tid, label = arg.split('=')\n"
              "    code = main(['label-fix', '-w', sys.argv[1], '--split', sys.argv[2], tid, '--label', label,\n"
              "                 '--reason', 'seen ' + tid, '--by', 'proc'])\n"
              "    assert code == 0, code\n")
    batches = [ids[0:40], ids[40:80]]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(ws), "sample",
                               *(f"{t}={_flipped(labels, t)}" for t in batch)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for batch in batches]
    for tid in ids[80:88]:  # the TUI's writer, meanwhile, in this process
        save_correction(ws, "sample", tid, _flipped(labels, tid), "from the tui", "tui")
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-2000:]
    fixes = label_set(split, "corrected").corrections  # readable, and what label-fix recorded
    assert sorted(fixes) == sorted(ids[:88])
    assert all(fixes[t].label == _flipped(labels, t) for t in ids[:88])


def test_a_reason_over_what_the_reader_takes_is_refused_in_one_line_and_the_file_stays_readable(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.devset.corrections import MAX_LINE_BYTES

    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b = split.ids[0], split.ids[1]
    assert main(["label-fix", "-w", str(ws), a, "--label", _flipped(labels, a), "--reason", "first"]) == 0
    before = corrections_file(ws).read_bytes()
    code, out, err = _cli(capsys, "label-fix", "-w", str(ws), b, "--label", _flipped(labels, b),
                          "--reason", "x" * 20_000)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and len(err) < 500, err
    assert "--reason" in err and f"{MAX_LINE_BYTES:,}" in err
    assert corrections_file(ws).read_bytes() == before
    # Just under the limit still writes, and whatever was written reads back.
    code, out, err = _cli(capsys, "label-fix", "-w", str(ws), b, "--label", _flipped(labels, b),
                          "--reason", "y" * (MAX_LINE_BYTES - 400))
    assert code == 0, err
    assert list(label_set(split, "corrected").corrections) == [a, b]
    c = split.ids[2]
    assert main(["label-fix", "-w", str(ws), c, "--label", _flipped(labels, c), "--reason", "later"]) == 0


def test_label_fix_on_a_heldout_item_gives_the_same_refusal_whatever_its_label(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.heldout import import_held

    wsobj = Workspace.open(ws)
    dev = set(open_split(wsobj, SPLIT).ids)
    sample = load_labels(open_split(wsobj, "sample"))
    rest = [t for t in sample if t not in dev]
    pos = next(t for t in rest if sample[t].is_positive)
    neg = next(t for t in rest if not sample[t].is_positive)
    import_held(ws, [pos, neg])
    errors = []
    for split_name in ("held", "sample"):  # the held-out split, and the superset that holds its items
        for tid in (pos, neg):
            for label in ("success", "failure"):
                code, out, err = _cli(capsys, "label-fix", "-w", str(ws), "--split", split_name, tid, "--label",
                                      label, "--reason", "r")
                assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
                assert "already labelled" not in err and "held out" in err
                errors.append((split_name, err))
    for split_name in ("held", "sample"):
        assert len({err for name, err in errors if name == split_name}) == 1  # one message, whatever the label
    assert not (ws / "devset" / "held" / "corrections.jsonl").exists()
    assert not (ws / "devset" / "sample" / "corrections.jsonl").exists()
