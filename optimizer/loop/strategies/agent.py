"""The ``agent`` strategy: an LLM with tools over the dev split edits the allowed prompt files.

Real tool use through the SDKs: Anthropic ``tools`` with ``tool_use`` / ``tool_result`` blocks, or
OpenAI Chat Completions ``tools`` with ``tool_calls`` and ``tool`` messages (a screenshot goes back
as a user message right after the tool messages, since a ``tool`` message carries text only). The
conversation runs for at most ``max_agent_turns`` model calls and ends at ``submit``; edits are
held in memory and returned in the `Proposal`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.loop.strategies.common import counts_by_direction
from optimizer.loop.strategies.llm import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    Usage,
    check_key,
    make_client,
    price_for,
    sdk_errors,
)
from optimizer.loop.strategies.tools import ToolOutput, ToolState, anthropic_tools, openai_tools, run_tool

if TYPE_CHECKING:
    from optimizer.config import OptimizerSection, Price

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


def _opening(ctx: ProposalContext) -> str:
    counts = counts_by_direction(ctx.disagreements)
    return (
        f"Experiment {ctx.experiment_seq}. Allowed files: {', '.join(ctx.allowed_files)}.\n"
        f"The incumbent judge disagrees with the labels on {len(ctx.disagreements)} dev items: "
        f"{counts['missed_failure']} missed failures (too lenient) and {counts['rejected_success']} "
        f"rejected successes (too strict). {len(ctx.history)} past experiments in this run.\n"
        + (AGENTIC_JUDGE_NOTE if ctx.judge_mode == "agentic" else "")
        + "Investigate with the tools, edit the files, then call submit."
    )


def _to_json_args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return None
    return raw


class AgentStrategy:
    """An LLM with tools (see `optimizer.strategies.tools`) proposes edits; ends at ``submit``."""

    name = "agent"

    def __init__(
        self,
        cfg: OptimizerSection,
        prices: Mapping[str, Price],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    ) -> None:
        check_key(cfg)
        self.cfg = cfg
        self.price = price_for(prices, cfg.model)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_output_tokens = max_output_tokens

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """Run the tool-using conversation; `ProposalError` if it ends without a valid submit."""
        state = ToolState(ctx)
        usage = Usage()
        client = make_client(self.cfg, timeout_s=self.timeout_s, max_retries=self.max_retries)
        try:
            if self.cfg.provider == "anthropic":
                await self._run_anthropic(client, ctx, state, usage)  # type: ignore[arg-type]
            else:
                await self._run_openai(client, ctx, state, usage)  # type: ignore[arg-type]
        finally:
            await client.close()
        if state.submitted is None:
            raise usage.error(f"the agent did not submit within {self.cfg.max_agent_turns} turns")
        return Proposal(
            files=state.changed_files(),
            rationale=state.submitted,
            calls=usage.calls,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=usage.cost_usd,
            tool_errors=state.errors,
        )

    def _system(self) -> str:
        return SYSTEM_PROMPT.format(max_diff_lines=self.cfg.max_diff_lines)

    async def _run_anthropic(self, client: Any, ctx: ProposalContext, state: ToolState, usage: Usage) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": _opening(ctx)}]
        tools = anthropic_tools()
        for _turn in range(self.cfg.max_agent_turns):
            with sdk_errors(usage, "anthropic", self.cfg.model):
                reply = await client.messages.create(
                    model=self.cfg.model,
                    max_tokens=self.max_output_tokens,
                    system=self._system(),
                    tools=tools,
                    messages=messages,
                )
            usage.add_anthropic(reply.usage, self.price)
            assistant: list[dict[str, Any]] = []
            tool_uses = []
            for block in reply.content:
                if block.type == "text":
                    if block.text:
                        assistant.append({"type": "text", "text": block.text})
                elif block.type == "tool_use":
                    assistant.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
                    tool_uses.append(block)
                else:  # thinking and other blocks go back verbatim, as the API requires
                    assistant.append(block.model_dump(exclude_none=True))
            if not assistant:
                assistant.append({"type": "text", "text": "(no output)"})
            messages.append({"role": "assistant", "content": assistant})
            if not tool_uses:
                messages.append({"role": "user", "content": "Use the tools; call submit when your edit is ready."})
                continue
            results = []
            for tu in tool_uses:
                out = run_tool(state, tu.name, tu.input)
                results.append(_anthropic_result(tu.id, out))
                if state.submitted is not None:
                    break  # submit ends the session: later calls in the same turn are not run
            if state.submitted is not None:
                return
            messages.append({"role": "user", "content": results})

    async def _run_openai(self, client: Any, ctx: ProposalContext, state: ToolState, usage: Usage) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self._system()},
            {"role": "user", "content": _opening(ctx)},
        ]
        tools = openai_tools()
        for _turn in range(self.cfg.max_agent_turns):
            with sdk_errors(usage, "openai", self.cfg.model):
                reply = await client.chat.completions.create(
                    model=self.cfg.model,
                    max_completion_tokens=self.max_output_tokens,
                    tools=tools,
                    messages=messages,
                )
            usage.add_openai(reply.usage, self.price)
            if not reply.choices:
                raise usage.error("the optimiser's reply had no choices")
            message = reply.choices[0].message
            calls = [c for c in (message.tool_calls or []) if getattr(c, "type", "function") == "function"]
            assistant: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if calls:
                assistant["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    for c in calls
                ]
            messages.append(assistant)
            if not calls:
                messages.append({"role": "user", "content": "Use the tools; call submit when your edit is ready."})
                continue
            images: list[dict[str, Any]] = []
            for c in calls:
                args = _to_json_args(c.function.arguments)
                if args is None:
                    out = state.fail(f"{c.function.name}: arguments are not valid JSON")
                    state.calls += 1
                else:
                    out = run_tool(state, c.function.name, args)
                text = out.text
                if out.image is not None:
                    text += " (image follows in the next user message)"
                    images.append({"type": "text", "text": out.text})
                    images.append({"type": "image_url", "image_url": {"url": _data_url(out)}})
                messages.append({"role": "tool", "tool_call_id": c.id, "content": text})
                if state.submitted is not None:
                    break  # submit ends the session: later calls in the same turn are not run
            if state.submitted is not None:
                return
            if images:
                messages.append({"role": "user", "content": images})


def _data_url(out: ToolOutput) -> str:
    assert out.image is not None
    return f"data:{out.media_type};base64,{base64.b64encode(out.image).decode('ascii')}"


def _anthropic_result(tool_use_id: str, out: ToolOutput) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": out.text}]
    if out.image is not None:
        content.append({
            "type": "image",
            "source": {"type": "base64", "media_type": out.media_type,
                       "data": base64.b64encode(out.image).decode("ascii")},
        })
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if out.is_error:
        result["is_error"] = True
    return result
