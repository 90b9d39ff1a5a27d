"""The TUI driven by Textual's Pilot over a ledger made by a real short `judgeloop run` (fake OpenAI server).

One session-scoped run (init --sample, a 32-item split, the library strategy, 5 candidates, 2
replicates) feeds every read-only test; tests that write (reviews, runs, STOP) work on a copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from textual.command import CommandList
from textual.widgets import DataTable, Input, Select

from optimizer.cli import main
from optimizer.judge.types import JudgeToolCall
from optimizer.ledger import Ledger
from optimizer.report import token_split
from optimizer.vocab import EventKind, ExperimentStatus
from tests.support.loop import present
from tests.support.tui_driving import (
    EVENT_WAIT_S,
    capture_notifications,
    drive,
    screen_lines,
    screen_rows,
    svg_text,
    wait_until,
)
from tests.support.tui_runs import make_real_run
from tui import runs
from tui.app import VIEWS, JudgeloopApp, settle
from tui.data import disagreements
from tui.modals import ConfirmModal, ErrorModal, ErrorScreen, ItemListModal, ReviewModal, StartRunModal
from tui.views import DisagreementsView, ExperimentView, HistoryView, ItemView, ReviewsView
from tui.widgets import FixedColumnsTable, StatusStrip, StepImage


@pytest.fixture(scope="session")
def run_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace whose ledger holds one real finished run (baseline, rolled-back and kept candidates)."""
    ws = tmp_path_factory.mktemp("tui") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert make_real_run(ws, max_experiments=5, replicates=2, items=32, screenshots="none") == 0
    return ws


@pytest.fixture
def ws_copy(run_ws: Path, tmp_path: Path) -> Path:
    """A private copy of the run workspace for tests that write (reviews, STOP, runs)."""
    target = tmp_path / "ws"
    shutil.copytree(run_ws, target, symlinks=True)
    return target


def ledger_of(ws: Path) -> Ledger:
    return Ledger.open_readonly(ws / "experiments" / "ledger.sqlite")


# ---------------------------------------------------------------------------------------------
# History


def test_history_shows_every_experiment_and_the_curves_then_filters_and_sorts(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        assert run is not None
        experiments = ledger.experiments(run.id)
        chain = [e.id for e in ledger.kept_chain(run.id)]
    assert len(chain) >= 1 and {e.status for e in experiments} >= {"baseline", "rolled_back"}
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, HistoryView)
        table = cast(DataTable[Any], screen.query_one("#history-table"))
        assert table.row_count == len(experiments)
        assert screen.history is not None and screen.history.chain_ids == chain
        text = svg_text(app)
        assert f"run {run.id}" in text and "baseline" in text and "rolled back" in text
        assert "kappa" in text and "fpr" in text and "kept chain" in text
        if any(e.early_stopped for e in experiments):
            assert "stopped early (partial *)" in text  # drawn at what it measured (the table's * figures)
        # The cursor starts on the incumbent, so e opens it.
        assert app.experiment_id == run.incumbent_experiment
        # Filter: the box shows on /, its text applies on enter, esc clears it.
        await pilot.press("slash")
        cast(Input, screen.query_one("#history-filter")).value = "status:rolled_back"
        await pilot.press("enter")
        rolled = [r for r in screen.history.rows if r.experiment.status == "rolled_back"]
        assert table.row_count == len(rolled) < len(experiments)
        await pilot.press("escape")
        assert table.row_count == len(experiments)
        first = table.get_row_at(0)[0].plain
        await pilot.press("o")  # same key again: descending
        assert table.get_row_at(0)[0].plain != first

    drive(app, scenario)


def chart_x_axis(chart: Any) -> tuple[list[str], list[tuple[int, int]], list[int], list[str]]:
    """A rendered chart's x axis: (lines above the axis, each tick label's column span, each tick mark's
    column, the labels) — read from the text the chart draws, as a person reads it."""
    lines = chart.render().plain.splitlines()
    axis = next(i for i, line in enumerate(lines) if line.lstrip().startswith("└"))
    marks = [col for col, ch in enumerate(lines[axis]) if ch == "┬"]
    found = list(re.finditer(r"\S+", lines[axis + 1]))
    return lines[:axis], [m.span() for m in found], marks, [m.group() for m in found]


