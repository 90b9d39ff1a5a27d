"""Driving the real TUI headlessly in tests: a scenario under Textual's Pilot, the notifications it
raised, and what its screen shows as text."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tests.support.waits import EVENT_WAIT_S
from tui.app import JudgeloopApp, settle

SIZE = (120, 40)


def drive(
    app: JudgeloopApp, scenario: Callable[[Any], Coroutine[Any, Any, None]], size: tuple[int, int] = SIZE
) -> None:
    """Run ``scenario(pilot)`` against ``app`` headlessly, after its first loads settle."""

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await scenario(pilot)

    asyncio.run(go())


async def wait_until(
    pilot: Any, happened: Callable[[], object], what: str, timeout_s: float = EVENT_WAIT_S
) -> None:
    """Let the app run until ``happened()`` is true (checked between short pauses); fail naming ``what``
    if it is still false after ``timeout_s`` seconds (an upper bound, not an expectation)."""
    deadline = time.monotonic() + timeout_s
    while not happened():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        await pilot.pause(0.05)


def capture_notifications(app: JudgeloopApp) -> list[str]:
    seen: list[str] = []
    original = app.notify

    def notify(message: str, **kwargs: Any) -> None:
        seen.append(str(message))
        original(message, **kwargs)

    app.notify = notify  # type: ignore[method-assign]
    return seen


def screen_lines(svg: str) -> str:
    """The text of an SVG screenshot, one screen line per line (Rich writes a <text> per styled run)."""
    import html
    import re

    lines: dict[float, list[tuple[float, str]]] = {}
    for x, y, content in re.findall(r'<text[^>]*?x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        lines.setdefault(float(y), []).append((float(x), html.unescape(content).replace("\xa0", " ")))
    return "\n".join("".join(t for _, t in sorted(parts)) for _, parts in sorted(lines.items()))


def svg_text(app: JudgeloopApp) -> str:
    """What the screen shows, as text lines, so assertions read like the screen."""
    return screen_lines(app.export_screenshot())


def screen_rows(app: JudgeloopApp) -> list[str]:
    """Every cell of the screen, one string per row, spaces included (the SVG's text drops the spaces
    that are margins and padding)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]
