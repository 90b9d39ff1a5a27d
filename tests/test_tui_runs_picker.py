"""The TUI over several runs: the run picker (R), every run side by side, `tui --run`, keep/discard only
on a waiting candidate, an early-stopped candidate's partial metrics, and the start-run form's split,
policy and provider.

The workspace is the manual workflow's (tests/support/tui_manual.py): a `library` run, then one
`run --strategy manual -m …` per hand edit, all real runs against the fake OpenAI server.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, cast

import pytest
from textual.widgets import DataTable, Footer, Input, OptionList, Select, Static

from optimizer.cli import main
from optimizer.errors import UserError
from optimizer.ledger import Experiment, LabelRow, Ledger, Run, RunSpec
from optimizer.stats.metrics import Metrics, score
from optimizer.vocab import POLICIES, TERMINAL_RUN_STATUSES
from tests.support.tui_driving import capture_notifications, drive, screen_lines, svg_text
from tests.support.tui_manual import HELDOUT, MANUAL_EDITS, SMALL, commit_all, make_manual_runs
from tests.support.tui_runs import RealRun, make_real_run
from tui.app import VIEWS, JudgeloopApp, settle
from tui.modals import ALL_RUNS, ConfirmModal, RunPickerModal, StartRunModal
from tui.runs import PROVIDERS, RunOptions, start_run
from tui.views import AllRunsView, ExperimentView, HistoryView

SIZE = (140, 40)


@pytest.fixture(scope="session")
def manual_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("tui-manual") / "ws"
    make_manual_runs(ws)
    return ws


@pytest.fixture
def manual_copy(manual_ws: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ws"
    shutil.copytree(manual_ws, target, symlinks=True)
    return target


@pytest.fixture(scope="session")
def waiting_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """After a real `run --propose-only --max-experiments 1`: one candidate waits for a decision."""
    ws = tmp_path_factory.mktemp("tui-waiting-picker") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert (
            make_real_run(
                ws, RealRun(max_experiments=1, replicates=1, items=16, screenshots="none", propose_only=True)
            )
            == 0
        )
    return ws


def ledger_of(ws: Path) -> Ledger:
    return Ledger.open_readonly(ws / "experiments" / "ledger.sqlite")


def runs_and_experiments(ws: Path) -> list[tuple[Run, list[Experiment]]]:
    """Every run (newest first) with its experiments, straight from the ledger."""
    with ledger_of(ws) as ledger:
        return [(run, ledger.experiments(run.id)) for run in ledger.runs()]


def table_keys(table: DataTable[Any]) -> list[int]:
    return [int(str(row.key.value)) for row in table.ordered_rows]


def widget_text(app: JudgeloopApp, selector: str) -> str:
    """A Static's whole text, however the screen wraps it."""
    return str(cast(Static, app.screen.query_one(selector)).render())


def footer_keys(app: JudgeloopApp) -> str:
    """The keys the footer offers, as its text."""
    footer = app.screen.query_one(Footer)
    return " ".join(str(child.render()) for child in footer.query("*"))


# ---------------------------------------------------------------------------------------------
# The run picker


@pytest.mark.slow
def test_run_picker_lists_every_run_with_its_figures_and_the_history_shows_the_picked_one(
    manual_ws: Path,
) -> None:
    runs = runs_and_experiments(manual_ws)
    assert len(runs) == 1 + len(MANUAL_EDITS)
    oldest, oldest_exps = runs[-1]
    app = JudgeloopApp(manual_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, HistoryView)
        assert f"history — run {runs[0][0].id}" in svg_text(app)  # the latest run by default
        await pilot.press("R")
        await settle(app, pilot)
        assert isinstance(app.screen, RunPickerModal)
        options = app.screen.query_one("#run-options", OptionList)
        ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert ids == [ALL_RUNS, *(run.id for run, _ in runs)]  # every run, newest first, after "all"
        for i, (run, exps) in enumerate(runs, start=1):
            words = str(options.get_option_at_index(i).prompt).split()
            kept = sum(e.status == "kept" for e in exps)
            assert words[-6:] == [
                run.strategy,
                run.policy,
                run.split,
                str(len(exps)),
                str(kept),
                run.status,
            ], words
            assert run.id in words and f"{run.created:%H:%M}" in words
        assert str(options.get_option_at_index(1).prompt).startswith("▸")  # the run shown now
        options.highlighted = ids.index(oldest.id)
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView) and app.run_id == oldest.id
        assert f"history — run {oldest.id}" in svg_text(app)
        assert table_keys(app.screen.query_one("#history-table", DataTable)) == [e.id for e in oldest_exps]
        await pilot.press("R")
        await settle(app, pilot)
        options = app.screen.query_one("#run-options", OptionList)
        assert options.highlighted == ids.index(oldest.id)  # the picker opens on the run shown
        await pilot.press("escape")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView) and app.run_id == oldest.id  # closed: nothing changed

    drive(app, scenario, SIZE)