def test_chart_x_ticks_are_integers_equal_to_the_experiment_ids_of_the_table(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        experiments = ledger.experiments(run.id)
    baseline = next(e for e in experiments if e.status == "baseline")
    assert [e.id for e in experiments] != [e.seq for e in experiments]  # the two numberings differ here
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        table = cast(DataTable[Any], app.screen.query_one("#history-table"))
        shown = [table.get_row_at(r)[0].plain.rstrip("◆") for r in range(table.row_count)]
        assert shown == [str(e.id) for e in experiments]
        for chart_id in ("#kappa-chart", "#fpr-chart"):
            plot, spans, marks, labels = chart_x_axis(app.screen.query_one(chart_id))
            # Every tick is an integer experiment id (not 0.00, 0.75, …); at this width, all of them.
            assert labels == shown, (chart_id, labels)
            # One tick mark under each label, and the baseline's marker B stands over its id's tick.
            assert len(marks) == len(spans) and all(a <= m < b for m, (a, b) in zip(marks, spans, strict=True))
            tick_of = dict(zip(labels, marks, strict=True))
            b_columns = {m.start() for line in plot for m in re.finditer(r"(?<!B)B(?!B)", line)}  # not the legend's BB
            assert tick_of[str(baseline.id)] in b_columns, (chart_id, b_columns)

    drive(app, scenario)


def test_empty_workspace_says_no_runs_yet_press_r(empty_workspace: Any) -> None:
    app = JudgeloopApp(empty_workspace.root, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, HistoryView)
        assert app.screen.has_class("-empty")
        assert "no runs yet — press r to start one" in svg_text(app)

    drive(app, scenario, size=(80, 24))


def test_newer_schema_ledger_gets_one_clear_error_screen(empty_workspace: Any) -> None:
    path = empty_workspace.root / "experiments" / "ledger.sqlite"
    Ledger(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    app = JudgeloopApp(empty_workspace.root, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ErrorScreen)
        assert "newer judgeloop" in app.screen.message and "upgrade judgeloop" in app.screen.message
        await pilot.press("h")  # views stay unreachable: the error is the whole app
        assert isinstance(app.screen, ErrorScreen)

    drive(app, scenario)


def test_a_ledger_that_appears_unreadable_is_shown_while_a_missing_or_empty_one_is_waited_for(
    empty_workspace: Any, tmp_path: Path
) -> None:
    """No ledger, then the empty file a starting run creates: nothing is wrong yet (the history says no
    runs yet). A ledger that then appears and this version cannot read is an error the user sees,
    not "no runs yet" for ever."""
    path = empty_workspace.root / "experiments" / "ledger.sqlite"
    newer = tmp_path / "newer.sqlite"
    Ledger(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.close()  # the last connection checkpoints the WAL: the one file holds the whole ledger
    app = JudgeloopApp(empty_workspace.root, image_mode="halfcell", watch=True, watch_interval_s=0.02)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, HistoryView) and app.screen.has_class("-empty")
        path.write_bytes(b"")
        await pilot.pause(0.2)  # several polls of an empty file
        assert isinstance(app.screen, HistoryView) and app.screen.has_class("-empty")
        os.replace(newer, path)  # whole, so no poll sees a half-made file
        await wait_until(pilot, lambda: isinstance(app.screen, ErrorModal), "the watcher thread's message")
        assert isinstance(app.screen, ErrorModal)
        assert "newer judgeloop" in app.screen.message and "upgrade judgeloop" in app.screen.message

    drive(app, scenario, size=(80, 24))


def test_not_ready_is_a_missing_empty_or_runless_ledger_and_nothing_else(tmp_path: Path) -> None:
    from optimizer.errors import UserError
    from tui.data import LedgerNotReady, load_helped, load_history, open_ledger

    path = tmp_path / "ledger.sqlite"
    with pytest.raises(LedgerNotReady):
        open_ledger(path)
    path.write_bytes(b"")  # created by a starting run, schema not written yet
    with pytest.raises(LedgerNotReady):
        open_ledger(path)
    Ledger(path).close()
    with open_ledger(path) as ledger:
        for load in (load_history, load_helped):
            with pytest.raises(LedgerNotReady, match="no runs yet"):
                load(ledger)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()  # checkpoints the WAL into the file
    with pytest.raises(UserError, match="newer judgeloop") as newer:
        open_ledger(path)
    assert not isinstance(newer.value, LedgerNotReady)
    path.write_bytes(b"not a database, and long enough to have a header: " * 4)
    with pytest.raises(UserError, match="not a readable judgeloop ledger") as garbage:
        open_ledger(path)
    assert not isinstance(garbage.value, LedgerNotReady)


# ---------------------------------------------------------------------------------------------
# Experiment, flips, compare


def test_experiment_view_shows_decision_metrics_diff_and_a_flip_cell_opens_its_items(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        kept = next(e for e in ledger.experiments(run.id) if e.status == "kept")
        kept = ledger.get_experiment(kept.id)
        labels = ledger.labels(run.id)
        let_through = {e: {v.trajectory_id for v in ledger.item_verdicts(e) if v.success is not False}
                       for e in (kept.id, present(kept.parent_id))}
    # False positives per type, counted here from the labels and the majority answers.
    kinds = ("Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction")
    per_type = {e: {k: sum(1 for t in ids if not labels[t].positive and (labels[t].mistake_type or "untyped") == k)
                    for k in (*kinds, "untyped")} for e, ids in let_through.items()}
    fp_line = "FP by type (incumbent → this, same items): " + ", ".join(
        f"{k} {per_type[present(kept.parent_id)][k]} → {per_type[kept.id][k]}" for k in (*kinds, "untyped"))
    cells = {(0, 1): "tp_to_fn", (0, 2): "tn_to_fp", (1, 1): "fn_to_tp", (1, 2): "fp_to_tn"}
    (row, col), key = next((rc, k) for rc, k in cells.items() if kept.flips and kept.flips[k])
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, experiment_id=kept.id, start_view="experiment")
    seen = capture_notifications(app)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ExperimentView)
        await pilot.press("k")  # keep applies only to a waiting (propose-only) candidate
        assert any("only a waiting candidate" in s for s in seen)
        text = svg_text(app)
        assert f"experiment {kept.id}" in text and "decision:" in text and "95% interval" in text
        assert "diff against parent" in text and "prompts/rubric.md" in text and "Additional rules" in text
        assert (kept.reason or "")[:30] in text
        assert " ".join(fp_line.split()) in " ".join(text.split())
        # The judge's tokens as billed (uncached input, cache reads and writes when any, output) and dollars.
        split = token_split(kept.input_tokens, kept.cache_read_tokens, kept.cache_write_tokens, kept.output_tokens)
        assert f"{split} · ${kept.cost_usd:.4f}" in " ".join(text.split())
        table = cast(DataTable[Any], app.screen.query_one("#flip-table"))
        table.focus()
        table.move_cursor(row=row, column=col)
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ItemListModal)
        assert app.screen.ids == present(kept.flips)[key]
        await pilot.press("enter")  # the first item opens in the item view
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView)
        assert app.item_id == kept.flips[key][0] and app.experiment_id == kept.id

    drive(app, scenario)


def test_experiment_view_title_numbers_the_experiment_as_its_history_row(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        experiments = ledger.experiments(run.id)
    # One whose run position (seq) is neither its id nor its parent's, so a title showing it stands out.
    exp = next(e for e in experiments if e.parent_id is not None and e.seq not in (e.id, e.parent_id))
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        table = cast(DataTable[Any], app.screen.query_one("#history-table"))
        row = table.get_row_index(str(exp.id))
        table.move_cursor(row=row)
        shown = table.get_row_at(row)[0].plain.rstrip("◆")
        parent_shown = table.get_row_at(table.get_row_index(str(exp.parent_id)))[0].plain.rstrip("◆")
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ExperimentView)
        title = svg_text(app).splitlines()[0]
        assert title.startswith(f"experiment {shown} ")
        # The only numbers besides the run id: this experiment's and its parent's, as the table shows them.
        assert re.findall(r"\d+", title.replace(run.id, "")) == [shown, parent_shown], title

    drive(app, scenario)


CORRECT = {"TP", "TN"}


def flip_label_claims(words: str) -> list[Callable[[str, str], bool]]:
    """What a flip-table row or column label says about each of its cells (before → after)."""
    claims: list[Callable[[str, str], bool]] = []
    if "newly wrong" in words:
        claims.append(lambda before, after: before in CORRECT and after not in CORRECT)
    elif "wrong" in words:
        claims.append(lambda before, after: after not in CORRECT)
    if "newly right" in words:
        claims.append(lambda before, after: before not in CORRECT and after in CORRECT)
    elif "right" in words:
        claims.append(lambda before, after: after in CORRECT)
    if "judged failed" in words:
        claims.append(lambda before, after: after in {"FN", "TN"})
    if "judged success" in words:
        claims.append(lambda before, after: after in {"TP", "FP"})
    if "positive" in words:
        claims.append(lambda before, after: before in {"TP", "FN"})
    if "negative" in words:
        claims.append(lambda before, after: before in {"TN", "FP"})
    return claims


