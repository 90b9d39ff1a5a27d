"""What an evaluation produces: one result per replicate call, per item, per evaluation.

Each level has a `Usage` (calls, tokens, US dollars; `optimizer.judge.providers.pricing`), and the
levels add up with ``+``: a replicate's is its call(s), an item's the sum of its replicates', a
pass's (`EvalRun.usage`) the calls made now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from optimizer.evaluation.warmup import CacheReads
from optimizer.events import StopReason
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import JudgeToolCall
from optimizer.models import Verdict
from optimizer.stats.metrics import Answer

ParseStatus = Literal["ok", "parse_error", "infra_error"]


class UsageFigures:
    """The figures of a result's ``usage`` under the names the result files, the ledger's rows, the
    CLI and the benchmarks use (one definition for replicates, items and evaluations)."""

    if TYPE_CHECKING:

        @property
        def usage(self) -> Usage: ...

    @property
    def calls_made(self) -> int:
        return self.usage.calls

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens

    @property
    def cache_read_tokens(self) -> int:
        return self.usage.cache_read_tokens

    @property
    def cache_write_tokens(self) -> int:
        return self.usage.cache_write_tokens

    @property
    def cost_usd(self) -> float:
        """What the calls cost when they were made (US dollars; a cached call cost nothing now)."""
        return self.usage.cost_usd


@dataclass(frozen=True)
class ReplicateResult(UsageFigures):
    """One judge call for one item (replicate ``index``), fresh or from the cache.

    ``usage``: the model calls behind it (one for a direct judge, one per answered turn for the
    agentic judge) as they were when made; a cached replicate cost nothing now.
    """

    index: int
    cache_key: str
    cached: bool
    reply_text: str | None
    verdict: Verdict | None
    parse_error: str | None
    model: str
    usage: Usage = field(default_factory=Usage)
    duration_s: float = 0.0
    infra_error: str | None = None
    # Agentic judge: the tool calls of the conversation in order (str() gives "read_steps(0-24)"),
    # and the number of model calls it took (1 for a direct judge).
    trace: tuple[JudgeToolCall, ...] = ()
    turns: int = 1
    # A panel (judge.toml [panel]): this replicate's verdict is the vote of ``members``, one call
    # each, whose ``member`` is the member's label; usage, cost and ``cached`` are theirs together.
    member: str | None = None
    members: tuple[ReplicateResult, ...] = ()

    @property
    def status(self) -> ParseStatus:
        if self.infra_error is not None:
            return "infra_error"
        return "ok" if self.verdict is not None else "parse_error"

    @property
    def success(self) -> bool | None:
        return None if self.verdict is None else self.verdict.success


@dataclass(frozen=True)
class ItemResult(UsageFigures):
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
    def usage(self) -> Usage:
        """Its replicates' calls as they were when made (cached or not)."""
        return sum((r.usage for r in self.replicates), Usage())

    @property
    def new_cost_usd(self) -> float:
        """What this item's calls cost in this evaluation (cached calls are free)."""
        return sum(r.cost_usd for r in self.replicates if not r.cached and r.infra_error is None)


@dataclass(frozen=True)
class EvalMeta:
    """Who judged, what, and with which parameters: what `optimizer.evaluation.files` writes to
    ``_summary.json`` and each verdict file's ``_meta``. Every field is None when unknown (an
    `EvalRun` built by hand, as tests and the loop's joins do), which the files write as ``null``.

    ``sampling``, ``settings`` and ``memory`` are the JSON records written as they are (the
    sampling's and judge.toml's settings; `optimizer.evaluation.evaluator.memory_record`).
    """

    provider: str | None = None
    model: str | None = None
    # The offline SmolLM2 judge says what it is wherever its results go.
    judge_label: str | None = None
    # A harness judge says how its CLI was confined ("none": unconfined) wherever its results go.
    judge_confinement: str | None = None
    base_url: str | None = None  # credentials redacted
    # [judge] base_urls: every replica that may have answered (base_url is then None).
    base_urls: list[str | None] | None = None
    text_only: bool | None = None
    split: str | None = None
    split_fingerprint: str | None = None
    # The Markdown the items were rendered from: the official analysis step reads it from
    # _summary.json to remap trajectory ids (`analyze_eval_results.py --trajectories`).
    md_dir: str | None = None
    prompt_hash: str | None = None
    sampling: dict[str, Any] | None = None
    replicates: int | None = None
    max_concurrency: int | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    settings: dict[str, Any] | None = None
    budget_usd: float | None = None  # US dollars
    batch: bool | None = None
    # Only when memory is on: the cases sent and the folds that kept each item's own cases out.
    memory: dict[str, Any] | None = None
    # Only for a cascade: the rule, the escalation share, the second judge and each stage's figures
    # (`optimizer.evaluation.cascade.stage_figures`).
    cascade: dict[str, Any] | None = None


@dataclass
class EvalRun(UsageFigures):
    """Everything one evaluation produced. ``usage`` counts only calls made now (its input tokens
    are the uncached ones, cache reads and writes are counted apart); ``cache_hits`` the calls the
    cache answered."""

    items: list[ItemResult]
    usage: Usage = field(default_factory=Usage)
    cache_hits: int = 0
    duration_s: float = 0.0
    stop: StopReason | None = None
    notes: list[str] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    # Planned vs billed cache-read tokens of this pass's paid calls (`optimizer.evaluation.warmup`).
    cache_reads: CacheReads = field(default_factory=CacheReads)
    meta: EvalMeta = field(default_factory=EvalMeta)
    # With [judge] base_urls: this pass's figures per endpoint (`optimizer.judge.endpoints.EndpointFigures`).
    endpoints: dict[str, dict[str, int]] = field(default_factory=dict)

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


def parsed_result(
    index: int,
    key: str,
    cached: bool,
    text: str,
    model: str,
    usage: Usage,
    duration_s: float,
) -> ReplicateResult:
    """A replicate's result from a reply text (fresh or cached): the verdict parsed strictly."""
    from optimizer.judge.verdicts import parse_verdict

    parsed = parse_verdict(text)
    return ReplicateResult(
        index=index,
        cache_key=key,
        cached=cached,
        reply_text=text,
        verdict=parsed.verdict,
        parse_error=parsed.error,
        model=model,
        usage=usage,
        duration_s=duration_s,
    )
