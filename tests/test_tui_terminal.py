"""`judgeloop tui` in a real pseudo-terminal that answers the queries programs send it, as xterm does.

The headless tests (test_tui.py) never meet a terminal; these do: the app's own process, its real
driver reading the pty, and a terminal's replies arriving on the same input as the keys.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.terminal import DA1_REPLY, PtyTerminal
from tests.support.tui_runs import RealRun, make_real_run

pytestmark = pytest.mark.slow  # a real run to build, then the app's own process started per test


@pytest.fixture(scope="module")
def run_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with one real finished run that has disagreements to open."""
    ws = tmp_path_factory.mktemp("tui-terminal") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert make_real_run(ws, RealRun(max_experiments=2, replicates=1, items=16, screenshots="none")) == 0
    return ws


def tui_in_pty(ws: Path, size: tuple[int, int], **terminal: Any) -> PtyTerminal:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEXTUAL")}
    env.update(PYTHONPATH=str(REPO_ROOT), TERM="xterm-256color", COLORTERM="truecolor")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return PtyTerminal(
        [sys.executable, "-m", "optimizer.cli", "-w", str(ws), "tui"],
        size=size,
        env=env,
        cwd=REPO_ROOT,
        **terminal,
    )


def title(lines: list[str]) -> str:
    return lines[0].strip()


@pytest.mark.parametrize("size", [(120, 36), (80, 24)])
def test_a_terminals_replies_to_queries_are_never_read_as_keys(run_ws: Path, size: tuple[int, int]) -> None:
    """Disagreements → Enter opens the first item (the first screen with a screenshot, whose image
    support is asked of the terminal); a second later it is still the item, not help or compare, and
    no key reached the app: the terminal's answer (DA1 "ESC [ ? 1 ; 2 c") is not the keys ? and c."""
    with tui_in_pty(run_ws, size) as term:
        term.wait_for(lambda lines: title(lines).startswith("history — run"), "the history view")
        term.press("d")
        term.wait_for(
            lambda lines: title(lines).startswith("disagreements — experiment"), "the disagreements view"
        )
        term.press("\r")
        term.wait_for(lambda lines: title(lines).startswith("item "), "the item view")
        term.pump(1.0)  # what a person sees a second later
        lines = term.lines()
        assert title(lines).startswith("item "), term.text()
        assert DA1_REPLY in term.screen.answered, (
            "the terminal was never asked: this test no longer tests anything"
        )
        # The keys still work after the queries were answered: h goes back to the history.
        term.press("h")
        term.wait_for(lambda lines: title(lines).startswith("history — run"), "the history view again")


@pytest.mark.parametrize(
    "terminal", [{"reply_delay_s": 0.4}, {"answers": False}], ids=["slow-replies", "silent"]
)
def test_a_slow_or_silent_terminal_neither_leaks_replies_as_keys_nor_blocks_the_keys(
    run_ws: Path,
    terminal: dict[str, Any],
) -> None:
    """Replies that arrive after the image library stopped waiting for them (0.1 s) are still not keys
    (they are drained before the app reads the input); a terminal that answers nothing only costs the
    wait, and the keys work."""
    with tui_in_pty(run_ws, (100, 30), **terminal) as term:
        term.wait_for(lambda lines: title(lines).startswith("history — run"), "the history view")
        if terminal.get("answers", True):
            assert DA1_REPLY in term.screen.answered  # asked, and answered late
        term.pump(1.0)  # a late reply would have arrived by now
        assert title(term.lines()).startswith("history — run"), term.text()
        term.press("d")
        term.wait_for(
            lambda lines: title(lines).startswith("disagreements — experiment"), "the disagreements view"
        )
        term.press("\r")
        term.wait_for(lambda lines: title(lines).startswith("item "), "the item view")
        term.pump(1.0)
        assert title(term.lines()).startswith("item "), term.text()
        term.press("h")
        term.wait_for(lambda lines: title(lines).startswith("history — run"), "the history view again")