def test_flip_table_labels_are_true_of_every_cell_in_their_row_and_column(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        kept = ledger.get_experiment(next(e.id for e in ledger.experiments(run.id) if e.status == "kept"))
    arrows = {"TP→FN": "tp_to_fn", "FN→TP": "fn_to_tp", "TN→FP": "tn_to_fp", "FP→TN": "fp_to_tn"}
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, experiment_id=kept.id, start_view="experiment")

    async def scenario(pilot: Any) -> None:
        table = cast(DataTable[Any], app.screen.query_one("#flip-table"))
        headers = [str(column.label) for column in table.columns.values()]
        seen = set()
        for row in range(table.row_count):
            label, *cells = (str(cell) for cell in table.get_row_at(row))
            assert flip_label_claims(label), label  # a row label that says what its cells are
            for column, cell in enumerate(cells, start=1):
                arrow, count = cell.split()
                before, after = arrow.split("→")
                for claim in flip_label_claims(label) + flip_label_claims(headers[column]):
                    assert claim(before, after), (label, headers[column], cell)
                assert int(count) == len(present(kept.flips)[arrows[arrow]])
                seen.add(arrow)
        assert seen == set(arrows)

    drive(app, scenario)


def test_experiment_view_splits_the_cost_into_judge_and_optimiser(ws_copy: Path) -> None:
    import sqlite3

    with ledger_of(ws_copy) as ledger:
        run = present(ledger.latest_run())
        exp = next(e for e in ledger.experiments(run.id) if e.seq > 0)
    conn = sqlite3.connect(ws_copy / "experiments" / "ledger.sqlite")  # as a run with an LLM optimiser writes it
    conn.execute("UPDATE experiments SET optimizer_calls = 3, optimizer_input_tokens = 1000, "
                 "optimizer_output_tokens = 234, optimizer_cost_usd = 0.05, cost_usd = cost_usd + 0.05 WHERE id = ?",
                 (exp.id,))
    conn.commit()
    conn.close()
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, experiment_id=exp.id, start_view="experiment")

    async def scenario(pilot: Any) -> None:
        text = svg_text(app)
        assert f"judge ${exp.cost_usd:.4f} · optimiser $0.0500 (3 calls · 1,234 tokens)" in text
        assert f"${exp.cost_usd + 0.05:.4f}" in text  # the total

    drive(app, scenario)


def test_compare_shows_two_experiments_and_the_flips_between_them(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        exps = ledger.experiments(present(ledger.latest_run()).id)
    kept = next(e for e in exps if e.status == "kept")
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, experiment_id=kept.id, start_view="compare")

    async def scenario(pilot: Any) -> None:
        text = svg_text(app)
        assert f"experiment {kept.parent_id} (left) vs {kept.id} (right)" in text
        counts = kept.flip_counts()
        assert f"{counts['fn_to_tp'] + counts['fp_to_tn']} newly right" in text
        assert f"{counts['tp_to_fn'] + counts['tn_to_fp']} newly wrong" in text

    drive(app, scenario)


# ---------------------------------------------------------------------------------------------
# Disagreements and items


def table_keys(table: Any) -> list[str]:
    """The row keys of a DataTable, top to bottom (what it shows, in order)."""
    from textual.coordinate import Coordinate

    return [table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value for row in range(table.row_count)]


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
        (("t",), negatives_typed("Misunderstanding of the Instruction"), "· Misunderstanding of the Instruction ·"),
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
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, experiment_id=base.id, start_view="disagreements")

    async def scenario(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, DisagreementsView)
        table = cast(DataTable[Any], screen.query_one("#disagreement-table"))
        for keys, rows, filter_text in steps:
            await pilot.press(*keys)
            line = str(screen.query_one("#disagreement-filters").render())
            assert table_keys(table) == rows, (keys, line)
            assert filter_text in line, (keys, line)
            assert [str(table.get_row(t)[6]) for t in rows] == ["yes" if t in reviewed else "" for t in rows]  # rev.

    drive(app, scenario)


def test_item_view_shows_label_replicates_steps_and_moves_step_by_step(
    run_ws: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        item = disagreements(ledger.labels(run.id), ledger.item_verdicts(base.id), set())[0]
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, experiment_id=base.id,
                       item_id=item.trajectory_id, start_view="item")
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


@pytest.mark.parametrize("stored", ["data", "old_lines"])
def test_item_view_lists_an_agentic_judges_tool_calls_and_marks_the_steps_it_viewed(ws_copy: Path, stored: str) -> None:
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
            conn.execute("UPDATE verdicts SET tools = ? WHERE experiment_id = ? AND trajectory_id = ? AND replicate = 0",
                         (json.dumps([str(c) for c in tools]), base.id, item.trajectory_id))
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, experiment_id=base.id,
                       item_id=item.trajectory_id, start_view="item")

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ItemView) and app.screen.detail is not None
        text = svg_text(app)
        assert ("tools: read_steps(0-24) · view_screenshots(3, 7) · view_screenshots(5) (refused) · submit_verdict"
                in text)
        steps = cast(DataTable[Any], app.screen.query_one("#step-table"))
        marked = [row for row in range(steps.row_count) if str(steps.get_row_at(row)[0]).endswith("●")]
        assert marked == [3, 7]  # the steps whose screenshots it viewed

    drive(app, scenario, size=(200, 50))  # the tools line fits the left half unwrapped


def test_item_view_lists_criteria_and_evidence_and_jumps_to_each_cited_step(ws_copy: Path) -> None:
    from optimizer.ledger import CriterionCheck, ReviewRecord

    path = ws_copy / "experiments" / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = present(ledger.latest_run())
        base = next(e for e in ledger.experiments(run.id) if e.status == "baseline")
        item = ledger.item_verdicts(base.id)[0]
        rep = item.replicates[0]
        rep.criteria = [CriterionCheck(text="The report is saved as a PDF", met=True, steps=[2, 0]),
                        CriterionCheck(text="No other file is changed", met=False, steps=[1])]
        rep.evidence_steps = [2]
        rep.review = ReviewRecord(violation=True, applied=True, steps=[1], reasoning="step 1 deletes a file",
                                  first_verdict={"success": True})
        ledger.record_verdicts(base.id, [item])
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, experiment_id=base.id,
                       item_id=item.trajectory_id, start_view="item")

    async def scenario(pilot: Any) -> None:
        view = app.screen
        assert isinstance(view, ItemView) and view.detail is not None and len(view.detail.steps) >= 3
        text = svg_text(app)
        assert "criteria (1/2 met" in text
        assert "✓ The report is saved as a PDF — steps 2, 0" in text and "✗ No other file is changed — step 1" in text
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


