"""Layout baselines: the screens the README shows, rendered by `judgeloop tui --screenshot` at 120×36
(the size of docs/screenshots/) and compared with the SVGs under tests/__snapshots__/test_tui_snapshots/;
then every view and dialog of the TUI, one class per feature (posting's habit: each class opens the app
at its view and presses its keys in a single ``run_before(pilot)``), each at 80×24 and at 160×45.

The workspace is a real run built to render the same everywhere (`make_snapshot_workspace`: a fixed
run id, git dates and clock fields, calls judged in order by a judge keyed by request), so a
difference is a change of layout or content. After a deliberate change, look at the new screens and
accept them with `pytest tests/test_tui_snapshots.py --snapshot-update` (a Textual upgrade may move a
few cells too).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from textual.pilot import Pilot
from textual.widgets import Input

from optimizer.cli import main
from optimizer.errors import UserError
from optimizer.evaluation import judging
from optimizer.workspace.workspace import Workspace
from tests.support.loop import present
from tests.support.tui_runs import make_snapshot_workspace
from tui.app import JudgeloopApp, screenshot_defaults, settle
from tui.modals import (
    ConfirmModal,
    CorrectionModal,
    ErrorModal,
    ErrorScreen,
    ItemListModal,
    ReviewModal,
    RunPickerModal,
    StartRunModal,
)

SIZE = "120x36"
SCREENS = ("history", "experiment", "item", "helped")


class SVGSnapshot(SingleFileSnapshotExtension):
    """One .svg file per snapshot, compared as text (a failure shows the lines that changed)."""

    file_extension = "svg"
    _write_mode = WriteMode.TEXT


def stable_commits(svg: str, ws: Path) -> str:
    """``svg`` with every commit id of ``ws`` replaced by a placeholder of the same width (its number in
    order of appearance). Commit ids depend on where the checkout lies (the split links the bundled
    sample by its absolute path), not on the layout; Rich names the frame after its text, so that
    name is fixed too."""
    shas = subprocess.run(
        ["git", "rev-list", "--all"], cwd=ws, capture_output=True, text=True, check=(ws / ".git").exists()
    ).stdout.split()  # no repository: no commit ids
    seen: dict[str, int] = {}

    def placeholder(match: re.Match[str]) -> str:
        token = match.group(0)
        sha = next((s for s in shas if s.startswith(token)), None)
        if sha is None:
            return token
        number = seen.setdefault(sha, len(seen) + 1)
        return str(number).rjust(len(token), "0")

    svg = re.sub(r"(?<![0-9a-z])[0-9a-f]{7,40}(?![0-9a-z])", placeholder, svg)
    return re.sub(r"terminal-\d+", "terminal-0", svg)


def screenshots(ws: Path, out: Path) -> dict[str, str]:
    """Every screen of ``ws`` as `judgeloop tui --screenshot` writes it (commit ids made stable)."""
    shots = {}
    for screen in SCREENS:
        path = out / f"{screen}.svg"
        assert (
            main(["tui", "-w", str(ws), "--screenshot", str(path), "--screen", screen, "--size", SIZE]) == 0
        )
        shots[screen] = stable_commits(path.read_text(encoding="utf-8"), ws)
    return shots


# Every test here renders a workspace that a real run builds first (a minute or more on two cores).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def plain_terminal() -> Iterator[None]:
    """The user's colour and Textual settings must not reach the frame."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n == "NO_COLOR" or n.startswith("TEXTUAL_")]:
            mp.delenv(name)
        yield


