"""One tool call's MCP progress notifications, from the engine's progress snapshots.

The engine reports each pass of an evaluation on its own (a candidate's first pass by futility's looks,
then re-judging its disagreements; attribution's several evaluations), each counting from 0. MCP asks a
call's progress value to increase with every notification, so `CallProgress` counts items over the whole
call: items judged in every pass so far over items planned so far, never reset (a pass is told apart from
the others by its size, the only thing a snapshot says of it). It also sends at most one
notification every `MIN_INTERVAL_S` (so never more than two in any second), holding back the newest
one in between and releasing it when its time comes; the call's last one is always sent.

A long call can be silent for minutes (a slow judge, the guards, git): hosts kill a call they hear nothing
from (an idle watchdog), so `CallProgress.beat` gives a heartbeat once `HEARTBEAT_S` passed without a
notification: the held notice if there is one, else the last value plus a thousandth (below the next whole
item, so still strictly increasing and never an item more than was judged), under the same pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from optimizer.events import ProgressSnapshot

MIN_INTERVAL_S = 0.5  # between two notifications of one call: at most two a second
HEARTBEAT_S = 20.0  # a call silent this long sends a heartbeat
_BEAT_STEP = 0.001  # what a heartbeat adds to the progress value (a thousandth of an item)


@dataclass(frozen=True)
class Notice:
    """One progress notification: ``progress`` items judged over ``total`` planned (both over the whole
    call), and the current pass's own line."""

    progress: float
    total: float | None
    message: str


class CallProgress:
    """One call's progress: `offer` each snapshot; send what it returns at once, and what `release`
    returns once `wait_s` seconds have passed. ``clock``: seconds, monotonic (injected by tests);
    ``sent_at``: when the server's previous call sent its last notification (the pace holds across calls)."""

    def __init__(
        self,
        interval_s: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sent_at: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._open: dict[int, int] = {}  # each pass under way, by its items planned: items judged
        self._closed = 0  # items judged by the call's passes that ended
        self._sent_value = 0.0
        self._sent_at = sent_at
        self._started = clock()
        self._held: Notice | None = None
        self._last: Notice | None = None  # the last notice sent

    def _count(self, snap: ProgressSnapshot) -> Notice:
        # Passes interleave (a look of the first pass, re-judging its disagreements, the first pass going on
        # from where it was), so each is followed by its size; a count going back starts a new pass of it.
        seen = self._open.get(snap.total)
        if seen is not None and snap.done < seen:
            self._closed += seen  # what it judged stays done; what it left unjudged is no longer planned
        self._open[snap.total] = snap.done
        done = self._closed + sum(self._open.values())
        planned = self._closed + sum(self._open)
        return Notice(float(done), float(planned), snap.line())

    def offer(self, snap: ProgressSnapshot) -> Notice | None:
        """The notice to send now for ``snap``, or None: not past the last one sent (dropped), or too soon
        after it (held back, replacing any held before it)."""
        notice = self._count(snap)
        if notice.progress <= self._sent_value:
            return None
        if self._sent_at is not None and self.clock() - self._sent_at < self.interval_s:
            self._held = notice
            return None
        return self._sent(notice)

    @property
    def sent_at(self) -> float | None:
        """When the last notification went out (``clock`` seconds), None if none has."""
        return self._sent_at

    def wait_s(self) -> float | None:
        """Seconds until the held notice may be sent (0: now); None when none is held."""
        if self._held is None:
            return None
        if self._sent_at is None:
            return 0.0
        return max(0.0, self._sent_at + self.interval_s - self.clock())

    def release(self) -> Notice | None:
        """The held notice when its time has come (it is then sent), else None."""
        wait = self.wait_s()
        if wait is None or wait > 0 or self._held is None:
            return None
        notice, self._held = self._held, None
        return self._sent(notice)

    @property
    def last(self) -> Notice | None:
        """The last notice sent (what a status request reports), None before the first."""
        return self._last

    def latest(self) -> Notice | None:
        """The newest progress known: the held notice, else the last one sent (no pace applies)."""
        return self._held or self._last

    def beat(self, heartbeat_s: float = HEARTBEAT_S) -> Notice | None:
        """A heartbeat to send now when the call has been silent ``heartbeat_s`` seconds (the held notice,
        or the last value plus a thousandth of an item, capped below the next whole item), else None."""
        since = max(self._started, self._sent_at if self._sent_at is not None else self._started)
        if self.clock() - since < max(heartbeat_s, self.interval_s):
            return None
        if self._held is not None:
            return self.release()
        value = self._sent_value
        nxt = min(value + _BEAT_STEP, float(int(value)) + 1 - _BEAT_STEP)
        if nxt <= value:  # a thousand heartbeats on one item: nothing left to add below the next one
            return None
        last = self._last
        message = f"still working ({last.message})" if last is not None else "still working"
        return self._sent(Notice(nxt, last.total if last is not None else None, message))

    def _sent(self, notice: Notice) -> Notice:
        self._last = notice
        self._sent_value = notice.progress
        self._sent_at = self.clock()
        self._held = None
        return notice
