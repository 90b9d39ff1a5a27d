"""One truth across the TUI's views (issue 36, points 6 and 7), driven by Textual's Pilot over a real
workspace: an early-stopped candidate is drawn and compared at what it measured (the ``0.03*`` the
history and experiment views show), ``]``/``[`` reach every experiment of every run that judged an
item, a filter without a match says so, and a person's keep against the policy reads "kept (overruled)".

The workspace: a real run whose three candidates the adaptive policy stopped early, then a real
`run --propose-only` whose one candidate waits (the policy rolls it back) for a person's decision.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from textual.widgets import DataTable

from optimizer.cli import main
from optimizer.ledger import Experiment, Ledger
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import present
from tests.support.tui_driving import drive, screen_rows, svg_text
from tests.support.tui_runs import RealRun, make_real_run, prompt_sensitive_judge
from tui.app import JudgeloopApp, settle
from tui.data import partial_metrics
from tui.modals import ConfirmModal
from tui.views import CompareView, ExperimentView, HistoryView, ItemView
from tui.widgets import MetricChart


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("tui-two-runs") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert make_real_run(ws, RealRun(max_experiments=3, replicates=1, items=16, screenshots="none")) == 0
        with FakeLLMServer() as server:
            server.default = prompt_sensitive_judge(ws, "mini")
            assert (
                main(
                    [
                        "run",
                        "-w",
                        str(ws),
                        "--split",
                        "mini",
                        "--provider",
                        "openai",
                        "--base-url",
                        server.openai_base_url,
                        "--model",
                        "fake-judge",
                        "--strategy",
                        "library",
                        "--max-experiments",
                        "1",
                        "--replicates",
                        "1",
                        "--propose-only",
                    ]
                )
                == 0
            )
    return ws


def ledger_of(ws: Path) -> Ledger:
    return Ledger.open_readonly(ws / "experiments" / "ledger.sqlite")


def first_run(ws: Path) -> tuple[str, list[Experiment]]:
    """The first run's id and its experiments (the early-stopped candidates are there)."""
    with ledger_of(ws) as ledger:
        run = ledger.runs()[-1]
        return run.id, ledger.experiments(run.id)


@pytest.mark.slow
def test_the_chart_draws_an_early_stopped_candidate_at_what_it_measured(two_runs: Path) -> None:
    """It drew them at the incumbent's level (FPR 1.00* drawn at 0.625); now at the partial figure the
    table shows, or not at all (a kappa over one class) with the title saying how many."""
    run_id, experiments = first_run(two_runs)
    stopped = [e for e in experiments if e.early_stopped]
    assert stopped, "the fixture's first run has no early-stopped candidate"
    with ledger_of(two_runs) as ledger:
        partial = {e.id: present(partial_metrics(ledger, e, with_incumbent=True)) for e in stopped}
        incumbent = ledger.get_experiment(present(stopped[0].parent_id))
    app = JudgeloopApp(two_runs, image_mode="halfcell", watch=False, run_id=run_id)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, HistoryView)
        rows = screen_rows(app)
        for metric in ("kappa", "fpr"):
            points = present(app.screen.query_one(f"#{metric}-chart", MetricChart).points)
            drawn = dict(
                zip(
                    points.stopped_x,
                    points.stopped_kappa if metric == "kappa" else points.stopped_fpr,
                    strict=True,
                )
            )
            for e in stopped:
                # Drawn at the figure the table shows (to its two places), or not drawn where it shows "—".
                shown = "—" if drawn[e.id] is None else f"{drawn[e.id]:.2f}*"
                assert shown == partial[e.id].cell(metric), (
                    metric,
                    e.id,
                    drawn[e.id],
                    partial[e.id].cell(metric),
                )
                # The table's row shows the same figure, marked partial.
                row = next(r for r in rows if r.split()[:1] == [str(e.id)])
                assert partial[e.id].cell(metric) in row, (metric, row)
        # The fixture is one where that differs from the incumbent's level (what used to be drawn).
        assert any(partial[e.id].cell("kappa") != f"{incumbent.kappa:.2f}*" for e in stopped)

    drive(app, scenario)


