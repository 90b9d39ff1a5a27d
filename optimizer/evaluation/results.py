"""What an evaluation produces: one result per replicate call, per item, per evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from optimizer.events import StopReason
from optimizer.judge.types import JudgeToolCall
from optimizer.metrics import Answer
from optimizer.models import Verdict

ParseStatus = Literal["ok", "parse_error", "infra_error"]


@dataclass(frozen=True)
class ReplicateResult:
    """One judge call for one item (replicate ``index``), fresh or from the cache.

    ``cost_usd`` is what the call cost when it was made; a cached replicate cost nothing now.
    """

    index: int
    cache_key: str
    cached: bool
    reply_text: str | None
    verdict: Verdict | None
    parse_error: str | None
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    infra_error: str | None = None
    # Agentic judge: the tool calls of the conversation in order (str() gives "read_steps(0-24)"),
    # and the number of model calls it took (1 for a direct judge).
    trace: tuple[JudgeToolCall, ...] = ()
    turns: int = 1

    @property
    def status(self) -> ParseStatus:
        if self.infra_error is not None:
            return "infra_error"
        return "ok" if self.verdict is not None else "parse_error"

    @property
    def success(self) -> bool | None:
        return None if self.verdict is None else self.verdict.success


@dataclass(frozen=True)
class ItemResult:
    """One evaluated item: its replicates, the majority `Answer` that is scored, and instability.

    ``verdict`` is the replicate verdict that represents the majority (its reasoning is exported);
    None when the majority is a parse failure or the item is an infrastructure error.
    """

    trajectory_id: str
    replicates: list[ReplicateResult]
    answer: Answer
    unstable: bool
    infra_error: bool
    verdict: Verdict | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def cost_usd(self) -> float:
        """What this item's calls cost when they were made (cached or not)."""
        return sum(r.cost_usd for r in self.replicates)

    @property
    def new_cost_usd(self) -> float:
        """What this item's calls cost in this evaluation (cached calls are free)."""
        return sum(r.cost_usd for r in self.replicates if not r.cached and r.infra_error is None)


@dataclass
class EvalRun:
    """Everything one evaluation produced. Tokens and ``cost_usd`` count only calls made now; input
    tokens are the uncached ones, cache reads and writes are counted apart."""

    items: list[ItemResult]
    calls_made: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    stop: StopReason | None = None
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    notes: list[str] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def stopped_early(self) -> bool:
        return self.stop is not None

    @property
    def stop_reason(self) -> str | None:
        return None if self.stop is None else self.stop.message

    @property
    def infra_error_ids(self) -> list[str]:
        return [item.trajectory_id for item in self.items if item.infra_error]

    @property
    def cached_cost_usd(self) -> float:
        """What the cached calls reused here originally cost (money this evaluation did not spend)."""
        return sum(r.cost_usd for item in self.items for r in item.replicates if r.cached)

    def answers(self) -> dict[str, Answer]:
        """The scored answer of every evaluated item (infrastructure errors included, as such)."""
        return {item.trajectory_id: item.answer for item in self.items}
