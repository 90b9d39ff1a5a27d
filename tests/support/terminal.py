"""A program in a real pseudo-terminal, watched through a VT emulator that answers queries as xterm would.

The pty's other side is a pyte screen: what the program draws is readable as lines, keys are bytes
written to the pty, and the terminal's reports (primary device attributes, device status, cursor
position, cell size in pixels) are written back as a real terminal writes them, interleaved with
the keys. Every wait is bounded; the program is killed (by its pid's process group, which it leads)
when the terminal is closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyte

from tests.support.waits import EVENT_WAIT_S

# What tmux (and xterm in VT100 mode) answers to ESC [ c: a VT100 with advanced video.
DA1_REPLY = "\x1b[?1;2c"
CELL_PIXELS = (20, 10)  # height, width: an ordinary 10×20 font


class _AnsweringScreen(pyte.Screen):
    """A pyte screen that writes the terminal's replies to the pty and records which it sent."""

    def __init__(
        self, columns: int, lines: int, fd: int, *, delay_s: float = 0.0, answers: bool = True
    ) -> None:
        super().__init__(columns, lines)
        self.fd = fd
        self.delay_s = delay_s
        self.answers = answers
        self.answered: list[str] = []
        self.pending: list[tuple[float, str]] = []  # (when, reply): a slow link delays them all, in order

    def write_process_input(self, data: str) -> None:
        if not self.answers:
            return
        self.answered.append(data)
        self.pending.append((time.monotonic() + self.delay_s, data))
        self.send_due()

    def send_due(self) -> None:
        """Write the replies whose time has come (all of them without a delay)."""
        while self.pending and self.pending[0][0] <= time.monotonic():
            _, data = self.pending.pop(0)
            with contextlib.suppress(OSError):
                os.write(self.fd, data.encode())

    def report_device_attributes(self, mode: int = 0, **kwargs: bool) -> None:
        if mode == 0 and not kwargs.get("private"):
            self.write_process_input(DA1_REPLY)

    def window_report(self, *params: int, **_kwargs: bool) -> None:
        """XTWINOPS reports (CSI 14/16/18 t): text area in pixels, cell size, text area in cells."""
        height, width = CELL_PIXELS
        match params[:1]:
            case (14,):
                self.write_process_input(f"\x1b[4;{self.lines * height};{self.columns * width}t")
            case (16,):
                self.write_process_input(f"\x1b[6;{height};{width}t")
            case (18,):
                self.write_process_input(f"\x1b[8;{self.lines};{self.columns}t")
            case _:
                return  # other window reports: a real terminal ignores what it does not support


class _Stream(pyte.ByteStream):
    csi = {**pyte.ByteStream.csi, "t": "window_report"}  # noqa: RUF012  (pyte's own attribute)


class PtyTerminal:
    """``argv`` running in a ``columns``×``lines`` pty; use as a context manager (it kills the program).
    ``reply_delay_s``: the terminal's replies arrive that much later (a slow ssh link); ``answers=False``:
    a terminal that answers no query at all."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        size: tuple[int, int] = (120, 36),
        env: Mapping[str, str],
        cwd: Path,
        reply_delay_s: float = 0.0,
        answers: bool = True,
    ) -> None:
        columns, lines = size
        master, slave = os.openpty()
        # Pixel sizes 0, as tmux reports them: a program must ask the terminal for the cell size.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.fd = master
        self.screen = _AnsweringScreen(columns, lines, master, delay_s=reply_delay_s, answers=answers)
        self.stream = _Stream(self.screen)
        self.closed = False
        self.output = bytearray()
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)

    def __enter__(self) -> PtyTerminal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill the program (its whole session: it leads one) and release the pty."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def pump(self, seconds: float) -> None:
        """Read and draw what the program writes (answering its queries) for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.screen.send_due()
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.02) if self.screen.pending else left)
            if not ready:
                continue
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the program closed the pty (it exited)
                data = b""
            if not data:
                time.sleep(min(left, 0.05))
                continue
            self.output += data
            self.stream.feed(data)

    def lines(self) -> list[str]:
        """The screen, one string per line."""
        return [str(line).rstrip() for line in self.screen.display]

    def text(self) -> str:
        return "\n".join(self.lines())

    def wait_for(
        self, predicate: Callable[[list[str]], Any], what: str, timeout: float = EVENT_WAIT_S
    ) -> None:
        """Pump until ``predicate(lines)`` holds; fail with the screen after ``timeout`` seconds or if the
        program exits."""
        deadline = time.monotonic() + timeout
        while not predicate(self.lines()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(
                    f"{what}: not on screen after {timeout:g} s (exit code {self.proc.poll()}):\n"
                    f"{self.text()}"
                )
            self.pump(0.1)

    def press(self, keys: str) -> None:
        """Type ``keys`` (raw: "\\r" is Enter)."""
        os.write(self.fd, keys.encode())