def test_open_png_uses_opener(run_ws: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "opened.txt"
    script = tmp_path / "opener.sh"
    script.write_text(f'#!/bin/sh\necho "$1" > {marker}\n')
    script.chmod(0o755)
    monkeypatch.setenv("OPENER", str(script))
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        tid = ledger.item_verdicts(present(run.incumbent_experiment))[0].trajectory_id
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, experiment_id=run.incumbent_experiment,
                       item_id=tid, start_view="item")

    async def scenario(pilot: Any) -> None:
        await pilot.press("o")
        await wait_until(pilot, lambda: marker.exists() and marker.read_text().strip(), "the opener (a process)")
        assert marker.read_text().strip() == str(app.screen.query_one(StepImage).path)

    drive(app, scenario)


# ---------------------------------------------------------------------------------------------
# Reviews


@pytest.mark.slow  # three app sessions over one ledger
def test_review_is_stored_survives_a_restart_and_exports(ws_copy: Path, tmp_path: Path) -> None:
    with ledger_of(ws_copy) as ledger:
        run = present(ledger.latest_run())
        tid = ledger.item_verdicts(present(run.incumbent_experiment))[0].trajectory_id
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, experiment_id=run.incumbent_experiment,
                       item_id=tid, start_view="item")

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


# ---------------------------------------------------------------------------------------------
# Live strip


def test_live_strip_follows_events_another_process_appends(ws_copy: Path) -> None:
    with ledger_of(ws_copy) as ledger:
        run_id = present(ledger.latest_run()).id
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=True, watch_interval_s=0.05)
    writer = (
        "import sys\n"
        "from optimizer.ledger import Ledger\n"
        "with Ledger(sys.argv[1]) as led:\n"
        "    led.add_event(sys.argv[2], 'stage', {'stage': 'evaluating'})\n"
        "    led.add_event(sys.argv[2], 'progress', {'done': 7, 'total': 99, 'errors': 2, 'calls': 9,\n"
        "        'cache_hits': 0, 'input_tokens': 1000, 'output_tokens': 234, 'cost_usd': 0.5, 'elapsed_s': 12})\n"
    )

    async def scenario(pilot: Any) -> None:
        strip = app.screen.query_one(StatusStrip)
        assert "judged 7/99" not in str(strip.render())
        subprocess.run([sys.executable, "-c", writer, str(ws_copy / "experiments" / "ledger.sqlite"), run_id],
                       check=True, cwd=Path(__file__).resolve().parents[1])
        await wait_until(pilot, lambda: "judged 7/99" in str(app.screen.query_one(StatusStrip).render()),
                         "the watcher thread's message")
        line = str(app.screen.query_one(StatusStrip).render())
        assert "stage evaluating" in line and "judged 7/99" in line and "2 errors" in line
        assert "1,234 tokens" in line and "$0.5000" in line
        await pilot.press("d")  # input still works while the watcher runs
        await settle(app, pilot)
        assert isinstance(app.screen, DisagreementsView)

    drive(app, scenario)


# ---------------------------------------------------------------------------------------------
# Driving runs


