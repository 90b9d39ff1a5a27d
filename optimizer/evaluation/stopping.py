"""Stopping evaluations from outside: a person's Ctrl-C or SIGTERM, another thread.

A `StopRequest` is shared by whoever asks (a signal handler, a window) and the evaluations that honour
it (`evaluate_items(stop=...)`): once it is requested no new judge call starts, and the calls in flight
finish into the cache and the spend (a provider bills an answered call whether or not anyone reads
it), so nothing paid for is lost. Honoured by direct passes; a batch pass, paid for once sent, runs on.
"""

from __future__ import annotations

from collections.abc import Callable

Listener = Callable[[str], None]


class Stopped(Exception):
    """Evaluation is stopping; this item makes no new paid call."""


class StopRequest:
    """A one-way switch: `request` sets it (the first reason is kept), `subscribe` hears it.

    No lock: `request` may run in a signal handler, which interrupts the main thread anywhere (a lock
    held there would deadlock it); list appends and attribute stores are atomic in CPython.
    """

    def __init__(self) -> None:
        self._reason: str | None = None
        self._listeners: list[Listener] = []

    @property
    def reason(self) -> str | None:
        """Who asked, e.g. "Ctrl-C" or "SIGTERM"; None while not requested."""
        return self._reason

    def is_set(self) -> bool:
        return self._reason is not None

    def request(self, reason: str) -> bool:
        """Ask every subscriber to stop; True the first time, False when already requested."""
        if self._reason is not None:
            return False
        self._reason = reason
        for listener in list(self._listeners):
            listener(reason)
        return True

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(reason)`` on the request (at once when it was already made); returns the
        function that unsubscribes it."""
        self._listeners.append(listener)
        if self._reason is not None:
            listener(self._reason)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe


class Aborted(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM: stop now, mid-step. ``who`` names the signal."""

    def __init__(self, who: str) -> None:
        super().__init__(who)
        self.who = who


class Interrupted(Exception):
    """An evaluation a `StopRequest` stopped: ``message`` says what was judged and what a rerun pays."""