@pytest.mark.slow
def test_all_runs_view_lines_up_each_manual_edit_under_the_one_before_with_its_run(manual_ws: Path) -> None:
    runs = list(reversed(runs_and_experiments(manual_ws)))  # oldest first
    everything = [e.id for _, exps in runs for e in exps]
    manual = [e for run, exps in runs if run.strategy == "manual" for e in exps if e.status != "baseline"]
    app = JudgeloopApp(manual_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("R")
        await settle(app, pilot)
        cast(OptionList, app.screen.query_one("#run-options")).highlighted = 0
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, AllRunsView)
        table = app.screen.query_one("#all-runs-table", DataTable)
        assert table_keys(table) == everything
        numbers = {str(e.id): f"#{n}" for n, (_, exps) in enumerate(runs, start=1) for e in exps}
        assert all(str(table.get_cell(key, "run")) == numbers[str(key.value)] for key in table.rows)
        await pilot.press("b")  # candidates only: the successive edits one under another
        await settle(app, pilot)
        assert table_keys(table) == [e.id for _, exps in runs for e in exps if e.status != "baseline"]
        text = svg_text(app)
        assert "baselines hidden" in text
        positions = [text.index(message[:20]) for _, message in MANUAL_EDITS]
        assert positions == sorted(positions)  # the edits in the order they were made
        assert [e.rationale for e in manual] == [message for _, message in MANUAL_EDITS]
        table.move_cursor(row=table.get_row_index(str(manual[0].id)))
        await settle(app, pilot)
        detail = widget_text(app, "#all-runs-detail")  # the whole rationale, whatever the width
        assert (
            f"experiment {manual[0].id}" in detail
            and MANUAL_EDITS[0][1] in detail
            and manual[0].run_id in detail
        )
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ExperimentView) and app.experiment_id == manual[0].id
        await pilot.press("h")  # the history follows the opened experiment's run
        await settle(app, pilot)
        assert f"history — run {manual[0].run_id}" in svg_text(app)

    drive(app, scenario, SIZE)


@pytest.mark.slow
def test_run_picker_on_a_workspace_without_runs_says_so(empty_workspace: Any) -> None:
    app = JudgeloopApp(empty_workspace.root, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("R")
        await settle(app, pilot)
        assert isinstance(app.screen, RunPickerModal)
        assert "no runs yet" in svg_text(app)
        await pilot.press("escape")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView)

    drive(app, scenario)