@pytest.mark.slow
def test_run_started_from_the_tui_is_detached_and_keeps_going_after_quit(
    ws_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is provably mid-evaluation when the app quits (its first judge call is held at the
    server), and finishes afterwards, as a second app following the ledger sees."""
    import re
    import signal
    import threading

    from optimizer.workspace import JUDGELOOP_ACTOR, Workspace, repo_at
    from tests.support.config import write_config
    from tests.support.fakeserver import Behaviour, FakeLLMServer
    from tests.support.tui_runs import prompt_sensitive_judge

    # Nothing cached, so the new run's first judge call reaches the server (and waits there).
    for cache_file in (ws_copy / "experiments").glob("cache.sqlite*"):
        cache_file.unlink()
    answer = prompt_sensitive_judge(ws_copy, "mini")
    reached, release = threading.Event(), threading.Event()

    def held(request: Any) -> Behaviour:
        reached.set()
        release.wait(timeout=120)  # bounded: a failed test never leaves the run hanging for long
        return answer(request)

    monkeypatch.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")  # the run inherits it
    pid: int | None = None
    with FakeLLMServer() as server:
        server.default = held
        config = Workspace.open(ws_copy).config
        write_config(ws_copy, config.model_copy(update={
            "workspace": config.workspace.model_copy(update={"dev_split": "mini"}),
            "judge": config.judge.model_copy(update={
                "provider": "openai", "model": "fake-judge", "base_url": server.openai_base_url,
            }),
        }))
        with repo_at(ws_copy) as repo:
            repo.git.checkout("main")
            repo.index.add(["judgeloop.toml"])
            repo.index.commit("test: judge on the fake server", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)
        with ledger_of(ws_copy) as ledger:
            runs_before = {r.id for r in ledger.runs()}

        app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False)
        seen = capture_notifications(app)

        async def start(pilot: Any) -> None:
            nonlocal pid
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, StartRunModal)
            cast(Input, app.screen.query_one("#run-max")).value = "1"
            await pilot.click("#start")
            await settle(app, pilot)
            announced = [m for s in seen if (m := re.match(r"run started \(pid (\d+)\)", s))]
            assert announced, seen
            pid = int(announced[0].group(1))
            for _ in range(1200):  # bounded wait until the run is judging: its first call is at the server
                if reached.is_set():
                    break
                await pilot.pause(0.05)
            assert reached.is_set(), "the run never called the judge"

        try:
            drive(app, start)  # the app quits here, with the run's judge call still held
            with ledger_of(ws_copy) as ledger:
                [run] = [r for r in ledger.runs() if r.id not in runs_before]
                assert ledger.get_run(run.id).status == "running"
            release.set()

            follower = JudgeloopApp(ws_copy, image_mode="halfcell", watch=True, watch_interval_s=0.05)

            async def follow(pilot: Any) -> None:
                for _ in range(2400):  # bounded wait for the ledger to say the run finished
                    if f"run {run.id} · finished" in str(app_strip(follower)):
                        break
                    await pilot.pause(0.05)

            drive(follower, follow)
            with ledger_of(ws_copy) as ledger:
                status = ledger.get_run(run.id).status
            logs = sorted((ws_copy / "experiments" / "runs").glob("*.log"))
            assert len(logs) == 1
            assert status == "finished", logs[0].read_text()[-2000:]
            assert "reached --max-experiments 1" in logs[0].read_text()
        finally:
            release.set()
            if pid is not None and _alive(pid):  # only on failure: the run this test started
                os.kill(pid, signal.SIGTERM)


def app_strip(app: JudgeloopApp) -> str:
    return str(app.screen.query_one(StatusStrip).render())


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and has ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def waiting_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace after a real `run --propose-only --max-experiments 1`: one candidate waits at the branch tip."""
    ws = tmp_path_factory.mktemp("tui-waiting") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert make_real_run(ws, max_experiments=1, replicates=1, items=16, screenshots="none", propose_only=True) == 0
    return ws


@pytest.mark.slow  # a propose-only run built, then `judgeloop decide` in a worker
@pytest.mark.parametrize(("key", "status"), [("k", "kept"), ("x", "rolled_back")])
def test_waiting_candidate_is_kept_or_discarded_from_the_experiment_view(
    waiting_ws: Path, tmp_path: Path, key: str, status: str
) -> None:
    from optimizer import gitops

    ws = tmp_path / "ws"
    shutil.copytree(waiting_ws, ws, symlinks=True)
    with ledger_of(ws) as ledger:
        run = present(ledger.latest_run())
        assert run is not None and run.status == "waiting"
        waiting = [e for e in ledger.experiments(run.id) if e.status == "waiting"]
    assert len(waiting) == 1 and gitops.rev_parse(ws, run.branch) == waiting[0].commit_sha
    candidate = waiting[0]
    app = JudgeloopApp(ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, HistoryView)
        assert f"experiment {candidate.id} waiting" in svg_text(app)
        table = cast(DataTable[Any], app.screen.query_one("#history-table"))
        table.focus()
        table.move_cursor(row=table.get_row_index(str(candidate.id)))
        await pilot.press("e")
        await settle(app, pilot)
        assert isinstance(app.screen, ExperimentView) and app.experiment_id == candidate.id
        assert "this candidate is waiting" in svg_text(app)
        await pilot.press(key)
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await settle(app, pilot)  # the worker runs `judgeloop decide` to completion, then the view reloads
        assert isinstance(app.screen, ExperimentView)
        assert "this candidate is waiting" not in svg_text(app)

    drive(app, scenario)
    with ledger_of(ws) as ledger:
        decided = ledger.get_experiment(candidate.id)
        parent = ledger.get_experiment(present(candidate.parent_id))
        assert ledger.get_run(run.id).status == "stopped"
    assert decided.status == status
    tip = gitops.rev_parse(ws, run.branch)
    if status == "kept":
        assert tip == decided.commit_sha
        assert gitops.parse_trailers(gitops.commit_message(ws, tip))["Judgeloop-Decision"] == "kept"
    else:
        assert tip == parent.commit_sha  # the branch is back at the incumbent
        assert gitops.rejected_refs(ws)[candidate.id] == decided.commit_sha
        rejected = gitops.rev_parse(ws, f"refs/judgeloop/rejected/{candidate.id}")
        assert gitops.parse_trailers(gitops.commit_message(ws, rejected))["Judgeloop-Decision"] == "rolled_back"


def test_stop_key_creates_the_stop_file_only_while_a_run_is_going(ws_copy: Path) -> None:
    from optimizer.workspace import Workspace, command_lock

    notes: list[str] = []

    async def scenario(pilot: Any) -> None:
        await pilot.press("s")
        await pilot.pause()
        notes.extend(str(n.message) for n in pilot.app._notifications)

    # No run going: a STOP left behind would end the next run after its baseline (the red team's case).
    drive(JudgeloopApp(ws_copy, image_mode="halfcell", watch=False), scenario)
    assert not (ws_copy / "experiments" / "STOP").exists()
    assert any("no run is going" in n for n in notes)

    with command_lock(Workspace.open(ws_copy), "run"):  # a run holds the workspace's loop lock
        drive(JudgeloopApp(ws_copy, image_mode="halfcell", watch=False), scenario)
        assert (ws_copy / "experiments" / "STOP").is_file()


# ---------------------------------------------------------------------------------------------
# Conventions: palette, help, bindings, worker errors, 80×24, headless screenshots


def test_every_binding_has_an_id_and_help_lists_every_key_by_its_readable_name(run_ws: Path) -> None:
    from tui import modals

    classes = [JudgeloopApp, *VIEWS.values(), modals.ErrorModal, modals.ConfirmModal, modals.ReviewModal,
               modals.StartRunModal, modals.ItemListModal, modals.ErrorScreen, modals.CorrectionModal]
    bindings = [b for cls in classes for b in cls.__dict__.get("BINDINGS", [])]
    assert bindings and all(b.id for b in bindings)
    assert len({b.id for b in bindings}) == len(bindings)
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, start_view="help")

    async def scenario(pilot: Any) -> None:
        shown = svg_text(app)
        assert shown.splitlines()[0].strip().startswith("help — every key")
        # Scrolled to the end, the help has shown every row of its text.
        seen = set(shown.splitlines())
        for _ in range(40):
            await pilot.press("pagedown")
            await pilot.pause()
            seen |= set(svg_text(app).splitlines())
        words = " ".join(" ".join(line.split()) for line in seen)
        for cls in (JudgeloopApp, *VIEWS.values()):
            for b in cls.__dict__.get("BINDINGS", []):
                what = b.tooltip or b.description
                assert " ".join(what.split()[:4]) in words, (b.id, what)
        rows = {what: keys for _, section in app.help_sections() for keys, what in section}
        assert rows["This list of every key"] == "? / F1"
        assert rows["Select the next step"] == "→ / ."
        assert rows["Open the selected experiment"] == "Enter"
        assert rows["The same item under the next experiment that judged it (of any run)"] == "]"
        for internal in ("question_mark", "f1,", "right_square_bracket", "None", "set_keymap", "view.history"):
            assert internal not in words and internal not in app.help_text(), internal

    drive(app, scenario, size=(80, 24))


def test_command_palette_switches_views(run_ws: Path) -> None:
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"reviews")
        await settle(app, pilot)  # the palette searches in a worker: wait for it, not for a time
        commands = app.screen.query_one(CommandList)
        assert commands.highlighted == 0
        assert str(commands.get_option_at_index(0).prompt).startswith("View: reviews")
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ReviewsView)

    drive(app, scenario)


