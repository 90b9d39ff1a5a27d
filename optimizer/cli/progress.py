"""Rendering engine events on a terminal: a progress line, status lines on stdout, notes on stderr."""

from __future__ import annotations

import sys
from typing import TextIO

from optimizer.events import Event, Progress, ProgressSnapshot


class StderrProgress:
    """A single updating progress line on a terminal; plain lines (about every 10%) otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_plain = -1
        self._open = False

    def __call__(self, snap: ProgressSnapshot) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + snap.line())
            self.stream.flush()
            self._open = True
            return
        step = max(1, snap.total // 10)
        if snap.done == snap.total or snap.done // step != self._last_plain // step or self._last_plain < 0:
            self._last_plain = snap.done
            print(snap.line(), file=self.stream, flush=True)

    def close(self) -> None:
        """End the updating line so later output starts on a fresh line."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


class TerminalEvents:
    """Renders engine events: status messages on stdout, notes on stderr (after ``prefix``), and
    progress as a `StderrProgress` line. Use as a context manager so the progress line is closed."""

    def __init__(self, prefix: str = "", progress: bool = True) -> None:
        self.prefix = prefix
        self.progress = StderrProgress() if progress else None

    def __call__(self, event: Event) -> None:
        if isinstance(event, Progress):
            if self.progress is not None:
                self.progress(event.snapshot)
        elif event.stream == "note":
            print(f"{self.prefix}{event.text}", file=sys.stderr, flush=True)
        else:
            print(event.text, flush=True)

    def __enter__(self) -> TerminalEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.close()