@pytest.fixture(scope="module")
def snapshot_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workspace every screen of this module shows (read only: no test writes to it)."""
    root = tmp_path_factory.mktemp("tui-snapshots") / "ws"
    make_snapshot_workspace(root)
    return root


@pytest.fixture(scope="module")
def shots(snapshot_ws: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return screenshots(snapshot_ws, tmp_path_factory.mktemp("svg"))


@pytest.mark.parametrize("screen", SCREENS)
def test_screen_matches_its_baseline(screen: str, shots: dict[str, str], snapshot: SnapshotAssertion) -> None:
    assert "pytest-of" not in shots[screen] and "/tmp/" not in shots[screen]  # no path of this machine
    assert shots[screen] == snapshot(extension_class=SVGSnapshot)


def test_a_second_build_on_a_slower_machine_renders_byte_for_byte_the_same(
    shots: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing from the clock or the timing of calls reaches a screen. The second build renders each
    item 30 ms slower, as a loaded machine does: at an early stop the next item's first call is then
    no longer in flight (one call fewer in a rolled-back experiment), which shifted every later verdict
    of a judge that numbered its calls across the server; the screens must not move."""
    render = judging.ItemJudge._render

    def slow_render(self: judging.ItemJudge, traj: Any) -> Any:
        time.sleep(0.03)
        return render(self, traj)

    monkeypatch.setattr(judging.ItemJudge, "_render", slow_render)
    make_snapshot_workspace(tmp_path / "ws")
    again = screenshots(tmp_path / "ws", tmp_path / "svg")
    for screen in SCREENS:
        assert again[screen] == shots[screen], screen


# ---------------------------------------------------------------------------------------------
# Every view and dialog, one class per feature, at a small and a wide terminal

SIZES = {"80x24": (80, 24), "160x45": (160, 45)}


@pytest.fixture(scope="module")
def wave_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The snapshot workspace's run judged in waves of two (`run --wave 2`)."""
    root = tmp_path_factory.mktemp("tui-waves") / "ws"
    make_snapshot_workspace(root, wave=2)
    return root


@pytest.fixture
def fresh_ws(empty_workspace: Workspace) -> Path:
    return empty_workspace.root


@pytest.fixture
def unreadable_ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace whose ledger a newer judgeloop wrote (the error screen), its path in the message made
    relative: the temporary folder's name would move the text's line breaks."""
    from optimizer.errors import UserError
    from optimizer.ledger import Ledger
    from tui import app as app_module

    path = tmp_path / "ws" / "experiments" / "ledger.sqlite"
    path.parent.mkdir(parents=True)
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    real = app_module.open_ledger

    def open_ledger(ledger_path: Path) -> Ledger:
        try:
            return real(ledger_path)
        except UserError as exc:
            raise UserError(str(exc).replace(str(ledger_path), "experiments/ledger.sqlite")) from None

    monkeypatch.setattr(app_module, "open_ledger", open_ledger)
    return tmp_path / "ws"


class FeatureSnapshot:
    """One feature's screen: the app over ``workspace`` (a fixture's name) opened at ``start_view`` on
    the run's incumbent and its first disagreement (as `judgeloop tui --screenshot` opens it), then
    ``run_before(pilot)``; compared with its baseline at each size in SIZES."""

    workspace = "snapshot_ws"
    start_view = "history"

    async def run_before(self, pilot: Pilot[None]) -> None:
        """The keys that reach the feature's screen (none: the start view is the feature)."""

    @pytest.mark.parametrize("size", SIZES)
    def test_matches_its_baseline(
        self, size: str, request: pytest.FixtureRequest, snapshot: SnapshotAssertion
    ) -> None:
        ws: Path = request.getfixturevalue(self.workspace)
        svg = stable_commits(asyncio.run(self.render(ws, SIZES[size])), ws)
        assert "pytest-of" not in svg and "/tmp/" not in svg  # no path of this machine
        assert svg == snapshot(extension_class=SVGSnapshot)

    async def render(self, ws: Path, size: tuple[int, int]) -> str:
        """The screen after ``run_before``, settled, the inputs' cursors steady (no blink phase)."""
        try:
            experiment_id, item_id = screenshot_defaults(ws / "experiments" / "ledger.sqlite", None)
        except UserError:  # a ledger the app cannot read: its error screen is the feature
            experiment_id, item_id = None, None
        app = JudgeloopApp(
            ws,
            image_mode="halfcell",
            start_view=self.start_view,
            experiment_id=experiment_id,
            item_id=item_id,
            watch=False,
        )
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await self.run_before(pilot)
            await settle(app, pilot)
            for field in app.screen.query(Input):
                field.cursor_blink = False
            await pilot.pause()
            return app.export_screenshot()


