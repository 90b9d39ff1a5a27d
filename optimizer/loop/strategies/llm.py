"""The optimiser's own model during one proposal, through the judge's provider layer.

`OptimiserModel` is a thin session over `optimizer.judge.providers.make_optimizer_provider`: the
key check, the SDK clients, retries and timeouts (``[optimizer] max_retries`` / ``timeout_s``), the
error mapping, the token convention and the price table are the providers'. What it adds is what the
loop needs from a proposal: the usage summed over its calls, and a transport failure that survived
the SDK's retries turned into `ProposalError` carrying that usage (the loop records it and
continues). A rejected key or an unknown model stays a `UserError`: every later experiment would
fail the same way, so the run stops and says what to fix. Keys are never logged or stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from optimizer.judge.providers import Usage, make_optimizer_provider
from optimizer.judge.types import (
    AssistantTurn,
    ConversationMessage,
    InfrastructureError,
    Sampling,
    ToolSpec,
)
from optimizer.loop.strategies import Proposal, ProposalError

if TYPE_CHECKING:
    from optimizer.workspace.config import OptimizerSection, Price

DEFAULT_MAX_OUTPUT_TOKENS = 4096


class OptimiserModel:
    """One proposal's conversation partner: ``await model.turn(system, messages, tools)`` per call.

    Use as ``async with OptimiserModel(cfg, prices) as model:``; the provider is closed on exit.
    Constructing it checks the key (`UserError` naming the optimiser when it is missing).
    """

    def __init__(
        self,
        cfg: OptimizerSection,
        prices: Mapping[str, Price],
        *,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    ) -> None:
        self.provider = make_optimizer_provider(cfg)
        self.prices = prices
        self.sampling = Sampling(max_tokens=max_output_tokens)
        self.usage = Usage()

    async def __aenter__(self) -> OptimiserModel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.provider.aclose()

    async def turn(
        self,
        system: str,
        messages: Sequence[ConversationMessage],
        tools: Sequence[ToolSpec] = (),
        *,
        last: bool = False,
    ) -> AssistantTurn:
        """One model call; its usage is added to ``self.usage``. ``last``: no turn will follow (the
        conversation is not marked for the prompt cache). Transport failure → `ProposalError`."""
        try:
            turn, reply = await self.provider.converse(
                system, list(messages), list(tools), self.sampling, cache_conversation=not last
            )
        except InfrastructureError as exc:
            raise self.error(str(exc)) from None
        self.usage += Usage.of(reply, self.prices)
        return turn

    def error(self, reason: str) -> ProposalError:
        """A `ProposalError` carrying what this proposal spent so far."""
        return ProposalError(
            reason,
            calls=self.usage.calls,
            input_tokens=self.usage.input_tokens,
            output_tokens=self.usage.output_tokens,
            cost_usd=self.usage.cost_usd,
        )

    def proposal(self, files: dict[str, str], rationale: str, *, tool_errors: int = 0) -> Proposal:
        """The `Proposal`, with what this proposal spent."""
        return Proposal(
            files=files,
            rationale=rationale,
            calls=self.usage.calls,
            input_tokens=self.usage.input_tokens,
            output_tokens=self.usage.output_tokens,
            cost_usd=self.usage.cost_usd,
            tool_errors=tool_errors,
        )
