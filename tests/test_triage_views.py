"""Label triage as people and optimisers see it: the TUI's suspects and item views driven through the real
app, the structural judges' evidence (panel members, reviews, criteria) in the queue's score, and no
optimiser surface showing a correction or the queue."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from optimizer.answers.triage import label_suspects
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split
from optimizer.ledger import Ledger, RunSpec
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.models import Label
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, commit_all, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, install, ledger_of, toggle
from tests.support.triage import SPLIT, corrections_file, report_dict, run_cli, setup_triage, triage_runs

# -- the TUI's suspects view -------------------------------------------------------------------------


@pytest.mark.slow
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
            ledger.record_verdicts(
                exp.id,
                [ItemVerdict(trajectory_id=t, success=r[0].success, replicates=r) for t, r in reps.items()],
            )

        def single(i: int, success: bool, confidence: str = "high", **extra: Any) -> ReplicateVerdict:
            return ReplicateVerdict(replicate=i, success=success, confidence=confidence, **extra)

        def panel(i: int, votes: list[tuple[bool, str]]) -> ReplicateVerdict:
            members = [
                MemberVerdict(member=f"m{k}", success=s, confidence=conf) for k, (s, conf) in enumerate(votes)
            ]
            agree = len({s for s, _ in votes}) == 1
            return ReplicateVerdict(
                replicate=i,
                success=sum(s for s, _ in votes) * 2 > len(votes),
                confidence="high" if agree else "low",
                members=members,
            )

        # Version s: a single judge, with high confidence, on the labels' side for a, c, d; against b and e.
        record(
            "s",
            {
                a: [single(0, True), single(1, True)],
                b: [single(0, False), single(1, False)],
                c: [single(0, True), single(1, True)],
                d: [single(0, False), single(1, False)],
                e: [single(0, False, "medium"), single(1, False, "medium")],
            },
        )
        # Version p: a panel of three. a: every member says failure (medium confidence each); b: two of three.
        record(
            "p",
            {
                a: [panel(i, [(False, "medium")] * 3) for i in range(2)],
                b: [panel(i, [(False, "medium"), (False, "medium"), (True, "high")]) for i in range(2)],
            },
        )
        # Version r: review and criteria. c: the review turned the success into a failure, citing steps
        # (the first verdict medium); e: a review that found nothing citable leaves e's medium failure.
        review = ReviewRecord(violation=True, applied=True, steps=[3, 4], reasoning="the file was deleted")
        met = [
            CriterionCheck(text="the file is saved", met=True, steps=[5]),
            CriterionCheck(text="nothing else changed", met=True, steps=[2, 6]),
        ]
        record(
            "r",
            {
                c: [single(i, False, "medium", review=review) for i in range(3)],
                d: [single(i, True, "medium", criteria=met) for i in range(3)],
                e: [single(i, False, "medium", review=ReviewRecord(violation=False)) for i in range(3)],
            },
        )
    return [a, b, c, d, e], labels


def test_a_panels_unanimous_members_rank_a_planted_error_above_a_split_panel(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each valid member a judgement; a unanimous replicate's members weigh 1 (optimizer.answers.triage's
    docstring). Through `judgeloop report --json`, and the figures by hand."""
    (a, b, *_rest), _labels = _record_structural(ws)
    suspects = {s["id"]: s for s in report_dict(ws, capsys)["label_suspects"]}
    # a: 2 single judgements for the label, 6 members against, unanimous → 6 × 1 / 8. Counting the
    # panel's vote alone (one judgement a replicate) it would be 2 of 4: no majority, no suspect.
    assert (suspects[a]["against"], suspects[a]["judged"]) == (6, 8)
    assert suspects[a]["score"] == pytest.approx(6 / 8) and suspects[a]["structural_against"] == 6
    assert (suspects[a]["versions"], suspects[a]["versions_against"]) == (2, 1)
    # b: 2 single judgements against (high), 4 of 6 members against (medium, split) → (2 + 4 × 0.5) / 8.
    assert (suspects[b]["against"], suspects[b]["judged"]) == (6, 8)
    assert suspects[b]["score"] == pytest.approx(4 / 8) and suspects[b]["structural_against"] == 0
    ranked = [s["id"] for s in report_dict(ws, capsys)["label_suspects"]]
    assert ranked.index(a) < ranked.index(b)
    text = run_cli(capsys, "report", "-w", str(ws))[1]
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


@pytest.mark.slow
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
    code, _out, err = run_cli(
        capsys,
        "label-fix",
        "-w",
        str(ws),
        first,
        "--label",
        right,
        "--reason",
        "step 7 shows the dialog cancelled",
        "--by",
        "ana",
    )
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


@pytest.mark.slow
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
    assert (
        run_cli(capsys, "label-fix", "-w", str(ws), tid, "--label", right, "--reason", reason, "--by", "ana")[
            0
        ]
        == 0
    )
    split = open_split(Workspace.open(ws), SPLIT)
    assert tid in {s.trajectory_id for s in label_suspects(ledger_of(ws), split)}  # the queue holds it
    set_toml_key(
        ws,
        "optimizer",
        "allowed_files",
        '["prompts/judge.md", "prompts/rubric.md", '
        '"prompts/memory/principles.md", "prompts/memory/cases.jsonl"]',
    )
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
        for path in (
            target,
            f"./{target}",
            str(ws / target),
            f"prompts/../{target}",
            f"prompts/memory/../../{target}",
            f"devset/{SPLIT}/../{SPLIT}/corrections.jsonl",
        ):
            out = run_tool(state, "read_file", {"path": path})
            assert out.is_error and "not an allowed file" in out.text, path
            said[f"read_file {path}"] = out.text.replace(path, "<the path asked>")  # the refusal names it
        for name, args in (
            ("list_disagreements", {}),
            ("read_trajectory", {"trajectory_id": tid}),
            ("read_history", {}),
            ("read_guidance", {}),
            ("read_structure", {}),
            (
                "add_case",
                {
                    "text": "A saved file counts only when the last screen shows it.",
                    "source_items": [tid],
                    "id": "saved",
                },
            ),
            ("edit_case", {"id": "saved", "text": "The last screen decides.", "source_items": [tid]}),
        ):
            out = run_tool(state, name, args)
            said[name] = out.text
        assert not run_tool(state, "add_case", {"text": "x", "source_items": [tid], "id": "two"}).is_error
        return toggle(GOOD_ENTRY)(ctx)

    install(monkeypatch, ScriptedStrategy([probe]))
    with FakeLLMServer(default=judge) as server:
        assert (
            run_loop(
                ws,
                server.openai_base_url,
                "--max-experiments",
                "1",
                "--replicates",
                "1",
                "--policy",
                "literal",
            )
            == 0
        )
    assert (
        said["list_disagreements"] and "added case saved" in said["add_case"] and "saved" in said["edit_case"]
    )
    assert tid in said["ctx.disagreements"] or tid in said["list_disagreements"]  # the item itself is visible
    for name, text in said.items():
        assert reason not in text, name
        assert "corrected" not in text.lower() and "corrections.jsonl" not in text, name
        assert "label suspects" not in text.lower() and "suspects" not in text.lower(), name