class TestHistory(FeatureSnapshot):
    start_view = "history"


class TestHistoryFilter(FeatureSnapshot):
    """The history's filter box, typed into."""

    async def run_before(self, pilot: Pilot[None]) -> None:
        await pilot.press("slash", "k", "e", "p", "t")


class TestAllRuns(FeatureSnapshot):
    start_view = "runs"


class TestRunsPicker(FeatureSnapshot):
    async def run_before(self, pilot: Pilot[None]) -> None:
        await pilot.press("R")
        await settle(pilot.app, pilot)
        assert isinstance(pilot.app.screen, RunPickerModal)


class TestStartRunForm(FeatureSnapshot):
    async def run_before(self, pilot: Pilot[None]) -> None:
        await pilot.press("r")
        await settle(pilot.app, pilot)
        assert isinstance(pilot.app.screen, StartRunModal)


class TestExperiment(FeatureSnapshot):
    start_view = "experiment"


class TestFlipItems(FeatureSnapshot):
    """A flip-table cell's items (the experiment view: f, then a cell, then Enter)."""

    start_view = "experiment"

    async def run_before(self, pilot: Pilot[None]) -> None:
        await pilot.press("f", "down", "right", "enter")  # the newly right positives
        await settle(pilot.app, pilot)
        assert isinstance(pilot.app.screen, ItemListModal)


class TestDecideDialog(FeatureSnapshot):
    """Keep or discard a waiting candidate: the question k asks (the experiment view asks it only of a
    propose-only run's waiting candidate, which this run has not: the app's own method asks it here)."""

    start_view = "experiment"

    async def run_before(self, pilot: Pilot[None]) -> None:
        app = cast(JudgeloopApp, pilot.app)
        app.decide_waiting(present(app.experiment_id), "keep")
        await settle(app, pilot)
        assert isinstance(app.screen, ConfirmModal)


class TestDisagreements(FeatureSnapshot):
    start_view = "disagreements"


class TestItem(FeatureSnapshot):
    start_view = "item"


class TestReviewDialog(FeatureSnapshot):
    start_view = "item"

    async def run_before(self, pilot: Pilot[None]) -> None:
        await pilot.press("w")
        await settle(pilot.app, pilot)
        assert isinstance(pilot.app.screen, ReviewModal)
        await pilot.press(*"cites the wrong step")


class TestReviews(FeatureSnapshot):
    start_view = "reviews"


class TestCompare(FeatureSnapshot):
    start_view = "compare"


class TestWhatHelped(FeatureSnapshot):
    start_view = "helped"


class TestSuspects(FeatureSnapshot):
    start_view = "suspects"


class TestLabelFixDialog(FeatureSnapshot):
    start_view = "suspects"

    async def run_before(self, pilot: Pilot[None]) -> None:
        await pilot.press("x")
        await settle(pilot.app, pilot)
        assert isinstance(pilot.app.screen, CorrectionModal)


class TestHelp(FeatureSnapshot):
    start_view = "help"


class TestErrorModal(FeatureSnapshot):
    """A failure shown instead of a crash (the one handler every worker error and failed command uses)."""

    async def run_before(self, pilot: Pilot[None]) -> None:
        app = cast(JudgeloopApp, pilot.app)
        app.show_error(
            "judgeloop decide failed",
            UserError(
                "experiment 3 is not waiting for a decision; only a propose-only run's candidate can be kept"
            ),
        )
        await settle(app, pilot)
        assert isinstance(app.screen, ErrorModal)


class TestNoRunYet(FeatureSnapshot):
    """A new workspace: the history before its first run."""

    workspace = "fresh_ws"


class TestUnreadableLedger(FeatureSnapshot):
    """The whole-app error screen: a ledger a newer judgeloop wrote."""

    workspace = "unreadable_ws"

    async def run_before(self, pilot: Pilot[None]) -> None:
        assert isinstance(pilot.app.screen, ErrorScreen)


class TestWavesHistory(FeatureSnapshot):
    workspace = "wave_ws"


class TestWavesExperiment(FeatureSnapshot):
    workspace = "wave_ws"
    start_view = "experiment"
