"""The most one harness call may cost, as a budget reserves it (`CallCeiling`).

A harness CLI's cost is known only after it ran, and a CLI may report far more than the declared
``[judge] price_per_call_usd``. The ceiling a budget reserves per call is therefore the larger of the
declared price and the highest cost a call reported so far, or ``[judge] max_cost_per_call_usd`` when
the user set one. Until a call of a CLI that reports its cost has reported (the ceiling is then
unproven), calls go one at a time: the first reported cost sets the ceiling before the next call
reserves, so a budget is crossed by at most one call's reported cost.
"""

from __future__ import annotations

import asyncio


class CallCeiling:
    """See the module docstring. ``declared_usd``: the declared price; ``fixed_usd``: the user's
    ``max_cost_per_call_usd`` (None: unset); ``reports_cost``: whether the CLI reports what a call cost
    (when it does not, a call costs the declared price and the ceiling is proven from the start)."""

    def __init__(self, declared_usd: float | None, fixed_usd: float | None, *, reports_cost: bool) -> None:
        self.declared_usd = declared_usd or 0.0
        self.fixed_usd = fixed_usd
        self.highest_reported_usd = 0.0
        self._proven = fixed_usd is not None or not reports_cost
        self._leading = False
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def usd(self) -> float:
        """The dollars to reserve for the next call."""
        if self.fixed_usd is not None:
            return self.fixed_usd
        return max(self.declared_usd, self.highest_reported_usd)

    def describe(self) -> str:
        """Where `usd` comes from, in a few words."""
        if self.fixed_usd is not None:
            return "[judge] max_cost_per_call_usd"
        if self.highest_reported_usd > self.declared_usd:
            return "the highest cost one call of the CLI reported"
        return "[judge] price_per_call_usd"

    def observe(self, reported_usd: float) -> None:
        """A call reported costing ``reported_usd`` dollars."""
        self.highest_reported_usd = max(self.highest_reported_usd, reported_usd)
        self._proven = True

    async def turn(self) -> bool:
        """Wait until the next call may reserve `usd`. True: this call goes alone to prove the ceiling
        (the caller calls `done` when it ended, whatever happened)."""
        while not self._proven:
            if not self._leading:
                self._leading = True
                return True
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        return False

    def done(self) -> None:
        """The call that went alone ended (reported or not): wake the calls waiting for it."""
        self._leading = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
