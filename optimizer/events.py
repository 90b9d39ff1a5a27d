"""What the engine tells the outside world while it works: progress, messages, and why it stopped.

Engine functions never print. They take an ``events: Listener`` (any callable taking an `Event`)
and call it; the CLI renders events on the terminal (`optimizer.cli.render`), the TUI and tests
collect them. `StopReason` is typed: code branches on its `kind`, people read its `message`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal


@dataclass(frozen=True)
class ProgressSnapshot:
    """An evaluation's running totals; tokens and dollars count only calls made now."""

    done: int
    total: int
    infra_errors: int
    parse_errors: int
    calls_made: int
    cache_hits: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    elapsed_s: float
    # What the figures are of when not one evaluation (a wave's candidates judged together), said first.
    label: str = ""

    def plus(self, other: ProgressSnapshot) -> ProgressSnapshot:
        """Both snapshots' counts and seconds summed (this one's label)."""
        return replace(
            self, done=self.done + other.done, total=self.total + other.total,
            infra_errors=self.infra_errors + other.infra_errors, parse_errors=self.parse_errors + other.parse_errors,
            calls_made=self.calls_made + other.calls_made, cache_hits=self.cache_hits + other.cache_hits,
            input_tokens=self.input_tokens + other.input_tokens, output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd, elapsed_s=self.elapsed_s + other.elapsed_s,
        )

    @classmethod
    def summed(cls, snaps: Iterable[ProgressSnapshot]) -> ProgressSnapshot:
        """``snaps``' counts and seconds summed (all zero for none)."""
        total = cls(0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
        for snap in snaps:
            total = total.plus(snap)
        return total

    def line(self) -> str:
        tokens = self.input_tokens + self.output_tokens
        return (
            f"{self.label + ': ' if self.label else ''}judge {self.done}/{self.total} items · "
            f"{self.infra_errors} infra errors · "
            f"{self.parse_errors} parse failures · {self.calls_made} calls + {self.cache_hits} cached · "
            f"{tokens:,} tokens · ${self.cost_usd:.4f} · {self.elapsed_s:.0f}s"
        )


@dataclass(frozen=True)
class Message:
    """A line for the person following the work. ``stream="status"`` lines are the command's own
    account (stdout in the CLI); ``"note"`` lines are side remarks (stderr)."""

    text: str
    stream: Literal["status", "note"] = "status"


@dataclass(frozen=True)
class Progress:
    snapshot: ProgressSnapshot


Event = Message | Progress
Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The listener for callers that want no events."""


class StopKind(StrEnum):
    """Why an evaluation or a loop stopped."""

    # an evaluation
    EARLY_STOP = "early_stop"  # the caller's exact stopping rule was met
    BUDGET = "budget"  # the next paid call would cross the budget
    # a loop run
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM
    STOP_FILE = "stop_file"  # experiments/STOP
    MAX_EXPERIMENTS = "max_experiments"
    HOURS = "hours"
    SPENT = "spent"  # the run spent its --budget-usd
    PATIENCE = "patience"
    WAITING = "waiting"  # --propose-only: a candidate waits for `judgeloop decide`
    PROPOSED = "proposed"  # --propose-only: the candidate ended without waiting (rejected, error)


@dataclass(frozen=True)
class StopReason:
    kind: StopKind
    message: str

    def __str__(self) -> str:
        return self.message