@pytest.mark.slow
def test_compare_shows_an_early_stopped_candidates_partial_figures_not_dashes(two_runs: Path) -> None:
    _, experiments = first_run(two_runs)
    candidate = next(e for e in experiments if e.early_stopped)
    with ledger_of(two_runs) as ledger:
        partial = present(partial_metrics(ledger, candidate, with_incumbent=True))
    app = JudgeloopApp(
        two_runs, image_mode="halfcell", watch=False, start_view="compare", experiment_id=candidate.id
    )

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, CompareView)
        text = svg_text(app)
        assert f"over the {partial.judged} items judged before the early stop" in " ".join(text.split())
        for name in ("kappa", "fpr"):
            if partial.value(name) is not None:
                line = next(
                    line
                    for line in text.splitlines()
                    if line.split()[:1] == [name] and partial.cell(name) in line
                )
                assert partial.delta_cell(name) in line, line

    drive(app, scenario, size=(100, 60))  # the sides one above the other: each line whole


@pytest.mark.slow
def test_next_and_previous_experiment_reach_every_run_that_judged_the_item(two_runs: Path) -> None:
    """`]` used to say "no other experiment judged this item" though an earlier run had."""
    with ledger_of(two_runs) as ledger:
        latest = present(ledger.latest_run())
        baseline = ledger.experiments(latest.id)[0]
        tid = ledger.item_verdicts(baseline.id)[0].trajectory_id
        judged = sorted(
            e.id
            for run in ledger.runs()
            for e in ledger.experiments(run.id)
            if ledger.item_verdicts(e.id, tid)
        )
        runs_judging = {ledger.get_experiment(i).run_id for i in judged}
    assert len(runs_judging) == 2, "the item was judged in one run only"
    app = JudgeloopApp(
        two_runs,
        image_mode="halfcell",
        watch=False,
        start_view="item",
        experiment_id=baseline.id,
        item_id=tid,
    )

    async def scenario(pilot: Any) -> None:
        seen = []
        for _ in judged:
            await pilot.press("right_square_bracket")
            await settle(app, pilot)
            assert isinstance(app.screen, ItemView) and app.screen.detail is not None
            seen.append(app.screen.detail.experiment.id)
        assert sorted(seen) == judged, (seen, judged)
        await pilot.press("left_square_bracket")
        await settle(app, pilot)
        assert app.experiment_id == seen[-2]

    drive(app, scenario)


@pytest.mark.slow
def test_a_history_filter_without_a_match_says_so(two_runs: Path) -> None:
    app = JudgeloopApp(two_runs, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("slash", *"nothing-matches-this")
        await settle(app, pilot)
        table = cast(DataTable[Any], app.screen.query_one("#history-table"))
        assert table.row_count == 0
        assert "no experiment matches the filter 'nothing-matches-this'" in " ".join(svg_text(app).split())

    drive(app, scenario, size=(80, 24))


@pytest.mark.slow
def test_a_keep_against_the_policy_is_asked_then_shown_kept_overruled(two_runs: Path, tmp_path: Path) -> None:
    """k on the waiting candidate the policy rolls back: the question says it overrules the policy; once
    kept, the history and experiment views say "kept (overruled)" (they said only "kept")."""
    ws = tmp_path / "ws"
    shutil.copytree(two_runs, ws, symlinks=True)
    with ledger_of(ws) as ledger:
        (candidate,) = ledger.experiments_with_status("waiting")
    assert candidate.policy_keep is False, "the fixture's waiting candidate is one the policy keeps"
    app = JudgeloopApp(
        ws, image_mode="halfcell", watch=False, start_view="experiment", experiment_id=candidate.id
    )

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ExperimentView)
        await pilot.press("k")
        await settle(app, pilot)
        assert isinstance(app.screen, ConfirmModal)
        assert "overrules the policy" in " ".join(svg_text(app).split())
        await pilot.press("y")
        await settle(app, pilot)  # the worker decides, then the view reloads
        assert isinstance(app.screen, ExperimentView)
        text = svg_text(app)
        assert "kept (overruled)" in text.splitlines()[0] or "kept (overruled)" in text
        assert "kept by a person over the policy's roll back" in " ".join(text.split())
        await pilot.press("h")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView)
        row = next(
            r for r in screen_rows(app) if r.split()[:1] in ([str(candidate.id)], [f"{candidate.id}◆"])
        )
        assert "kept (overruled)" in row, row

    drive(app, scenario)
    with ledger_of(ws) as ledger:
        kept = ledger.get_experiment(candidate.id)
    assert kept.status == "kept" and kept.decided_by == "person" and kept.overrule is not None
