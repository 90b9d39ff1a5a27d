"""What the engine tells the outside world while it works: progress, messages, the loop's typed
events, and why it stopped. The one module for the event types.

Engine functions never print. They take an ``events: Listener`` (any callable taking an `Event`)
and call it; the CLI renders events on the terminal (`optimizer.cli.progress.TerminalEvents`), the
TUI, the MCP server and tests collect them. Every event has a ``kind`` (its discriminator) and says
its line for a person through `said` (None: nothing to print), so no consumer parses display text.

Two families:

- what a listener hears: `Message` (free text), `Progress` (a pass's running totals), and the loop's
  life cycle: `CandidateProposed`, `GuardRejected`, `CandidateDecided`, `RunStopped`;
- what the ledger's event feed stores (`LedgerEvent`, the feed's ``kind`` column and JSON payload):
  `StageChanged` (``stage``), `PassProgress` (``progress``), `DecisionRecorded` (``decision``),
  `RunStatusChanged` (``run_status``). `LedgerEvent.payload` is the stored JSON, unchanged from older
  versions, and `read_event` the one parser every follower (the TUI's live strip, a resume) reads the
  feed with: a kind it does not know, or a payload it cannot read, is None (skipped), never an error.

`StopReason` is typed: code branches on its `kind`, people read its `message`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import TypeAdapter, ValidationError

from optimizer.vocab import EVENT_KINDS


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
            self,
            done=self.done + other.done,
            total=self.total + other.total,
            infra_errors=self.infra_errors + other.infra_errors,
            parse_errors=self.parse_errors + other.parse_errors,
            calls_made=self.calls_made + other.calls_made,
            cache_hits=self.cache_hits + other.cache_hits,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            elapsed_s=self.elapsed_s + other.elapsed_s,
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


Stream = Literal["status", "note"]


@dataclass(frozen=True)
class Message:
    """A line for the person following the work. ``stream="status"`` lines are the command's own
    account (stdout in the CLI); ``"note"`` lines are side remarks (stderr)."""

    kind: ClassVar[Literal["message"]] = "message"
    text: str
    stream: Stream = "status"


@dataclass(frozen=True)
class Progress:
    """A pass's running totals, for a progress line (the ledger's copy is `PassProgress`)."""

    kind: ClassVar[Literal["progress"]] = "progress"
    snapshot: ProgressSnapshot


# -- the loop's life cycle, as a listener hears it --------------------------------------------------


@dataclass(frozen=True)
class CandidateProposed:
    """The optimiser's edit is recorded as experiment ``experiment_id`` (before the guards read it):
    ``files_changed`` its files, ``insertions``/``deletions`` its diff's lines. Nothing is printed."""

    kind: ClassVar[Literal["candidate_proposed"]] = "candidate_proposed"
    experiment_id: int
    seq: int
    strategy: str
    files_changed: tuple[str, ...] = ()
    insertions: int = 0
    deletions: int = 0


@dataclass(frozen=True)
class GuardRejected:
    """The guards refused candidate ``experiment_id`` before any judge call; ``reason`` says why."""

    kind: ClassVar[Literal["guard_rejected"]] = "guard_rejected"
    experiment_id: int
    reason: str


@dataclass(frozen=True)
class Judged:
    """What a decided candidate's evaluation cost: judge calls made, answers from the cache, US dollars."""

    calls: int
    cached: int
    cost_usd: float


@dataclass(frozen=True)
class CandidateDecided:
    """Candidate ``experiment_id`` settled as ``status`` (`optimizer.vocab.ExperimentStatus`): kept or
    rolled back (with ``judged``; ``cheaper``: kept as cheaper, not worse), an error (``reason`` says it
    was rolled back), or ``waiting`` for a person (``reason`` then the policy's advice, ``commit_sha``
    the candidate to review)."""

    kind: ClassVar[Literal["candidate_decided"]] = "candidate_decided"
    experiment_id: int
    status: str
    reason: str
    judged: Judged | None = None
    cheaper: bool = False
    policy: str = ""
    commit_sha: str = ""

    def line(self) -> str:
        """The line the CLI prints (unchanged from before the events were typed)."""
        head = f"  experiment {self.experiment_id}: "
        if self.status == "waiting":
            return (
                f"{head}evaluated; the {self.policy} policy {self.reason} "
                f"(review it: `git show {self.commit_sha[:12]}`, `judgeloop tui`)"
            )
        if self.judged is None:
            return head + self.reason
        outcome = (
            ("KEPT (cheaper, not worse)" if self.cheaper else "KEPT")
            if self.status == "kept"
            else "rolled back"
        )
        j = self.judged
        return f"{head}{outcome} — {self.reason} (calls={j.calls}, cached={j.cached}, ${j.cost_usd:.4f})"


