"""The ``agent`` strategy: an LLM with tools over the dev split edits the allowed prompt files.

Real tool use through the judge's provider layer (`OptimiserModel` over the providers' `converse`):
Anthropic ``tool_use`` / ``tool_result`` blocks, or OpenAI Chat Completions ``tool_calls`` and
``tool`` messages (a screenshot goes back as a user message right after the tool messages, since a
``tool`` message carries text only). The conversation runs for at most ``max_agent_turns`` model
calls and ends at ``submit``; edits are held in memory and returned in the `Proposal`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optimizer.judge.memory import MEMORY_FILES
from optimizer.judge.providers import check_optimizer_key
from optimizer.judge.types import (
    AssistantTurn,
    ConversationMessage,
    ImagePart,
    Part,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResults,
    UserMessage,
)
from optimizer.loop.strategies import Proposal, ProposalContext, ProposalError
from optimizer.loop.strategies.common import counts_by_direction
from optimizer.loop.strategies.llm import DEFAULT_MAX_OUTPUT_TOKENS, OptimiserModel
from optimizer.loop.strategies.tools import ToolOutput, ToolState, run_tool, tool_specs

if TYPE_CHECKING:
    from optimizer.workspace.config import OptimizerSection, Price

NUDGE = "Use the tools; call submit when your edit is ready."

SYSTEM_PROMPT = """\
You improve the prompt of an LLM judge. The judge reads a computer-use trajectory (an instruction and \
~120 steps of screenshots and actions) and answers whether the agent accomplished the instruction. \
Negatives in the data are coherent executions of a *different but close* instruction, so the judge must \
check the trajectory against the exact request (Critical Mistake, Bad Side Effect, Misunderstanding of \
the Instruction). Your edit is kept only if agreement with human labels (Cohen's kappa) rises on the dev \
split without raising the false-positive rate, so never make the judge more lenient in a way that lets \
failures through.

Work with the tools: look at the disagreements (both directions), read some trajectories and screenshots \
to understand *why* the judge is wrong, read the history so you do not repeat an edit that was rolled back, \
read the human guidance, then edit the allowed prompt files and submit with a one-paragraph rationale.

Rules: write general rules that transfer to unseen trajectories. Never quote trajectory ids, recording ids, \
phrases of 8+ words from dev instructions, or their concrete values (file names, addresses, dates, times, \
quoted names): such candidates are rejected unevaluated. Keep the diff \
small (at most {max_diff_lines} changed lines). Leave protected regions (between judgeloop protect markers) \
and template placeholders exactly as they are. Keep the judge's JSON answer format unchanged.
"""


AGENTIC_JUDGE_NOTE = (
    "The judge runs in agentic mode: it sees the instruction and one line per step's action, then chooses "
    "which steps to read and which screenshots to view before it submits; each disagreement lists its tool "
    "calls (judge_tool_calls), so you can see what it did not look at and tell it where to look.\n"
)


MEMORY_NOTE = (
    "The judge's memory (prompts/memory/) is yours to edit with add_case, edit_case, retire_case and "
    "edit_principles: a case's source_items are the one place dev trajectory ids belong (a case is never shown "
    "for its own items' fold, so it helps only similar items elsewhere); the principles are general rules.\n"
)


def _opening(ctx: ProposalContext) -> str:
    counts = counts_by_direction(ctx.disagreements)
    return (
        f"Experiment {ctx.experiment_seq}. Allowed files: {', '.join(ctx.allowed_files)}.\n"
        f"The incumbent judge disagrees with the labels on {len(ctx.disagreements)} dev items: "
        f"{counts['missed_failure']} missed failures (too lenient) and {counts['rejected_success']} "
        f"rejected successes (too strict). {len(ctx.history)} past experiments in this run.\n"
        + (AGENTIC_JUDGE_NOTE if ctx.judge_mode == "agentic" else "")
        + (MEMORY_NOTE if any(f in MEMORY_FILES for f in ctx.allowed_files) else "")
        + (
            f"You may also move these judge.toml keys with set_structure (read_structure lists them): "
            f"{', '.join(ctx.structure_moves)}.\n"
            if ctx.structure_moves
            else ""
        )
        + "Investigate with the tools, edit the files, then call submit."
    )


def _arguments(call: ToolCall) -> Any:
    """A tool call's arguments as JSON (``{}`` when empty), or None when they are not valid JSON."""
    try:
        return json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError:
        return None


def _result(call: ToolCall, out: ToolOutput) -> ToolResult:
    parts: tuple[Part, ...] = (TextPart(out.text),)
    if out.image is not None:
        parts += (ImagePart(out.image, media_type=out.media_type),)
    return ToolResult(call_id=call.id, parts=parts, is_error=out.is_error)


class AgentStrategy:
    """An LLM with tools (see `optimizer.strategies.tools`) proposes edits; ends at ``submit``."""

    name = "agent"

    def __init__(
        self,
        cfg: OptimizerSection,
        prices: Mapping[str, Price],
        *,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    ) -> None:
        check_optimizer_key(cfg)
        self.cfg = cfg
        self.prices = prices
        self.max_output_tokens = max_output_tokens

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """Run the tool-using conversation; `ProposalError` if it ends without a valid submit."""
        state = ToolState(ctx)
        system = SYSTEM_PROMPT.format(max_diff_lines=self.cfg.max_diff_lines)
        messages: list[ConversationMessage] = [UserMessage((TextPart(_opening(ctx)),))]
        async with OptimiserModel(self.cfg, self.prices, max_output_tokens=self.max_output_tokens) as model:
            await self._until_submit(model, system, messages, state)
        if state.submitted is None:
            raise model.error(f"the agent did not submit within {self.cfg.max_agent_turns} turns")
        return model.proposal(state.changed_files(), state.submitted, tool_errors=state.errors)

    async def _until_submit(
        self, model: OptimiserModel, system: str, messages: list[ConversationMessage], state: ToolState
    ) -> list[ToolResult]:
        """Turns until ``submit`` (or ``max_agent_turns``); the submitting turn's tool results are returned,
        not appended (a conversation that goes on must answer them)."""
        tools = tool_specs(state.ctx.allowed_files, structure=bool(state.ctx.structure_moves))
        for _turn in range(self.cfg.max_agent_turns):
            turn = await model.turn(system, messages, tools)
            # An empty assistant turn is refused by both APIs when sent back.
            messages.append(turn if turn.text or turn.tool_calls else AssistantTurn(text="(no output)"))
            if not turn.tool_calls:
                messages.append(UserMessage((TextPart(NUDGE),)))
                continue
            results = []
            for call in turn.tool_calls:
                args = _arguments(call)
                if args is None:
                    state.calls += 1
                    out = state.fail(f"{call.name}: arguments are not valid JSON")
                else:
                    out = run_tool(state, call.name, args)
                results.append(_result(call, out))
                if state.submitted is not None:
                    break  # submit ends the session: later calls in the same turn are not run
            if state.submitted is not None:
                # Every call of the turn is answered (the ones after submit were not run).
                done = {r.call_id for r in results}
                return results + [
                    ToolResult(call_id=c.id, parts=(TextPart("not run: submitted before it"),), is_error=True)
                    for c in turn.tool_calls
                    if c.id not in done
                ]
            messages.append(ToolResults(tuple(results)))
        return []

    async def propose_wave(self, ctx: ProposalContext, k: int) -> list[Proposal | ProposalError]:
        """``k`` candidates in one conversation (`[loop] wave`): after each submit the files go back to the
        incumbent's and the agent is asked for a different edit; each candidate carries its own turns'
        spend. A candidate not submitted within ``max_agent_turns`` turns is its `ProposalError`."""
        system = SYSTEM_PROMPT.format(max_diff_lines=self.cfg.max_diff_lines)
        messages: list[ConversationMessage] = [
            UserMessage(
                (
                    TextPart(
                        _opening(ctx)
                        + f"\nThis round judges a wave of {k} candidates together against the same incumbent; "
                        f"you will be asked for each in this conversation. Candidate 1 of {k}."
                    ),
                )
            )
        ]
        out: list[Proposal | ProposalError] = []
        async with OptimiserModel(self.cfg, self.prices, max_output_tokens=self.max_output_tokens) as model:
            for i in range(1, k + 1):
                state = ToolState(ctx)
                before = model.usage
                try:
                    results = await self._until_submit(model, system, messages, state)
                except ProposalError as exc:  # the transport failed: no later candidate either
                    out += [exc] + [ProposalError(f"not proposed: {exc.reason}") for _ in range(k - i)]
                    break
                now = model.usage
                spent = {
                    "calls": now.calls - before.calls,
                    "input_tokens": now.input_tokens - before.input_tokens,
                    "output_tokens": now.output_tokens - before.output_tokens,
                }
                cost = now.cost_usd - before.cost_usd
                if state.submitted is None:
                    out += [
                        ProposalError(
                            f"the agent did not submit candidate {i} within {self.cfg.max_agent_turns} turns",
                            calls=spent["calls"],
                            input_tokens=spent["input_tokens"],
                            output_tokens=spent["output_tokens"],
                            cost_usd=cost,
                        )
                    ]
                    out += [ProposalError("not proposed: the agent stopped submitting") for _ in range(k - i)]
                    break
                out.append(
                    Proposal(
                        files=state.changed_files(),
                        rationale=state.submitted,
                        calls=spent["calls"],
                        input_tokens=spent["input_tokens"],
                        output_tokens=spent["output_tokens"],
                        cost_usd=cost,
                        tool_errors=state.errors,
                    )
                )
                if i < k:
                    messages.append(ToolResults(tuple(results)))
                    messages.append(UserMessage((TextPart(WAVE_NEXT.format(i=i + 1, k=k)),)))
        return out


WAVE_NEXT = (
    "Candidate {i} of {k}: the files are back to the incumbent's. Propose a different edit from every one "
    "you submitted above (another section, or another rule for the same disagreements); it is judged "
    "beside them. Edit the files, then call submit."
)