@pytest.mark.slow
def test_tui_run_flag_opens_that_run_and_refuses_an_unknown_id_in_one_line(
    manual_ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    oldest = runs_and_experiments(manual_ws)[-1][0]
    out = tmp_path / "history.svg"
    assert main(["tui", "-w", str(manual_ws), "--run", oldest.id, "--screenshot", str(out)]) == 0
    assert f"history — run {oldest.id}" in screen_lines(out.read_text(encoding="utf-8"))
    capsys.readouterr()
    assert main(["tui", "-w", str(manual_ws), "--run", "20990101-000000-dead", "--screenshot", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run '20990101-000000-dead'" in err and oldest.id in err
    assert "Traceback" not in err
    assert "runs" in VIEWS  # `--screen runs` opens every run side by side
    out2 = tmp_path / "runs.svg"
    assert main(["tui", "-w", str(manual_ws), "--screen", "runs", "--screenshot", str(out2)]) == 0
    assert "all runs — 3 runs" in screen_lines(out2.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# Keep / discard only on a waiting candidate


@pytest.mark.slow
def test_keep_and_discard_are_refused_with_a_reason_on_an_experiment_that_is_not_waiting(
    manual_ws: Path,
) -> None:
    _, exps = runs_and_experiments(manual_ws)[0]
    decided = next(e for e in exps if e.status != "baseline")
    app = JudgeloopApp(
        manual_ws, image_mode="halfcell", watch=False, start_view="experiment", experiment_id=decided.id
    )
    seen = capture_notifications(app)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ExperimentView)
        keys = footer_keys(app)
        assert "Flips" in keys and "Keep" not in keys and "Discard" not in keys
        for key, verb in (("k", "keep"), ("x", "discard")):
            await pilot.press(key)
            await settle(app, pilot)
            assert isinstance(app.screen, ExperimentView)  # no confirmation asked
            assert seen[-1].startswith(
                f"nothing to {verb}: experiment {decided.id} is rolled back, not waiting"
            )

    drive(app, scenario, SIZE)
    with ledger_of(manual_ws) as ledger:
        assert ledger.get_experiment(decided.id).status == decided.status


@pytest.mark.slow
def test_keep_and_discard_are_offered_on_the_waiting_candidate_only(waiting_ws: Path) -> None:
    _, exps = runs_and_experiments(waiting_ws)[0]
    waiting = next(e for e in exps if e.status == "waiting")
    baseline = next(e for e in exps if e.status == "baseline")
    app = JudgeloopApp(
        waiting_ws, image_mode="halfcell", watch=False, start_view="experiment", experiment_id=waiting.id
    )
    seen = capture_notifications(app)

    async def scenario(pilot: Any) -> None:
        keys = footer_keys(app)
        assert "Keep" in keys and "Discard" in keys
        await pilot.press("x")
        await settle(app, pilot)
        assert (
            isinstance(app.screen, ConfirmModal)
            and f"discard experiment {waiting.id}?" in app.screen.question
        )
        await pilot.press("n")  # answered no: nothing decided
        await settle(app, pilot)
        app.select(experiment_id=baseline.id, switch_to="experiment")  # the baseline of the same run
        await settle(app, pilot)
        assert app.screen.detail is not None and app.screen.detail.experiment.id == baseline.id  # type: ignore[attr-defined]
        assert "Keep" not in footer_keys(app)
        await pilot.press("k")
        await settle(app, pilot)
        assert isinstance(app.screen, ExperimentView)
        assert seen[-1].startswith(f"nothing to keep: experiment {baseline.id} is baseline, not waiting")

    drive(app, scenario, SIZE)
    with ledger_of(waiting_ws) as ledger:
        assert ledger.get_experiment(waiting.id).status == "waiting"


# ---------------------------------------------------------------------------------------------
# Partial metrics of an early-stopped candidate


def judged_score(ledger: Ledger, labels: dict[str, LabelRow], experiment_id: int, ids: list[str]) -> Metrics:
    """The engine's own scoring of ``experiment_id``'s answers over ``ids`` only."""
    answers = ledger.item_answers(experiment_id)
    return score(cast(Any, {t: labels[t] for t in ids}), {t: answers[t] for t in ids if t in answers})


@pytest.mark.slow
def test_early_stopped_candidates_show_their_partial_metrics_marked_in_history_and_experiment(
    manual_ws: Path,
) -> None:
    run, exps = runs_and_experiments(manual_ws)[-1]  # the library run: its candidates stopped early
    stopped = [e for e in exps if e.early_stopped]
    assert stopped and all(e.kappa is None for e in stopped)  # the ledger has no metrics for them
    with ledger_of(manual_ws) as ledger:
        labels = ledger.labels(run.id)
        expected = {}
        for exp in stopped:
            answers = ledger.item_answers(exp.id)
            judged = sorted(t for t, a in answers.items() if a.status in ("ok", "invalid"))
            assert 0 < len(judged) < len(labels)
            expected[exp.id] = (
                judged_score(ledger, labels, exp.id, judged),
                judged_score(ledger, labels, cast(int, exp.parent_id), judged),
                len(judged),
            )
    assert any(mine != theirs for mine, theirs, _ in expected.values())  # some edit changed verdicts
    app = JudgeloopApp(manual_ws, image_mode="halfcell", watch=False, run_id=run.id)

    async def scenario(pilot: Any) -> None:
        table = app.screen.query_one("#history-table", DataTable)
        for exp_id, (mine, theirs, _) in expected.items():
            # kappa over items of one class only is undefined, as balanced accuracy is: "—", not 0.00*
            one_class = mine.tpr is None or mine.tnr is None
            assert str(table.get_cell(str(exp_id), "kappa")) == ("—" if one_class else f"{mine.kappa:.2f}*")
            p_value = next(e.p_value for e in stopped if e.id == exp_id)
            if p_value is not None:  # an early stop's p is a bound, as in the report
                assert str(table.get_cell(str(exp_id), "p")) == f"≥{p_value:.3f}"
            assert str(table.get_cell(str(exp_id), "fpr")) == f"{mine.fpr:.2f}*"
            # Δ against the incumbent over the same items (the candidate judged the negatives first)
            assert (
                str(table.get_cell(str(exp_id), "dfpr"))
                == f"{cast(float, mine.fpr) - cast(float, theirs.fpr):+.2f}*"
            )
        baseline = next(e for e in exps if e.status == "baseline")
        assert str(table.get_cell(str(baseline.id), "kappa")) == f"{baseline.kappa:.3f}"  # complete: unmarked
        assert "* = over the items judged before an early stop" in widget_text(app, "#view-title")
        exp_id = next(
            e
            for e, (mine, theirs, _) in expected.items()
            if mine.kappa != theirs.kappa and None not in (mine.tpr, mine.tnr, theirs.tpr, theirs.tnr)
        )
        mine, incumbent, n = expected[exp_id]
        table.move_cursor(row=table.get_row_index(str(exp_id)))
        await pilot.press("e")
        await settle(app, pilot)
        text = svg_text(app)
        assert f"* partial metrics ({n}/{len(labels)} judged)" in widget_text(app, "#experiment-decision")
        kappa_row = next(
            line.replace(" ", "") for line in text.splitlines() if line.strip().startswith("kappa")
        )
        delta = cast(float, mine.kappa) - cast(float, incumbent.kappa)
        # value, interval (none on part of the items), the incumbent on the same items, the difference
        assert kappa_row == f"kappa{mine.kappa:.2f}*—{incumbent.kappa:.2f}*{delta:+.2f}*"

    drive(app, scenario, SIZE)


# ---------------------------------------------------------------------------------------------
# The start-run form: split, policy, provider


def select_values(select: Select[str]) -> list[str]:
    return [str(value) for _, value in select._options if isinstance(value, str)]  # Textual keeps them there


@pytest.mark.slow
def test_start_run_form_offers_the_workspace_splits_and_config_defaults_never_a_heldout_split(
    manual_ws: Path,
) -> None:
    from optimizer.workspace.workspace import Workspace

    config = Workspace.open(manual_ws).config
    assert (
        HELDOUT in config.workspace.heldout_splits
        and (manual_ws / "devset" / HELDOUT / "split.json").is_file()
    )
    app = JudgeloopApp(manual_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, StartRunModal)
        split = cast(Select[str], app.screen.query_one("#run-split"))
        policy = cast(Select[str], app.screen.query_one("#run-policy"))
        provider = cast(Select[str], app.screen.query_one("#run-provider"))
        assert sorted(select_values(split)) == sorted(["mini", SMALL, "sample"])  # `held` is not there
        assert HELDOUT not in select_values(split)
        assert (split.value, policy.value, provider.value) == (
            config.workspace.dev_split,
            config.loop.policy,
            config.judge.provider,
        )
        assert select_values(policy) == list(POLICIES) and select_values(provider) == list(PROVIDERS)
        assert f"held out, never offered for a run: {HELDOUT}" in svg_text(app)
        options = app.screen.options()
        assert (options.split, options.policy, options.provider) == (
            "mini",
            "adaptive",
            config.judge.provider,
        )

    drive(app, scenario, (80, 24))


@pytest.mark.slow  # a whole detached `judgeloop run` on the chosen settings
def test_a_run_started_from_the_form_runs_on_the_chosen_split_policy_and_provider(
    manual_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.workspace.workspace import Workspace
    from tests.support.config import write_config
    from tests.support.fakeserver import FakeLLMServer
    from tests.support.tui_runs import prompt_sensitive_judge

    monkeypatch.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")  # the run inherits it
    with FakeLLMServer() as server:
        server.default = prompt_sensitive_judge(manual_copy, SMALL)
        config = Workspace.open(manual_copy).config
        assert config.judge.provider == "local" and config.loop.policy == "adaptive"
        # The config's judge is the local one; the form switches the run to openai (on the fake server).
        write_config(
            manual_copy,
            config.model_copy(
                update={
                    "judge": config.judge.model_copy(update={"base_url": server.openai_base_url}),
                }
            ),
        )
        commit_all(manual_copy, "test: the judge's base url is the fake server")
        before = {r.id for r in ledger_of(manual_copy).runs()}
        app = JudgeloopApp(manual_copy, image_mode="halfcell", watch=False)
        seen = capture_notifications(app)

        async def scenario(pilot: Any) -> None:
            await pilot.press("r")
            await settle(app, pilot)
            assert isinstance(app.screen, StartRunModal)
            app.screen.query_one("#run-split", Select).value = SMALL
            app.screen.query_one("#run-policy", Select).value = "literal"
            app.screen.query_one("#run-provider", Select).value = "openai"
            app.screen.query_one("#run-max", Input).value = "1"
            await pilot.click("#start")
            await settle(app, pilot)
            assert any(s.startswith("run started") for s in seen), seen

        drive(app, scenario, SIZE)
        new: Run | None = None
        for _ in range(1200):  # bounded wait for the detached run to end
            with ledger_of(manual_copy) as ledger:
                fresh = [r for r in ledger.runs() if r.id not in before]
            if fresh and fresh[0].status in TERMINAL_RUN_STATUSES:
                new = fresh[0]
                break
            time.sleep(0.05)
    logs = sorted((manual_copy / "experiments" / "runs").glob("*.log"))
    assert new is not None, logs[-1].read_text()[-2000:] if logs else "no log"
    assert new.status == "finished", logs[-1].read_text()[-2000:]
    assert (new.split, new.policy, new.config["judge"]["provider"]) == (SMALL, "literal", "openai")


@pytest.mark.slow
def test_start_run_refuses_a_heldout_split_or_a_malformed_choice_before_starting_anything(
    manual_copy: Path,
) -> None:
    runs_dir = manual_copy / "experiments" / "runs"
    logs_before = sorted(runs_dir.glob("*.log"))
    with pytest.raises(UserError, match=f"split '{HELDOUT}' is held out"):
        start_run(manual_copy, RunOptions(split=HELDOUT))
    for bad, message in (
        (RunOptions(split="--resume"), "is not a split name"),
        (RunOptions(policy="greedy"), "unknown policy 'greedy'"),
        (RunOptions(provider="--base-url=http://evil"), "unknown provider"),
    ):
        with pytest.raises(UserError, match=message):
            start_run(manual_copy, bad)
    assert sorted(runs_dir.glob("*.log")) == logs_before  # no log, so no process: refused up front
    argv = RunOptions(split=SMALL, policy="paired", provider="openai").argv(manual_copy)
    assert argv[argv.index("--split") + 1] == SMALL and argv[argv.index("--policy") + 1] == "paired"
    assert argv[argv.index("--provider") + 1] == "openai"
    assert RunOptions(split=HELDOUT, resume=True).argv(manual_copy)[-1] == "--resume"  # resume takes no split


@pytest.mark.slow
def test_the_picker_shows_a_crafted_runs_names_as_text_and_every_new_binding_has_its_own_id(
    manual_copy: Path,
) -> None:
    from tui import modals
    from tui.app import JudgeloopApp as App

    with Ledger(
        manual_copy / "experiments" / "ledger.sqlite"
    ) as writer:  # a run no loop made: no experiments
        crafted = writer.create_run(
            RunSpec(strategy="manual", policy="literal", split="[b]x", split_fingerprint="f", start_rev="s")
        )
    app = JudgeloopApp(manual_copy, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        await pilot.press("R")
        await settle(app, pilot)
        options = app.screen.query_one("#run-options", OptionList)
        line = str(options.get_option_at_index(1).prompt)
        assert crafted.id in line and "[b]x" in line  # markup in a name is shown, never interpreted
        options.highlighted = 1
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, HistoryView) and app.run_id == crafted.id
        assert "no runs yet" not in svg_text(app)
        await pilot.press("R")
        await settle(app, pilot)
        cast(OptionList, app.screen.query_one("#run-options")).highlighted = 0
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, AllRunsView)
        assert "all runs — 4 runs" in widget_text(app, "#view-title")  # the empty run counts, adds no row

    drive(app, scenario, SIZE)
    classes = [
        App,
        *VIEWS.values(),
        modals.ErrorModal,
        modals.ConfirmModal,
        modals.ReviewModal,
        modals.StartRunModal,
        modals.RunPickerModal,
        modals.ItemListModal,
        modals.ErrorScreen,
    ]
    bindings = [b for cls in classes for b in cls.__dict__.get("BINDINGS", [])]
    assert all(b.id for b in bindings) and len({b.id for b in bindings}) == len(bindings)
    assert {"run.pick", "runs.open", "runs.baselines", "runs.close"} <= {b.id for b in bindings}
