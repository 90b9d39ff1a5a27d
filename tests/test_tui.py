"""The TUI driven by Textual's Pilot over a ledger made by a real short `judgeloop run` (fake OpenAI server).

One session-scoped run (init --sample, a 32-item split, the library strategy, 5 candidates, 2
replicates: `run_ws` in tests/support/tui_runs.py, registered in tests/conftest.py) feeds every read-only
test; tests that write (reviews, runs, STOP) work on a copy (`ws_copy`). Here: history, experiment and
compare, what helped; the items and reviews, the live strip and driven runs, the conventions and layout
are in tests/test_tui_items.py, test_tui_live.py and test_tui_layout.py.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from textual.widgets import DataTable, Input

from optimizer.ledger import Ledger
from optimizer.report import token_split
from tests.support.loop import present
from tests.support.tui_driving import (
    capture_notifications,
    drive,
    svg_text,
    wait_until,
)
from tests.support.tui_runs import ledger_of
from tui.app import JudgeloopApp, settle
from tui.modals import ErrorModal, ErrorScreen, ItemListModal
from tui.views import ExperimentView, HistoryView, ItemView

# ---------------------------------------------------------------------------------------------
# History


@pytest.mark.slow
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


@pytest.mark.slow
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
            assert len(marks) == len(spans) and all(
                a <= m < b for m, (a, b) in zip(marks, spans, strict=True)
            )
            tick_of = dict(zip(labels, marks, strict=True))
            b_columns = {
                m.start() for line in plot for m in re.finditer(r"(?<!B)B(?!B)", line)
            }  # not the legend's BB
            assert tick_of[str(baseline.id)] in b_columns, (chart_id, b_columns)

    drive(app, scenario)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_experiment_view_shows_decision_metrics_diff_and_a_flip_cell_opens_its_items(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        kept = next(e for e in ledger.experiments(run.id) if e.status == "kept")
        kept = ledger.get_experiment(kept.id)
        labels = ledger.labels(run.id)
        let_through = {
            e: {v.trajectory_id for v in ledger.item_verdicts(e) if v.success is not False}
            for e in (kept.id, present(kept.parent_id))
        }
    # False positives per type, counted here from the labels and the majority answers.
    kinds = ("Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction")
    per_type = {
        e: {
            k: sum(1 for t in ids if not labels[t].positive and (labels[t].mistake_type or "untyped") == k)
            for k in (*kinds, "untyped")
        }
        for e, ids in let_through.items()
    }
    fp_line = "FP by type (incumbent → this, same items): " + ", ".join(
        f"{k} {per_type[present(kept.parent_id)][k]} → {per_type[kept.id][k]}" for k in (*kinds, "untyped")
    )
    cells = {(0, 1): "tp_to_fn", (0, 2): "tn_to_fp", (1, 1): "fn_to_tp", (1, 2): "fp_to_tn"}
    (row, col), key = next((rc, k) for rc, k in cells.items() if kept.flips and kept.flips[k])
    app = JudgeloopApp(
        run_ws, image_mode="halfcell", watch=False, experiment_id=kept.id, start_view="experiment"
    )
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
        split = token_split(
            kept.input_tokens, kept.cache_read_tokens, kept.cache_write_tokens, kept.output_tokens
        )
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_flip_table_labels_are_true_of_every_cell_in_their_row_and_column(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        kept = ledger.get_experiment(next(e.id for e in ledger.experiments(run.id) if e.status == "kept"))
    arrows = {"TP→FN": "tp_to_fn", "FN→TP": "fn_to_tp", "TN→FP": "tn_to_fp", "FP→TN": "fp_to_tn"}
    app = JudgeloopApp(
        run_ws, image_mode="halfcell", watch=False, experiment_id=kept.id, start_view="experiment"
    )

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


@pytest.mark.slow
def test_experiment_view_splits_the_cost_into_judge_and_optimiser(ws_copy: Path) -> None:
    import sqlite3

    with ledger_of(ws_copy) as ledger:
        run = present(ledger.latest_run())
        exp = next(e for e in ledger.experiments(run.id) if e.seq > 0)
    conn = sqlite3.connect(
        ws_copy / "experiments" / "ledger.sqlite"
    )  # as a run with an LLM optimiser writes it
    conn.execute(
        "UPDATE experiments SET optimizer_calls = 3, optimizer_input_tokens = 1000, "
        "optimizer_output_tokens = 234, optimizer_cost_usd = 0.05, cost_usd = cost_usd + 0.05 WHERE id = ?",
        (exp.id,),
    )
    conn.commit()
    conn.close()
    app = JudgeloopApp(
        ws_copy, image_mode="halfcell", watch=False, experiment_id=exp.id, start_view="experiment"
    )

    async def scenario(pilot: Any) -> None:
        text = svg_text(app)
        assert f"judge ${exp.cost_usd:.4f} · optimiser $0.0500 (3 calls · 1,234 tokens)" in text
        assert f"${exp.cost_usd + 0.05:.4f}" in text  # the total

    drive(app, scenario)


@pytest.mark.slow
def test_compare_shows_two_experiments_and_the_flips_between_them(run_ws: Path) -> None:
    with ledger_of(run_ws) as ledger:
        exps = ledger.experiments(present(ledger.latest_run()).id)
    kept = next(e for e in exps if e.status == "kept")
    app = JudgeloopApp(
        run_ws, image_mode="halfcell", watch=False, experiment_id=kept.id, start_view="compare"
    )

    async def scenario(pilot: Any) -> None:
        text = svg_text(app)
        assert f"experiment {kept.parent_id} (left) vs {kept.id} (right)" in text
        counts = kept.flip_counts()
        assert f"{counts['fn_to_tp'] + counts['fp_to_tn']} newly right" in text
        assert f"{counts['tp_to_fn'] + counts['tn_to_fp']} newly wrong" in text

    drive(app, scenario)


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
            [
                sys.executable,
                "-m",
                "optimizer.cli",
                "attribute",
                "-w",
                str(ws),
                "--provider",
                "openai",
                "--base-url",
                server.openai_base_url,
                "--model",
                "fake-judge",
                "--json",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
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
        marked = {
            int(present(k.value))
            for k in cast(DataTable[Any], screen.query_one("#history-table")).rows
            if screen.cells[int(present(k.value))][0].plain.endswith("?")
        }
        assert marked == weak

    drive(app, history)


@pytest.mark.slow
def test_experiment_view_lists_the_rejudged_items_with_their_draws_and_the_test(ws_copy: Path) -> None:
    from optimizer.report import rejudged_items

    with ledger_of(ws_copy) as ledger:
        run = present(ledger.latest_run())
        decided = [ledger.get_experiment(e.id) for e in ledger.experiments(run.id) if e.test]
    exp = next(
        e for e in decided if rejudged_items(e)
    )  # the fixture's run decides under the default, adaptive
    app = JudgeloopApp(
        ws_copy, image_mode="halfcell", watch=False, experiment_id=exp.id, start_view="experiment"
    )

    async def scenario(pilot: Any) -> None:
        text = " ".join(svg_text(app).split())
        from tui.views import fmt_p

        assert f"sign-flip p = {fmt_p(present(exp.test)['p_value'])} at alpha 0.1" in text
        assert f"re-judged {len(rejudged_items(exp))} item(s) ×2 under each prompt" in text
        first = rejudged_items(exp)[0]
        assert f"{first.trajectory_id[:8]} {first.draws()}" in text  # e.g. "1/3 → 3/3"

    drive(app, scenario)