def test_worker_failure_becomes_an_error_modal_not_a_crash(run_ws: Path) -> None:
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, experiment_id=999_999, start_view="experiment")

    async def scenario(pilot: Any) -> None:
        await settle(app, pilot)
        assert isinstance(app.screen, ErrorModal)
        assert "no experiment 999999" in app.screen.message
        await pilot.press("escape")
        await pilot.press("h")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView)

    drive(app, scenario)


def test_history_then_disagreements_then_item_by_keys_at_80_by_24(run_ws: Path) -> None:
    """At 80×24 each view shows what it is for, unclipped, with the footer on the last line."""
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        experiments = ledger.experiments(run.id)
        incumbent = ledger.get_experiment(present(run.incumbent_experiment))
        labels = ledger.labels(run.id)
        wrong = sorted(v.trajectory_id for v in ledger.item_verdicts(incumbent.id)
                       if v.success != labels[v.trajectory_id].positive)
    assert wrong and incumbent.kappa is not None and incumbent.fpr is not None
    first = min(wrong, key=lambda t: (labels[t].positive, t))  # the top row: false positives first
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    def screen() -> list[str]:
        lines = [line.rstrip() for line in svg_text(app).splitlines() if line.strip()]
        assert "palette" in lines[-1]  # the footer is there, on the bottom line
        return lines

    def line_with(lines: list[str], *parts: str) -> str:
        found = [line for line in lines if all(p in line for p in parts)]
        assert found, (parts, lines)
        return found[0]

    async def scenario(pilot: Any) -> None:
        await pilot.press("h")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView)
        lines = screen()
        assert lines[0].startswith(f"history — run {run.id}")
        # The decision columns fit (the least important are hidden): the header names them, and every
        # experiment's row is on screen with its p and cost, the incumbent's with its kappa and FPR.
        line_with(lines, "id", "decision", "κ", "FPR", "Δκ", "p", "$", "rationale")
        rows = screen_rows(app)
        for exp in experiments:
            row = [line for line in rows if line.split()[:1] in ([str(exp.id)], [f"{exp.id}◆"])][:1]  # not the x axis
            assert row, exp.id
            assert (f"{exp.p_value:.3f}" if exp.p_value is not None else "—") in row[0], (exp.id, row[0])
            assert f"{exp.cost_usd:.4f}" in row[0], (exp.id, row[0])
        line_with(lines, f"{incumbent.id}◆", f"{incumbent.kappa:.3f}", f"{incumbent.fpr:.3f}")

        await pilot.press("d")
        await settle(app, pilot)
        assert isinstance(app.screen, DisagreementsView)
        lines = screen()
        assert lines[0].startswith(f"disagreements — experiment {incumbent.id}")
        line_with(lines, "item", "kind", "judge", "rev.")  # the last fixed column is not cut off
        for tid in wrong:  # every disagreement, with its kind
            line_with(lines, tid[:8], "FN" if labels[tid].positive else "FP")

        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView) and app.screen.detail is not None
        detail = app.screen.detail
        assert detail.trajectory_id == first
        lines = screen()
        assert lines[0].startswith(f"item {first} under experiment {incumbent.id}")
        line_with(lines, detail.instruction.split()[0], "0", detail.steps[0].action[:20])  # instruction | steps
        line_with(lines, f"label: {labels[first].label}")
        line_with(lines, "replicate 0:")

    drive(app, scenario, size=(80, 24))


HISTORY_HEADERS = ("id", "time", "strategy", "decision", "κ", "FPR", "bal.acc", "Δκ", "ΔFPR", "p", "+rej", "$",
                   "rationale")


@pytest.mark.parametrize(("size", "hidden"), [
    ((160, 45), ()), ((120, 36), ("+rej", "time")), ((80, 24), ("+rej", "time", "strategy", "bal.acc", "ΔFPR")),
])
def test_history_hides_its_least_important_columns_first_and_the_footer_keeps_help_and_quit(
    run_ws: Path, size: tuple[int, int], hidden: tuple[str, ...],
) -> None:
    """At each width the table fits without a horizontal scrollbar, shows the columns a decision is read
    from (p, $ and the rationale included), and hides only the least important; the footer always shows
    ? (help) and q, and at 80 columns every view key as a letter. Resizing the same app moves between them."""
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    def check(width: int, hidden: tuple[str, ...]) -> None:
        assert isinstance(app.screen, HistoryView)
        table = cast(FixedColumnsTable, app.screen.query_one("#history-table"))
        assert [str(c.label) for c in table.columns.values()] == [h for h in HISTORY_HEADERS if h not in hidden]
        assert table.virtual_size.width <= table.scrollable_content_region.width
        rationale = next(c for c in table.columns.values() if c.key.value == "rationale")
        assert rationale.width >= (20 if width >= 120 else 10)
        footer = screen_rows(app)[-1]
        assert footer.lstrip().startswith("? Help") and "q Quit" in footer and "palette" in footer, footer
        if width == 80:
            assert "h e d i v c g L views" in footer, footer

    async def scenario(pilot: Any) -> None:
        check(size[0], hidden)
        await pilot.resize_terminal(160, 45)
        await settle(app, pilot)
        check(160, ())
        await pilot.resize_terminal(*size)
        await settle(app, pilot)
        check(size[0], hidden)

    drive(app, scenario, size=size)


@pytest.mark.parametrize(("size", "min_reasoning"), [((120, 36), 20), ((80, 24), None)])
def test_disagreements_table_fits_its_width_without_a_horizontal_scrollbar(
    run_ws: Path, size: tuple[int, int], min_reasoning: int | None
) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, start_view="disagreements",
                       experiment_id=run.incumbent_experiment)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, DisagreementsView)
        table = cast(DataTable[Any], app.screen.query_one("#disagreement-table"))
        assert table.row_count > 0
        assert not table.show_horizontal_scrollbar
        assert table.virtual_size.width <= table.scrollable_content_region.width
        # The reasoning column takes the width the others leave; at 80 columns it is hidden (the selected
        # row's reasoning is shown whole under the table: tests/test_tui_small_terminal.py).
        reasoning = [c for c in table.columns.values() if c.key.value == "reasoning"]
        if min_reasoning is None:
            assert not reasoning
        else:
            assert reasoning[0].width > min_reasoning

    drive(app, scenario, size=size)


