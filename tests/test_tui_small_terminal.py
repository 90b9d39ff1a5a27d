"""The TUI at 80×24 and its dialogs, driven by Textual's Pilot (issue 36, points 4 and 5).

At 80×24 nothing a reviewer reads is cut: every key a view offers is in its footer (named where there
is room, else the key alone in its group: help names them all), the label's mistake type and the
judge's reasoning wrap, a dialog's title wraps. A typed note is never lost: moving the focus keeps it,
and a review is saved only with its note.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from textual.binding import Binding
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from optimizer.ledger import Ledger
from optimizer.workspace.workspace import Workspace
from tests.support.loop import present
from tests.support.tui_driving import capture_notifications, drive, screen_rows, svg_text
from tests.support.tui_runs import RealRun, make_real_run
from tui.app import VIEWS, JudgeloopApp, settle
from tui.modals import CorrectionModal, ReviewModal
from tui.views import DisagreementsView, ItemView
from tui.widgets import KeyFooter

SMALL = (80, 24)


@pytest.fixture(scope="module")
def run_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace whose ledger holds one real finished run (the sample's "Misunderstanding of the
    Instruction" negatives among its 32 items)."""
    ws = tmp_path_factory.mktemp("tui-small") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert make_real_run(ws, RealRun(max_experiments=2, replicates=2, items=32, screenshots="none")) == 0
    return ws


