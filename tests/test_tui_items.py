"""The TUI's disagreements, item and review screens, driven by Textual's Pilot over the session's real short
run (`run_ws`, tests/conftest.py) or a copy of it (`ws_copy`) for the tests that write. Moved from
tests/test_tui.py."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from rich.text import Text
from textual.widgets import DataTable, Static

from optimizer.cli import main
from optimizer.judge.types import JudgeToolCall
from optimizer.ledger import Ledger
from tests.support.loop import present
from tests.support.tui_driving import (
    capture_notifications,
    drive,
    svg_text,
    wait_until,
)
from tests.support.tui_runs import ledger_of
from tui.app import JudgeloopApp, settle
from tui.items import disagreements
from tui.modals import ReviewModal
from tui.views import DisagreementsView, ItemView, ReviewsView
from tui.widgets import StepImage

# ---------------------------------------------------------------------------------------------
# Disagreements and items


def table_keys(table: Any) -> list[str]:
    """The row keys of a DataTable, top to bottom (what it shows, in order)."""
    from textual.coordinate import Coordinate

    return [table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value for row in range(table.row_count)]


@pytest.mark.slow
def test_disagreement_filters_select_kind_type_stability_and_review(ws_copy: Path) -> None:
    with Ledger(ws_copy / "experiments" / "ledger.sqlite") as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        labels = ledger.labels(run.id)
        verdicts = {v.trajectory_id: v for v in ledger.item_verdicts(base.id)}
        # A disagreement: the majority answer is not the label (no valid answer counts as wrong).
        wrong = [t for t, v in verdicts.items() if v.success != labels[t].positive]
        fps = sorted(t for t in wrong if not labels[t].positive)
        fns = sorted(t for t in wrong if labels[t].positive)
        assert fps and fns
        reviewed = {fps[0], fns[-1]}
        for tid in sorted(reviewed):
            ledger.add_review(tid, "judge_wrong", "looked at it", experiment_id=base.id)
        agreeing = next(t for t in verdicts if t not in wrong)
        ledger.add_review(agreeing, "label_suspect", "reviewed, but the judge agrees: never listed")
    everything = fps + fns  # false positives first, each kind by id

    def only(keep: Callable[[str], bool]) -> list[str]:
        return [t for t in everything if keep(t)]

    def negatives_typed(name: str) -> list[str]:
        # A positive has no mistake type: a type filter shows negatives only ("untyped": no type given).
        return only(lambda t: not labels[t].positive and (labels[t].mistake_type or "untyped") == name)

    # (keys, the rows that must show, the filter line); t cycles through the three types, then untyped.
    steps: list[tuple[tuple[str, ...], list[str], str]] = [
        ((), everything, "FP+FN · any type · stable or not · reviewed or not"),
        (("f",), fps, "FP · any type"),
        (("f",), fns, "FN · any type"),
        (("f",), everything, "FP+FN · any type"),
        (("t",), negatives_typed("Critical Mistake"), "FP+FN · Critical Mistake ·"),
        (("t",), negatives_typed("Bad Side Effect"), "FP+FN · Bad Side Effect ·"),
        (
            ("t",),
            negatives_typed("Misunderstanding of the Instruction"),
            "· Misunderstanding of the Instruction ·",
        ),
        (("t",), negatives_typed("untyped"), "FP+FN · untyped ·"),
        (("t",), everything, "FP+FN · any type ·"),
        (("u",), only(lambda t: verdicts[t].unstable), "· unstable only ·"),
        (("u",), only(lambda t: not verdicts[t].unstable), "· stable only ·"),
        (("u",), everything, "· stable or not ·"),
        (("n",), only(lambda t: t not in reviewed), "· not reviewed"),
        (("n",), only(lambda t: t in reviewed), "· reviewed   ("),
        (("n",), everything, "· reviewed or not"),
        (("f", "n", "n"), [fps[0]], "FP · any type · stable or not · reviewed   ("),
    ]
    # The data exercise the filters: each type filter narrows the list, and some type is really absent
    # from the positives that the plain "untyped" rule would otherwise let in.
    assert all(len(rows) < len(everything) for keys, rows, _ in steps[4:8])
    assert any(rows for _, rows, _ in steps[4:8])
    app = JudgeloopApp(
        ws_copy, image_mode="halfcell", watch=False, experiment_id=base.id, start_view="disagreements"
    )

    async def scenario(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, DisagreementsView)
        table = cast(DataTable[Any], screen.query_one("#disagreement-table"))
        for keys, rows, filter_text in steps:
            await pilot.press(*keys)
            line = str(screen.query_one("#disagreement-filters").render())
            assert table_keys(table) == rows, (keys, line)
            assert filter_text in line, (keys, line)
            assert [str(table.get_row(t)[6]) for t in rows] == [
                "yes" if t in reviewed else "" for t in rows
            ]  # rev.

    drive(app, scenario)


@pytest.mark.slow
def test_item_view_shows_label_replicates_steps_and_moves_step_by_step(
    run_ws: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        item = disagreements(ledger.labels(run.id), ledger.item_verdicts(base.id), set())[0]
    app = JudgeloopApp(
        run_ws,
        image_mode="halfcell",
        watch=False,
        experiment_id=base.id,
        item_id=item.trajectory_id,
        start_view="item",
    )
    seen = capture_notifications(app)
    monkeypatch.delenv("OPENER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no xdg-open anywhere: opening must degrade to a message

    async def scenario(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, ItemView) and screen.detail is not None
        detail = screen.detail
        text = svg_text(app)
        assert detail.instruction[:40] in text and "replicate 0" in text and "replicate 1" in text
        assert f"label: {item.label.label}" in text
        assert len(detail.steps) > 2 and detail.steps[0].action in text
        image = screen.query_one(StepImage)
        assert image.path == detail.steps[0].screenshot and image.path is not None and image.path.is_file()
        await pilot.press("right")
        await settle(app, pilot)
        assert screen.step_index == 1 and image.path == detail.steps[1].screenshot
        assert "step 1:" in svg_text(app)
        await pilot.press("left", "left")
        await settle(app, pilot)
        assert screen.step_index == 0
        await pilot.press("o")
        assert any("no program to open images" in s and str(detail.steps[0].screenshot) in s for s in seen)
        # The same item under the next experiment that judged it.
        await pilot.press("right_square_bracket")
        await settle(app, pilot)
        assert app.experiment_id != base.id and screen.detail.experiment.id == app.experiment_id
        assert screen.detail.trajectory_id == item.trajectory_id

    drive(app, scenario)


@pytest.mark.slow
@pytest.mark.parametrize("stored", ["data", "old_lines"])
def test_item_view_lists_an_agentic_judges_tool_calls_and_marks_the_steps_it_viewed(
    ws_copy: Path, stored: str
) -> None:
    tools = [
        JudgeToolCall("read_steps", {"first": 0, "last": 24}),
        JudgeToolCall("view_screenshots", {"steps": [3, 7]}),
        JudgeToolCall("view_screenshots", {"steps": [5]}, "refused"),  # not shown: not marked
        JudgeToolCall("submit_verdict"),
    ]
    path = ws_copy / "experiments" / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        item = ledger.item_verdicts(base.id)[0]
        item.replicates[0].tools = tools
        ledger.record_verdicts(base.id, [item])
    if stored == "old_lines":  # a ledger written before tool calls were data holds their display lines
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE verdicts SET tools = ? WHERE experiment_id = ? AND trajectory_id = ? AND replicate = 0",
                (json.dumps([str(c) for c in tools]), base.id, item.trajectory_id),
            )
    app = JudgeloopApp(
        ws_copy,
        image_mode="halfcell",
        watch=False,
        experiment_id=base.id,
        item_id=item.trajectory_id,
        start_view="item",
    )

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ItemView) and app.screen.detail is not None
        text = svg_text(app)
        assert (
            "tools: read_steps(0-24) · view_screenshots(3, 7) · view_screenshots(5) (refused) · submit_verdict"
            in text
        )
        steps = cast(DataTable[Any], app.screen.query_one("#step-table"))
        marked = [row for row in range(steps.row_count) if str(steps.get_row_at(row)[0]).endswith("●")]
        assert marked == [3, 7]  # the steps whose screenshots it viewed

    drive(app, scenario, size=(200, 50))  # the tools line fits the left half unwrapped


@pytest.mark.slow
def test_item_view_lists_criteria_and_evidence_and_jumps_to_each_cited_step(ws_copy: Path) -> None:
    from optimizer.ledger import CriterionCheck, ReviewRecord

    path = ws_copy / "experiments" / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        item = ledger.item_verdicts(base.id)[0]
        rep = item.replicates[0]
        rep.criteria = [
            CriterionCheck(text="The report is saved as a PDF", met=True, steps=[2, 0]),
            CriterionCheck(text="No other file is changed", met=False, steps=[1]),
        ]
        rep.evidence_steps = [2]
        rep.review = ReviewRecord(
            violation=True,
            applied=True,
            steps=[1],
            reasoning="step 1 deletes a file",
            first_verdict={"success": True},
        )
        ledger.record_verdicts(base.id, [item])
    app = JudgeloopApp(
        ws_copy,
        image_mode="halfcell",
        watch=False,
        experiment_id=base.id,
        item_id=item.trajectory_id,
        start_view="item",
    )

    async def scenario(pilot: Any) -> None:
        view = app.screen
        assert isinstance(view, ItemView) and view.detail is not None and len(view.detail.steps) >= 3
        text = svg_text(app)
        assert "criteria (1/2 met" in text
        assert (
            "✓ The report is saved as a PDF — steps 2, 0" in text
            and "✗ No other file is changed — step 1" in text
        )
        assert "evidence: step 2" in text and "review: turned success into failure — step 1" in text
        steps = cast(DataTable[Any], view.query_one("#step-table"))
        marked = [row for row in range(steps.row_count) if str(steps.get_row_at(row)[0]).endswith("◆")]
        assert marked == [0, 1, 2]
        view.step_index = 0
        seen = []
        for _ in range(4):  # n: the next cited step, wrapping round
            await pilot.press("n")
            await settle(app, pilot)
            seen.append(view.step_index)
            assert steps.cursor_row == view.step_index
        assert seen == [1, 2, 0, 1]
        await pilot.press("p")
        await settle(app, pilot)
        assert view.step_index == 0

    drive(app, scenario, size=(200, 50))


@pytest.mark.slow
def test_open_png_uses_opener(run_ws: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "opened.txt"
    script = tmp_path / "opener.sh"
    script.write_text(f'#!/bin/sh\necho "$1" > {marker}\n')
    script.chmod(0o755)
    monkeypatch.setenv("OPENER", str(script))
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        tid = ledger.item_verdicts(present(run.incumbent_experiment))[0].trajectory_id
    app = JudgeloopApp(
        run_ws,
        image_mode="halfcell",
        watch=False,
        experiment_id=run.incumbent_experiment,
        item_id=tid,
        start_view="item",
    )

    async def scenario(pilot: Any) -> None:
        await pilot.press("o")
        await wait_until(
            pilot, lambda: marker.exists() and marker.read_text().strip(), "the opener (a process)"
        )
        assert marker.read_text().strip() == str(app.screen.query_one(StepImage).path)

    drive(app, scenario)


# ---------------------------------------------------------------------------------------------
# Reviews


@pytest.mark.slow  # three app sessions over one ledger
def test_review_is_stored_survives_a_restart_and_exports(ws_copy: Path, tmp_path: Path) -> None:
    with ledger_of(ws_copy) as ledger:
        run = present(ledger.latest_run())
        tid = ledger.item_verdicts(present(run.incumbent_experiment))[0].trajectory_id
    app = JudgeloopApp(
        ws_copy,
        image_mode="halfcell",
        watch=False,
        experiment_id=run.incumbent_experiment,
        item_id=tid,
        start_view="item",
    )

    async def review(pilot: Any) -> None:
        await pilot.press("l")
        await pilot.pause()
        assert isinstance(app.screen, ReviewModal)
        await pilot.press(*"off target", "enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView) and app.screen.detail is not None
        assert [(r.kind, r.note) for r in app.screen.detail.reviews] == [("label_suspect", "off target")]

    drive(app, review)

    again = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, start_view="reviews")

    async def listed(pilot: Any) -> None:
        assert isinstance(again.screen, ReviewsView)
        text = svg_text(again)
        assert "label suspect" in text and "off target" in text and tid[:13] in text

    drive(again, listed)

    out = tmp_path / "reviews.jsonl"
    assert main(["reviews", "-w", str(ws_copy), "--export", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["trajectory_id"], r["kind"], r["note"], r["experiment_id"]) for r in rows] == [
        (tid, "label_suspect", "off target", run.incumbent_experiment)
    ]


@pytest.mark.slow
def test_item_view_shows_both_stages_of_an_escalated_item_and_the_escalation_share(ws_copy: Path) -> None:
    from optimizer.ledger.rows import CascadeRecord

    path = ws_copy / "experiments" / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        went_on, stayed = ledger.item_verdicts(base.id)[:2]
        for item, escalated in ((went_on, True), (stayed, False)):
            for rep in item.replicates:
                rep.cascade = CascadeRecord(
                    rule="success",
                    escalated=escalated,
                    final="second" if escalated else "first",
                    first={"success": escalated, "confidence": "medium", "reasoning": "cheap"},
                    first_cost_usd=0.0015,
                    second_cost_usd=0.056 if escalated else 0.0,
                )
        ledger.record_verdicts(base.id, [went_on, stayed])
        answer = {True: "success", False: "failure", None: "invalid"}[went_on.replicates[0].success]
    shown: dict[str, str] = {}
    for tid in (went_on.trajectory_id, stayed.trajectory_id):
        app = JudgeloopApp(
            ws_copy, image_mode="halfcell", watch=False, experiment_id=base.id, item_id=tid, start_view="item"
        )

        async def scenario(pilot: Any, app: JudgeloopApp = app, tid: str = tid) -> None:
            view = app.screen
            assert isinstance(view, ItemView) and view.detail is not None
            content = view.query_one("#item-replicates", Static).content
            shown[tid] = content.plain if isinstance(content, Text) else str(content)

        drive(app, scenario, size=(200, 60))
    up, down = shown[went_on.trajectory_id], shown[stayed.trajectory_id]
    # The experiment's share (of replicate verdicts), on both items' pages.
    k, n = len(went_on.replicates), len(went_on.replicates) + len(stayed.replicates)
    for text in (up, down):
        assert f"cascade: {k} of {n} verdicts escalated ({k / n:.0%}) in this experiment" in text
    # The escalated item: the first verdict, the rule that sent it on, the second verdict marked final.
    assert "first judge: success · confidence medium → escalated (rule success)" in up
    assert f"second judge: {answer} · final" in up and "cost $0.0015 + $0.0560" in up
    # The item that stayed: the first verdict is final, no second judge.
    assert "first judge: failure · confidence medium · final (rule success: not escalated)" in down
    assert "second judge:" not in down
