"""Ctrl-C and SIGTERM for the long commands (`run`, `eval`, `confirm`, `attribute`).

The first signal asks the engine to stop (`StopRequest`): no new judge call starts, the calls in flight
finish into the cache, and the command ends cleanly, saying so on stderr at once. A second signal
aborts (`Aborted`, a KeyboardInterrupt: exit 130). Each signal is named as what it was.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from optimizer.cli.progress import CLEAR_LINE
from optimizer.evaluation.stopping import Aborted, StopRequest

SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def _write(text: str) -> None:
    # os.write, not print: a handler runs between two bytecodes of the main thread, which may be in the
    # middle of writing to sys.stderr (a nested buffered write raises "reentrant call").
    try:
        tty = os.isatty(2)
        os.write(2, ((CLEAR_LINE if tty else "") + text + "\n").encode("utf-8", "replace"))
    except OSError:
        return  # stderr closed or gone: the stop itself still happens, only its message is lost


def stopping_message(who: str, what: str) -> str:
    again = "Ctrl-C again to abort" if who == "Ctrl-C" else f"{who} or Ctrl-C again to abort"
    return f"judgeloop: {who}: {what} stops after the judge calls in flight (no new call starts); {again}"


@contextmanager
def stop_on_signals(what: str) -> Iterator[StopRequest]:
    """While the block runs, SIGINT and SIGTERM request a stop of the yielded `StopRequest` (the
    first one) or raise `Aborted` (the second). ``what`` says what stops ("the run", "the evaluation"). The previous
    handlers come back at the end. Off the main thread no handler can be installed: the request is
    then only the caller's to make."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        who = SIGNAL_NAMES.get(signal.Signals(signum), signal.Signals(signum).name)
        if stop.request(who):
            _write(stopping_message(who, what))
            return
        _write(f"judgeloop: second {who}: aborting now")
        raise Aborted(who)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNAL_NAMES}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