def test_screenshot_command_renders_screens_headlessly(run_ws: Path, tmp_path: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
    expected = {
        "history": f"run {run.id}",
        "item": "replicate 0",
    }
    for screen, needle in expected.items():
        out = tmp_path / f"{screen}.svg"
        assert main(["tui", "-w", str(run_ws), "--screenshot", str(out), "--screen", screen, "--size", "100x30"]) == 0
        assert needle in screen_lines(out.read_text()), screen


def test_screenshot_command_refuses_bad_arguments_in_one_line(run_ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tui", "-w", str(run_ws), "--screenshot", "x.png"]) == 2
    assert main(["tui", "-w", str(run_ws), "--screenshot", "x.svg", "--screen", "nope"]) == 2
    assert main(["tui", "-w", str(run_ws), "--screenshot", "x.svg", "--size", "big"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith(("judgeloop: error:", "judgeloop tui: error:")) for line in err)


# ---------------------------------------------------------------------------------------------
# Curves and the history table, without an app


FIRST_ID = 11  # a later run's experiments: ids differ from seqs (0 = baseline) by more than one


def _exp(seq: int, status: ExperimentStatus, kappa: float | None, fpr: float | None, parent: int | None,
         early: bool = False) -> Any:
    from datetime import UTC, datetime

    from optimizer.ledger import Experiment

    metrics = None if kappa is None else {"kappa": kappa, "fpr": fpr}
    return Experiment(id=FIRST_ID + seq, run_id="r", seq=seq, parent_id=parent,
                      created=datetime(2026, 1, 1, tzinfo=UTC), status=status, metrics=metrics, early_stopped=early)


def test_curve_is_a_step_line_over_experiment_ids_with_early_stopped_at_their_partial_values_and_rejected_counted(
) -> None:
    from optimizer.ledger import Run
    from optimizer.stats.metrics import Metrics
    from tui.data import History as HistoryData
    from tui.data import HistoryRow, PartialMetrics, chain_from, curve_points

    exps = [
        _exp(0, "baseline", 0.20, 0.40, None),
        _exp(1, "rolled_back", None, None, 11, early=True),
        _exp(2, "kept", 0.50, 0.20, 11),
        _exp(3, "rolled_back", 0.45, 0.25, 13),
        _exp(4, "guard_rejected", None, None, 13),
        _exp(5, "rolled_back", None, None, 13, early=True),
    ]
    run = Run.model_construct(id="r", incumbent_experiment=13)
    chain = chain_from(run, {e.id: e for e in exps})
    assert chain == [11, 13]
    # Experiment 12 stopped after 6 items of both classes; 16 after 3 negatives only (no kappa: "—").
    partial = {12: PartialMetrics(Metrics.from_counts(2, 1, 1, 2), 6, 32),
               16: PartialMetrics(Metrics.from_counts(0, 0, 1, 2), 3, 32)}
    history = HistoryData(run=run, rows=[HistoryRow(e, None, None, None, e.id in chain, partial=partial.get(e.id))
                                         for e in exps], chain_ids=chain, runs=[run])
    points = curve_points(history)
    # x is the experiment id (what the history table shows), not the run's seq.
    assert points.experiment_ids == [11, 12, 13, 14, 15, 16] and points.x_range() == (11, 16)
    # Flat at the baseline until experiment 13, a vertical step there, then flat to the last experiment.
    assert points.chain_x == [11, 13, 13, 16]
    assert points.chain_kappa == [0.20, 0.20, 0.50, 0.50]
    assert points.chain_fpr == [0.40, 0.40, 0.20, 0.20]
    assert points.evaluated_x == [13, 14] and points.evaluated_kappa == [0.50, 0.45]
    # Early-stopped candidates sit at what they measured before the stop (the table's "*" figures), never
    # at the incumbent's level; one without a partial kappa is left out of that chart and counted.
    assert points.stopped_x == [12, 16]
    assert points.stopped("kappa") == ([12], [partial[12].value("kappa")]) and points.unplotted("kappa") == 1
    assert points.stopped("fpr") == ([12, 16], [2 / 3, 2 / 3]) and points.unplotted("fpr") == 0
    assert partial[12].cell("fpr") == "0.67*" and partial[16].cell("kappa") == "—"
    assert points.rejected == 1 and points.baseline == (11, 0.20, 0.40)


def test_x_ticks_are_experiment_ids_thinned_to_round_steps_that_fit() -> None:
    from tui.data import x_ticks

    assert x_ticks([1, 2, 3, 4, 5, 6], 10) == [1, 2, 3, 4, 5, 6]
    assert x_ticks(range(1, 61), 10) == [10, 20, 30, 40, 50, 60]
    assert x_ticks(range(1, 61), 12) == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60]
    assert x_ticks(range(11, 15), 1) == [11]  # no multiple of a step that fits: the first experiment
    assert x_ticks([7], 5) == [7] and x_ticks([], 5) == []


def test_fixed_columns_table_measures_no_cell_where_a_datatable_measures_every_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`FixedColumnsTable` overrides DataTable's private `_update_dimensions` to skip measuring cells
    whose width is fixed anyway. Pinned against Textual's contract: a plain DataTable measures every
    new cell there (through `textual.widgets._data_table.measure`), the override measures none, and
    both end up the same size and draw the same lines. If Textual renames the method, stops calling
    it, or measures differently, this fails."""
    import textual.widgets._data_table as data_table_module
    from rich.text import Text
    from textual.app import App
    from textual.widgets import DataTable

    from tui.widgets import FixedColumnsTable

    measured = {"cells": 0}
    real_measure = data_table_module.measure

    def counting_measure(*args: Any, **kwargs: Any) -> int:
        measured["cells"] += 1
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(data_table_module, "measure", counting_measure)
    rows, widths = 50, (5, 12, 30)

    class Tables(App[None]):
        def compose(self) -> Any:
            yield FixedColumnsTable(id="fixed")
            yield DataTable(id="plain")
            yield FixedColumnsTable(id="auto")  # one auto-width column: the override must defer

    async def fill(pilot: Any, table: DataTable[Any], auto: bool = False) -> int:
        for i, width in enumerate(widths):
            table.add_column(f"c{i}", key=f"c{i}", width=None if auto and i == 1 else width)
        await pilot.pause()
        measured["cells"] = 0
        for r in range(rows):
            table.add_row(Text(str(r)), Text("x" * 40), Text("y"), key=str(r))
        await pilot.pause()  # DataTable sizes new rows when idle
        return measured["cells"]

    async def go() -> None:
        app = Tables()
        async with app.run_test(size=(100, 60)) as pilot:
            fixed, plain, auto = (app.query_one(f"#{name}", DataTable) for name in ("fixed", "plain", "auto"))
            assert await fill(pilot, plain) == rows * len(widths)  # Textual measures every cell...
            assert await fill(pilot, fixed) == 0  # ...the override none
            assert await fill(pilot, auto, auto=True) == rows * len(widths)  # an auto column: measured as usual
            assert fixed.row_count == plain.row_count == rows
            assert fixed.virtual_size == plain.virtual_size
            assert auto.virtual_size.width == plain.virtual_size.width - widths[1] + 40  # sized to its content
            lines = range(min(fixed.size.height, plain.size.height))
            drawn = [fixed.render_line(y).text for y in lines]
            assert len(drawn) > 2 and drawn[1].split() == ["0", "x" * widths[1], "y"]  # clipped to its width
            assert drawn == [plain.render_line(y).text for y in lines]

    asyncio.run(go())


def test_run_options_build_the_command_line_including_a_manual_run(tmp_path: Path) -> None:
    from optimizer.errors import UserError
    from tui.runs import RunOptions

    argv = RunOptions(strategy="manual", propose_only=True).argv(tmp_path)
    assert argv[argv.index("--strategy") + 1] == "manual" and argv[-1] == "--propose-only"
    assert RunOptions(strategy="library", resume=True).argv(tmp_path)[-1] == "--resume"  # resume ignores the rest
    with pytest.raises(UserError, match="unknown strategy 'genetic'"):
        RunOptions(strategy="genetic").argv(tmp_path)


@pytest.mark.slow  # a `judgeloop run` process started and waited for
def test_a_run_refused_at_once_is_reported_not_announced_as_started(ws_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The app gives a run a few seconds to refuse (tui.runs.early_outcome); a loaded machine may take longer
    # to start Python, so here it waits for the refusing process's exit, up to a generous bound.
    monkeypatch.setattr(runs, "early_outcome", functools.partial(runs.early_outcome, wait_s=EVENT_WAIT_S))
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False)
    seen = capture_notifications(app)

    async def scenario(pilot: Any) -> None:
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, StartRunModal)
        cast(Select[str], app.screen.query_one("#run-strategy")).value = "manual"  # with no edit in the working tree
        await pilot.click("#start")
        await settle(app, pilot)
        assert any(s.startswith("the run stopped at once (exit 2): judgeloop: error: no edit to judge") for s in seen), seen
        assert not any(s.startswith("run started") for s in seen)

    drive(app, scenario)


def test_live_strip_drops_the_item_count_once_the_candidate_is_decided() -> None:
    from datetime import UTC, datetime

    from optimizer.ledger import Event
    from tui.watch import LiveState, apply_events

    def event(n: int, kind: EventKind, payload: dict[str, Any]) -> Event:
        return Event(id=n, run_id="r1", experiment_id=6, created=datetime.now(UTC), kind=kind, payload=payload)

    state = apply_events(LiveState(), [event(1, "stage", {"stage": "evaluating"}),
                                       event(2, "progress", {"done": 1, "total": 88})])
    assert "judged 1/88" in state.line()
    state = apply_events(state, [event(3, "decision", {"status": "rolled_back"})])
    assert "judged" not in state.line() and "stage decided: rolled_back (exp 6)" in state.line()
    state = apply_events(state, [event(4, "progress", {"done": 2, "total": 88})])  # the next candidate
    assert "judged 2/88" in state.line()


# ---------------------------------------------------------------------------------------------
# What helped (attribution)


def attribute_run(ws: Path) -> dict[str, Any]:
    """`judgeloop attribute --json` on the run in ``ws`` against the same prompt-sensitive fake judge."""
    from tests.support.fakeserver import FakeLLMServer
    from tests.support.tui_runs import prompt_sensitive_judge

    with FakeLLMServer() as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        server.default = prompt_sensitive_judge(ws, "mini")
        out = subprocess.run(
            [sys.executable, "-m", "optimizer.cli", "attribute", "-w", str(ws), "--provider", "openai", "--base-url",
             server.openai_base_url, "--model", "fake-judge", "--json"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_what_helped_shows_gain_when_kept_beside_contribution_and_opens_the_items(ws_copy: Path) -> None:
    from tui.views import HelpedView

    # Before attribute: the kept chain, with the contribution at the end not measured yet.
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, start_view="helped")

    async def before(pilot: Any) -> None:
        assert isinstance(app.screen, HelpedView)
        assert "not measured yet: run `judgeloop attribute`" in svg_text(app)

    drive(app, before)
    result = attribute_run(ws_copy)
    rows = result["attribution"]
    assert rows and result["final_vs_baseline"]["items"] is not None
    weak = {r["experiment"] for r in rows if r["items"] is not None and r["p_value"] >= 0.1}
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, start_view="helped")

    async def scenario(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, HelpedView) and screen.helped is not None
        table = cast(DataTable[Any], screen.query_one("#helped-table"))
        assert [str(k.value) for k in table.rows] == [str(r["experiment"]) for r in rows]  # newest first
        text = svg_text(app)
        assert "gain when kept" in text and "at the end" in text and "final vs baseline" in text
        assert "its diff" in text and "items that depend on it" in text
        first = rows[0]
        if first["fixed"] or first["broken"]:
            await pilot.press("enter")
            assert isinstance(app.screen, ItemListModal)
            await pilot.press("enter")
            await settle(app, pilot)
            assert isinstance(app.screen, ItemView) and app.item_id in first["fixed"] + first["broken"]

    drive(app, scenario)
    # The history marks the kept edits whose contribution at the end is not significant.
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False)

    async def history(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, HistoryView) and screen.history is not None
        assert screen.history.weak_ids == weak
        marked = {int(present(k.value)) for k in cast(DataTable[Any], screen.query_one("#history-table")).rows
                  if screen.cells[int(present(k.value))][0].plain.endswith("?")}
        assert marked == weak

    drive(app, history)


def test_experiment_view_lists_the_rejudged_items_with_their_draws_and_the_test(ws_copy: Path) -> None:
    from optimizer.report import rejudged_items

    with ledger_of(ws_copy) as ledger:
        run = present(ledger.latest_run())
        decided = [ledger.get_experiment(e.id) for e in ledger.experiments(run.id) if e.test]
    exp = next(e for e in decided if rejudged_items(e))  # the fixture's run decides under the default, adaptive
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False, experiment_id=exp.id, start_view="experiment")

    async def scenario(pilot: Any) -> None:
        text = " ".join(svg_text(app).split())
        from tui.views import fmt_p

        assert f"sign-flip p = {fmt_p(present(exp.test)['p_value'])} at alpha 0.1" in text
        assert f"re-judged {len(rejudged_items(exp))} item(s) ×2 under each prompt" in text
        first = rejudged_items(exp)[0]
        assert f"{first.trajectory_id[:8]} {first.draws()}" in text  # e.g. "1/3 → 3/3"

    drive(app, scenario)
