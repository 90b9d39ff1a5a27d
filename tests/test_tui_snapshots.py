"""Layout baselines: the screens the README shows, rendered by `judgeloop tui --screenshot` at 120×36
(the size of docs/screenshots/) and compared with the SVGs under tests/__snapshots__/test_tui_snapshots/.

The workspace is a real run built to render the same everywhere (`make_snapshot_workspace`: a fixed
run id, git dates and clock fields, calls judged in order by a judge keyed by request), so a
difference is a change of layout or content. After a deliberate change, look at the new screens and
accept them with `pytest tests/test_tui_snapshots.py --snapshot-update` (a Textual upgrade may move a
few cells too).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from optimizer.cli import main
from optimizer.evaluation import judging
from tests.support.tui_runs import make_snapshot_workspace

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
    shas = subprocess.run(["git", "rev-list", "--all"], cwd=ws, capture_output=True, text=True,
                          check=True).stdout.split()
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
        assert main(["tui", "-w", str(ws), "--screenshot", str(path), "--screen", screen, "--size", SIZE]) == 0
        shots[screen] = stable_commits(path.read_text(encoding="utf-8"), ws)
    return shots


@pytest.fixture(autouse=True, scope="module")
def plain_terminal() -> Iterator[None]:
    """The user's colour and Textual settings must not reach the frame."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n == "NO_COLOR" or n.startswith("TEXTUAL_")]:
            mp.delenv(name)
        yield


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tui-snapshots")
    make_snapshot_workspace(root / "ws")
    return screenshots(root / "ws", root / "svg")


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