@pytest.fixture
def ws_copy(run_ws: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ws"
    shutil.copytree(run_ws, target, symlinks=True)
    return target


def ledger_of(ws: Path) -> Ledger:
    return Ledger.open_readonly(ws / "experiments" / "ledger.sqlite")


def words(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces (a wrapped text, read whole)."""
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------
# The footer


def offered_actions(app: JudgeloopApp) -> set[str]:
    """Every action the current view offers by a key: its own shown bindings (those its ``check_action``
    does not hide) and the app's on keys the view does not take for itself."""
    offered = set()
    taken: set[str] = set()
    for owner in (app.screen, app):
        for binding in owner.BINDINGS:
            if not isinstance(binding, Binding):
                continue
            keys = {k.strip() for k in binding.key.split(",")}
            name, *_ = binding.action.split("(")
            if owner is app.screen and owner.check_action(name, ()) is not False:
                taken |= keys
            elif owner is app and keys & taken:
                continue
            if binding.show and (owner is app or owner.check_action(name, ()) is not False):
                offered.add(binding.action)
    return offered


@pytest.mark.slow
@pytest.mark.parametrize("view", [v for v in VIEWS if v != "help"] + ["help"])
def test_every_key_a_view_offers_is_in_its_footer_at_80_by_24(empty_workspace: Workspace, view: str) -> None:
    """The history footer used to drop R (runs) and s (stop), the item view's a third of its keys."""
    app = JudgeloopApp(empty_workspace.root, image_mode="halfcell", watch=False, start_view=view)

    async def scenario(pilot: Any) -> None:
        footer = app.screen.query_one(KeyFooter)
        shown = [k for k in footer.query(FooterKey) if "-command-palette" not in k.classes]
        missing = offered_actions(app) - {k.action for k in shown}
        assert not missing, (view, missing, [k.key_display for k in shown])
        named = {k.key_display: k.description for k in shown}
        assert named.get("?") == "Help" and named.get("q") == "Quit"  # help and quit always with their names
        # The footer is one line that fits: its last key ends before the palette.
        assert footer.region.width == SMALL[0] and all(k.region.right <= SMALL[0] for k in shown)

    drive(app, scenario, size=SMALL)


# ---------------------------------------------------------------------------------------------
# Wrapped, not cut


@pytest.mark.slow
def test_disagreements_at_80_by_24_wrap_the_mistake_type_and_show_the_reasoning_whole(run_ws: Path) -> None:
    """It used to show "Misunderstanding o" and a reasoning column eight wide ("Checklis")."""
    with ledger_of(run_ws) as ledger:
        run = present(ledger.latest_run())
        app = JudgeloopApp(
            run_ws,
            image_mode="halfcell",
            watch=False,
            start_view="disagreements",
            experiment_id=run.incumbent_experiment,
        )
        labels = ledger.labels(run.id)
    long_types = {t.mistake_type for t in labels.values() if t.mistake_type and len(t.mistake_type) > 18}
    assert long_types, "the fixture's split has no long mistake type"

    async def scenario(pilot: Any) -> None:
        view = app.screen
        assert isinstance(view, DisagreementsView) and view.items
        text = words(svg_text(app))
        typed = [d for d in view.items if d.label.mistake_type in long_types]
        assert typed, "no disagreement with a long mistake type"
        for d in view.items:  # each row in turn: the whole reasoning and mistake type under the table
            table = view.query_one("#disagreement-table")
            table.move_cursor(row=table.get_row_index(d.trajectory_id))  # type: ignore[attr-defined]
            await settle(app, pilot)
            text = words(svg_text(app))
            assert words(d.reasoning) in text, (d.trajectory_id, d.reasoning, text)
            if d.label.mistake_type:
                assert d.label.mistake_type in text, (d.label.mistake_type, text)

    drive(app, scenario, size=SMALL)


@pytest.mark.slow
def test_a_dialog_title_wraps_at_80_by_24(run_ws: Path) -> None:
    """The label-correction dialog's title used to end in "(given: fail"."""
    app = JudgeloopApp(run_ws, image_mode="halfcell", watch=False, start_view="suspects")

    async def scenario(pilot: Any) -> None:
        await pilot.press("x")
        await settle(app, pilot)
        assert isinstance(app.screen, CorrectionModal)
        title = app.screen.query_one("Label")
        rows, box = screen_rows(app), title.region  # what the screen shows where the title is
        shown = words(" ".join(rows[y][box.x : box.right] for y in range(box.y, box.bottom)))
        assert shown == words(str(title.render())), shown

    drive(app, scenario, size=SMALL)


# ---------------------------------------------------------------------------------------------
# Typed text is never lost


def item_app(ws: Path) -> tuple[JudgeloopApp, str]:
    with ledger_of(ws) as ledger:
        run = present(ledger.latest_run())
        tid = ledger.item_verdicts(present(run.incumbent_experiment))[0].trajectory_id
    return JudgeloopApp(
        ws,
        image_mode="halfcell",
        watch=False,
        experiment_id=run.incumbent_experiment,
        item_id=tid,
        start_view="item",
    ), tid


@pytest.mark.slow
def test_a_note_typed_then_tabbed_away_and_back_is_kept_and_saved_whole(ws_copy: Path) -> None:
    """Tab moves the focus to the buttons and back round to the note: what was typed stays, the next
    keys add to it (they used to replace it: the note came back selected), and Save stores it all."""
    app, tid = item_app(ws_copy)

    async def scenario(pilot: Any) -> None:
        await pilot.press("w")
        await settle(app, pilot)
        assert isinstance(app.screen, ReviewModal)
        await pilot.press(*"cites the wrong step")
        await pilot.press("tab")  # to Save
        await pilot.press("tab")  # to Cancel
        await pilot.press("shift+tab", "shift+tab")  # back to the note
        note = cast(Input, app.screen.query_one("#review-note"))
        assert app.focused is note and note.value == "cites the wrong step"
        await pilot.press(*" of the menu")
        await pilot.press("tab")  # to Save
        assert app.focused is not None and app.focused.id == "save"
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView)

    drive(app, scenario)
    with ledger_of(ws_copy) as ledger:
        assert [(r.kind, r.note) for r in ledger.reviews(trajectory_id=tid)] == [
            ("judge_wrong", "cites the wrong step of the menu")
        ]


@pytest.mark.slow
def test_a_review_without_a_note_is_refused_and_nothing_is_saved(ws_copy: Path) -> None:
    """Tab then Enter on Save with no note used to save an empty review."""
    app, tid = item_app(ws_copy)
    notes = capture_notifications(app)

    async def scenario(pilot: Any) -> None:
        await pilot.press("w")
        await settle(app, pilot)
        assert isinstance(app.screen, ReviewModal)
        await pilot.press("tab", "enter")  # Save, with no note
        await settle(app, pilot)
        assert isinstance(app.screen, ReviewModal)  # still open, saying why
        assert any("note" in n and "empty" in n for n in notes), notes
        await pilot.press(*"   ", "enter")  # spaces are no note either
        await settle(app, pilot)
        assert isinstance(app.screen, ReviewModal)
        await pilot.press("escape")
        await settle(app, pilot)
        assert isinstance(app.screen, ItemView)

    drive(app, scenario)
    with ledger_of(ws_copy) as ledger:
        assert ledger.reviews(trajectory_id=tid) == []
