"""Rendering engine events on a terminal: a progress line, status lines on stdout, notes on stderr."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import TextIO

from optimizer.events import Event, Progress, ProgressSnapshot, said

CLEAR_LINE = "\r\x1b[K"  # back to column 0, erase to the end of the line


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short enough for a status line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


# Items finished after the pace's starting point before an ETA is shown ("ETA estimating" until then).
TIMED_ITEMS = 2


def progress_line(snap: ProgressSnapshot, timed_from: tuple[int, float] | None = None) -> str:
    """One evaluation's progress (or, after its label, a wave's): items judged / total, calls, cost,
    elapsed and the time left (an upper bound when the loop may stop early). ``timed_from``: (items done,
    elapsed seconds) when the pace starts, the first snapshot with an item done, so the time a model takes
    to load (the offline judge: a minute or more) is not spread over the items; the ETA reads
    "estimating" until `TIMED_ITEMS` items finished after it."""
    parts = [
        f"{snap.label + ': ' if snap.label else ''}judged {snap.done}/{snap.total} items",
        f"{snap.calls_made} calls + {snap.cache_hits} cached",
        f"${snap.cost_usd:.4f}",
        f"{duration(snap.elapsed_s)} elapsed",
    ]
    if snap.done < snap.total:
        timed = snap.done - timed_from[0] if timed_from is not None else 0
        if timed_from is not None and timed >= TIMED_ITEMS:
            pace_s = (snap.elapsed_s - timed_from[1]) / timed
            parts.append(f"ETA {duration(pace_s * (snap.total - snap.done))}")
        else:
            parts.append("ETA estimating")
    errors = [
        f"{n} {what}"
        for n, what in ((snap.infra_errors, "infra errors"), (snap.parse_errors, "parse failures"))
        if n
    ]
    return " · ".join(parts + errors)


def _columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to (its own, not stdout's, which may be a pipe)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return columns if columns > 0 else shutil.get_terminal_size((100, 24)).columns


class StderrProgress:
    """A single updating progress line on a terminal; plain lines (about every 10%) otherwise.

    On a terminal the line is cut to its width (a wrapped line could not be erased) and redrawn at most
    ten times a second; `clear` erases it so other output starts on a clean line.
    """

    MIN_REDRAW_S = 0.1

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_plain = -1
        self._open = False
        self._drawn_at = 0.0
        self._pace: tuple[tuple[str, int], int, float] | None = (
            None  # (label, total), done, elapsed at its start
        )

    def _timed_from(self, snap: ProgressSnapshot) -> tuple[int, float] | None:
        """Where this evaluation's pace starts: the first snapshot with an item done (model loaded)."""
        key = (snap.label, snap.total)
        if self._pace is not None and (self._pace[0] != key or snap.done < self._pace[1]):
            self._pace = None  # another evaluation
        if self._pace is None and snap.done > 0:
            self._pace = (key, snap.done, snap.elapsed_s)
        return None if self._pace is None else self._pace[1:]

    def __call__(self, snap: ProgressSnapshot) -> None:
        timed_from = self._timed_from(snap)
        if self.tty:
            now = time.monotonic()
            if now - self._drawn_at < self.MIN_REDRAW_S and snap.done < snap.total:
                return
            self._drawn_at = now
            width = _columns(self.stream) - 1
            line = progress_line(snap, timed_from)
            if len(line) > width:
                line = line[: max(0, width - 1)] + "…"
            self.stream.write(CLEAR_LINE + line)
            self.stream.flush()
            self._open = True
            return
        step = max(1, snap.total // 10)
        if snap.done == snap.total or snap.done // step != self._last_plain // step or self._last_plain < 0:
            self._last_plain = snap.done
            print(progress_line(snap, timed_from), file=self.stream, flush=True)

    def clear(self) -> None:
        """Erase the updating line (the next snapshot draws it again)."""
        if self._open:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
            self._open = False
            self._drawn_at = 0.0

    def close(self) -> None:
        """Erase the updating line at the end: what it said is in the lines printed after it."""
        self.clear()


class TerminalEvents:
    """Renders engine events: status messages on stdout, notes on stderr (after ``prefix``), and
    progress as a `StderrProgress` line, erased before any other line is printed. Use as a context
    manager so the progress line is erased at the end."""

    def __init__(self, prefix: str = "", progress: bool = True) -> None:
        self.prefix = prefix
        self.progress = StderrProgress() if progress else None

    def clear(self) -> None:
        if self.progress is not None:
            self.progress.clear()

    def __call__(self, event: Event) -> None:
        if isinstance(event, Progress):
            if self.progress is not None:
                self.progress(event.snapshot)
            return
        line = said(event)
        if line is None:
            return
        self.clear()
        if line.stream == "note":
            print(f"{self.prefix}{line.text}", file=sys.stderr, flush=True)
        else:
            print(line.text, flush=True)

    def __enter__(self) -> TerminalEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.close()
