"""Optimiser strategies: given the incumbent prompts and what it gets wrong on the dev split, propose
new texts for some allowed prompt files.

A strategy never writes files (the loop applies the texts after the guards), never opens a split
other than ``ctx.split`` (the dev split) and sees labels only through `Disagreement`.
``make_strategy`` picks one of ``library`` (offline, no LLM), ``memory`` (offline: distils human reviews
and disagreements into ``prompts/memory/``), ``reflect`` (one LLM call) and ``agent`` (an LLM with
tools over the dev split).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard

from optimizer.vocab import STRATEGIES

if TYPE_CHECKING:
    from optimizer.devset.split import Split
    from optimizer.judge.types import JudgeToolCall
    from optimizer.workspace.config import OptimizerSection, Price

Direction = Literal["missed_failure", "rejected_success"]


@dataclass(frozen=True)
class Disagreement:
    """One dev item where the incumbent judge and the label disagree."""

    trajectory_id: str
    instruction: str
    label_positive: bool
    mistake_type: str | None  # the label's mistake type (negatives only)
    judge_success: bool | None  # None: the judge gave no valid answer
    reasoning: str
    confidence: str | None
    unstable: bool  # replicates of the incumbent disagreed with each other
    judge_tools: tuple[
        JudgeToolCall, ...
    ] = ()  # an agentic judge's tool calls (str(): "view_screenshots(3, 7)")

    @property
    def direction(self) -> Direction:
        """``missed_failure``: a negative the judge let through; ``rejected_success``: a positive it failed."""
        return "rejected_success" if self.label_positive else "missed_failure"


# `PastExperiment.decision` of another candidate of the same wave (`[loop] wave`): proposed against the
# same incumbent and judged together with the one being proposed, not decided yet.
IN_WAVE = "in_wave"
# `PastExperiment.decision` of a rolled-back candidate that pointed the right way and waits in the incumbent's
# pool to be merged with others and tested together (`[loop] stack`, `optimizer.loop.stack`): a promising
# direction a strategy may build on rather than abandon.
POOLED = "pointed the right way, pooled"


@dataclass(frozen=True)
class ReviewNote:
    """A person's review of a dev item (the ledger's ``reviews``; only dev items ever reach a strategy)."""

    trajectory_id: str
    kind: str  # optimizer.vocab.REVIEW_KINDS
    note: str
    instruction: str


@dataclass(frozen=True)
class PastExperiment:
    id: int
    decision: str
    reason: str
    rationale: str
    kappa: float | None
    fpr: float | None
    diff: str
    meta: Mapping[str, Any] = field(default_factory=dict)  # the proposal's `Proposal.meta`, from the ledger


@dataclass
class ProposalContext:
    workspace_root: Path
    allowed_files: list[str]
    current_files: dict[str, str]  # path (relative, as in allowed_files) -> incumbent text
    disagreements: list[Disagreement]
    history: list[PastExperiment]
    guidance: str  # experiments/guidance.md + human reviews
    split: Split  # the dev split only
    rng_seed: int
    experiment_seq: int
    judge_mode: str = "direct"  # prompts/judge.toml mode of the incumbent: "direct" or "agentic"
    judge_memory: str = "off"  # prompts/judge.toml memory of the incumbent: "off" or "retrieve"
    # Decided experiments of earlier runs on this split whose incumbent had these same prompts: their
    # outcome against this incumbent is known (`library` never proposes them again).
    earlier: list[PastExperiment] = field(default_factory=list)
    # The human reviews of dev items, oldest first (their text is in ``guidance`` too).
    reviews: list[ReviewNote] = field(default_factory=list)
    # [optimizer] structure_moves / max_members: the judge.toml keys a strategy may move (then
    # prompts/judge.toml is in current_files), `optimizer.structure`.
    structure_moves: list[str] = field(default_factory=list)
    max_members: int = 1


@dataclass
class Proposal:
    files: dict[str, str]  # path -> new full text (only the files it changes)
    rationale: str  # one paragraph
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    # Tool calls the agent made that were refused (file not allowed, id not in the dev split, bad args).
    tool_errors: int = 0
    # What the strategy records about its proposal as data (JSON-serialisable), for itself later: stored
    # with the experiment (ledger ``proposal_meta``) and handed back in `PastExperiment.meta`. The
    # library strategy keeps ``{"library_enabled": [ids]}`` here.
    meta: dict[str, Any] = field(default_factory=dict)


class ProposalError(Exception):
    """The optimiser produced no usable candidate (malformed reply, no submit, transport failure).

    The loop records ``reason`` (``str(exc)``) with the experiment and continues. ``usage`` carries
    what was spent before the failure, so budgets stay honest.
    """

    def __init__(
        self,
        reason: str,
        *,
        calls: int = 0,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float = 0.0,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.calls = calls
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cost_usd = cost_usd


class Strategy(Protocol):
    name: str

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """Return new texts for some allowed files; raise `ProposalError` when there is none."""
        ...


class WaveStrategy(Strategy, Protocol):
    """A strategy that proposes a wave's candidates in one conversation (`[loop] wave`)."""

    async def propose_wave(self, ctx: ProposalContext, k: int) -> list[Proposal | ProposalError]:
        """``k`` proposals (or each one's `ProposalError`), each told about the ones before it."""
        ...


def proposes_waves(strategy: Strategy) -> TypeGuard[WaveStrategy]:
    """Whether ``strategy`` proposes a whole wave at once (`WaveStrategy`)."""
    return callable(getattr(strategy, "propose_wave", None))


def _library(optimizer_cfg: OptimizerSection, prices: Mapping[str, Price]) -> Strategy:  # noqa: ARG001 - one factory signature
    from optimizer.loop.strategies.library import LibraryStrategy

    return LibraryStrategy(optimizer_cfg.allowed_files)


def _reflect(optimizer_cfg: OptimizerSection, prices: Mapping[str, Price]) -> Strategy:
    from optimizer.loop.strategies.reflect import ReflectStrategy

    return ReflectStrategy(optimizer_cfg, prices)


def _memory(optimizer_cfg: OptimizerSection, prices: Mapping[str, Price]) -> Strategy:  # noqa: ARG001 - one factory signature
    from optimizer.loop.strategies.memory import MemoryStrategy

    return MemoryStrategy(optimizer_cfg.allowed_files)


def _agent(optimizer_cfg: OptimizerSection, prices: Mapping[str, Price]) -> Strategy:
    from optimizer.loop.strategies.agent import AgentStrategy

    return AgentStrategy(optimizer_cfg, prices)


# Every name in `optimizer.vocab.STRATEGIES` (a test holds them equal); modules load on first use.
FACTORIES: dict[str, Callable[[OptimizerSection, Mapping[str, Price]], Strategy]] = {
    "agent": _agent,
    "reflect": _reflect,
    "library": _library,
    "memory": _memory,
}


def make_strategy(name: str, optimizer_cfg: OptimizerSection, prices: Mapping[str, Price]) -> Strategy:
    """The strategy called ``name`` (``library`` | ``memory`` | ``reflect`` | ``agent``).

    ``prices`` maps model ids to `Price` (US dollars per million tokens) for the optimiser's cost.
    LLM strategies check the API key here, so a missing key fails the run before any experiment.
    """
    from optimizer.errors import UserError

    factory = FACTORIES.get(name)
    if factory is None:
        raise UserError(f"unknown optimiser strategy {name!r}; use one of: {', '.join(STRATEGIES)}")
    return factory(optimizer_cfg, prices)
