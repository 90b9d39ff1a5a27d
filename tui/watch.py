"""Following a live run: a thread polls the ledger's event feed and reports a cumulative snapshot.

The toolong pattern: the watcher never touches widgets; it hands a complete `LiveState` to a callback
(the app posts it as a message that replaces any older one still queued), so a burst of progress
events becomes one repaint and input is never blocked. Each snapshot is cumulative, so dropping an
older one loses nothing. The feed is read through its one parser (`optimizer.ledger.Event.typed`): a
row this version cannot read is skipped, never the end of the watcher.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from optimizer.errors import UserError
from optimizer.events import DecisionRecorded, PassProgress, RunStatusChanged, StageChanged
from optimizer.ledger import Event, Ledger
from optimizer.vocab import StageKind
from tui.data import LedgerNotReady, open_ledger

BACKLOG_EVENTS = 500  # on start, replay this many recent events to show a run already under way


@dataclass(frozen=True)
class MemberProgress:
    """One evaluating experiment's latest ``progress`` event: its own figures."""

    experiment_id: int
    done: int = 0
    total: int = 0
    errors: int = 0
    calls: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def id_span(ids: list[int]) -> str:
    """``5–8`` for consecutive ids, else ``5, 7, 8``."""
    ids = sorted(ids)
    return f"{ids[0]}–{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else ", ".join(map(str, ids))


@dataclass(frozen=True)
class LiveState:
    """What the status strip shows. ``changes`` counts decisions/new experiments/status changes seen,
    so a view can reload only when it moved. ``members``: the experiments evaluating since the last one
    started, each with its latest progress; a wave's K interleave their events, and ``done``/``total``
    and the call and token counts are their sums (one candidate: its own)."""

    run_id: str | None = None
    run_status: str | None = None
    experiment_id: int | None = None
    stage: str | None = None
    done: int = 0
    total: int = 0
    errors: int = 0
    calls: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    last_event_id: int = 0
    changes: int = 0
    members: tuple[MemberProgress, ...] = ()

    def line(self) -> str:
        """One line for the strip; a wave's members as one figure (``wave exps 5–8: judged 210/648``)."""
        if self.run_id is None:
            return "no runs yet — press r to start one"
        parts = [f"run {self.run_id}", self.run_status or "?"]
        wave = len(self.members) > 1
        if self.stage:
            parts.append(
                f"stage {self.stage}"
                + (f" (exp {self.experiment_id})" if self.experiment_id and not wave else "")
            )
        if wave:
            parts.append(
                f"wave exps {id_span([m.experiment_id for m in self.members])}: "
                f"judged {self.done}/{self.total}"
            )
        elif self.total:
            parts.append(f"judged {self.done}/{self.total}")
        parts += [
            f"{self.errors} errors",
            f"{self.input_tokens + self.output_tokens:,} tokens",
            f"${self.cost_usd:.4f}",
            f"{self.elapsed_s:.0f}s",
        ]
        return " · ".join(parts)


def _summed(state: LiveState, members: tuple[MemberProgress, ...]) -> LiveState:
    """``state`` with ``members`` and their summed figures."""
    return replace(
        state,
        members=members,
        done=sum(m.done for m in members),
        total=sum(m.total for m in members),
        errors=sum(m.errors for m in members),
        calls=sum(m.calls for m in members),
        cache_hits=sum(m.cache_hits for m in members),
        input_tokens=sum(m.input_tokens for m in members),
        output_tokens=sum(m.output_tokens for m in members),
    )


