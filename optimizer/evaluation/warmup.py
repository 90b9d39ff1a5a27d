"""Single-flight per cached prefix, and the telemetry of planned vs billed cache reads.

A provider's prompt-cache entry is readable only once the response that writes it has begun, so
calls for one item's prefix that start together each pay the write. `PrefixWarmth` lets one call
go first for a cold prefix (the leader) and starts the others after its response has returned
(a non-streaming call's response has begun by then; the leader is a real replicate, so warming
costs no extra call). A prefix answered within its TTL (less a margin) is warm: its calls start at
once. The registry is per process (`WARM_PREFIXES`), so a re-judging pass, a later candidate or a
panel member in the same process finds the prefixes the earlier passes wrote.

Telemetry: every paid call on a cached prefix that is not a cold prefix's leader plans to read the
prefix (its estimated tokens); `CacheReads` compares that plan with the reads the provider billed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

# Billed reads below this share of the planned reads make a pass's cache telemetry a warning.
LOW_READS_SHARE = 0.8
# A prefix counts as warm for this share of its TTL after a call answered on it (clock skew, and
# the provider's own timing of the entry, eat into the rest).
TTL_MARGIN = 0.9
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


class PrefixWarmth:
    """Which cached prefixes are warm (answered recently), and who goes first on a cold one."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._warm: dict[str, float] = {}  # prefix key -> time until which it is warm
        # (event loop id, prefix key) -> set when the leader's call ends; per loop, so a loop that
        # died mid-call (Ctrl-C) leaves nothing another loop could wait on forever.
        self._leaders: dict[tuple[int, str], asyncio.Event] = {}

    def is_warm(self, key: str) -> bool:
        until = self._warm.get(key)
        return until is not None and until > self.clock()

    def try_lead(self, key: str) -> bool:
        """Become the leader of cold ``key`` when nobody leads it: True (then call `done`)."""
        slot = (id(asyncio.get_running_loop()), key)
        if self.is_warm(key) or slot in self._leaders:
            return False
        self._leaders[slot] = asyncio.Event()
        return True

    async def wait_turn(self, key: str) -> bool:
        """Wait until ``key`` is warm (False: go, it will be read) or has no leader left (True:
        this caller now leads, the previous leader's call failed)."""
        slot = (id(asyncio.get_running_loop()), key)
        while not self.is_warm(key):
            leader = self._leaders.get(slot)
            if leader is None:
                self._leaders[slot] = asyncio.Event()
                return True
            await leader.wait()
        return False

    def done(self, key: str, *, answered: bool, ttl: str | None) -> None:
        """The leader's call on ``key`` ended; ``answered``: the provider answered it (so it wrote the prefix)."""
        if answered:
            self.mark_warm(key, ttl)
        leader = self._leaders.pop((id(asyncio.get_running_loop()), key), None)
        if leader is not None:
            leader.set()

    def mark_warm(self, key: str, ttl: str | None) -> None:
        """A call on ``key`` was answered outside single-flight (a batch entry): it is warm now."""
        self._warm[key] = self.clock() + TTL_MARGIN * TTL_SECONDS.get(ttl or "5m", 300.0)

    def forget(self) -> None:
        """Treat every prefix as cold again (the provider's cache was cleared)."""
        self._warm.clear()


WARM_PREFIXES = PrefixWarmth()


@dataclass(frozen=True)
class CacheReads:
    """One pass's cache reads: what the plan expected and what the provider billed (tokens)."""

    planned: int = 0
    billed: int = 0

    @property
    def low(self) -> bool:
        """Billed reads fell below `LOW_READS_SHARE` of the planned ones."""
        return self.planned > 0 and self.billed < LOW_READS_SHARE * self.planned

    def warning(self) -> str | None:
        if not self.low:
            return None
        return (
            f"warning: the provider billed {self.billed:,} cache-read tokens of {self.planned:,} planned "
            f"({self.billed / self.planned:.0%}, below {LOW_READS_SHARE:.0%}): calls paid cache writes "
            "instead (a cold batch, an evicted or cleared cache, or another server)"
        )