@dataclass(frozen=True)
class RunStopped:
    """Run ``run_id`` ended as ``status`` (`optimizer.vocab.RunStatus`) because of ``stop``;
    ``waiting_for``: the experiment a person must decide (--propose-only), with the run's spend so
    far (``spent_usd``, US dollars)."""

    kind: ClassVar[Literal["run_stopped"]] = "run_stopped"
    run_id: str
    status: str
    stop: StopReason
    waiting_for: int | None = None
    spent_usd: float = 0.0

    def line(self) -> str:
        """The line the CLI prints (unchanged from before the events were typed)."""
        if self.waiting_for is not None:
            return (
                f"run {self.run_id} waiting: experiment {self.waiting_for} waits for your decision: "
                f"`judgeloop decide {self.waiting_for} keep|discard`; spent ${self.spent_usd:.4f}"
            )
        return f"run {self.run_id} {self.status}: {self.stop.message}"


Event = Message | Progress | CandidateProposed | GuardRejected | CandidateDecided | RunStopped
Listener = Callable[[Event], None]


def said(event: Event) -> Message | None:
    """The line a person reads for ``event`` (its stream included), or None: progress and silent
    events have none. Every listener that prints or collects lines goes through this."""
    if isinstance(event, Message):
        return event
    if isinstance(event, GuardRejected):
        return Message(f"  experiment {event.experiment_id}: rejected by the guards: {event.reason}")
    if isinstance(event, CandidateDecided):
        return Message(event.line())
    if isinstance(event, RunStopped):
        return Message(event.line())
    return None


def said_lines(events: Iterable[Event]) -> list[str]:
    """The text of every event's line (`said`), in order."""
    return [line.text for event in events if (line := said(event)) is not None]


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


# -- the ledger's event feed ----------------------------------------------------------------------
# Each payload's fields carry the defaults older readers assumed for a missing key, so every stored
# row, old or new, reads as it did.


@dataclass(frozen=True)
class StageChanged:
    """What the loop is doing (``stage``: a `StageKind`, or an older version's name) and its details:
    ``seq``/``strategy`` (proposing), ``started_at`` (evaluating; Unix seconds, as the cache's
    ``created``), ``items`` (re-judging), ``text`` (display text, e.g. a batch's state line) and
    ``paid_before_crash_usd`` (resuming). None: not part of this stage."""

    kind: ClassVar[Literal["stage"]] = "stage"
    stage: str
    seq: int | None = None
    strategy: str | None = None
    started_at: float | None = None
    items: int | None = None
    text: str | None = None
    paid_before_crash_usd: float | None = None

    def payload(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def shown(self) -> str:
        """What a live strip shows: the display text when there is one, else the stage's name."""
        return str(self.text or self.stage)


@dataclass(frozen=True)
class PassProgress:
    """One pass's running totals as the ledger keeps them: items ``done`` of ``total``, ``errors``
    (infrastructure and parse), judge ``calls`` made and ``cache_hits``, tokens, ``cost_usd`` (the
    run's spend so far, US dollars) and ``elapsed_s`` (seconds since the run's process started)."""

    kind: ClassVar[Literal["progress"]] = "progress"
    done: int = 0
    total: int = 0
    errors: int = 0
    calls: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0

    def payload(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DecisionRecorded:
    """An experiment's decision as the ledger wrote it (``status`` also stored as ``decision``)."""

    kind: ClassVar[Literal["decision"]] = "decision"
    status: str | None = None
    reason: str | None = None

    def payload(self) -> dict[str, Any]:
        return {"status": self.status, "decision": self.status, "reason": self.reason}


@dataclass(frozen=True)
class RunStatusChanged:
    """A run's new status (`optimizer.vocab.RunStatus`) and, once it ends, why."""

    kind: ClassVar[Literal["run_status"]] = "run_status"
    status: str | None = None
    stop_reason: str | None = None

    def payload(self) -> dict[str, Any]:
        return {"status": self.status, "stop_reason": self.stop_reason}


@dataclass(frozen=True)
class RunOpened(RunStatusChanged):
    """A run's first status as the ledger writes it when the run is inserted: the status alone (nothing
    has ended yet, so the payload has no ``stop_reason`` key); read back as a `RunStatusChanged`."""

    def payload(self) -> dict[str, Any]:
        return {"status": self.status}


LedgerEvent = StageChanged | PassProgress | DecisionRecorded | RunStatusChanged
_FEED: dict[str, TypeAdapter[Any]] = {
    cls.kind: TypeAdapter(cls) for cls in (StageChanged, PassProgress, DecisionRecorded, RunStatusChanged)
}
assert set(_FEED) == set(EVENT_KINDS)  # every kind the feed stores has its type


def read_event(kind: str, payload: Mapping[str, Any] | Any) -> LedgerEvent | None:
    """The typed event of one row of the ledger's feed (its ``kind`` column and JSON ``payload``), or
    None for a kind this version does not know or a payload it cannot read (skipped by followers)."""
    adapter = _FEED.get(kind)
    if adapter is None or not isinstance(payload, Mapping):
        return None
    try:
        event: LedgerEvent = adapter.validate_python(dict(payload))
    except ValidationError:
        return None
    return event