def apply_events(state: LiveState, events: list[Event]) -> LiveState:
    """Fold events into the snapshot (pure). A new run's events reset the per-run counters; a new
    experiment's start empties the evaluating members, a decision takes its experiment out of them."""
    for ev in events:
        if ev.run_id and ev.run_id != state.run_id:
            state = LiveState(run_id=ev.run_id, last_event_id=state.last_event_id, changes=state.changes + 1)
        event = ev.typed()
        if isinstance(event, StageChanged):
            # A stage's display text (a batch's state line) is its ``text``; events before it had none.
            state = replace(state, stage=event.shown(), experiment_id=ev.experiment_id or state.experiment_id)
            if event.stage == StageKind.EXPERIMENT_STARTED:
                state = replace(state, changes=state.changes + 1, done=0, total=0, members=())
        elif isinstance(event, PassProgress):
            exp_id = ev.experiment_id or state.experiment_id or 0
            member = MemberProgress(
                exp_id,
                done=event.done,
                total=event.total,
                errors=event.errors,
                calls=event.calls,
                cache_hits=event.cache_hits,
                input_tokens=event.input_tokens,
                output_tokens=event.output_tokens,
            )
            members = tuple(
                sorted(
                    (*(m for m in state.members if m.experiment_id != exp_id), member),
                    key=lambda m: m.experiment_id,
                )
            )
            cost, elapsed = event.cost_usd, event.elapsed_s
            if len(members) > 1:
                # Each member's cost is the run's spend before the wave plus its own: the largest is the
                # closest to the run's (a lower bound), and the figure never jumps back between members.
                cost, elapsed = max(cost, state.cost_usd), max(elapsed, state.elapsed_s)
            state = replace(
                _summed(state, members), experiment_id=exp_id or None, cost_usd=cost, elapsed_s=elapsed
            )
        elif isinstance(event, DecisionRecorded):
            # The evaluation is over: its item count would read as the run's (often a candidate
            # stopped early after a few items), so the strip shows none until the next one starts;
            # a wave's other members, still evaluating, go on being counted.
            left = tuple(m for m in state.members if m.experiment_id != ev.experiment_id)
            state = replace(
                _summed(state, left) if left else replace(state, done=0, total=0, members=()),
                changes=state.changes + 1,
                stage=f"decided: {event.status}",
                experiment_id=ev.experiment_id or state.experiment_id,
            )
        elif isinstance(event, RunStatusChanged):
            state = replace(state, run_status=str(event.status), changes=state.changes + 1)
        state = replace(state, last_event_id=max(state.last_event_id, ev.id))
    return state


def drain(ledger: Ledger, state: LiveState) -> LiveState:
    """Fold every event newer than ``state.last_event_id`` into ``state``."""
    while True:
        events = ledger.events_since(state.last_event_id, limit=1000)
        if not events:
            return state
        state = apply_events(state, events)


def initial_state(ledger: Ledger) -> LiveState:
    """The latest run's snapshot from its status and the most recent events (a run already under way)."""
    run = ledger.latest_run()
    if run is None:
        return LiveState()
    start = max(0, ledger.last_event_id() - BACKLOG_EVENTS)
    state = drain(ledger, LiveState(run_id=run.id, run_status=run.status, last_event_id=start))
    # The backlog may start mid-run: the run's recorded status is authoritative.
    return replace(state, run_status=run.status) if state.run_id == run.id else state


class LedgerWatcher(threading.Thread):
    """Polls ``events_since`` every ``interval_s`` on its own read-only connection; calls
    ``on_state(LiveState)`` whenever something new arrived. Waits for a ledger that does not exist yet
    (LedgerNotReady); a ledger it cannot read (any other UserError) goes to ``on_error``, and it stops."""

    def __init__(
        self,
        ledger_path: Path,
        on_state: Callable[[LiveState], object],
        *,
        on_error: Callable[[UserError], object],
        interval_s: float = 0.5,
    ) -> None:
        super().__init__(name="judgeloop-ledger-watcher", daemon=True)
        self.ledger_path = Path(ledger_path)
        self.on_state = on_state
        self.on_error = on_error
        self.interval_s = interval_s
        self._stop_event = threading.Event()
        self.state = LiveState()

    def stop(self) -> None:
        self._stop_event.set()

    def _initial(self, ledger: Ledger) -> LiveState:
        return initial_state(ledger)

    def _drain(self, ledger: Ledger, state: LiveState) -> LiveState:
        return drain(ledger, state)

    def run(self) -> None:
        ledger: Ledger | None = None
        try:
            while not self._stop_event.is_set():
                if ledger is None:
                    try:
                        ledger = open_ledger(self.ledger_path)
                    except LedgerNotReady:
                        self._stop_event.wait(self.interval_s)  # no ledger yet: a run will create it
                        continue
                    except UserError as exc:  # polling again would not make it readable
                        self.on_error(exc)
                        return
                    self.state = self._initial(ledger)
                    self.on_state(self.state)
                else:
                    new = self._drain(ledger, self.state)
                    if new != self.state:
                        self.state = new
                        self.on_state(new)
                self._stop_event.wait(self.interval_s)
        finally:
            if ledger is not None:
                ledger.close()
