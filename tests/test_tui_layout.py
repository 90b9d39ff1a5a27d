"""The TUI's conventions (palette, help, bindings, worker errors, 80×24, headless screenshots) and its
curves and tables without an app, over the session's real short run (`run_ws`, tests/conftest.py). Moved
from tests/test_tui.py."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any, cast

import pytest
from textual.command import CommandList
from textual.widgets import DataTable, Select

from optimizer.cli import main
from optimizer.vocab import EventKind, ExperimentStatus
from tests.support.loop import present
from tests.support.tui_driving import (
    capture_notifications,
    drive,
    screen_lines,
    screen_rows,
    svg_text,
)
from tests.support.tui_runs import ledger_of
from tests.support.waits import EVENT_WAIT_S
from tui import runs
from tui.app import VIEWS, JudgeloopApp, settle
from tui.modals import ErrorModal, StartRunModal
from tui.views import DisagreementsView, HistoryView, ItemView, ReviewsView
from tui.widgets import FixedColumnsTable

# ---------------------------------------------------------------------------------------------
# Conventions: palette, help, bindings, worker errors, 80×24, headless screenshots


@pytest.mark.slow
def test_every_binding_has_an_id_and_help_lists_every_key_by_its_readable_name(run_ws: Path) -> None:
    from tui import modals

    classes = [
        JudgeloopApp,
        *VIEWS.values(),
        modals.ErrorModal,
        modals.ConfirmModal,
        modals.ReviewModal,
        modals.StartRunModal,
        modals.ItemListModal,
        modals.ErrorScreen,
        modals.CorrectionModal,
    ]
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
        for internal in (
            "question_mark",
            "f1,",
            "right_square_bracket",
            "None",
            "set_keymap",
            "view.history",
        ):
            assert internal not in words and internal not in app.help_text(), internal

    drive(app, scenario, size=(80, 24))


@pytest.mark.slow
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


@pytest.mark.slow
def test_worker_failure_becomes_an_error_modal_not_a_crash(run_ws: Path) -> None:
    app = JudgeloopApp(
        run_ws, image_mode="halfcell", watch=False, experiment_id=999_999, start_view="experiment"
    )

    async def scenario(pilot: Any) -> None:
        await settle(app, pilot)
        assert isinstance(app.screen, ErrorModal)
        assert "no experiment 999999" in app.screen.message
        await pilot.press("escape")
        await pilot.press("h")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView)

    drive(app, scenario)


@pytest.mark.slow
def test_history_then_disagreements_then_item_by_keys_at_80_by_24(run_ws: Path) -> None:
    """At 80×24 each view shows what it is for, unclipped, with the footer on the last line."""
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        experiments = ledger.experiments(run.id)
        incumbent = ledger.get_experiment(present(run.incumbent_experiment))
        labels = ledger.labels(run.id)
        wrong = sorted(
            v.trajectory_id
            for v in ledger.item_verdicts(incumbent.id)
            if v.success != labels[v.trajectory_id].positive
        )
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
            row = [line for line in rows if line.split()[:1] in ([str(exp.id)], [f"{exp.id}◆"])][
                :1
            ]  # not the x axis
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
        line_with(
            lines, detail.instruction.split()[0], "0", detail.steps[0].action[:20]
        )  # instruction | steps
        line_with(lines, f"label: {labels[first].label}")
        line_with(lines, "replicate 0:")

    drive(app, scenario, size=(80, 24))


HISTORY_HEADERS = (
    "id",
    "time",
    "strategy",
    "decision",
    "κ",
    "FPR",
    "bal.acc",
    "Δκ",
    "ΔFPR",
    "p",
    "+rej",
    "$",
    "rationale",
)


@pytest.mark.parametrize(
    ("size", "hidden"),
    [
        ((160, 45), ()),
        ((120, 36), ("+rej", "time")),
        ((80, 24), ("+rej", "time", "strategy", "bal.acc", "ΔFPR")),
    ],
)
@pytest.mark.slow
def test_history_hides_its_least_important_columns_first_and_the_footer_keeps_help_and_quit(
    run_ws: Path,
    size: tuple[int, int],
    hidden: tuple[str, ...],
) -> None:
    """At each width the table fits without a horizontal scrollbar, shows the columns a decision is read
    from (p, $ and the rationale included), and hides only the least important; the footer always shows
    ? (help) and q, and at 80 columns every view key as a letter. Resizing the same app moves between them."""
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False)

    def check(width: int, hidden: tuple[str, ...]) -> None:
        assert isinstance(app.screen, HistoryView)
        table = cast(FixedColumnsTable, app.screen.query_one("#history-table"))
        assert [str(c.label) for c in table.columns.values()] == [
            h for h in HISTORY_HEADERS if h not in hidden
        ]
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


@pytest.mark.slow
@pytest.mark.parametrize(("size", "min_reasoning"), [((120, 36), 20), ((80, 24), None)])
def test_disagreements_table_fits_its_width_without_a_horizontal_scrollbar(
    run_ws: Path, size: tuple[int, int], min_reasoning: int | None
) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
    app = JudgeloopApp(
        run_ws,
        image_mode="halfcell",
        watch=False,
        start_view="disagreements",
        experiment_id=run.incumbent_experiment,
    )

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


@pytest.mark.slow
def test_screenshot_command_renders_screens_headlessly(run_ws: Path, tmp_path: Path) -> None:
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
    expected = {
        "history": f"run {run.id}",
        "item": "replicate 0",
    }
    for screen, needle in expected.items():
        out = tmp_path / f"{screen}.svg"
        assert (
            main(["tui", "-w", str(run_ws), "--screenshot", str(out), "--screen", screen, "--size", "100x30"])
            == 0
        )
        assert needle in screen_lines(out.read_text()), screen


@pytest.mark.slow
def test_screenshot_command_refuses_bad_arguments_in_one_line(
    run_ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tui", "-w", str(run_ws), "--screenshot", "x.png"]) == 2
    assert main(["tui", "-w", str(run_ws), "--screenshot", "x.svg", "--screen", "nope"]) == 2
    assert main(["tui", "-w", str(run_ws), "--screenshot", "x.svg", "--size", "big"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(
        line.startswith(("judgeloop: error:", "judgeloop tui: error:")) for line in err
    )


# ---------------------------------------------------------------------------------------------
# Curves and the history table, without an app


FIRST_ID = 11  # a later run's experiments: ids differ from seqs (0 = baseline) by more than one


def _exp(
    seq: int,
    status: ExperimentStatus,
    kappa: float | None,
    fpr: float | None,
    parent: int | None,
    early: bool = False,
) -> Any:
    from datetime import UTC, datetime

    from optimizer.ledger import Experiment

    metrics = None if kappa is None else {"kappa": kappa, "fpr": fpr}
    return Experiment(
        id=FIRST_ID + seq,
        run_id="r",
        seq=seq,
        parent_id=parent,
        created=datetime(2026, 1, 1, tzinfo=UTC),
        status=status,
        metrics=metrics,
        early_stopped=early,
    )


def test_curve_is_a_step_line_over_experiment_ids_with_early_stopped_at_their_partial_values_and_rejected_counted() -> (
    None
):
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
    partial = {
        12: PartialMetrics(Metrics.from_counts(2, 1, 1, 2), 6, 32),
        16: PartialMetrics(Metrics.from_counts(0, 0, 1, 2), 3, 32),
    }
    history = HistoryData(
        run=run,
        rows=[HistoryRow(e, None, None, None, e.id in chain, partial=partial.get(e.id)) for e in exps],
        chain_ids=chain,
        runs=[run],
    )
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
            assert await fill(pilot, auto, auto=True) == rows * len(
                widths
            )  # an auto column: measured as usual
            assert fixed.row_count == plain.row_count == rows
            assert fixed.virtual_size == plain.virtual_size
            assert (
                auto.virtual_size.width == plain.virtual_size.width - widths[1] + 40
            )  # sized to its content
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
    assert (
        RunOptions(strategy="library", resume=True).argv(tmp_path)[-1] == "--resume"
    )  # resume ignores the rest
    with pytest.raises(UserError, match="unknown strategy 'genetic'"):
        RunOptions(strategy="genetic").argv(tmp_path)


@pytest.mark.slow  # a `judgeloop run` process started and waited for
def test_a_run_refused_at_once_is_reported_not_announced_as_started(
    ws_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app gives a run a few seconds to refuse (tui.runs.early_outcome); a loaded machine may take longer
    # to start Python, so here it waits for the refusing process's exit, up to a generous bound.
    monkeypatch.setattr(runs, "early_outcome", functools.partial(runs.early_outcome, wait_s=EVENT_WAIT_S))
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False)
    seen = capture_notifications(app)

    async def scenario(pilot: Any) -> None:
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, StartRunModal)
        cast(
            Select[str], app.screen.query_one("#run-strategy")
        ).value = "manual"  # with no edit in the working tree
        await pilot.click("#start")
        await settle(app, pilot)
        assert any(
            s.startswith("the run stopped at once (exit 2): judgeloop: error: no edit to judge") for s in seen
        ), seen
        assert not any(s.startswith("run started") for s in seen)

    drive(app, scenario)


def test_live_strip_drops_the_item_count_once_the_candidate_is_decided() -> None:
    from datetime import UTC, datetime

    from optimizer.ledger import Event
    from tui.watch import LiveState, apply_events

    def event(n: int, kind: EventKind, payload: dict[str, Any]) -> Event:
        return Event(
            id=n, run_id="r1", experiment_id=6, created=datetime.now(UTC), kind=kind, payload=payload
        )

    state = apply_events(
        LiveState(),
        [event(1, "stage", {"stage": "evaluating"}), event(2, "progress", {"done": 1, "total": 88})],
    )
    assert "judged 1/88" in state.line()
    state = apply_events(state, [event(3, "decision", {"status": "rolled_back"})])
    assert "judged" not in state.line() and "stage decided: rolled_back (exp 6)" in state.line()
    state = apply_events(state, [event(4, "progress", {"done": 2, "total": 88})])  # the next candidate
    assert "judged 2/88" in state.line()
